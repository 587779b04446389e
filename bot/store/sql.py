"""What the SQL stores share (huey's ``BaseSqlStorage`` pattern): every transition,
listing and multi-step operation is written here once, on top of one primitive each
backend provides: ``_run`` (statements on one connection, in one transaction or as one
atomic statement). SQL here uses ``?`` placeholders; the backend keeps only what its SQL
does differently (admit, claim, migrations, the lease clock, row locks).
"""

from __future__ import annotations

import json
import secrets
import time
from typing import Any, Callable

from ..models import Draft, Status, Vote, operator_id
from ..redact import scrub
from ..scoreboard import edit_size
from .chain import Record
from .context_sql import ContextSql
from .followups_sql import FollowupSql
from .notes_sql import NotesSql
from .rows import (
    BEFORE_SQL,
    DRAFT_COLS,
    REDRAFT_SET,
    SYSTEM,
    Change,
    Db,
    audit_row,
    draft_detail,
    draft_from_row,
    example_row,
    unsupported_count,
    unsupported_note,
)
from .sql_ops import SqlOps
from .sql_reads import SqlReads
from .sql_records import SqlRecords
from .transitions import (
    APPROVE,
    BEGIN_SEND,
    CLAIM,
    DISMISS,
    DRAFT_REPLY,
    EDIT,
    FAIL,
    FINISH,
    MARK_SEND_FAILED,
    MARK_SEND_UNKNOWN,
    MARK_SENT,
    ON_DEMAND,
    POST,
    POST_FYI,
    QUORUM_MET,
    REGENERATE,
    REJECT,
    RELEASE,
    RETRY,
    RETRY_SEND,
    TRIAGE_NOTIFY,
    TRIAGE_REPLY,
    TRIAGE_SKIP,
    UNDO,
    VOTE_SQL,
    VOTES_SQL,
    Step,
)
from .vectors_sql import VectorSql

#: The predicate of the drafts_pending partial index (its schema migration), word for word.

def _one(*steps: Step, **kw: Any) -> Change:
    return Change(steps, **kw)


