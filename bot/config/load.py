"""YAML -> validated settings.

Every problem is collected (not just the first) and names the file, the key path and
what was expected, e.g. ``pipelines/support.yaml: source.query: expected a string, got
42``. A pipeline's stage options become the typed objects of :mod:`bot.config.options` here,
once; a model's options are checked by its drafter, through :class:`Checker`.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..redact import register as redact_register
from . import knowledge
from . import options as _options
from .checker import CLOCK_RE, DURATION_RE, Checker, kind_of, parse_duration
from .files import load_yaml, pipeline_files
from .gmail import GmailAccount, parse_account
from .imap import Accounts, ImapAccount, parse_accounts
from .options import (
    ApprovalOptions,
    DrafterOptions,
    FilterOptions,
    SenderOptions,
    SourceOptions,
    TriageOptions,
)
from .outage import OutageOptions, parse_outage
from .telegram import TelegramConfig, parse_telegram
from .telegram import chat_id as _chat_id

SOURCE_TYPES = ("maildir", "schedule", "gmail", "imap")
SENDER_TYPES = ("outbox", "webhook", "gmail_reply", "gmail_draft", "smtp_reply", "imap_draft")
PROVIDERS = ("template", "openai", "anthropic")
CHANNELS = ("console", "telegram")
CATCHUP_POLICIES = ("latest", "all", "none")
MARK_SEEN = ("at_fetch", "on_success")


# ---------------------------------------------------------------------------------------


@dataclass
class ModelConfig:
    name: str
    provider: str
    options: dict[str, Any]  # base_url, model, api_key_env, timeout, ... (checked by the drafter)


@dataclass(frozen=True)
class PipelineConfig:
    name: str
    file: str
    schedule: str  # "5m" or a cron expression
    interval: float | None  # seconds, when schedule is an interval
    cron: str | None
    source: SourceOptions | None  # None: missing or wrong (reported by the loader)
    filters: FilterOptions
    drafter: DrafterOptions
    recipe: str
    approval: ApprovalOptions
    sender: SenderOptions | None  # None: missing or wrong (reported by the loader)
    lease: float = 600.0
    max_attempts: int = 3
    mark_seen: str = "at_fetch"
    catchup: str = "latest"
    catchup_max: int = 24
    daily_token_budget: int | None = None
    enabled: bool = True
    base_dir: Path = Path(".")
    max_per_tick: int = 200  # new items fetched and admitted per tick; the rest wait
    triage: TriageOptions | None = None  # None: every admitted email is drafted
    timezone: str = "UTC"  # IANA zone of cron schedules and slot ids

    def path(self, value: str) -> Path:
        """A path from this pipeline's file, relative to the deployment directory."""
        return _resolve(self.base_dir, value)


@dataclass
class Settings:
    file: str
    base_dir: Path
    store: str
    pipelines: list[PipelineConfig]
    telegram: TelegramConfig | None = None
    gmail_accounts: dict[str, GmailAccount] = field(default_factory=dict)
    imap_accounts: dict[str, ImapAccount] = field(default_factory=dict)
    models: dict[str, ModelConfig] = field(default_factory=dict)
    max_in_flight: int = 8
    seen_ttl_days: float = 90.0
    approval_ttl_days: float | None = None
    runs_keep_days: float = 30.0
    sweep_every: float = 86400.0
    demo: bool = False  # console approvals auto-approve (clearly labelled)
    listen: tuple[str, int] | None = None  # observability.listen: /metrics, /healthz, /readyz
    log_format: str = "text"  # logging.format: text | json
    outage: OutageOptions = field(default_factory=OutageOptions)  # outage.notify_after

    def has_pipeline(self, name: str) -> bool:
        return any(p.name == name for p in self.pipelines)

    def pipeline(self, name: str) -> PipelineConfig:
        for p in self.pipelines:
            if p.name == name:
                return p
        known = ", ".join(p.name for p in self.pipelines) or "none configured"
        raise ConfigError(f"unknown pipeline {name!r}; known pipelines: {known}")

    def resolve(self, value: str) -> Path:
        return _resolve(self.base_dir, value)


