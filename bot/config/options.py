"""A pipeline's ``source:``, ``filters:``, ``drafter:``, ``triage:``, ``approval:`` and ``sender:``,
parsed once when the configuration loads into the frozen objects below (as httpx's
``_config.py`` has ``Limits`` and ``Timeout``). Every default is written here; nothing
downstream reads a YAML mapping. Each problem is recorded in the :class:`Checker`."""

from __future__ import annotations

import re
from dataclasses import dataclass, fields
from email.headerregistry import Address
from itertools import pairwise
from typing import Any, Callable, TypeVar, Union
from urllib.parse import urlsplit

from .. import scheduler
from ..mail.mime import DEFAULT_MAX_BODY
from ..mail.reply import parse_from
from . import imap as _imap
from . import microsoft as _ms
from .checker import Checker, parse_duration, parse_size, url_problem
from .imap import ImapSourceOptions, SmtpSenderOptions
from .mailbox import SENDER_KEYS, SOURCE_KEYS
from .microsoft import MicrosoftSenderOptions, MicrosoftSourceOptions

DEFAULT_SLOT_FORMAT = "%Y-%m-%dT%H:%M"
# A fixed reference (Monday 2026-01-05 00:00 UTC) for checking slot_format without I/O.
_REFERENCE = 1767571200.0
_CHECKED_SLOTS = 50  # consecutive slots whose ids must differ (catches "9,21" with %Y-%m-%d)


@dataclass(frozen=True)
class FilterOptions:
    """``filters:``, see :mod:`bot.sources.filters`. skip_own and skip_auto_replies stop reply
    loops: on unless turned off in so many words (an empty ``skip_own:`` keeps them)."""

    skip_senders: tuple[str, ...] = ()  # globs on the sender address: "noreply@*"
    skip_mailing_lists: bool = False  # List-Unsubscribe, List-Id, Precedence: bulk/list
    skip_own: bool = True  # never answer our own mail
    own_addresses: tuple[str, ...] = ()  # besides the sender's own From
    max_body: int | None = None  # bytes of the raw message, written 200kB
    skip_subjects: tuple[re.Pattern, ...] = ()  # searched, any case: "^\\[JIRA\\]"
    skip_auto_replies: bool = True  # Auto-Submitted, X-Autoreply


@dataclass(frozen=True)
class ApprovalOptions:
    channel: str = "console"  # console | telegram
    chat: int | None = None  # None: telegram.approvals_chat
    quorum: int = 1  # distinct operators who must approve the same version
    operators: tuple[int, ...] | None = None  # who may decide; None: telegram.operators
    remind_after: float | None = None  # seconds; None: no reminders
    #: May the host's console (`draftgate review`) decide this pipeline's cards? It is
    #: one identity and counts once toward a quorum. Default: only where one operator
    #: decides and the pipeline names no operators (see bot.desk.operator).
    console: bool = True
    #: Seconds an approved reply waits before it is sent, with an Undo button on its
    #: card (issue 28). 0 (the default): sent at once, as before; 10s suits a phone.
    undo: float = 0.0
    #: ``approval.send_hours``: an approved reply waits for the next such hour, in the
    #: pipeline's timezone (None: any time).
    send_hours: scheduler.SendHours | None = None


@dataclass(frozen=True)
class DrafterOptions:
    model: str = "template"
    prompt: str | None = None  # a file, relative to the deployment
    max_input: int = 8000  # characters of email the model sees
    signature: str = ""
    language: str = "auto"  # "auto": the sender's language; otherwise e.g. "German"
    # Context (see bot/context/builder.py), each within max_input after the email itself:
    thread: int = 6  # earlier messages of the thread; 0 = off
    examples: int = 3  # past sent replies of this pipeline; 0 = off
    knowledge: tuple[str, ...] = ()  # globs of files searched for passages; none by default
    knowledge_max_file: int = 2_000_000  # bytes; a bigger knowledge file is left out, named
    # Grounded drafts (issue 24; bot/context/retrieval.py, bot/context/grounding.py):
    retrieval: str = "hybrid"  # hybrid: words and meaning | lexical: words only
    embeddings: str = "local"  # local: the bundled model | a models: entry serving embeddings
    grounding: str = "flag"  # flag | confirm (Approve asks once more) | off