class SqlStore(SqlOps, SqlReads, ContextSql, VectorSql, NotesSql, SqlRecords, FollowupSql):
    """Durable state of draftgate (``bot.store.Store``): the shared half of
    :class:`SQLiteStore` and :class:`PostgresStore`. Open once at start, close at shutdown."""

    async def _change(self, change: Change) -> Draft | None:
        """Run ``change`` in one transaction; the draft after it, or None."""
        async def run(db: Db) -> Draft | None:
            old = None
            if change.before is not None:
                found = await db.rows(BEFORE_SQL + self.FOR_UPDATE, (change.before,))
                old = found[0] if found else None
            pre = [await db.rows(sql, args) for sql, args in change.prelude]
            for step in change.steps:
                rows = await db.rows(*step.sql(DRAFT_COLS))
                if rows:
                    break
            else:
                await self._append(db, change.missed(pre, self._clean) if change.missed else [])
                return None
            draft = draft_from_row(rows[0])
            statements, records, tokens = change.followups(draft, old, self._clean, pre)
            for sql, args in statements:
                await db.run(sql, args)
            await self._append(db, records, tokens)
            return draft

        return await self._run(run, tx=not change.single)

    # -- drafting --------------------------------------------------------------------
    async def claim_key(self, key: str, lease_seconds: float,
                        now: float | None = None) -> Draft | None:
        """Claim one specific queued draft by key; ``None`` if it is not queued."""
        clock, arg = self._db_clock(now)
        return await self._change(_one(Step(
            CLAIM, f"lease_until = {clock} + ?, fence = {self.NEXT_FENCE}, updated_at = ?",
            (arg, float(lease_seconds), self._now(now)), "key = ?", (key,))))

    async def finish_draft(self, draft_id: int, fence: int, body: str, *,
                           tokens_in: int = 0, tokens_out: int = 0, model: str = "",
                           now: float | None = None,
                           used: dict[str, Any] | None = None,
                           post_lease: float | None = None,
                           lease_now: float | None = None) -> Draft | None:
        """Fenced ``drafting -> ready`` storing the body and what its request ``used``
        (:meth:`Context.used`). ``None`` when the fence no
        longer matches (the lease was lost): a stale worker changes nothing. Token use
        is added to the draft and to the pipeline's usage for the UTC day of ``now``.
        Audited as ``draft`` (version, ``model``, tokens). ``post_lease`` (seconds):
        the caller posts the card itself, and :meth:`unposted` leaves the draft out
        for that long (from ``lease_now``, the lease clock), so no other process
        posts it meanwhile."""
        t = self._now(now)
        lease_sql, lease_args = self._post_lease(post_lease, lease_now)
        return await self._change(_one(Step(
            FINISH, f"body = ?, lease_until = {lease_sql}, error = NULL, "
                    "tokens_in = tokens_in + ?, tokens_out = tokens_out + ?, updated_at = ?, "
                    "used = ?, flagged = COALESCE(flagged, ?), unsupported = ?",
            (self._clean(body), *lease_args, int(tokens_in), int(tokens_out), t,
             self._clean(json.dumps(used)) if used else None, unsupported_count(used),
             unsupported_count(used)),
            "id = ? AND fence = ?", (draft_id, fence)), at=t, tokens=tokens_in + tokens_out,
            action="draft", actor=SYSTEM, detail=lambda d, _: draft_detail(
                d.version, model, int(tokens_in), int(tokens_out), used)))

    async def fail_draft(self, draft_id: int, fence: int, error: str, *, retryable: bool,
                         max_attempts: int, now: float | None = None) -> Draft | None:
        """Fenced: ``drafting -> queued`` with attempt + 1 when ``retryable`` and
        attempt + 1 < max_attempts, else ``drafting -> failed`` with ``error``.
        ``None`` when the fence no longer matches."""
        assign = "attempt = attempt + 1, lease_until = NULL, error = ?, updated_at = ?"
        args = (self._clean(scrub(error)), self._now(now))  # shown on cards and in /status
        fail = Step(FAIL, assign, args, "id = ? AND fence = ?", (draft_id, fence))
        retry = Step(RETRY, assign, args, "id = ? AND fence = ? AND attempt + 1 < ?",
                     (draft_id, fence, max_attempts))
        return await self._change(Change((retry, fail) if retryable else (fail,)))

    async def release(self, draft_id: int, fence: int) -> bool:
        """Fenced ``drafting -> queued`` without counting an attempt (budget spent,
        shutdown)."""
        return await self._change(_one(Step(
            RELEASE, "lease_until = NULL, updated_at = ?", (time.time(),),
            "id = ? AND fence = ?", (draft_id, fence)))) is not None

    def _post_lease(self, seconds: float | None, now: float | None) -> tuple[str, tuple]:
        """SQL and arguments for ``lease_until`` of a draft entering ``ready`` (or
        ``notified``): NULL, or the lease clock + ``seconds`` (see ``finish_draft``)."""
        if seconds is None:
            return "NULL", ()
        clock, arg = self._db_clock(now)
        return f"{clock} + ?", (arg, float(seconds))

    async def record_triage(self, draft_id: int, fence: int, action: str, reason: str, *,
                            tokens: int = 0, lease_seconds: float,
                            now: float | None = None, post_lease: float | None = None,
                            lease_now: float | None = None) -> Draft | None:
        """Fenced, one transaction: store the triage decision (``reply | notify | skip``)
        and its reason with the draft, add ``tokens`` to the day's usage and append an
        audit row. ``reply``: stays ``drafting`` with its lease renewed for
        ``lease_seconds``; ``notify``: ``notified`` (an FYI card to post); ``skip``:
        ``skipped`` with the reason as error text. ``None`` when the fence moved."""
        t = self._now(now)
        assign, args = "triage = ?, triage_reason = ?, updated_at = ?", (
            action, self._clean(reason), t)
        if action == "reply":  # drafting goes on under this claim, with a fresh lease
            clock, arg = self._db_clock(now)
            step = Step(TRIAGE_REPLY, assign + f", lease_until = {clock} + ?",
                        (*args, arg, float(lease_seconds)), "id = ? AND fence = ?",
                        (draft_id, fence))
        elif action == "notify":  # its FYI card: posted by the caller, as finish_draft's
            lease_sql, lease_args = self._post_lease(post_lease, lease_now)
            step = Step(TRIAGE_NOTIFY, assign + f", lease_until = {lease_sql}",
                        (*args, *lease_args), "id = ? AND fence = ?", (draft_id, fence))
        elif action == "skip":  # the reason is what `status <pipeline>` lists
            step = Step(TRIAGE_SKIP, assign + ", lease_until = NULL, error = ?",
                        (*args, self._clean(scrub(f"triage: {reason}"))),
                        "id = ? AND fence = ?", (draft_id, fence))
        else:
            raise ValueError(f"unknown triage action {action!r}")
        return await self._change(_one(step, action="triage", at=t, tokens=tokens,
                                       detail=lambda d, _: f"{action}: {reason}"))

    # -- approval --------------------------------------------------------------------
    async def mark_posted(self, draft_id: int, version: int, chat: str,
                          message_id: str, now: float | None = None) -> Draft | None:
        """CAS ``ready -> awaiting`` for that version, keeping the card's chat and
        message id; for a ``notified`` draft (an FYI card) the status stays;
        ``updated_at`` becomes ``now`` (reminders count from it)."""
        # updated_at is when the card went up: reminders count from it. lease_until: a
        # post lease (finish_draft's post_lease) ends with the post.
        # posted_at: the first card, where the time to a decision starts.
        assign = ("approval_chat = ?, approval_message_id = ?, lease_until = NULL, "
                  "updated_at = ?, posted_at = COALESCE(posted_at, ?)")
        args = (str(chat), str(message_id), self._now(now), self._now(now))
        where = "id = ? AND version = ?", (draft_id, version)
        # A draft's card (ready -> awaiting), or an FYI card (stays notified).
        return await self._change(Change((Step(POST, assign, args, *where),
                                          Step(POST_FYI, assign, args, *where))))

    async def draft_reply(self, draft_id: int, version: int, actor: str,
                          now: float | None = None) -> Draft | None:
        """CAS ``notified -> queued`` for ``version`` (an operator tapped Draft a reply
        on the FYI card): version + 1, so it is drafted without triage. Audited."""
        t = self._now(now)
        return await self._decide(Step(
            DRAFT_REPLY, "version = version + 1, attempt = 0, lease_until = NULL, "
                         "error = NULL, updated_at = ?, overridden_at = ?, overridden_by = ?",
            (t, t, actor),
            "id = ? AND version = ?", (draft_id, version)),
            "draft_reply", actor, t, lambda d, _: f"v{version} -> v{d.version}")

    async def dismiss(self, draft_id: int, version: int, actor: str,
                      now: float | None = None) -> Draft | None:
        """CAS ``notified -> dismissed`` for ``version``. Audited."""
        t = self._now(now)
        return await self._decide(Step(
            DISMISS, "decided_by = ?, decided_at = ?, updated_at = ?", (actor, t, t),
            "id = ? AND version = ?", (draft_id, version)),
            "dismiss", actor, t, lambda d, _: f"v{version}")

    async def _decide(self, step: Step, action: str, actor: str, t: float,
                      detail: Callable[[Draft, Any], str], before: int | None = None
                      ) -> Draft | None:
        return await self._change(_one(step, action=action, actor=actor, detail=detail, at=t,
                                       before=before))

    async def approve(self, draft_id: int, version: int, actor: str,
                      now: float | None = None, *, quorum: int = 1,
                      body: str | None = None, key: str | None = None,
                      send_after: float | None = None, note: str = "") -> Draft | None:
        """Record ``actor``'s vote for ``version`` (one per operator and version, only
        while it awaits a decision), then CAS ``awaiting -> approved`` if ``quorum``
        distinct operators voted for it; audit row with the sha256 of the body the
        operator saw. ``None`` if the draft did not move: anything differs, or the
        quorum is not met yet (then a new vote is audited, with ``body`` and ``key``
        of the version voted for). ``send_after``: the approved draft is not sent
        before then (the undo window, a later time); None: at once. ``note``: added to
        the audit detail (e.g. the unsupported claims the operator confirmed)."""
        t = self._now(now)
        extra = f"; {note}" if note else ""
        # The vote and the CAS in one transaction, under the draft's row lock (where the
        # backend has row locks), so of two operators tapping at once the later one sees
        # the earlier vote: exactly one of them moves the draft, or neither (quorum 3).
        vote = (VOTE_SQL, (operator_id(actor), actor, t, draft_id, version, Status.AWAITING))
        count = ("SELECT COUNT(*) FROM approvals WHERE draft_id = ? AND version = ?",
                 (draft_id, version))

        def partial(pre: list[list[Any]], clean: Callable) -> list[Record]:
            if not pre[0] or key is None:  # no new vote (stale, or the same operator)
                return []
            return [audit_row(t, actor, "approve", key, body,
                              f"v{version}: {pre[1][0][0]}/{quorum} approvals{extra}", clean)]

        detail = f"v{version}" + (f": {quorum}/{quorum} approvals" if quorum > 1 else "") + extra
        return await self._change(Change((Step(
            APPROVE, "decided_by = ?, decided_at = ?, updated_at = ?, send_after = ?",
            (actor, t, t, send_after),
            f"id = ? AND version = ? AND {QUORUM_MET}", (draft_id, version, quorum)),),
            action="approve", actor=actor, at=t, detail=lambda d, _: detail,
            # Quorum 1: the vote alone (the CAS approves at once), one round trip less.
            before=draft_id if quorum > 1 else None,
            prelude=(vote, count) if quorum > 1 else (vote,),
            missed=partial if quorum > 1 else None))

    async def votes(self, draft_id: int, version: int) -> list[Vote]:
        """The approvals of that version, oldest first."""
        rows = await self._query(VOTES_SQL, (draft_id, version))
        return [Vote(r[0], r[1], float(r[2])) for r in rows]

    async def redraft(self, draft_id: int, actor: str, instruction: str = "",
                      now: float | None = None) -> Draft | None:
        """/reply: CAS an ``awaiting``, skipped, rejected, failed or expired draft to
        ``queued`` with version + 1 and ``instruction`` for the drafter. Audited."""
        t = self._now(now)
        return await self._decide(Step(
            ON_DEMAND, f"{REDRAFT_SET}, version = version + 1, instruction = ?, attempt = 0, "
                       "lease_until = NULL, error = NULL, decided_by = NULL, decided_at = NULL, "
                       "updated_at = ?",
            (t, actor, self._clean(instruction), t), "id = ?", (draft_id,)),
            "reply", actor, t, lambda d, old: f"v{d.version - 1} -> v{d.version} (was "
            f"{old['status']})" + (f": {instruction}" if instruction else ""), before=draft_id)

    async def claim_notice(self, key: str, now: float | None = None, *,
                           draft_id: int | None = None, version: int | None = None) -> bool:
        """Claim the right to send the notice ``key`` (a reminder, a digest) once, across
        restarts and hosts: True for exactly one caller. With ``draft_id``, only while
        that ``version`` of the draft awaits a decision."""
        # ? IS NULL: a digest; otherwise a reminder, claimed only while that version of
        # the draft still waits for a decision.
        return await self._execute(
            "INSERT INTO sent_notices (key, at) SELECT CAST(? AS TEXT), CAST(? AS DOUBLE "
            "PRECISION) WHERE CAST(? AS INTEGER) IS NULL OR EXISTS ("
            "SELECT 1 FROM drafts WHERE id = ? AND version = ? AND status = ?) "
            "ON CONFLICT (key) DO NOTHING",
            (key, self._now(now), draft_id, draft_id, version, Status.AWAITING)) == 1

    async def edit(self, draft_id: int, version: int, body: str, actor: str,
                   now: float | None = None, used: dict[str, Any] | None = None
                   ) -> Draft | None:
        """CAS on ``awaiting`` and ``version``: new body, version + 1, status ``ready``
        so the card is re-rendered (the approval message id is kept). Audited.
        ``used``: the new version's (its grounding re-checked); None keeps it."""
        t = self._now(now)
        # first_body: the model's text, at the first edit since it was drafted.
        sets = ("first_body = COALESCE(first_body, body), edits = edits + 1, body = ?, "
                "version = version + 1, updated_at = ?")
        args: list[Any] = [self._clean(body), t]
        if used is not None:
            sets, args = sets + ", used = ?, unsupported = ?", [
                *args, self._clean(json.dumps(used)), unsupported_count(used)]
        return await self._decide(Step(EDIT, sets, tuple(args), "id = ? AND version = ?",
                                       (draft_id, version)),
                                  "edit", actor, t, lambda d, _: f"v{version} -> v{d.version}"
                                  + unsupported_note(used))

    async def regenerate(self, draft_id: int, version: int, actor: str,
                         instruction: str = "", now: float | None = None) -> Draft | None:
        """CAS on ``awaiting`` and ``version``: status ``queued``, version + 1,
        ``instruction`` stored for the drafter, attempt reset. Audited."""
        t = self._now(now)
        # The audit hash is of the body the operator saw when asking for another one.
        return await self._decide(Step(
            REGENERATE, "first_body = NULL, regenerations = regenerations + 1, "
                        "version = version + 1, instruction = ?, attempt = 0, "
                        "lease_until = NULL, error = NULL, updated_at = ?",
            (self._clean(instruction), t), "id = ? AND version = ?", (draft_id, version)),
            "regenerate", actor, t, lambda d, _: f"v{version} -> v{d.version}"
            + (f": {instruction}" if instruction else ""))

    async def reject(self, draft_id: int, version: int, actor: str, reason: str = "",
                     now: float | None = None) -> Draft | None:
        """CAS ``awaiting -> rejected`` for ``version``. Audited."""
        t = self._now(now)
        return await self._decide(Step(
            REJECT, "decided_by = ?, decided_at = ?, error = ?, updated_at = ?",
            (actor, t, self._clean(reason) or None, t),
            "id = ? AND version = ?", (draft_id, version)),
            "reject", actor, t, lambda d, _: f"v{version}" + (f": {reason}" if reason else ""))

    # -- sending ---------------------------------------------------------------------
    async def begin_send(self, draft_id: int, holder: str | None = None,
                         now: float | None = None) -> Draft | None:
        """CAS ``approved -> sending`` once its ``send_after`` has passed at ``now``,
        committed before the send call, recording the sending process (``holder``, as
        in the locks table) in ``send_holder``. The only way to send. The first one
        draws the random part of the reply's Message-ID (``reply_nonce``); a retry
        keeps it, so every check looks for the same id."""
        # updated_at by the store's clock for leases: recover_abandoned_sends ages rows with it.
        clock, arg = self._db_clock(None)
        return await self._change(_one(Step(
            BEGIN_SEND, f"send_holder = ?, reply_nonce = COALESCE(reply_nonce, ?), "
                        f"updated_at = {clock}", (holder, secrets.token_hex(16), arg),
            "id = ? AND (send_after IS NULL OR send_after <= ?)",
            (draft_id, self._now(now)))))

    async def undo(self, draft_id: int, version: int, actor: str, action: str = "undo",
                   now: float | None = None) -> Draft | None:
        """Undo (or Cancel a later send): CAS ``approved -> awaiting`` of ``version``
        while its send waits for ``send_after``; the version's votes are cleared, so it
        needs its approvals again. Loses to :meth:`begin_send`. Audited as ``action``."""
        t = self._now(now)
        return await self._change(Change((Step(
            UNDO, "decided_by = NULL, decided_at = NULL, send_after = NULL, updated_at = ?",
            (t,), "id = ? AND version = ? AND send_after IS NOT NULL", (draft_id, version)),),
            action=action, actor=actor, at=t, detail=lambda d, _: f"v{version}: not sent",
            then=lambda d, _: [("DELETE FROM approvals WHERE draft_id = ? AND version = ?",
                             (d.id, d.version))]))

    async def mark_sent(self, draft_id: int, sent_id: str,
                        now: float | None = None, actor: str | None = None) -> Draft | None:
        """CAS ``sending|send_unknown -> sent``; audit row with the sent text's hash
        (``actor``: the operator who said so, for an unknown send); the reply and its
        original kept as an example of the pipeline, and an edited one's edit size
        (the model's text against the text sent) measured (same transaction)."""
        t = self._now(now)

        def then(d: Draft, pre: list[list[Any]]) -> list[tuple[str, tuple]]:
            out = example_row(d, t, self._clean)
            if pre[0]:  # edited: the model's text it replaced, for the scoreboard
                out.append(("UPDATE drafts SET edit_size = ? WHERE id = ?",
                            (edit_size(pre[0][0][0], d.body), d.id)))
            return out

        return await self._change(_one(Step(
            MARK_SENT, "sent_id = ?, error = NULL, updated_at = ?", (str(sent_id), t),
            "id = ?", (draft_id,)), action="sent", at=t, actor=actor,
            detail=lambda d, _: f"v{d.version}, message id {sent_id}",
            prelude=(("SELECT first_body FROM drafts WHERE id = ? AND edits > 0 "
                      "AND first_body IS NOT NULL", (draft_id,)),), then=then))

    async def mark_send_failed(self, draft_id: int, reason: str) -> Draft | None:
        """CAS ``sending -> send_failed``."""
        return await self._change(_one(Step(
            MARK_SEND_FAILED, "error = ?, updated_at = ?",
            (self._clean(scrub(reason)), time.time()), "id = ?", (draft_id,))))

    async def mark_send_unknown(self, draft_id: int, reason: str) -> Draft | None:
        """CAS ``sending -> send_unknown``."""
        return await self._change(_one(Step(
            MARK_SEND_UNKNOWN, "error = ?, updated_at = ?",
            (self._clean(scrub(reason)), time.time()), "id = ?", (draft_id,))))

    async def retry_send(self, draft_id: int, actor: str,
                         now: float | None = None) -> Draft | None:
        """CAS ``send_failed|send_unknown -> approved`` by an operator. Audited."""
        t = self._now(now)
        return await self._change(_one(Step(
            RETRY_SEND, "error = NULL, send_after = NULL, updated_at = ?", (t,), "id = ?",
            (draft_id,)),
            action="retry_send", actor=actor, at=t, before=draft_id,
            detail=lambda d, old: f"after {old['status']}: {old['error'] or ''}".rstrip(": ")))
