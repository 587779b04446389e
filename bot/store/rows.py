"""Rows and SQL texts both SQL stores share: the draft columns, row -> object, the audit
and token rows, and :class:`Change`, one transaction on one draft (see ``SqlStore``).
SQL here uses ``?`` placeholders.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable, Iterable, NamedTuple, Protocol

from ..clock import utc_day
from ..models import Draft, Message, Run, sha256_text
from ..redact import scrub
from .chain import Record
from .transitions import IllegalTransition, Step

DRAFT_COLUMNS = (
    "id", "key", "pipeline", "scope", "item_id", "recipe", "status", "payload", "attempt",
    "lease_until", "fence", "body", "version", "instruction", "approval_chat",
    "approval_message_id", "decided_by", "decided_at", "sent_id", "error", "tokens_in",
    "tokens_out", "created_at", "updated_at", "card_stale", "send_holder", "triage",
    "triage_reason", "used", "send_after", "attached", "reply_nonce",
)
#: SET clause of a move that drafts a new version over the current one (a replay, a
#: /reply): a drafted body counts as a regeneration (and, as after Regenerate, the
#: model's next text is the one an edit is measured from); an item triage skipped or
#: sent as an FYI is an override of the triage, by the operator (args: when, who).
REDRAFT_SET = (
    "regenerations = regenerations + CASE WHEN body <> '' THEN 1 ELSE 0 END, "
    "first_body = NULL, "
    "overridden_at = CASE WHEN status IN ('skipped', 'notified') AND triage IN ('skip', 'notify') "
    "THEN CAST(? AS DOUBLE PRECISION) ELSE overridden_at END, "
    "overridden_by = CASE WHEN status IN ('skipped', 'notified') AND triage IN ('skip', 'notify') "
    "THEN CAST(? AS TEXT) ELSE overridden_by END")


def unsupported_count(used: dict[str, Any] | None) -> int:
    """How many claims the grounding check found in no source (``used["unsupported"]``)."""
    return len((used or {}).get("unsupported") or [])
DRAFT_COLS = ", ".join(DRAFT_COLUMNS)
SYSTEM = "draftgate"  # audit actor for transitions no operator caused directly
TOKENS_SQL = ("INSERT INTO token_usage (pipeline, day, tokens) VALUES (?, ?, ?) "
              "ON CONFLICT (pipeline, day) DO UPDATE SET "
              "tokens = token_usage.tokens + excluded.tokens")
BEFORE_SQL = "SELECT status, error FROM drafts WHERE id = ?"


class Tokens(NamedTuple):
    """Tokens to add to a pipeline's usage of a UTC day (TOKENS_SQL's arguments)."""

    pipeline: str
    day: str
    tokens: int
CURSOR_SQL = ("INSERT INTO cursors (pipeline, scope, value, updated_at) VALUES (?, ?, ?, ?) "
              "ON CONFLICT (pipeline, scope) DO UPDATE SET value = excluded.value, "
              "updated_at = excluded.updated_at")


def draft_from_row(row: Any) -> Draft:
    fields = {c: row[c] for c in DRAFT_COLUMNS}  # the Draft's fields, but for these two:
    fields["message"] = Message.from_json(fields.pop("payload"))
    fields["card_stale"] = bool(fields["card_stale"])
    fields["used"] = json.loads(fields["used"]) if fields["used"] else {}
    fields["attached"] = json.loads(fields["attached"]) if fields["attached"] else []
    return Draft(**fields)


def run_from_row(row: Any) -> Run:
    return Run(id=row["id"], pipeline=row["pipeline"], started_at=row["started_at"],
               ended_at=row["ended_at"], status=row["status"], error_text=row["error_text"],
               counts=json.loads(row["counts"] or "{}"), scheduled_for=row["scheduled_for"])


def audit_row(t: float, actor: str, action: str, key: str | None, text: str | None,
              detail: str | None, clean: Callable = lambda x: x) -> Record:
    """One audit row to append to the chain (sha256 of ``text`` when given)."""
    return Record(float(t), clean(str(actor)) or "", str(action), key,
                  None if text is None else sha256_text(text), clean(scrub(detail)))


def admit_record(t: float, key: str, skip_reason: str | None,
                 clean: Callable = lambda x: x) -> Record:
    """The audit row of one admitted item: queued, or skipped and why. (Built directly:
    admit writes one per item, and "queued" needs no scrubbing.)"""
    if skip_reason:
        return audit_row(t, SYSTEM, "admit", key, None, f"skipped: {skip_reason}", clean)
    return Record(float(t), SYSTEM, "admit", key, None, "queued")


def draft_detail(version: int, model: str, tokens_in: int, tokens_out: int,
                 used: dict[str, Any] | None = None) -> str:
    """The audit detail of a stored draft: which version, by which model, how many
    tokens, and the claims its sources do not support (the grounding check)."""
    return (f"v{version} by {model or 'the drafter'}, {tokens_in + tokens_out} tokens "
            f"(in {tokens_in}, out {tokens_out})" + unsupported_note(used))


def unsupported_note(used: dict[str, Any] | None) -> str:
    """``; not in the sources: 14 days · €25`` for an audit detail; "" when none."""
    claims = [str(c) for c in (used or {}).get("unsupported") or []]
    return "; not in the sources: " + " · ".join(claims) if claims else ""


#: Characters of the original email kept with an example (its start says what it asks).
EXAMPLE_ORIGINAL_CHARS = 4000


def example_row(d: Draft, t: float, clean: Callable) -> list[tuple[str, tuple]]:
    """The sent reply of ``d`` with its original email, as an example of its pipeline
    (written in the transaction that records the send). Edited: the version sent is
    the one an operator's edit made. A scheduled post answers no email: no example."""
    m = d.message
    if m.kind == "slot":
        return []
    original = f"{m.subject}\n{m.body}".strip()[:EXAMPLE_ORIGINAL_CHARS]
    return [("INSERT INTO examples (pipeline, item_id, draft_key, original, reply, edited, "
             "sent_at) SELECT ?, ?, ?, ?, ?, CASE WHEN EXISTS (SELECT 1 FROM audit WHERE "
             "draft_key = ? AND action = 'edit' AND detail LIKE ?) THEN 1 ELSE 0 END, ? "
             "ON CONFLICT (draft_key) DO NOTHING",
             (d.pipeline, d.item_id, d.key, clean(original), clean(d.body), d.key,
              f"%-> v{d.version}", t))]


