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
from . import microsoft as _ms
from . import options as _options
from .approval import parse_approval
from .checker import CLOCK_RE, DURATION_RE, Checker, kind_of, parse_duration
from .files import load_yaml, pipeline_files
from .followup import FollowupOptions, parse_followup
from .gmail import GmailAccount, parse_account
from .imap import ImapAccount, parse_accounts
from .limits import DEFAULT_MAX_PER_TICK, catchup_options, limits
from .models import ModelConfig, parse_model
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

SOURCE_TYPES = ("maildir", "schedule", "gmail", "imap", "microsoft")
SENDER_TYPES = ("outbox", "webhook", "gmail_reply", "gmail_draft", "smtp_reply", "imap_draft",
                "microsoft_reply", "microsoft_draft")
MARK_SEEN = ("at_fetch", "on_success")


# ---------------------------------------------------------------------------------------


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
    followup: FollowupOptions | None = None  # None: no follow-ups
    attachments: Path | None = None  # sender.attachments: files 📎 Attach offers; None: off
    style_notes: str = "off"  # weekly: distill style notes from edits once a week

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
    microsoft_accounts: dict[str, _ms.MicrosoftAccount] = field(default_factory=dict)
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


_TOP_KEYS = {"store", "pipelines", "telegram", "gmail", "imap", "microsoft", "models",
             "max_in_flight", "sweep", "observability", "logging", "outage"}
_PIPELINE_KEYS = {"name", "schedule", "source", "filters", "drafter", "recipe", "approval",
                  "sender", "lease", "max_attempts", "mark_seen", "catchup",
                  "daily_token_budget", "enabled", "max_per_tick", "triage", "timezone",
                  "followup", "style_notes"}


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
    settings.imap_accounts = imap_accounts = parse_accounts(ck, data.get("imap"))
    _models(ck, ck.mapping(data.get("models"), "models"), settings)
    seen_names: dict[str, str] = {}
    settings.microsoft_accounts = ms_accounts = _ms.parse_accounts(ck, data.get("microsoft"))
    for f in pipeline_files(ck, data, base):
        rel = os.path.relpath(f, base) if str(f).startswith(str(base)) else str(f)
        pck = Checker(rel, errors)
        p = parse_pipeline(pck, load_yaml(f, pck), settings, base, (imap_accounts, ms_accounts))
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
        model = parse_model(ck, str(name), m)
        if model is not None:
            settings.models[str(name)] = model
    if "template" not in settings.models:
        # The offline drafter is always available under this name.
        settings.models["template"] = ModelConfig("template", "template")


def parse_pipeline(ck: Checker, raw: Any, settings: Settings, base: Path,
                   accounts: tuple[Any, Any] = ((), ())) -> PipelineConfig | None:
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
                           imap_accounts=accounts[0], microsoft_accounts=accounts[1])
    source = _stage(ck, data, "source", SOURCE_TYPES, ctx)
    filters = _options.parse_filters(ck, ck.mapping(data.get("filters"), "filters"))
    drafter = _drafter(ck, data, settings, base)
    triage = None if "triage" not in data else _options.parse_triage(
        ck, data["triage"], drafter.model,
        {n: m.provider for n, m in settings.models.items()}, settings.file)
    approval = parse_approval(ck, ck.mapping(data.get("approval"), "approval"), settings)
    data, attachments = _attachments(ck, data, base)
    sender = _stage(ck, data, "sender", SENDER_TYPES, ctx)
    if drafter.signature == "gmail" and not any(
            getattr(o, "account", None) in settings.gmail_accounts for o in (source, sender)):
        ck.error("drafter.signature", "gmail uses the signature of the pipeline's Gmail "
                                      "account: it needs a gmail source or a gmail_reply / "
                                      "gmail_draft sender (or write the signature itself)")
    recipe = ck.get(data, "recipe", "", (str, int), default="v1")
    if recipe is not None and "|" in str(recipe):
        ck.error("recipe", "must not contain '|'")
    budget = ck.get(data, "daily_token_budget", "", int, default=None)
    if budget == 0:
        budget = None  # 0 means no budget, as leaving it out does
    elif budget is not None and budget < 1:
        ck.error("daily_token_budget", f"expected a whole number of tokens (0 or left out: "
                                       f"no budget), got {budget}")
    catchup, catchup_max = catchup_options(ck, data)
    lease, max_attempts, max_per_tick = limits(ck, data)
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
        timezone=tz, followup=parse_followup(ck, data.get("followup"), base),
        attachments=attachments,
        style_notes=ck.get(data, "style_notes", "", str, default="off", choices=("off", "weekly")),
    )


def _attachments(ck: Checker, data: dict, base: Path) -> tuple[dict, Path | None]:
    """``sender.attachments`` (a folder, for every sender type), and the pipeline's data
    without it for the sender's own options."""
    raw = data.get("sender")
    if not isinstance(raw, dict) or "attachments" not in raw:
        return data, None
    rest = {**data, "sender": {k: v for k, v in raw.items() if k != "attachments"}}
    value = raw["attachments"]
    if not isinstance(value, str) or not value.strip():
        ck.error("sender.attachments", f"expected a folder of files operators may attach, "
                                       f"like attachments/, got {kind_of(value)} {value!r}")
        return rest, None
    folder = _resolve(base, value)
    if not folder.is_dir():
        ck.error("sender.attachments", f"not a folder: {value} (looked for {folder})")
        return rest, None
    return rest, folder


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
