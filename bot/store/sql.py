"""What the SQL stores share (huey's ``BaseSqlStorage`` pattern): every single-draft
transition and every draft listing is written here once, on top of two primitives each
backend provides: ``_change`` (run a :class:`Change` in one transaction) and
``_select_drafts``. SQL here uses ``?`` placeholders; the backend keeps only what its
SQL does differently (admit, claim, leases by the database's clock, locks, migrations).
"""

from __future__ import annotations

import abc
import json
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable

from ..clock import utc_day
from ..models import (
    APPROVED,
    DRAFTING,
    PENDING_STATUSES,
    QUEUED,
    READY,
    SEND_UNKNOWN,
    SENDING,
    STATUSES,
    TERMINAL_STATUSES,
    AuditEntry,
    Draft,
    Message,
    Run,
    sha256_text,
)
from ..redact import scrub
from .base import Store
from .transitions import (
    APPROVE,
    BEGIN_SEND,
    CLAIM,
    EDIT,
    FAIL,
    FINISH,
    MARK_SEND_FAILED,
    MARK_SEND_UNKNOWN,
    MARK_SENT,
    POST,
    REGENERATE,
    REJECT,
    RELEASE,
    RETRY,
    RETRY_SEND,
    IllegalTransition,
    Step,
)

DRAFT_COLUMNS = (
    "id", "key", "pipeline", "scope", "item_id", "recipe", "status", "payload", "attempt",
    "lease_until", "fence", "body", "version", "instruction", "approval_chat",
    "approval_message_id", "decided_by", "decided_at", "sent_id", "error", "tokens_in",
    "tokens_out", "created_at", "updated_at", "card_stale", "send_holder",
)
DRAFT_COLS = ", ".join(DRAFT_COLUMNS)
SYSTEM = "draftgate"  # audit actor for transitions no operator caused directly
AUDIT_SQL = ("INSERT INTO audit (at, actor, action, draft_key, text_sha256, detail) "
             "VALUES (?, ?, ?, ?, ?, ?)")
TOKENS_SQL = ("INSERT INTO token_usage (pipeline, day, tokens) VALUES (?, ?, ?) "
              "ON CONFLICT (pipeline, day) DO UPDATE SET "
              "tokens = token_usage.tokens + excluded.tokens")
BEFORE_SQL = "SELECT status, error FROM drafts WHERE id = ?"
CURSOR_SQL = ("INSERT INTO cursors (pipeline, scope, value, updated_at) VALUES (?, ?, ?, ?) "
              "ON CONFLICT (pipeline, scope) DO UPDATE SET value = excluded.value, "
              "updated_at = excluded.updated_at")


def draft_from_row(row: Any) -> Draft:
    return Draft(
        id=row["id"], key=row["key"], pipeline=row["pipeline"], scope=row["scope"],
        item_id=row["item_id"], recipe=row["recipe"], status=row["status"],
        message=Message.from_json(row["payload"]), attempt=row["attempt"],
        lease_until=row["lease_until"], fence=row["fence"], body=row["body"],
        version=row["version"], instruction=row["instruction"],
        approval_chat=row["approval_chat"], approval_message_id=row["approval_message_id"],
        decided_by=row["decided_by"], decided_at=row["decided_at"], sent_id=row["sent_id"],
        error=row["error"], tokens_in=row["tokens_in"], tokens_out=row["tokens_out"],
        created_at=row["created_at"], updated_at=row["updated_at"],
        card_stale=bool(row["card_stale"]), send_holder=row["send_holder"],
    )


def run_from_row(row: Any) -> Run:
    return Run(id=row["id"], pipeline=row["pipeline"], started_at=row["started_at"],
               ended_at=row["ended_at"], status=row["status"], error_text=row["error_text"],
               counts=json.loads(row["counts"] or "{}"), scheduled_for=row["scheduled_for"])


