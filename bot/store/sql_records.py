"""Cursors, token counts, runs, the audit, pause flags, holds, locks, cards and prompt
records: the rows around the drafts, written once for both SQL stores (a mixin of
:class:`bot.store.sql.SqlStore`, on the primitives of :class:`~bot.store.base.Backend`)."""

from __future__ import annotations

import json
import time

from ..clock import utc_day
from ..models import AuditEntry, Run, Status
from ..redact import scrub
from . import chain
from .base import Backend
from .rows import (
    TOKENS_SQL,
    Db,
    run_from_row,
)


class SqlRecords(Backend):
    """See the module docstring."""

    # -- cursors, tokens -------------------------------------------------------------
    async def get_cursor(self, pipeline: str, scope: str) -> str | None:
        rows = await self._query("SELECT value FROM cursors WHERE pipeline = ? AND scope = ?",
                                 (pipeline, scope))
        return rows[0][0] if rows else None

    async def add_tokens(self, pipeline: str, tokens: int, now: float | None = None) -> None:
        """Count tokens spent that did not end in a stored draft (failed attempts)."""
        if tokens:
            await self._execute(TOKENS_SQL, (pipeline, utc_day(self._now(now)), int(tokens)))

    async def tokens_used(self, pipeline: str, day: str) -> int:
        """Tokens used by ``pipeline`` on UTC ``day`` (``YYYY-MM-DD``)."""
        rows = await self._query("SELECT tokens FROM token_usage WHERE pipeline = ? AND day = ?",
                                 (pipeline, day))
        return int(rows[0][0] or 0) if rows else 0

    async def ping(self) -> None:
        """A trivial query (``/readyz``): raises if the store does not answer."""
        await self._query("SELECT 1")

    # -- runs ------------------------------------------------------------------------
    async def start_run(self, pipeline: str, scheduled_for: float | None = None,
                        now: float | None = None) -> int:
        rows = await self._query(
            "INSERT INTO pipeline_runs (pipeline, scheduled_for, started_at, status, counts) "
            "VALUES (?, ?, ?, 'running', '{}') RETURNING id",
            (pipeline, scheduled_for, self._now(now)))
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
        """Newest first."""
        return await self._runs(pipeline, None, limit)

    async def last_run(self, pipeline: str, status: str | None = None) -> Run | None:
        runs = await self._runs(pipeline, status, 1)
        return runs[0] if runs else None

    # -- audit -----------------------------------------------------------------------
    async def audit(self, actor: str, action: str, draft_key: str | None = None,
                    text: str | None = None, detail: str | None = None,
                    now: float | None = None) -> None:
        """Append one audit row (sha256 of ``text`` when given)."""
        await self._script([], [self._audit_row(self._now(now), actor, action, draft_key, text,
                                             detail)])

    async def audit_log(self, draft_key: str | None = None,
                        limit: int = 100) -> list[AuditEntry]:
        """Newest first: in chain order (``seq``), which the chain's hashes cover; the
        row ids do not (swapping two ids would reorder a history undetected)."""
        where, args = ("WHERE draft_key = ?", (draft_key,)) if draft_key is not None else ("", ())
        rows = await self._query(
            "SELECT id, at, actor, action, draft_key, text_sha256, detail, seq FROM audit "
            f"{where} ORDER BY seq DESC NULLS LAST, id DESC LIMIT ?", (*args, int(limit)))
        return [AuditEntry(*tuple(r)) for r in rows]

    async def count_audit(self, action: str, key_prefix: str, since: float,
                          until: float) -> int:
        """Audit rows of ``action`` whose draft key starts with ``key_prefix``, written
        in ``[since, until)`` (the digest's sent and rejected counts)."""
        rows = await self._query(
            "SELECT COUNT(*) FROM audit WHERE action = ? AND substr(draft_key, 1, ?) = ? "
            "AND at >= ? AND at < ?", (action, len(key_prefix), key_prefix, since, until))
        return int(rows[0][0])

    async def audit_export(self, since: float = 0.0, after_seq: int = 0,
                           limit: int = 1000) -> list[dict]:
        """Chained audit rows in chain order (``bot.store.chain.CHAIN_COLS`` as keys):
        after position ``after_seq``, or (``after_seq`` 0) from the first row written at
        or after ``since`` on, every later row (contiguous, so an export verifies)."""
        if after_seq <= 0:  # from the first row written since then, every later one
            first = (await self._query(chain.FIRST_SINCE_SQL, (float(since),)))[0][0]
            if first is None:
                return []
            after_seq = int(first) - 1
        rows = await self._query(chain.EXPORT_SQL, (int(after_seq), int(limit)))
        return [dict(zip(chain.CHAIN_COLS, tuple(r), strict=True)) for r in rows]

    # -- flags, holds, locks, cards ----------------------------------------------------
    async def set_paused(self, pipeline: str, paused: bool, actor: str) -> None:
        t = time.time()

        async def tx(db: Db) -> None:
            await db.run("INSERT INTO pipeline_flags (pipeline, paused, updated_at, updated_by) "
                         "VALUES (?, ?, ?, ?) ON CONFLICT (pipeline) DO UPDATE SET "
                         "paused = excluded.paused, updated_at = excluded.updated_at, "
                         "updated_by = excluded.updated_by", (pipeline, int(paused), t, actor))
            await self._append(db, [self._audit_row(t, actor, "pause" if paused else "resume",
                                                    None, None, pipeline)])

        await self._run(tx)

    async def paused(self) -> set[str]:
        rows = await self._query("SELECT pipeline FROM pipeline_flags WHERE paused = 1")
        return {r[0] for r in rows}

    async def set_hold(self, pipeline: str, reason: str | None, until: float | None = None) -> None:
        """Record why the pipeline's drafting is held (a setup error, a model's
        Retry-After, a spent budget) and until when (None: until drafting works again);
        ``reason=None`` clears it. Kept in the store so ``status`` in any process sees it."""
        await self._execute(
            "INSERT INTO pipeline_flags (pipeline, paused, updated_at, hold_reason, "
            "hold_until) VALUES (?, 0, ?, ?, ?) ON CONFLICT (pipeline) DO UPDATE SET "
            "hold_reason = excluded.hold_reason, hold_until = excluded.hold_until",
            (pipeline, time.time(), reason, until if reason is not None else None))

    async def holds(self) -> dict[str, tuple[str, float | None]]:
        """Every recorded hold: pipeline -> (reason, until or None)."""
        rows = await self._query("SELECT pipeline, hold_reason, hold_until FROM pipeline_flags "
                                 "WHERE hold_reason IS NOT NULL")
        return {r[0]: (r[1], r[2]) for r in rows}

    async def unlock(self, name: str, holder: str) -> None:
        await self._execute("DELETE FROM locks WHERE name = ? AND holder = ?", (name, holder))

    async def lock_holder(self, name: str) -> str | None:
        """Who holds the named lock (expired or not), or None."""
        rows = await self._query("SELECT holder FROM locks WHERE name = ?", (name,))
        return rows[0][0] if rows else None

    async def mark_card_stale(self, draft_id: int, stale: bool) -> None:
        """Remember (or forget) that the draft's card shows an old state because its
        last edit failed; the channel re-renders such cards until an edit succeeds."""
        # updated_at stays: it measures the draft's state (expiry, send grace), not its card.
        await self._execute("UPDATE drafts SET card_stale = ? WHERE id = ?",
                            (int(stale), draft_id))

    async def record_prompt(self, chat: str, message_id: str, record: str, actor: str, *,
                            now: float | None = None) -> None:
        """Remember what a prompt message (chat, message id) asks about."""
        await self._execute(
            "INSERT INTO prompts (chat, message_id, record, actor, at) VALUES (?, ?, ?, ?, ?) "
            "ON CONFLICT (chat, message_id) DO UPDATE SET record = excluded.record, "
            "actor = excluded.actor, at = excluded.at",
            (chat, message_id, record, actor, time.time() if now is None else now))

    async def prompt_record(self, chat: str, message_id: str) -> str | None:
        """What :meth:`record_prompt` kept for that message (None: not a prompt)."""
        rows = await self._query("SELECT record FROM prompts WHERE chat = ? AND message_id = ?",
                                 (chat, message_id))
        return rows[0][0] if rows else None

    async def sending_holders(self) -> list[str]:
        """The distinct ``send_holder`` values of rows in ``sending``."""
        rows = await self._query("SELECT DISTINCT send_holder FROM drafts WHERE status = ? "
                                 "AND send_holder IS NOT NULL", (Status.SENDING,))
        return [r[0] for r in rows]

    async def try_lock(self, name: str, holder: str, ttl_seconds: float,
                       now: float | None = None) -> bool:
        """Take or renew a named lease row (e.g. ``tick:support``) for ``holder``.
        True if ``holder`` now holds it. Used so ticks of one pipeline never overlap
        across processes."""
        clock, arg = self._db_clock(now)
        return bool(await self._query(
            f"INSERT INTO locks (name, holder, expires_at) VALUES (?, ?, {clock} + ?)"
            " ON CONFLICT (name) DO UPDATE SET holder = excluded.holder,"
            " expires_at = excluded.expires_at"
            f" WHERE locks.holder = excluded.holder OR locks.expires_at <= {clock}"
            " RETURNING holder", (name, holder, arg, float(ttl_seconds), arg)))