def _resolve(base: Path, value: str) -> Path:
    """``value`` with ~ expanded, relative to ``base`` unless absolute."""
    p = Path(os.path.expanduser(value))
    return p if p.is_absolute() else base / p


#: Default ``max_per_tick``: enough for any normal tick, small enough that a flood or a
#: backfill is fetched, stored and drafted in bounded steps (memory, time to first card).
DEFAULT_MAX_PER_TICK = 200

_TOP_KEYS = {"store", "pipelines", "telegram", "gmail", "imap", "models", "max_in_flight",
             "sweep", "observability", "logging", "outage"}
_PIPELINE_KEYS = {"name", "schedule", "source", "filters", "drafter", "recipe", "approval",
                  "sender", "lease", "max_attempts", "mark_seen", "catchup",
                  "daily_token_budget", "enabled", "max_per_tick", "triage", "timezone"}


def load_settings(config_file: str | os.PathLike, *, only_pipelines: list[str] | None = None
                  ) -> Settings:
    """Read and validate the deployment file and every pipeline file it names.
    Raises ConfigError listing every problem."""
    settings, errors = collect_settings(config_file, only_pipelines=only_pipelines)
    if errors or settings is None:
        raise ConfigError(errors)
    return settings


def collect_settings(config_file: str | os.PathLike, *,
                     only_pipelines: list[str] | None = None) -> tuple[Settings | None, list[str]]:
    """The settings as far as they could be read, and every problem found: what
    ``validate`` needs to go on checking the stages of pipelines that have errors of
    their own. ``None`` when the deployment file itself cannot be read."""
    path = Path(config_file)
    base = path.parent.resolve()
    errors: list[str] = []
    ck = Checker(str(config_file), errors)
    raw = load_yaml(path, ck)
    if errors:
        return None, errors
    data = ck.mapping(raw, "")
    ck.unknown(data, _TOP_KEYS, "")
    settings = Settings(file=str(config_file), base_dir=base, store=_store(ck, data, base),
                        pipelines=[])
    settings.max_in_flight = ck.get(data, "max_in_flight", "", int, default=8)
    if settings.max_in_flight is not None and settings.max_in_flight < 1:
        ck.error("max_in_flight", "expected a whole number of at least 1")
    _sweep(ck, ck.mapping(data.get("sweep"), "sweep"), settings)
    _service(ck, data, settings)
    settings.outage = parse_outage(ck, data)
    if "telegram" in data and data["telegram"] is not None:
        settings.telegram = parse_telegram(ck, ck.mapping(data["telegram"], "telegram"))
    gmail = ck.mapping(data.get("gmail"), "gmail")
    ck.unknown(gmail, {"accounts"}, "gmail")
    for name, acc in ck.mapping(gmail.get("accounts"), "gmail.accounts").items():
        settings.gmail_accounts[str(name)] = parse_account(ck, acc, f"gmail.accounts.{name}")
    settings.imap_accounts, imap_names = parse_accounts(ck, data.get("imap"))
    _models(ck, ck.mapping(data.get("models"), "models"), settings)
    seen_names: dict[str, str] = {}
    imap_accounts = Accounts(settings.imap_accounts)
    imap_accounts.names = imap_names
    for f in pipeline_files(ck, data, base):
        rel = os.path.relpath(f, base) if str(f).startswith(str(base)) else str(f)
        pck = Checker(rel, errors)
        p = _pipeline(pck, load_yaml(f, pck), settings, base, imap_accounts)
        if p is None or (only_pipelines is not None and p.name not in only_pipelines):
            continue
        if p.name in seen_names:
            pck.error("name", f"duplicate pipeline name {p.name!r}, already used in "
                              f"{seen_names[p.name]}; each pipeline needs its own name")
            continue
        seen_names[p.name] = rel
        settings.pipelines.append(p)
    return settings, errors


