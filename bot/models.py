"""Plain data passed between stages. No I/O here.

A fetched :class:`Item` becomes a row in the store's ``drafts`` table; the store hands
it back as a :class:`Draft`. ``Message`` is the parsed email (or the slot, for a
schedule source) and is stored as JSON in the draft's payload, so everything needed to
draft and reply survives a restart.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import orjson


# Draft lifecycle. Every transition is a compare-and-set in the store, allowed only if
# bot/store/transitions.py lists it.
class Status(StrEnum):
    QUEUED = "queued"
    DRAFTING = "drafting"
    READY = "ready"
    AWAITING = "awaiting"
    APPROVED = "approved"
    SENDING = "sending"
    SENT = "sent"
    SEND_FAILED = "send_failed"
    SEND_UNKNOWN = "send_unknown"
    FAILED = "failed"
    SKIPPED = "skipped"
    REJECTED = "rejected"
    EXPIRED = "expired"
    # Triage (issue 13): an FYI card with no draft, waiting for Draft a reply or
    # Dismiss; and the end of one an operator dismissed.
    NOTIFIED = "notified"
    DISMISSED = "dismissed"
    CANCELLED = "cancelled"  # a follow-up the recipient's answer made needless (error: why)


#: Every status, in lifecycle order.
STATUSES = tuple(Status)
#: States an operator has to act on or watch (shown by /pending): waiting for a
#: decision (a draft, or an FYI card), or approved and not yet known to be sent.
PENDING_STATUSES = (Status.READY, Status.AWAITING, Status.APPROVED, Status.SENDING,
                    Status.SEND_FAILED, Status.SEND_UNKNOWN, Status.NOTIFIED)
#: States nothing moves any more, except /replay.
TERMINAL_STATUSES = (Status.SENT, Status.FAILED, Status.SKIPPED, Status.REJECTED,
                     Status.EXPIRED, Status.DISMISSED)
#: States /replay may send back to queued.
REPLAYABLE_STATUSES = (Status.FAILED, Status.REJECTED, Status.SKIPPED, Status.EXPIRED,
                       Status.DISMISSED)
#: What triage may decide (bot.drafters.triage); anything else is taken as reply.
TRIAGE_ACTIONS = ("reply", "notify", "skip")


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def draft_key(pipeline: str, scope: str, item_id: str, recipe: str) -> str:
    """``pipeline|scope|item_id|recipe``; a long or awkward item id is hashed, with
    its readable start kept beside the hash so the key stays greppable."""
    part = item_id
    if len(part) > 80 or "|" in part:
        readable = "".join(c for c in part[:40] if c.isalnum() or c in "@.-_<>")
        part = f"{readable}~{hashlib.sha256(item_id.encode()).hexdigest()[:16]}"
    return f"{pipeline}|{scope}|{part}|{recipe}"


@dataclass
class Message:
    """A parsed email, or a schedule slot (``kind == "slot"``).

    ``reply_to`` is the address a reply goes to, worked out by code from the
    original's Reply-To or From; it is never taken from model output.
    """

    kind: str = "email"  # "email" | "slot"
    message_id: str = ""  # RFC 5322 Message-ID, with angle brackets
    from_name: str = ""
    from_addr: str = ""
    reply_to: str = ""
    to: list[str] = field(default_factory=list)
    cc: list[str] = field(default_factory=list)
    subject: str = ""
    date: str = ""  # ISO 8601 when known
    body: str = ""  # plain text (HTML converted), possibly truncated
    body_truncated: bool = False
    references: list[str] = field(default_factory=list)
    headers: dict[str, str] = field(default_factory=dict)  # a few kept for filters
    size: int = 0  # bytes of the raw message
    attachments: list[str] = field(default_factory=list)
    attachment_sizes: list[int] = field(default_factory=list)  # bytes, as attachments (about)
    thread_id: str = ""  # Gmail thread id
    source_id: str = ""  # Gmail message id, or a file name
    labels: list[str] = field(default_factory=list)
    slot: str = ""  # schedule sources: the slot this item is for

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Message":
        names = _MESSAGE_FIELDS
        return cls(**{k: v for k, v in data.items() if k in names})

    def to_json(self) -> str:
        """The JSON of :meth:`to_dict`: what the store keeps as the draft's payload."""
        # orjson encodes the dataclass directly, about ten times faster than json.dumps;
        # that encoding was a third of the admit transaction. It refuses what the
        # stdlib escapes (a lone surrogate, an odd nested value): those take the slow path.
        try:
            return orjson.dumps(self).decode()
        except TypeError:  # orjson.JSONEncodeError
            return json.dumps(self.to_dict())

    @classmethod
    def from_json(cls, text: str) -> "Message":
        try:
            data = orjson.loads(text)
        except ValueError:  # orjson.JSONDecodeError: an escaped lone surrogate
            data = json.loads(text)
        return cls.from_dict(data)