def audit_row(t: float, actor: str, action: str, key: str | None, text: str | None,
              detail: str | None, clean: Callable = lambda x: x) -> tuple[str, tuple]:
    """The INSERT of one audit row (sha256 of ``text`` when given)."""
    return AUDIT_SQL, (t, actor, action, key, None if text is None else sha256_text(text),
                       clean(scrub(detail)))


#: Statuses counted live (not kept in draft_counts): those a draft leaves again.
_LIVE = tuple(s for s in STATUSES if s not in TERMINAL_STATUSES)

#: The predicate of the drafts_pending partial index (schema migration 3), word for word.
PENDING_SQL = "status IN ({})".format(", ".join(f"'{s}'" for s in PENDING_STATUSES))


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

    def __post_init__(self) -> None:
        for step in self.steps:
            if step.t.audited != (self.action is not None):
                raise IllegalTransition(f"{step.t.name}: audited is {step.t.audited}, "
                                        f"but the change has action {self.action!r}")

    @property
    def single(self) -> bool:
        """One statement and nothing after it (no transaction needed)."""
        return (len(self.steps) == 1 and self.action is None and not self.tokens
                and self.before is None)

    def followups(self, d: Draft, old: Any, clean: Callable) -> list[tuple[str, tuple]]:
        out = []
        if self.action is not None and self.detail is not None:
            out.append(audit_row(self.at, self.actor or d.decided_by or SYSTEM, self.action,
                                 d.key, d.body, self.detail(d, old), clean))
        if self.tokens:
            out.append((TOKENS_SQL, (d.pipeline, utc_day(self.at), int(self.tokens))))
        return out


def _one(*steps: Step, **kw: Any) -> Change:
    return Change(steps, **kw)