@dataclass(frozen=True)
class TriageOptions:
    """``triage:`` (optional): before drafting, one short model call sorts each email
    by the operator's ``rules`` into reply (drafted), notify (an FYI card, no draft)
    or skip (recorded with the reason). Any doubt is reply."""

    rules: str  # plain text, the operator's own words (instructions, not data)
    model: str  # a models: entry; default the drafter's model


def parse_triage(ck: Checker, raw: Any, drafter_model: str, providers: dict[str, str],
                 settings_file: str) -> TriageOptions | None:
    """``triage:`` as written; ``None`` with the problems recorded. ``providers``: each
    ``models:`` entry's provider. Triage needs an LLM: the template drafter cannot
    read rules, so a template model is refused here rather than triaging nothing."""
    if raw is None:
        ck.error("triage", "empty; expected rules: (and optionally model:), or leave "
                           "triage: out to draft every admitted email")
        return None
    raw = ck.mapping(raw, "triage")
    ck.unknown(raw, _keys(TriageOptions), "triage")
    rules = ck.get(raw, "rules", "triage", str)
    if rules is not None and not rules.strip():
        ck.error("triage.rules", "empty; write in plain words which email to reply to, "
                                 "which only to notify about and which to skip")
    model = ck.get(raw, "model", "triage", str, default=drafter_model)
    where = "triage.model" if "model" in raw else "triage"
    if model is not None and model not in providers:
        ck.error(where, f"unknown model {model!r}; define it under models in {settings_file} "
                        f"(known: {', '.join(sorted(providers))})")
    elif model is not None and providers[model] == "template":
        ck.error(where, f"triage needs an LLM model (provider openai or anthropic), and "
                        f"{model!r} is the offline template drafter, which cannot read rules; "
                        f"set triage.model to one, or leave triage: out")
    elif rules and rules.strip() and model:
        return TriageOptions(rules=rules.strip(), model=model)
    return None


@dataclass(frozen=True)
class MaildirSourceOptions:
    path: str
    max_body: int = DEFAULT_MAX_BODY
    max_age: float | None = None
    type: str = "maildir"


@dataclass(frozen=True)
class ScheduleSourceOptions:
    topic: str
    slot_format: str = DEFAULT_SLOT_FORMAT
    type: str = "schedule"


@dataclass(frozen=True)
class GmailSourceOptions:
    account: str
    query: str = "in:inbox"
    label: str | None = None
    backfill: int = 0
    max_body: int | None = None  # None: filters.max_body, else the parser's default
    resync_window: float = 30 * 86400.0
    concurrency: int = 8
    type: str = "gmail"


@dataclass(frozen=True)
class OutboxSenderOptions:
    path: str
    from_addr: Address
    type: str = "outbox"


@dataclass(frozen=True)
class WebhookSenderOptions:
    url: str
    secret_env: str | None = None
    timeout: float = 10.0
    status_url: str | None = None
    type: str = "webhook"


@dataclass(frozen=True)
class GmailSenderOptions:
    account: str
    mark_read: bool = False
    label: str | None = None
    type: str = "gmail_reply"  # or gmail_draft


SourceOptions = Union[MaildirSourceOptions, ScheduleSourceOptions, GmailSourceOptions,
                      ImapSourceOptions, MicrosoftSourceOptions]
SenderOptions = Union[OutboxSenderOptions, WebhookSenderOptions, GmailSenderOptions,
                      SmtpSenderOptions, MicrosoftSenderOptions]

_O = TypeVar("_O")


def expect(options: SourceOptions | SenderOptions | None, kind: type[_O]) -> _O:
    """A pipeline's ``source`` or ``sender`` options as the class of the stage reading
    them: bot.engine.build picks the stage by the options' ``type``, and the loader keeps no
    options that had errors (None), so anything else is a bug, not a config problem."""
    if not isinstance(options, kind):
        raise TypeError(f"expected {kind.__name__}, got {type(options).__name__}")
    return options