_MESSAGE_FIELDS = frozenset(f.name for f in dataclasses.fields(Message))


@dataclass
class Item:
    """One fetched unit of work. ``skip_reason`` set means: record it as skipped."""

    item_id: str
    message: Message
    skip_reason: str | None = None


@dataclass
class FetchResult:
    """What a source returns. ``cursor`` is committed in the same transaction as the
    admitted items, so a crash between the two can never skip mail."""

    items: list[Item]
    cursor: str | None = None
    api_calls: int = 0
    note: str = ""  # e.g. "first run: cursor recorded, 0 backfilled"
    more: bool = False  # the source stopped at FetchContext.limit; the rest come next tick


@dataclass
class Draft:
    """A row of the ``drafts`` table."""

    id: int
    key: str
    pipeline: str
    scope: str
    item_id: str
    recipe: str
    status: str
    message: Message
    attempt: int = 0
    lease_until: float | None = None
    fence: int = 0
    body: str = ""
    version: int = 1
    instruction: str = ""  # regenerate instruction from the operator
    approval_chat: str | None = None
    approval_message_id: str | None = None
    decided_by: str | None = None
    decided_at: float | None = None
    sent_id: str | None = None
    error: str | None = None
    tokens_in: int = 0
    tokens_out: int = 0
    created_at: float = 0.0
    updated_at: float = 0.0
    card_stale: bool = False  # the card's last edit failed; re-render it
    send_holder: str | None = None  # process that moved it to `sending`
    triage: str | None = None  # reply | notify | skip, decided for version 1; None: not triaged
    triage_reason: str | None = None  # the model's one sentence (or why triage failed)
    used: dict[str, Any] = field(default_factory=dict)  # what its request was given (Context.used)
    send_after: float | None = None  # approved: not sent before this (undo, later); None: at once
    attached: list[str] = field(default_factory=list)  # paths of files sent with the reply
    #: The random part of its reply's Message-ID (bot.mail.reply), drawn at the first
    #: `approved -> sending`; "" or None: the id derived from the key alone (older rows).
    reply_nonce: str | None = None


@dataclass(frozen=True)
class ThreadMessage:
    """An earlier message of the thread (ours too), as the model sees it."""

    sender: str
    date: str
    text: str  # its new text, without what it quoted
    ours: bool = False  # sent from our own address (a reply draftgate or a person sent)


@dataclass(frozen=True)
class Example:
    """A sent reply kept with its original email: how this pipeline's team answers."""

    pipeline: str
    item_id: str
    original: str
    reply: str
    edited: bool
    sent_at: float


@dataclass(frozen=True)
class Passage:
    """A piece of a knowledge file: under one heading, or one paragraph."""

    path: str
    heading: str
    text: str

    @property
    def name(self) -> str:
        """``returns.md › Refunds`` (the file name alone when there is no heading)."""
        file = self.path.replace("\\", "/").rsplit("/", 1)[-1]
        return f"{file} › {self.heading}" if self.heading else file


@dataclass
class Context:
    """What a draft is based on besides the email (bot/context.py), already cut to fit
    the pipeline's ``max_input``: every part is data inside the request's boundary."""

    thread: list[ThreadMessage] = field(default_factory=list)
    examples: list[Example] = field(default_factory=list)
    passages: list[Passage] = field(default_factory=list)
    #: Earlier messages of the thread found but not given: the sender took no part in them.
    thread_left_out: int = 0

    def used(self) -> dict[str, Any]:
        """What the draft used, kept with it: for the card and ``pending --json``."""
        used: dict[str, Any] = {"thread": len(self.thread),
                                "examples": [e.item_id for e in self.examples],
                                "knowledge": [p.name for p in self.passages]}
        if self.thread_left_out:
            used["thread_left_out"] = self.thread_left_out
        return used


def unsupported_of(used: dict[str, Any] | None) -> list[str]:
    """A version's claims that its sources do not support (bot/context/grounding.py),
    as the draft wrote them; [] when none or not checked."""
    return [str(c) for c in (used or {}).get("unsupported") or []]