def _store(ck: Checker, data: dict, base: Path) -> str:
    """``store:``, a sqlite path made absolute against the deployment's folder."""
    store = ck.get(data, "store", "", str, default="sqlite:///draftgate.db")
    known_scheme = bool(store) and store.startswith(("sqlite://", "postgresql://", "postgres://"))
    if store and not known_scheme:
        ck.error("store", f"expected sqlite:///path/to/state.db or postgresql://user@host/db, got {store!r}")
    if store and store.startswith("sqlite:///") and not store.startswith("sqlite:////"):
        rel = store[len("sqlite:///"):]
        if rel and rel != ":memory:":
            # ~ means the home folder, as in every other path of the configuration.
            store = "sqlite:///" + str(base / Path(rel).expanduser())
            literal = base / rel
            if rel.startswith("~") and literal.exists() and not Path(rel).expanduser().exists():
                ck.error("store", f"the store is at {literal} (a folder named ~, made by an "
                                  f"earlier draftgate) but {rel} now means "
                                  f"{Path(rel).expanduser()}: move the file there, or write "
                                  f"sqlite:////{str(literal).lstrip('/')}")
    if known_scheme:
        # The store's own parser (no I/O), so a URL it would refuse later is reported
        # here, with the file and key, instead of by every command that opens it.
        from ..errors import StoreError
        from ..store import create_store

        try:
            create_store(store)
        except (StoreError, ValueError) as exc:
            ck.error("store", str(exc))
    return store or ""


def _service(ck: Checker, data: dict, settings: Settings) -> None:
    """``observability.listen`` (HOST:PORT) and ``logging.format``."""
    obs = ck.mapping(data.get("observability"), "observability")
    ck.unknown(obs, {"listen"}, "observability")
    listen = ck.get(obs, "listen", "observability", str, default=None)
    if listen:
        host, _, port = listen.rpartition(":")
        host = host.strip("[]")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            ck.error("observability.listen", f"expected HOST:PORT like 127.0.0.1:9464, got "
                                             f"{listen!r}")
        else:
            settings.listen = (host, int(port))
    logging_ = ck.mapping(data.get("logging"), "logging")
    ck.unknown(logging_, {"format"}, "logging")
    settings.log_format = ck.get(logging_, "format", "logging", str, default="text",
                                 choices=("text", "json")) or "text"


def _sweep(ck: Checker, sweep: dict, settings: Settings) -> None:
    ck.unknown(sweep, {"seen_ttl_days", "approval_ttl_days", "runs_keep_days", "every"}, "sweep")
    for key, default in (("seen_ttl_days", 90.0), ("approval_ttl_days", None),
                         ("runs_keep_days", 30.0)):
        days = ck.get(sweep, key, "sweep", float, default=default)
        if days is not None and days <= 0:
            ck.error(f"sweep.{key}", f"expected a number of days above 0, got {days}"
                     + ("; leave it out to never expire cards" if default is None else ""))
            days = default
        setattr(settings, key, days)
    every = ck.convert(sweep, "every", "sweep", parse_duration, default=86400.0)
    if every is not None and every < 60:
        ck.error("sweep.every", f"expected a duration of at least 1 minute like 1d, got "
                                f"{sweep['every']!r}; the sweep would run without pause")
    settings.sweep_every = every if every is not None else 86400.0


def _models(ck: Checker, models: dict, settings: Settings) -> None:
    for name, m in models.items():
        m = ck.mapping(m, f"models.{name}")
        provider = ck.get(m, "provider", f"models.{name}", str, choices=PROVIDERS)
        if provider:
            settings.models[str(name)] = ModelConfig(str(name), provider, dict(m))
    if "template" not in settings.models:
        # The offline drafter is always available under this name.
        settings.models["template"] = ModelConfig("template", "template", {"provider": "template"})