@dataclass(frozen=True)
class Context:  # what a stage's options are checked against besides themselves
    settings_file: str = ""
    gmail_accounts: Any = ()  # names of gmail.accounts entries
    interval: float | None = None  # the pipeline's schedule, for slot_format
    cron: str | None = None
    source_account: Any = None  # the default of sender.account
    timezone: str = "UTC"  # the pipeline's, for cron and slot ids
    imap_accounts: Any = ()  # imap.accounts: name -> ImapAccount
    microsoft_accounts: Any = ()  # microsoft.accounts: name -> MicrosoftAccount


def parse_filters(ck: Checker, raw: dict, path: str = "filters") -> FilterOptions:
    ck.unknown(raw, _keys(FilterOptions), path)
    senders = ck.str_list(raw, "skip_senders", path)
    own = ck.str_list(raw, "own_addresses", path)
    switches = {key: ck.get(raw, key, path, bool, default=None)
                for key in ("skip_mailing_lists", "skip_own", "skip_auto_replies")}
    max_body = None
    if "max_body" in raw:
        max_body = ck.convert(raw, "max_body", path, parse_size)
        if max_body is not None and max_body < 1:
            ck.error(f"{path}.max_body", f"expected a size of at least 1 byte like 200kB, got "
                                         f"{raw['max_body']!r}; every message would be skipped")
            max_body = None
    subjects = []
    for i, pattern in enumerate(ck.str_list(raw, "skip_subjects", path)):
        try:
            subjects.append(re.compile(pattern, re.IGNORECASE))
        except re.error as exc:
            where = f"{path}.skip_subjects[{i}]" if isinstance(raw.get("skip_subjects"), list) \
                else f"{path}.skip_subjects"
            ck.error(where, f"not a valid regular expression ({exc}): {pattern!r}")
    return FilterOptions(skip_senders=tuple(senders), own_addresses=tuple(own),
                         max_body=max_body, skip_subjects=tuple(subjects),
                         **{k: v for k, v in switches.items() if v is not None})


RETRIEVALS = ("hybrid", "lexical")
GROUNDINGS = ("flag", "confirm", "off")


def parse_drafter(ck: Checker, raw: dict) -> DrafterOptions:
    """``drafter:``; whether the model and the prompt file exist is the loader's check,
    what a model makes of them its drafter's."""
    d = DrafterOptions()
    ck.unknown(raw, _keys(DrafterOptions), "drafter")
    signature = ck.get(raw, "signature", "drafter", str, default=d.signature)
    language = ck.get(raw, "language", "drafter", str, default=d.language)
    counts = {key: _count(ck, raw, key, getattr(d, key)) for key in ("thread", "examples")}
    knowledge = [g.strip() for g in ck.str_list(raw, "knowledge", "drafter")]
    for i, pattern in enumerate(knowledge):
        if not pattern:
            ck.error(f"drafter.knowledge[{i}]", "empty; expected a file or a glob such as "
                                                "knowledge/*.md")
    if raw.get("grounding") is False:  # YAML 1.1 reads a bare off as false
        raw = {**raw, "grounding": "off"}
    retrieval = ck.get(raw, "retrieval", "drafter", str, default=d.retrieval, choices=RETRIEVALS)
    grounding = ck.get(raw, "grounding", "drafter", str, default=d.grounding, choices=GROUNDINGS)
    embeddings = ck.get(raw, "embeddings", "drafter", str, default=d.embeddings)
    max_file = ck.convert(raw, "knowledge_max_file", "drafter", parse_size,
                          default=d.knowledge_max_file)
    if not isinstance(max_file, int) or max_file < 1:
        if isinstance(max_file, int):
            ck.error("drafter.knowledge_max_file", f"expected a size of at least 1 byte like "
                                                   f"2MB or 500kB, got {raw['knowledge_max_file']!r}")
        max_file = d.knowledge_max_file
    return DrafterOptions(knowledge_max_file=max_file,
        embeddings=(embeddings or "").strip() or d.embeddings,
        retrieval=retrieval or d.retrieval, grounding=grounding or d.grounding,
        model=ck.get(raw, "model", "drafter", str, default=d.model),
        prompt=ck.get(raw, "prompt", "drafter", str, default=None),
        max_input=ck.get(raw, "max_input", "drafter", int, default=d.max_input),
        signature=(signature or "").strip(), language=(language or "").strip() or d.language,
        knowledge=tuple(g for g in knowledge if g), **counts)


