"""Replay, sweep, recovery of abandoned work and the counts `status` shows, written once for both SQL stores (a
base of :class:`bot.store.sql.SqlStore`, on the primitives of :class:`~bot.store.base.Backend`)."""

from __future__ import annotations

from typing import Any, Iterable

from ..models import REPLAYABLE_STATUSES, STATUSES, TERMINAL_STATUSES, Status
from ..scoreboard import DECIDED, Decision, Override
from .base import ABANDONED_SEND, HEARTBEAT_PREFIX, Backend, ReplayResult, SweepResult
from .rows import DRAFT_COLS, REDRAFT_SET, Db, draft_from_row, select_drafts, status_where
from .transitions import EXPIRE, LEASE_FAIL, LEASE_RETRY, RECOVER_SEND, REPLAY, cas

DAY = 86400.0
#: Statuses counted live (not kept in draft_counts): those a draft leaves again.
_LIVE = tuple(s for s in STATUSES if s not in TERMINAL_STATUSES)


class SqlOps(Backend):
    """Operations over many drafts."""

    # -- operations --------------------------------------------------------------------
    async def replay(self, pipeline: str, item_id: str, actor: str,
                     now: float | None = None) -> ReplayResult:
        """A failed, rejected, skipped or expired draft of the item -> ``queued``
        (attempt 0, version + 1). An item only seen (no draft) loses its seen mark. A
        sent item or one still in flight is ``refused``. Always audited."""
        t = self._now(now)
        where = f"{pipeline} {item_id}"

        async def tx(db: Db) -> ReplayResult:
            drafts = await select_drafts(db, "pipeline = ? AND item_id = ?", (pipeline, item_id),
                                         "ORDER BY id" + self.FOR_UPDATE)
            # A sent item is never replayed, nor one still in flight.
            sent = [d for d in drafts if d.status == Status.SENT]
            busy = [d for d in drafts if d.status not in REPLAYABLE_STATUSES]
            if not drafts:
                removed = await db.run("DELETE FROM seen_items WHERE pipeline = ? AND item_id = ?",
                                       (pipeline, item_id))
                result = ReplayResult("unseen", f"{where}: seen mark removed; the next fetch "
                                                "takes it again") if removed else ReplayResult(
                    "not_found", f"{where}: no seen mark and no draft; check the pipeline "
                                 "name and the item id")
                key, detail = None, f"{result.outcome}: {where}"
            elif sent or busy:
                d = (sent or busy)[-1]
                why = (f"draft #{d.id} was already sent; a sent item is never replayed" if sent
                       else f"draft #{d.id} is still {d.status}; decide on it or let it finish "
                            "first")
                result = ReplayResult("refused", f"{where}: {why}", d)
                key, detail = d.key, f"refused: {why}"
            else:
                old = drafts[-1]  # the newest recipe's draft
                # version + 1 makes the old card's buttons stale; the card's chat and
                # message id stay so the channel can edit that same card.
                rows = await db.rows(*cas(
                    REPLAY, f"{REDRAFT_SET}, attempt = 0, version = version + 1, "
                            "lease_until = NULL, error = NULL, decided_by = NULL, "
                            "decided_at = NULL, instruction = '', updated_at = ?",
                    (t, actor, t), "id = ?", (old.id,), src=(old.status,),
                    returning=DRAFT_COLS))
                draft = draft_from_row(rows[0])  # the rows are locked: nothing else moved it
                detail = f"requeued from {old.status}" + (f" ({old.error})" if old.error else "")
                result, key = ReplayResult("requeued", f"{where}: {detail}", draft), draft.key
            await self._append(db, [self._audit_row(t, actor, "replay", key, None, detail)])
            return result

        return await self._run(tx)

    async def sweep(self, *, seen_ttl_days: float, max_attempts: int = 3,
                    approval_ttl_days: float | None = None, runs_keep_days: float = 30,
                    now: float | None = None) -> SweepResult:
        """Delete seen marks older than the TTL (only those with no live draft
        needed), return expired drafting leases to queued (attempt + 1; past
        ``max_attempts``, failed), expire ``awaiting`` drafts older than
        ``approval_ttl_days`` if given, prune runs older than ``runs_keep_days``."""
        t = self._now(now)

        async def tx(db: Db) -> SweepResult:
            res = SweepResult()
            # Deleting a mark whose item has a draft is safe: admit also checks the
            # draft key, so the item is never queued twice.
            res.seen_deleted = await db.run("DELETE FROM seen_items WHERE seen_at < ?",
                                            (t - seen_ttl_days * DAY,))
            res.leases_requeued, res.leases_failed = await self._requeue(db, None, max_attempts,
                                                                         now)
            if approval_ttl_days is not None:
                res.approvals_expired = await db.run(*cas(
                    EXPIRE, "error = ?, updated_at = ?",
                    (f"no decision within {approval_ttl_days:g} days", t),
                    "updated_at < ?", (t - approval_ttl_days * DAY,)))
            res.runs_pruned = await db.run("DELETE FROM pipeline_runs WHERE started_at < ?",
                                           (t - runs_keep_days * DAY,))
            return res

        return await self._run(tx)

    async def requeue_expired(self, pipeline: str, *, max_attempts: int,
                              now: float | None = None) -> tuple[int, int]:
        """The lease part of ``sweep`` for one pipeline, cheap enough for every tick:
        expired ``drafting`` leases -> ``queued`` (attempt + 1, new fence) or, past
        ``max_attempts``, ``failed``. Returns (requeued, failed)."""
        return await self._run(lambda db: self._requeue(db, pipeline, max_attempts, now))

    async def _requeue(self, db: Db, pipeline: str | None, max_attempts: int,
                       now: float | None) -> tuple[int, int]:
        """Expired ``drafting`` leases (of one pipeline, or all) -> queued or failed,
        expired by the lease clock (see ``_db_clock``)."""
        clock, arg = self._db_clock(now)
        args: tuple[Any, ...] = (arg,)
        where = f"lease_until < {clock}"
        if pipeline is not None:
            where, args = "pipeline = ? AND " + where, (pipeline, arg)
        # A new fence on every expired lease, so the stale worker's update loses.
        assign = f"attempt = attempt + 1, lease_until = NULL, fence = {self.NEXT_FENCE}, "
        t = (self._now(now),)
        requeued = await db.run(*cas(
            LEASE_RETRY, assign + "error = 'lease expired; retrying', updated_at = ?", t,
            where + " AND attempt + 1 < ?", (*args, max_attempts)))
        failed = await db.run(*cas(
            LEASE_FAIL, assign + "error = 'lease expired after ' || (attempt + 1) || "
                                 "' attempts', updated_at = ?", t, where, args))
        return requeued, failed

    async def recover_abandoned_sends(self, *, dead: Iterable[str] = (), alive: str | None = None,
                                      grace: float, now: float | None = None) -> int:
        """``sending`` rows whose sending process is gone -> ``send_unknown`` (error
        ``ABANDONED_SEND``): those of a holder in ``dead`` (the caller saw its pid gone on
        this machine), those whose holder's heartbeat row ``process:<holder>`` is missing
        or expired (never ``alive``'s, the caller's own), and rows with no holder (begun
        before holders were recorded) older than ``grace`` seconds. ``now`` None: the
        store's clock, which on a shared store is the database's."""
        clock, arg = self._db_clock(now)
        dead = list(dead)
        marks = ", ".join("?" * len(dead)) or "NULL"

        async def tx(db: Db) -> int:
            n = await db.run(*cas(
                RECOVER_SEND, "error = ?, updated_at = ?", (ABANDONED_SEND, self._now(now)),
                f"(send_holder IN ({marks})"
                " OR (send_holder IS NOT NULL AND (CAST(? AS text) IS NULL OR send_holder <> ?)"
                "     AND NOT EXISTS (SELECT 1 FROM locks"
                "                     WHERE name = CAST(? AS text) || drafts.send_holder"
                f"                    AND expires_at > {clock}))"
                f" OR (send_holder IS NULL AND updated_at < {clock} - ?))",
                (*dead, alive, alive, HEARTBEAT_PREFIX, arg, arg, float(grace))))
            # Heartbeats of processes gone for a day: nothing can refer to them any more.
            await db.run(f"DELETE FROM locks WHERE name LIKE ? AND expires_at < {clock} - ?",
                         (HEARTBEAT_PREFIX + "%", arg, DAY))
            return n

        return await self._run(tx)

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
        """How many drafts each pipeline has in ``statuses`` (pipelines with none are
        left out): finds work owned by pipelines that left the configuration."""
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

    async def draft_gauges(self) -> tuple[dict[tuple[str, str], int], dict[str, float]]:
        """For metrics, in one query: how many drafts each (pipeline, status) has, and
        each pipeline's oldest ``awaiting`` draft's ``created_at``."""
        live_where, live_args = status_where(_LIVE, None)
        rows = await self._query("SELECT pipeline, status, COUNT(*), MIN(created_at) FROM drafts "
                                 f"WHERE {live_where} GROUP BY pipeline, status", live_args)
        done = await self._query("SELECT pipeline, status, SUM(n) FROM draft_counts "
                                 "GROUP BY pipeline, status HAVING SUM(n) > 0")
        return ({(r[0], r[1]): int(r[2]) for r in [*rows, *done]},
                {r[0]: float(r[3]) for r in rows if r[1] == Status.AWAITING})

    # -- the scoreboard ----------------------------------------------------------------
    async def quality(self, since: float, until: float, pipeline: str | None = None
                      ) -> tuple[list[Decision], list[Override]]:
        """The drafts decided in ``[since, until)`` (approved or rejected; an edited and
        sent one with its edit size, measured when it was sent) and the triage overrides
        in it, of one pipeline or all: two range reads of partial indexes
        (``drafts_decided``, ``drafts_overridden``), for :mod:`bot.scoreboard`."""
        only, args = ("AND pipeline = ? ", (pipeline,)) if pipeline is not None else ("", ())
        states = ", ".join("?" * len(DECIDED))
        rows = await self._query(
            "SELECT pipeline, COALESCE(decided_by, ''), status, decided_at, posted_at, edits, "
            "regenerations, COALESCE(flagged, 0), unsupported, edit_size "
            f"FROM {self.DRAFTS_BY.format('drafts_decided')} WHERE decided_at IS NOT NULL AND decided_at >= ? "
            f"AND decided_at < ? AND status IN ({states}) {only}",
            (float(since), float(until), *DECIDED, *args))
        decided = [Decision(*r) for r in rows]  # the columns in Decision's order
        rows = await self._query(
            "SELECT pipeline, COALESCE(overridden_by, ''), overridden_at FROM "
            f"{self.DRAFTS_BY.format('drafts_overridden')} WHERE overridden_at "
            f"IS NOT NULL AND overridden_at >= ? AND overridden_at < ? {only}",
            (float(since), float(until), *args))
        return decided, [Override(*r) for r in rows]