class SqlStore(Store):
    """The shared half of :class:`SQLiteStore` and :class:`PostgresStore`."""

    #: SQL giving a draft a fence token no earlier claim of it had.
    NEXT_FENCE: str = "fence + 1"

    def _now(self, now: float | None) -> float:
        return time.time() if now is None else float(now)

    def _clean(self, text: str | None) -> str | None:
        """Text as the database can hold it (PostgreSQL: no NUL)."""
        return text

    def _db_clock(self, now: float | None) -> tuple[str, Any]:
        """SQL for "now" where leases and send ages are decided, and its argument."""
        return "?", self._now(now)

    @abc.abstractmethod
    async def _change(self, change: Change) -> Draft | None:
        """Run ``change`` in one transaction; the draft after it, or None."""

    @abc.abstractmethod
    async def _query(self, sql: str, args: tuple = (), *, write: bool = False) -> list[Any]:
        """The rows of one statement (``write``: it changes something)."""

    @abc.abstractmethod
    async def _execute(self, sql: str, args: tuple = ()) -> int:
        """Run one writing statement; its row count."""

    @abc.abstractmethod
    async def _script(self, statements: list[tuple[str, tuple]]) -> None:
        """Run the statements in one transaction."""

    @abc.abstractmethod
    async def _select_drafts(self, where: str, args: tuple, tail: str = "ORDER BY id"
                             ) -> list[Draft]: ...

    # -- drafting --------------------------------------------------------------------
    async def claim_key(self, key: str, lease_seconds: float,
                        now: float | None = None) -> Draft | None:
        clock, arg = self._db_clock(now)
        return await self._change(_one(Step(
            CLAIM, f"lease_until = {clock} + ?, fence = {self.NEXT_FENCE}, updated_at = ?",
            (arg, float(lease_seconds), self._now(now)), "key = ?", (key,))))

    async def finish_draft(self, draft_id: int, fence: int, body: str, *,
                           tokens_in: int = 0, tokens_out: int = 0,
                           now: float | None = None) -> Draft | None:
        t = self._now(now)
        return await self._change(_one(Step(
            FINISH, "body = ?, lease_until = NULL, error = NULL, tokens_in = tokens_in + ?, "
                    "tokens_out = tokens_out + ?, updated_at = ?",
            (self._clean(body), int(tokens_in), int(tokens_out), t),
            "id = ? AND fence = ?", (draft_id, fence)), at=t, tokens=tokens_in + tokens_out))

    async def fail_draft(self, draft_id: int, fence: int, error: str, *, retryable: bool,
                         max_attempts: int, now: float | None = None) -> Draft | None:
        assign = "attempt = attempt + 1, lease_until = NULL, error = ?, updated_at = ?"
        args = (self._clean(scrub(error)), self._now(now))  # shown on cards and in /status
        fail = Step(FAIL, assign, args, "id = ? AND fence = ?", (draft_id, fence))
        retry = Step(RETRY, assign, args, "id = ? AND fence = ? AND attempt + 1 < ?",
                     (draft_id, fence, max_attempts))
        return await self._change(Change((retry, fail) if retryable else (fail,)))

    async def release(self, draft_id: int, fence: int) -> bool:
        return await self._change(_one(Step(
            RELEASE, "lease_until = NULL, updated_at = ?", (time.time(),),
            "id = ? AND fence = ?", (draft_id, fence)))) is not None

    # -- approval --------------------------------------------------------------------
    async def mark_posted(self, draft_id: int, version: int, chat: str,
                          message_id: str) -> Draft | None:
        return await self._change(_one(Step(
            POST, "approval_chat = ?, approval_message_id = ?, updated_at = ?",
            (str(chat), str(message_id), time.time()),
            "id = ? AND version = ?", (draft_id, version))))

    async def _decide(self, step: Step, action: str, actor: str, t: float,
                      detail: Callable[[Draft, Any], str]) -> Draft | None:
        return await self._change(_one(step, action=action, actor=actor, detail=detail, at=t))

    async def approve(self, draft_id: int, version: int, actor: str,
                      now: float | None = None) -> Draft | None:
        t = self._now(now)
        return await self._decide(Step(
            APPROVE, "decided_by = ?, decided_at = ?, updated_at = ?", (actor, t, t),
            "id = ? AND version = ?", (draft_id, version)),
            "approve", actor, t, lambda d, _: f"v{version}")

    async def edit(self, draft_id: int, version: int, body: str, actor: str,
                   now: float | None = None) -> Draft | None:
        t = self._now(now)
        return await self._decide(Step(
            EDIT, "body = ?, version = version + 1, updated_at = ?", (self._clean(body), t),
            "id = ? AND version = ?", (draft_id, version)),
            "edit", actor, t, lambda d, _: f"v{version} -> v{d.version}")

    async def regenerate(self, draft_id: int, version: int, actor: str,
                         instruction: str = "", now: float | None = None) -> Draft | None:
        t = self._now(now)
        # The audit hash is of the body the operator saw when asking for another one.
        return await self._decide(Step(
            REGENERATE, "version = version + 1, instruction = ?, attempt = 0, "
                        "lease_until = NULL, error = NULL, updated_at = ?",
            (self._clean(instruction), t), "id = ? AND version = ?", (draft_id, version)),
            "regenerate", actor, t, lambda d, _: f"v{version} -> v{d.version}"
            + (f": {instruction}" if instruction else ""))

    async def reject(self, draft_id: int, version: int, actor: str, reason: str = "",
                     now: float | None = None) -> Draft | None:
        t = self._now(now)
        return await self._decide(Step(
            REJECT, "decided_by = ?, decided_at = ?, error = ?, updated_at = ?",
            (actor, t, self._clean(reason) or None, t),
            "id = ? AND version = ?", (draft_id, version)),
            "reject", actor, t, lambda d, _: f"v{version}" + (f": {reason}" if reason else ""))

    # -- sending ---------------------------------------------------------------------
    async def begin_send(self, draft_id: int, holder: str | None = None) -> Draft | None:
        # updated_at by the store's clock for leases: recover_sending ages rows with it.
        clock, arg = self._db_clock(None)
        return await self._change(_one(Step(
            BEGIN_SEND, f"send_holder = ?, updated_at = {clock}", (holder, arg),
            "id = ?", (draft_id,))))

    async def mark_sent(self, draft_id: int, sent_id: str,
                        now: float | None = None) -> Draft | None:
        t = self._now(now)
        return await self._change(_one(Step(
            MARK_SENT, "sent_id = ?, error = NULL, updated_at = ?", (str(sent_id), t),
            "id = ?", (draft_id,)), action="sent", at=t,
            detail=lambda d, _: f"v{d.version} sent as {sent_id}"))

    async def mark_send_failed(self, draft_id: int, reason: str) -> Draft | None:
        return await self._change(_one(Step(
            MARK_SEND_FAILED, "error = ?, updated_at = ?",
            (self._clean(scrub(reason)), time.time()), "id = ?", (draft_id,))))

    async def mark_send_unknown(self, draft_id: int, reason: str) -> Draft | None:
        return await self._change(_one(Step(
            MARK_SEND_UNKNOWN, "error = ?, updated_at = ?",
            (self._clean(scrub(reason)), time.time()), "id = ?", (draft_id,))))

    async def retry_send(self, draft_id: int, actor: str,
                         now: float | None = None) -> Draft | None:
        t = self._now(now)
        return await self._change(_one(Step(
            RETRY_SEND, "error = NULL, updated_at = ?", (t,), "id = ?", (draft_id,)),
            action="retry_send", actor=actor, at=t, before=draft_id,
            detail=lambda d, old: f"after {old['status']}: {old['error'] or ''}".rstrip(": ")))

    # -- reading drafts --------------------------------------------------------------
    async def get_draft(self, draft_id: int) -> Draft | None:
        found = await self._select_drafts("id = ?", (draft_id,))
        return found[0] if found else None

    async def get_draft_by_key(self, key: str) -> Draft | None:
        """Not in the Store contract: for tests and tools."""
        found = await self._select_drafts("key = ?", (key,))
        return found[0] if found else None

    async def find_drafts(self, pipeline: str, item_id: str) -> list[Draft]:
        """Not in the Store contract: for tests and tools. Every draft of ``item_id``
        in ``pipeline`` (any scope or recipe)."""
        return await self._select_drafts("pipeline = ? AND item_id = ?", (pipeline, item_id))

    async def _by_status(self, statuses: Iterable[str], pipeline: str | None,
                         tail: str = "ORDER BY id") -> list[Draft]:
        return await self._select_drafts(*status_where(statuses, pipeline), tail)

    async def pending(self, pipeline: str | None = None, limit: int | None = None) -> list[Draft]:
        tail = "ORDER BY id" if limit is None else f"ORDER BY id LIMIT {int(limit)}"
        if pipeline is not None:
            return await self._by_status(PENDING_STATUSES, pipeline, tail)
        # Written out (no parameters) so the planner sees the drafts_pending index's
        # predicate in it and reads that index in id order.
        return await self._select_drafts(PENDING_SQL, (), tail)

    async def unposted(self, pipeline: str | None = None, limit: int = 100) -> list[Draft]:
        return await self._by_status((READY,), pipeline, f"ORDER BY id LIMIT {int(limit)}")

    async def approved(self, pipeline: str | None = None) -> list[Draft]:
        return await self._by_status((APPROVED,), pipeline)

    async def send_unknown(self, pipeline: str | None = None) -> list[Draft]:
        return await self._by_status((SEND_UNKNOWN,), pipeline)

    async def waiting(self, pipeline: str | None = None, limit: int = 100) -> list[Draft]:
        return await self._by_status((QUEUED, DRAFTING), pipeline,
                                     f"ORDER BY id LIMIT {int(limit)}")

    async def recent(self, pipeline: str, statuses: Iterable[str], limit: int = 10) -> list[Draft]:
        wanted = tuple(dict.fromkeys(statuses))
        if not wanted:
            return []
        return await self._by_status(wanted, pipeline, f"ORDER BY id DESC LIMIT {int(limit)}")

    async def stale_cards(self, limit: int = 50) -> list[Draft]:
        return await self._select_drafts("card_stale = 1", (), f"ORDER BY id LIMIT {int(limit)}")

    # -- cursors, tokens -------------------------------------------------------------
    async def get_cursor(self, pipeline: str, scope: str) -> str | None:
        rows = await self._query("SELECT value FROM cursors WHERE pipeline = ? AND scope = ?",
                                 (pipeline, scope))
        return rows[0][0] if rows else None

    async def set_cursor(self, pipeline: str, scope: str, value: str | None) -> None:
        """Not in the Store contract (admit stores cursors): for tests and tools."""
        await self._execute(CURSOR_SQL, (pipeline, scope, value, time.time()))

    async def add_tokens(self, pipeline: str, tokens: int, now: float | None = None) -> None:
        if tokens:
            await self._execute(TOKENS_SQL, (pipeline, utc_day(self._now(now)), int(tokens)))

    async def tokens_used(self, pipeline: str, day: str) -> int:
        rows = await self._query("SELECT tokens FROM token_usage WHERE pipeline = ? AND day = ?",
                                 (pipeline, day))
        return int(rows[0][0] or 0) if rows else 0

    # -- counting --------------------------------------------------------------------
    # Drafts in a final status and seen marks are counted from draft_counts and
    # seen_counts, which triggers keep in step with the rows (schema migration 3): a
    # year of mail would make COUNT(*) read every row. The few unfinished drafts are
    # counted live, so claims and posts write no counter row (no contention there).
    async def count_by_status(self, pipeline: str | None = None) -> dict[str, int]:
        where, args = ("WHERE pipeline = ?", (pipeline,)) if pipeline is not None else ("", ())
        rows = await self._query(f"SELECT status, SUM(n) FROM draft_counts {where} "
                                 "GROUP BY status HAVING SUM(n) > 0", args)
        live_where, live_args = status_where(_LIVE, pipeline)
        rows += await self._query(f"SELECT status, COUNT(*) FROM drafts WHERE {live_where} "
                                  "GROUP BY status", live_args)
        return {r[0]: int(r[1]) for r in rows}

    async def count_by_pipeline(self, statuses: Iterable[str]) -> dict[str, int]:
        wanted = tuple(dict.fromkeys(statuses))
        out: dict[str, int] = {}
        for table, chosen, total in (
                ("draft_counts", [w for w in wanted if w in TERMINAL_STATUSES], "SUM(n)"),
                ("drafts", [w for w in wanted if w not in TERMINAL_STATUSES], "COUNT(*)")):
            if not chosen:
                continue
            where, args = status_where(chosen, None)
            for r in await self._query(f"SELECT pipeline, {total} FROM {table} WHERE {where} "
                                       f"GROUP BY pipeline HAVING {total} > 0", args):
                out[r[0]] = out.get(r[0], 0) + int(r[1])
        return out

    async def seen_count(self, pipeline: str) -> int:
        rows = await self._query("SELECT COALESCE(SUM(n), 0) FROM seen_counts WHERE pipeline = ?",
                                 (pipeline,))
        return int(rows[0][0])

    # -- runs ------------------------------------------------------------------------
    async def start_run(self, pipeline: str, scheduled_for: float | None = None,
                        now: float | None = None) -> int:
        rows = await self._query(
            "INSERT INTO pipeline_runs (pipeline, scheduled_for, started_at, status, counts) "
            "VALUES (?, ?, ?, 'running', '{}') RETURNING id",
            (pipeline, scheduled_for, self._now(now)), write=True)
        return int(rows[0][0])

    async def end_run(self, run_id: int, status: str, counts: dict[str, int],
                      error_text: str | None = None, now: float | None = None) -> None:
        await self._execute(
            "UPDATE pipeline_runs SET ended_at = ?, status = ?, counts = ?, error_text = ? "
            "WHERE id = ?", (self._now(now), status, json.dumps(dict(counts)),
                             scrub(error_text), run_id))

    async def _runs(self, pipeline: str, status: str | None, limit: int) -> list[Run]:
        args: tuple[str, ...] = (pipeline,)
        where = "pipeline = ?"
        if status is not None:
            where, args = where + " AND status = ?", (pipeline, status)
        rows = await self._query(f"SELECT * FROM pipeline_runs WHERE {where} "
                                 "ORDER BY started_at DESC, id DESC LIMIT ?", (*args, int(limit)))
        return [run_from_row(r) for r in rows]

    async def recent_runs(self, pipeline: str, limit: int = 10) -> list[Run]:
        return await self._runs(pipeline, None, limit)

    async def last_run(self, pipeline: str, status: str | None = None) -> Run | None:
        runs = await self._runs(pipeline, status, 1)
        return runs[0] if runs else None

    # -- audit -----------------------------------------------------------------------
    def _audit_row(self, t: float, actor: str, action: str, key: str | None,
                   text: str | None, detail: str | None) -> tuple[str, tuple]:
        return audit_row(t, actor, action, key, text, detail, self._clean)

    async def audit(self, actor: str, action: str, draft_key: str | None = None,
                    text: str | None = None, detail: str | None = None,
                    now: float | None = None) -> None:
        await self._execute(*self._audit_row(self._now(now), actor, action, draft_key, text,
                                             detail))

    async def audit_log(self, draft_key: str | None = None,
                        limit: int = 100) -> list[AuditEntry]:
        where, args = ("WHERE draft_key = ?", (draft_key,)) if draft_key is not None else ("", ())
        rows = await self._query(
            "SELECT id, at, actor, action, draft_key, text_sha256, detail FROM audit "
            f"{where} ORDER BY id DESC LIMIT ?", (*args, int(limit)))
        return [AuditEntry(*tuple(r)) for r in rows]

    # -- flags, holds, locks, cards ----------------------------------------------------
    async def set_paused(self, pipeline: str, paused: bool, actor: str) -> None:
        t = time.time()
        await self._script([
            ("INSERT INTO pipeline_flags (pipeline, paused, updated_at, updated_by) "
             "VALUES (?, ?, ?, ?) ON CONFLICT (pipeline) DO UPDATE SET "
             "paused = excluded.paused, updated_at = excluded.updated_at, "
             "updated_by = excluded.updated_by", (pipeline, int(paused), t, actor)),
            self._audit_row(t, actor, "pause" if paused else "resume", None, None, pipeline)])

    async def paused(self) -> set[str]:
        rows = await self._query("SELECT pipeline FROM pipeline_flags WHERE paused = 1")
        return {r[0] for r in rows}

    async def set_hold(self, pipeline: str, reason: str | None, until: float | None = None) -> None:
        await self._execute(
            "INSERT INTO pipeline_flags (pipeline, paused, updated_at, hold_reason, "
            "hold_until) VALUES (?, 0, ?, ?, ?) ON CONFLICT (pipeline) DO UPDATE SET "
            "hold_reason = excluded.hold_reason, hold_until = excluded.hold_until",
            (pipeline, time.time(), reason, until if reason is not None else None))

    async def holds(self) -> dict[str, tuple[str, float | None]]:
        rows = await self._query("SELECT pipeline, hold_reason, hold_until FROM pipeline_flags "
                                 "WHERE hold_reason IS NOT NULL")
        return {r[0]: (r[1], r[2]) for r in rows}

    async def unlock(self, name: str, holder: str) -> None:
        await self._execute("DELETE FROM locks WHERE name = ? AND holder = ?", (name, holder))

    async def lock_holder(self, name: str) -> str | None:
        rows = await self._query("SELECT holder FROM locks WHERE name = ?", (name,))
        return rows[0][0] if rows else None

    async def mark_card_stale(self, draft_id: int, stale: bool) -> None:
        # updated_at stays: it measures the draft's state (expiry, send grace), not its card.
        await self._execute("UPDATE drafts SET card_stale = ? WHERE id = ?",
                            (int(stale), draft_id))

    async def sending_holders(self) -> list[str]:
        rows = await self._query("SELECT DISTINCT send_holder FROM drafts WHERE status = ? "
                                 "AND send_holder IS NOT NULL", (SENDING,))
        return [r[0] for r in rows]