def _count(ck: Checker, raw: dict, key: str, default: int) -> int:
    """``drafter.thread`` / ``drafter.examples``: how many, 0 = off (at most 50: each
    one costs tokens, and the budget would cut them anyway)."""
    value = ck.get(raw, key, "drafter", int, default=default)
    if value is None or not 0 <= value <= 50:
        if value is not None:
            ck.error(f"drafter.{key}", f"expected a number from 0 (off) to 50, got {value}")
        return default
    return value


def _maildir(ck: Checker, raw: dict, ctx: Context) -> MaildirSourceOptions:
    path = ck.get(raw, "path", "source", str)
    max_body = ck.convert(raw, "max_body", "source", parse_size,
                          default=MaildirSourceOptions.max_body)
    if isinstance(max_body, int) and max_body < 1:
        ck.error("source.max_body", "expected a size of at least 1 byte, like 200kB")
    max_age = ck.convert(raw, "max_age", "source", parse_duration, default=None)
    if isinstance(max_age, float) and max_age <= 0:
        ck.error("source.max_age", "expected a duration above 0, like 7d")
    return MaildirSourceOptions(path, max_body, max_age)


def _schedule(ck: Checker, raw: dict, ctx: Context) -> ScheduleSourceOptions:
    topic = ck.get(raw, "topic", "source", str)
    if topic is not None and not topic.strip():
        ck.error("source.topic", "expected what the posts are about, e.g. 'Weekly product tip'")
    fmt = ck.get(raw, "slot_format", "source", str, default=DEFAULT_SLOT_FORMAT)
    problem = fmt is not None and _slot_format_problem(ctx, fmt)
    if problem:
        ck.error("source.slot_format", problem)
    return ScheduleSourceOptions((topic or "").strip(), fmt)


def _slot_format_problem(schedule: Context, fmt: str) -> str | None:
    if "%" not in fmt:
        return f"expected a strftime format such as {DEFAULT_SLOT_FORMAT}, got {fmt!r}"
    if not (schedule.interval or schedule.cron):
        return None  # the schedule itself is reported by the config loader
    try:
        times, t = [], _REFERENCE
        for _ in range(_CHECKED_SLOTS):
            t = scheduler.next_due(schedule, t)
            times.append(t)
        ids = [scheduler.slot_id(t, fmt, schedule.timezone) for t in times]
    except (ValueError, KeyError) as exc:
        return f"cannot format a slot with {fmt!r}: {exc}"
    for a, b in pairwise(ids):
        if a == b:
            return (f"{fmt!r} gives two consecutive slots the same id ({a!r}); use a finer "
                    f"format such as {DEFAULT_SLOT_FORMAT}")
    return None


def _account(ck: Checker, account: Any, path: str, ctx: Context) -> None:
    if account is not None and account not in ctx.gmail_accounts:
        ck.error(path, f"unknown Gmail account {account!r}; add it under gmail.accounts in "
                       f"{ctx.settings_file}")


def _gmail_source(ck: Checker, raw: dict, ctx: Context) -> GmailSourceOptions:
    d, account = GmailSourceOptions(account=""), ck.get(raw, "account", "source", str)
    _account(ck, account, "source.account", ctx)
    backfill = ck.get(raw, "backfill", "source", int, default=d.backfill)
    if backfill is not None and backfill < 0:
        ck.error("source.backfill", "expected 0 or a positive number of messages")
    return GmailSourceOptions(
        account=account, query=ck.get(raw, "query", "source", str, default=d.query) or d.query,
        label=ck.get(raw, "label", "source", str, default=None), backfill=backfill or 0,
        max_body=ck.convert(raw, "max_body", "source", parse_size, default=None),
        resync_window=ck.convert(raw, "resync_window", "source", parse_duration,
                                 default=d.resync_window) or d.resync_window,
        concurrency=ck.get(raw, "concurrency", "source", int, default=d.concurrency)
        or d.concurrency)


def _outbox(ck: Checker, raw: dict, ctx: Context) -> OutboxSenderOptions | None:
    path, from_value = ck.get(raw, "path", "sender", str), ck.get(raw, "from", "sender", str)
    if from_value is None:
        return None  # ck.get recorded it
    try:
        return OutboxSenderOptions(path, parse_from(from_value))
    except ValueError as exc:
        ck.error("sender.from", str(exc))
        return None