def unsupported_line(used: dict[str, Any] | None) -> str:
    """``⚠️ Not in the sources: 14 days · €25`` (the grounding check); "" when none."""
    claims = unsupported_of(used)
    return "⚠️ Not in the sources: " + " · ".join(claims) if claims else ""


def public_used(used: dict[str, Any] | None) -> dict[str, Any]:
    """``used`` as shown to people (``pending --json``): without the sources' keys
    that an edited version is checked against."""
    return {k: v for k, v in (used or {}).items() if k != "source_keys"}


def used_line(used: dict[str, Any] | None) -> str:
    """``📎 thread 3 · 2 past replies · returns.md › Refunds``; "" when nothing was used."""
    used = used or {}
    parts = []
    if used.get("thread"):
        parts.append(f"thread {used['thread']}")
    n = len(used.get("examples") or [])
    if n:
        parts.append(f"{n} past repl{'y' if n == 1 else 'ies'}")
    parts += [str(k) for k in dict.fromkeys(used.get("knowledge") or [])]
    left_out = used.get("thread_left_out")
    if isinstance(left_out, int) and left_out > 0:
        parts.append(f"{left_out} earlier message{'s' if left_out > 1 else ''} left out "
                     f"(the sender took no part)")
    return "📎 " + " · ".join(parts) if parts else ""


@dataclass
class DraftRequest:
    """What a drafter gets. ``instruction`` is the operator's (regenerate); it is an
    instruction, the message and the context are data."""

    pipeline: str
    message: Message
    instruction: str = ""
    previous_body: str = ""
    draft_key: str = ""
    context: Context = field(default_factory=Context)
    signature: str | None = None  # drafter.signature: gmail, as fetched; None: the configured one
    #: The pipeline's approved style notes (instructions an operator approved).
    style_notes: tuple[str, ...] = ()


@dataclass
class DraftResult:
    body: str
    tokens_in: int = 0
    tokens_out: int = 0
    model: str = ""
    used: dict[str, Any] | None = None  # what of the context it used; None: all of it


@dataclass(frozen=True)
class TriageDecision:
    """What triage decided for one email, and what it cost. ``failed``: the model's
    answer could not be used (or there was none), so the action is ``reply``."""

    action: str
    reason: str
    tokens: int = 0
    failed: bool = False


@dataclass
class SendResult:
    sent_id: str  # Gmail message id, outbox file name, webhook answer id


@dataclass
class RunCounts:
    fetched: int = 0
    new: int = 0
    drafted: int = 0
    skipped: int = 0
    notified: int = 0  # triage: FYI cards instead of drafts
    triage_failed: int = 0  # triage answered unusably or not at all: drafted to be safe
    failed: int = 0
    posted: int = 0
    sent: int = 0
    tokens: int = 0

    def to_dict(self) -> dict[str, int]:
        return dataclasses.asdict(self)


@dataclass
class Run:
    id: int
    pipeline: str
    started_at: float
    ended_at: float | None
    status: str  # running | ok | error
    error_text: str | None
    counts: dict[str, int]
    scheduled_for: float | None = None


def operator_id(actor: str) -> str:
    """The stable part of an actor (``"tg:42 (Anna)"`` -> ``"tg:42"``): a quorum counts
    people, and a first name can change between two taps."""
    return actor.split(" (", 1)[0]


def telegram_user(actor: str) -> int | None:
    """The Telegram user id of a ``tg:<id> (...)`` actor; None for any other actor."""
    head = operator_id(actor)
    return int(head[3:]) if head.startswith("tg:") and head[3:].isdigit() else None


@dataclass(frozen=True)
class Vote:
    """One operator's approval of one version of a draft (quorum)."""

    operator: str  # operator_id(actor)
    actor: str
    at: float


@dataclass
class AuditEntry:
    id: int
    at: float
    actor: str
    action: str
    draft_key: str | None
    text_sha256: str | None
    detail: str | None
    seq: int | None = None  # chain position: the order of the audit (ids are not)


@dataclass
class StyleNotes:
    """One version of a pipeline's style rules learned from edits (``style_notes``):
    ``proposed`` by the model, then ``approved`` or ``rejected`` by an operator; an
    approved one is ``superseded`` by the next approved version."""

    id: int
    pipeline: str
    version: int
    rules: list[str]
    status: str  # proposed | approved | rejected | superseded
    created_at: float
    created_by: str
    decided_by: str | None = None
    decided_at: float | None = None
    approval_chat: str | None = None
    approval_message_id: str | None = None

    @property
    def key(self) -> str:
        """Its audit rows' key."""
        return f"{self.pipeline}|style-notes|v{self.version}"