def _pipeline(ck: Checker, raw: Any, settings: Settings, base: Path,
              imap_accounts: Any = ()) -> PipelineConfig | None:
    if raw is None and ck.errors:
        return None
    data = ck.mapping(raw, "")
    if not data:
        ck.error("", "empty pipeline file; expected at least name, schedule, source, sender")
        return None
    ck.unknown(data, _PIPELINE_KEYS, "")
    name = ck.get(data, "name", "", str)
    if name and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}", name):
        ck.error("name", f"expected letters, digits, '-', '_' or '.', got {name!r}")
    schedule, interval, cron = _schedule(ck, data)
    tz = ck.timezone(data, "timezone", "")
    raw_source = data.get("source")  # its account is the default of sender.account
    ctx = _options.Context(settings.file, settings.gmail_accounts, interval, cron,
                           raw_source.get("account") if isinstance(raw_source, dict) else None, tz,
                           imap_accounts=imap_accounts)
    source = _stage(ck, data, "source", SOURCE_TYPES, ctx)
    filters = _options.parse_filters(ck, ck.mapping(data.get("filters"), "filters"))
    drafter = _drafter(ck, data, settings, base)
    triage = None if "triage" not in data else _options.parse_triage(
        ck, data["triage"], drafter.model,
        {n: m.provider for n, m in settings.models.items()}, settings.file)
    approval = _approval(ck, ck.mapping(data.get("approval"), "approval"), settings)
    sender = _stage(ck, data, "sender", SENDER_TYPES, ctx)
    recipe = ck.get(data, "recipe", "", (str, int), default="v1")
    if recipe is not None and "|" in str(recipe):
        ck.error("recipe", "must not contain '|'")
    budget = ck.get(data, "daily_token_budget", "", int, default=None)
    if budget == 0:
        budget = None  # 0 means no budget, as leaving it out does
    elif budget is not None and budget < 1:
        ck.error("daily_token_budget", f"expected a whole number of tokens (0 or left out: "
                                       f"no budget), got {budget}")
    catchup, catchup_max = _catchup(ck, data)
    lease, max_attempts, max_per_tick = _limits(ck, data)
    if name is None:
        return None
    return PipelineConfig(
        name=name, file=ck.file, schedule=str(schedule), interval=interval, cron=cron,
        source=source, filters=filters, drafter=drafter,
        recipe=str(recipe), approval=approval, sender=sender,
        lease=600.0 if lease is None else lease, max_attempts=max_attempts or 3,
        mark_seen=ck.get(data, "mark_seen", "", str, default="at_fetch", choices=MARK_SEEN),
        catchup=catchup or "latest", catchup_max=catchup_max or 24,
        daily_token_budget=budget, enabled=ck.get(data, "enabled", "", bool, default=True),
        base_dir=base, max_per_tick=max_per_tick or DEFAULT_MAX_PER_TICK, triage=triage,
        timezone=tz,
    )


def _schedule(ck: Checker, data: dict) -> tuple[Any, float | None, str | None]:
    """``schedule:`` as written, and its interval in seconds or its cron expression."""
    schedule = ck.get(data, "schedule", "", (str, int, float), default="5m")
    interval = cron = None
    bare = DURATION_RE.match(str(schedule))
    if bare and not bare.group(2):
        # `schedule: 5` meant five minutes as often as five seconds: make it explicit.
        ck.error("schedule", f"{bare.group(1)} has no unit; write {bare.group(1)}m for every "
                             f"{bare.group(1)} minutes or {bare.group(1)}s for seconds")
        schedule = "5m"
    if isinstance(schedule, str) and DURATION_RE.match(schedule):
        interval = parse_duration(schedule)
        if interval < 1:
            ck.error("schedule", "expected an interval of at least 1s")
    elif isinstance(schedule, str) and CLOCK_RE.match(schedule):
        ck.error("schedule", f"{schedule!r} looks like a time of day, which a schedule is "
                             f"not; for a time of day use a quoted cron expression (in the "
                             f"pipeline's timezone, default UTC), e.g. schedule: "
                             f"'0 9 * * *' (every day at 09:00), or an interval like 9m")
    elif isinstance(schedule, str):
        from ..scheduler import validate_cron

        problem = validate_cron(schedule)
        if problem:
            ck.error("schedule", f"expected an interval like 5m or a cron expression like "
                                 f"'0 9 * * MON-FRI': {problem}")
        cron = schedule
    return schedule, interval, cron