def _webhook(ck: Checker, raw: dict, ctx: Context) -> WebhookSenderOptions:
    d = WebhookSenderOptions(url="")
    url = ck.get(raw, "url", "sender", str)
    _check_url(ck, url, "sender.url")
    status_url = ck.get(raw, "status_url", "sender", str, default=None)
    _check_url(ck, status_url, "sender.status_url")
    timeout = ck.convert(raw, "timeout", "sender", parse_duration, default=d.timeout)
    if isinstance(timeout, float) and timeout <= 0:
        ck.error("sender.timeout", "expected a duration above 0, like 10s")
    secret_env = ck.env_name(raw, "secret_env", "sender", default=None)
    if "secret" in raw:
        ck.error("sender.secret", "never put the secret in YAML; set secret_env to the name "
                                  "of an environment variable that holds it")
    return WebhookSenderOptions(url, secret_env, timeout, status_url)


def _check_url(ck: Checker, value: str | None, path: str) -> None:
    if value is None:
        return
    try:
        credentials = urlsplit(value).username or urlsplit(value).password
    except ValueError:
        credentials = None  # url_problem says what is wrong
    problem = "do not put credentials in the URL; use secret_env" if credentials \
        else url_problem(value)
    if problem:
        ck.error(path, problem)


def _gmail_sender(ck: Checker, raw: dict, ctx: Context) -> GmailSenderOptions:
    account = ck.get(raw, "account", "sender", str, default=ctx.source_account)
    if not account:
        ck.error("sender.account", "missing; expected the name of a gmail.accounts entry")
    _account(ck, account or None, "sender.account", ctx)
    return GmailSenderOptions(account, ck.get(raw, "mark_read", "sender", bool, default=False),
                              ck.get(raw, "label", "sender", str, default=None), raw["type"])


def _keys(cls: Any, *more: str) -> set[str]:  # cls: an options dataclass
    return {f.name for f in fields(cls)} | set(more)


#: type -> (the keys it takes, its parser).
_PARSERS: dict[str, tuple[set[str], Callable[[Checker, dict, Context], Any]]] = {
    "maildir": (_keys(MaildirSourceOptions), _maildir),
    "schedule": (_keys(ScheduleSourceOptions), _schedule),
    "gmail": (_keys(GmailSourceOptions), _gmail_source),
    "outbox": ({"type", "path", "from"}, _outbox),
    "webhook": (_keys(WebhookSenderOptions, "secret"), _webhook),  # secret: its own message
    "gmail_reply": (_keys(GmailSenderOptions), _gmail_sender),
    "gmail_draft": (_keys(GmailSenderOptions), _gmail_sender),
    "imap": (SOURCE_KEYS, lambda ck, raw, ctx: _imap.parse_source(
        ck, raw, ctx.imap_accounts, ctx.settings_file)),
    "smtp_reply": (SENDER_KEYS, lambda ck, raw, ctx: _imap.parse_sender(
        ck, raw, ctx.imap_accounts, ctx.settings_file, ctx.source_account)),
    "imap_draft": (SENDER_KEYS, lambda ck, raw, ctx: _imap.parse_sender(
        ck, raw, ctx.imap_accounts, ctx.settings_file, ctx.source_account)),
    "microsoft": (SOURCE_KEYS, lambda ck, raw, ctx: _ms.parse_source(
        ck, raw, ctx.microsoft_accounts, ctx.settings_file)),
    **{kind: (SENDER_KEYS, lambda ck, raw, ctx: _ms.parse_sender(
        ck, raw, ctx.microsoft_accounts, ctx.settings_file, ctx.source_account))
       for kind in ("microsoft_reply", "microsoft_draft")},
}


def parse_stage(ck: Checker, raw: dict, path: str, ctx: Context) -> Any:
    """A ``source:`` or ``sender:`` mapping whose ``type`` the loader has checked; None
    when its options have errors (each recorded in ``ck``)."""
    before, (keys, parse) = len(ck.errors), _PARSERS[raw["type"]]
    ck.unknown(raw, keys, path)
    options = parse(ck, raw, ctx)
    return options if len(ck.errors) == before else None