def status_where(statuses: Iterable[str], pipeline: str | None) -> tuple[str, tuple]:
    wanted = tuple(statuses)
    where = f"status IN ({', '.join('?' * len(wanted))})"
    if pipeline is not None:
        return "pipeline = ? AND " + where, (pipeline, *wanted)
    return where, wanted


@dataclass(frozen=True)
class Change:
    """One transaction on one draft: the first of ``steps`` whose CAS matches wins; if
    one did, its audit row (``action``; hash of the body after it) and token count
    follow in the same transaction. ``before``: that draft's old status and error are
    read first (under a row lock where the backend has them) for ``detail``."""

    steps: tuple[Step, ...]
    action: str | None = None
    actor: str | None = None  # None: whoever decided the draft, else SYSTEM
    detail: Callable[[Draft, Any], str] | None = None
    at: float = 0.0
    before: int | None = None
    tokens: int = 0
    #: Statements run first, in the same transaction (a quorum vote); their rows go
    #: to ``missed``, which gives the audit rows to append when no step matched.
    prelude: tuple[tuple[str, tuple], ...] = ()
    missed: Callable[[list[list[Any]], Callable], list[Record]] | None = None
    #: More statements, same transaction, from the draft after the change and the
    #: prelude's rows.
    then: Callable[[Draft, list[list[Any]]], list[tuple[str, tuple]]] | None = None

    def __post_init__(self) -> None:
        for step in self.steps:
            if step.t.audited != (self.action is not None):
                raise IllegalTransition(f"{step.t.name}: audited is {step.t.audited}, "
                                        f"but the change has action {self.action!r}")

    @property
    def single(self) -> bool:
        """Each step one statement, nothing after it: no transaction needed (a step
        whose CAS matches no row changes nothing, so the next may run on its own)."""
        return (self.action is None and not self.tokens and self.before is None
                and not self.prelude and self.then is None and self.missed is None)

    def followups(self, d: Draft, old: Any, clean: Callable, pre: list[list[Any]]
                  ) -> tuple[list[tuple[str, tuple]], list[Record], Tokens | None]:
        """The statements, the audit rows and the token count that go with the change
        (the count is added with the audit rows: see ``Backend._append``)."""
        out: list[tuple[str, tuple]] = []
        records = []
        if self.action is not None and self.detail is not None:
            records.append(audit_row(self.at, self.actor or d.decided_by or SYSTEM,
                                     self.action, d.key, d.body, self.detail(d, old), clean))
        tokens = Tokens(d.pipeline, utc_day(self.at), int(self.tokens)) if self.tokens else None
        if self.then is not None:
            out += self.then(d, pre)
        return out, records, tokens


class Db(Protocol):
    """One connection inside :meth:`SqlStore._run`; SQL with ``?`` placeholders."""

    async def rows(self, sql: str, args: Iterable[Any] = ()) -> list[Any]: ...

    async def run(self, sql: str, args: Iterable[Any] = ()) -> int:
        """Run one writing statement; its row count."""

    async def many(self, sql: str, rows: list[tuple]) -> int:
        """Run one writing statement once per row of arguments; the rows it changed
        (not counting triggers' rows), or -1 where the driver does not say."""


async def select_drafts(db: Db, where: str, args: Iterable[Any],
                        tail: str = "ORDER BY id") -> list[Draft]:
    rows = await db.rows(f"SELECT {DRAFT_COLS} FROM drafts WHERE {where} {tail}", args)
    return [draft_from_row(r) for r in rows]