def _drafter(ck: Checker, data: dict, settings: Settings, base: Path) -> DrafterOptions:
    drafter = _options.parse_drafter(ck, ck.mapping(data.get("drafter"), "drafter"))
    if drafter.model and drafter.model not in settings.models:
        ck.error("drafter.model", f"unknown model {drafter.model!r}; define it under models in "
                                  f"{settings.file} (known: {', '.join(sorted(settings.models))})")
    elif drafter.model in settings.models and drafter.max_input < 200 \
            and settings.models[drafter.model].provider != "template":  # a model reads it
        ck.error("drafter.max_input", f"expected at least 200 characters of email, got "
                                      f"{drafter.max_input}")
    if drafter.prompt:
        found = _resolve(base, drafter.prompt)  # as PipelineConfig.path, when the drafter reads it
        if found.is_dir():
            ck.error("drafter.prompt", f"{drafter.prompt} is a folder ({found}); expected a file")
        elif not found.is_file():
            ck.error("drafter.prompt", f"file not found: {drafter.prompt} (looked for {found})")
    for i, pattern in enumerate(drafter.knowledge):
        matched = knowledge.scan(base, (pattern,), drafter.knowledge_max_file)
        if not matched.files and not matched.skipped:
            ck.error(f"drafter.knowledge[{i}]", f"no file matches {pattern} (looked in "
                                                f"{_resolve(base, pattern).parent}); fix the "
                                                f"path or remove the entry")
    if drafter.embeddings != "local" and drafter.retrieval == "hybrid":
        model = settings.models.get(drafter.embeddings)
        if model is None or model.provider != "openai":
            ck.error("drafter.embeddings", f"expected local (the bundled model) or a models: "
                                           f"entry of provider openai serving /v1/embeddings "
                                           f"(known: {', '.join(sorted(settings.models))}), "
                                           f"got {drafter.embeddings!r}")
    return drafter


def _approval(ck: Checker, raw: dict, settings: Settings) -> ApprovalOptions:
    ck.unknown(raw, {"channel", "chat", "quorum", "operators", "remind_after", "console"},
               "approval")
    channel = ck.get(raw, "channel", "approval", str, default=ApprovalOptions.channel,
                     choices=CHANNELS)
    chat = raw.get("chat")
    if chat is not None and _chat_id(chat) is None:
        ck.error("approval.chat", f"expected a numeric Telegram chat id (like 123456789, or "
                                  f"-1001234567890 for a group), got {kind_of(chat)} {chat!r}")
    if channel == "telegram":
        if settings.telegram is None:
            ck.error("approval.channel", f"telegram needs a telegram: section in {settings.file}")
        elif chat is None and settings.telegram.approvals_chat is None:
            ck.error("approval.chat", f"missing; set the chat id here, or "
                                      f"telegram.approvals_chat in {settings.file}")
    team = _team(ck, raw, settings, channel)
    quorum, operators = team[0], team[1]
    console = ck.get(raw, "console", "approval", bool, default=quorum == 1 and operators is None)
    if "console" in raw and console is False and channel != "telegram":
        ck.error("approval.console", "false needs approval.channel: telegram (a console "
                                     "approval is decided in the console)")
    return ApprovalOptions(channel or ApprovalOptions.channel, _chat_id(chat), *team,
                           console=bool(console) if console is not None else True)


def _team(ck: Checker, raw: dict, settings: Settings, channel: str | None
          ) -> tuple[int, tuple[int, ...] | None, float | None]:
    """``approval.quorum``, ``approval.operators`` and ``approval.remind_after``."""
    quorum = ck.get(raw, "quorum", "approval", int, default=1)
    if quorum is not None and quorum < 1:
        ck.error("approval.quorum", f"expected a whole number of operators of at least 1, "
                                    f"got {quorum}")
        quorum = None
    everyone = settings.telegram.operators if settings.telegram is not None else []
    operators: tuple[int, ...] | None = None
    if "operators" in raw:
        listed = ck.get(raw, "operators", "approval", list, default=[]) or []
        operators = tuple(op for op in listed if isinstance(op, int) and not isinstance(op, bool))
        for i, op in enumerate(listed):
            if op not in operators:
                ck.error(f"approval.operators[{i}]", f"expected a numeric Telegram user id, "
                                                     f"got {op!r}")
            elif everyone and op not in everyone:
                ck.error(f"approval.operators[{i}]", f"{op} is not in telegram.operators of "
                         f"{settings.file}, so the bot drops their taps; add them there too")
        if raw["operators"] == []:
            ck.error("approval.operators", "expected at least one numeric user id; leave it "
                                           "out to let every telegram.operators entry decide")
    deciders = len(operators) if operators is not None else len(everyone)
    if quorum and quorum > 1 and deciders and quorum > deciders:
        ck.error("approval.quorum", f"{quorum} approvals needed but only {deciders} operator(s) "
                                    f"may decide this pipeline's cards; nothing could be sent")
    remind = ck.convert(raw, "remind_after", "approval", parse_duration, default=None)
    if remind is not None and remind < 1:
        ck.error("approval.remind_after", f"expected a duration of at least 1s like 4h, got "
                                          f"{raw['remind_after']!r}")
        remind = None
    if channel != "telegram":
        for key in ("operators", "remind_after") + (("quorum",) if (quorum or 1) > 1 else ()):
            if key in raw:
                ck.error(f"approval.{key}", "needs approval.channel: telegram (a console "
                                            "approval has one operator and no card)")
    return quorum or 1, operators, remind


def _catchup(ck: Checker, data: dict) -> tuple[str | None, int | None]:
    """``catchup:``, a policy or ``{policy, max}``: the policy and the most slots."""
    catchup = data.get("catchup", "latest")
    if not isinstance(catchup, dict):
        return ck.get(data, "catchup", "", str, default="latest", choices=CATCHUP_POLICIES), 24
    ck.unknown(catchup, {"policy", "max"}, "catchup")
    catchup_max = ck.get(catchup, "max", "catchup", int, default=24)
    if catchup_max is not None and catchup_max < 1:
        ck.error("catchup.max", f"expected a whole number of slots of at least 1, got "
                                f"{catchup_max}")
    return ck.get(catchup, "policy", "catchup", str, default="latest",
                  choices=CATCHUP_POLICIES), catchup_max


def _limits(ck: Checker, data: dict) -> tuple[float | None, int | None, int | None]:
    """``lease``, ``max_attempts`` and ``max_per_tick``, as far as they are valid."""
    lease = ck.convert(data, "lease", "", parse_duration, default=600.0)
    if lease is not None and lease <= 0:
        ck.error("lease", f"expected a duration above 0 like 10m, got {data['lease']!r}; a "
                          f"drafting claim that lasts no time would expire before every draft")
    max_attempts = ck.get(data, "max_attempts", "", int, default=3)
    if max_attempts is not None and max_attempts < 1:
        ck.error("max_attempts", "expected a whole number of at least 1")
    max_per_tick = ck.get(data, "max_per_tick", "", int, default=DEFAULT_MAX_PER_TICK)
    if max_per_tick is not None and max_per_tick < 1:
        ck.error("max_per_tick", f"expected a whole number of messages of at least 1, like "
                                 f"{DEFAULT_MAX_PER_TICK}, got {max_per_tick}; it bounds how "
                                 f"many new items one tick fetches (the rest come next tick)")
    return lease, max_attempts, max_per_tick


def _stage(ck: Checker, data: dict, key: str, types: tuple, ctx: _options.Context) -> Any:
    """``source:`` or ``sender:``, parsed by its type; None when missing or wrong."""
    raw = ck.mapping(data.get(key), key)
    if key not in data:
        ck.error(key, "missing; expected a mapping with type: " + " | ".join(types))
    elif (data[key] is None or isinstance(data[key], dict)) \
            and ck.get(raw, "type", key, str, choices=types):
        return _options.parse_stage(ck, raw, key, ctx)
    return None


def env_secret(var: str, what: str) -> str:
    """Read a secret from the environment; the error names the variable, never a value."""
    value = os.environ.get(var, "")
    redact_register(value, var)  # so that no log line, error or notice can show it
    if not value:
        raise ConfigError(f"{what}: environment variable {var} is not set; export it "
                          f"(for example in the service's EnvironmentFile)")
    return value
