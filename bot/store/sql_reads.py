"""The store's reads of drafts (by id, by item, by status: pending, unposted, approved
and due, waiting, recent, stale cards): one select each, shared by both backends."""

from __future__ import annotations

from typing import Iterable

from ..models import PENDING_STATUSES, Draft, Status
from .base import Backend
from .rows import status_where

#: Written out (no parameters) so the planner sees the drafts_pending index's predicate.
PENDING_SQL = "status IN ({})".format(", ".join(f"'{s}'" for s in PENDING_STATUSES))


class SqlReads(Backend):
    """See the module docstring."""

    async def get_draft(self, draft_id: int) -> Draft | None:
        found = await self._select_drafts("id = ?", (draft_id,))
        return found[0] if found else None

    async def item_drafts(self, pipeline: str, item_id: str) -> list[Draft]:
        """Every draft of ``item_id`` in ``pipeline`` (any scope or recipe), oldest first."""
        return await self._select_drafts("pipeline = ? AND item_id = ?", (pipeline, item_id))

    async def _by_status(self, statuses: Iterable[str], pipeline: str | None,
                         tail: str = "ORDER BY id") -> list[Draft]:
        return await self._select_drafts(*status_where(statuses, pipeline), tail)

    async def pending(self, pipeline: str | None = None, limit: int | None = None) -> list[Draft]:
        """Drafts in PENDING_STATUSES, oldest first (the oldest ``limit``, if given)."""
        tail = "ORDER BY id" if limit is None else f"ORDER BY id LIMIT {int(limit)}"
        if pipeline is not None:
            return await self._by_status(PENDING_STATUSES, pipeline, tail)
        # Written out (no parameters) so the planner sees the drafts_pending index's
        # predicate in it and reads that index in id order.
        return await self._select_drafts(PENDING_SQL, (), tail)

    async def unposted(self, pipeline: str | None = None, limit: int = 100,
                       now: float | None = None) -> list[Draft]:
        """Drafts in ``ready`` (never posted, or re-drafted) and ``notified`` ones whose
        FYI card was never posted, oldest first; not those whose post lease (see
        ``finish_draft``) runs at ``now`` (the lease clock): their drafter posts them."""
        clock, arg = self._db_clock(now)
        where = ("(status = ? OR (status = ? AND approval_message_id IS NULL))"
                 f" AND (lease_until IS NULL OR lease_until <= {clock})")
        args: tuple = (Status.READY, Status.NOTIFIED, arg)
        if pipeline is not None:
            where, args = "pipeline = ? AND " + where, (pipeline, *args)
        return await self._select_drafts(where, args, f"ORDER BY id LIMIT {int(limit)}")

    async def approved(self, pipeline: str | None = None, now: float | None = None) -> list[Draft]:
        """Drafts in ``approved`` (approved but the send was not begun); with ``now``,
        only those due then (``send_after`` passed or none)."""
        if now is None:
            return await self._by_status((Status.APPROVED,), pipeline)
        where, args = status_where((Status.APPROVED,), pipeline)
        return await self._select_drafts(f"{where} AND (send_after IS NULL OR send_after <= ?)",
                                         (*args, float(now)))

    async def due_sends(self, now: float) -> list[Draft]:
        """Approved drafts whose ``send_after`` has passed at ``now`` (deferred sends)."""
        return await self._select_drafts(
            "status = ? AND send_after IS NOT NULL AND send_after <= ?",
            (Status.APPROVED, float(now)), "ORDER BY send_after, id LIMIT 200")

    async def next_send_after(self, after: float) -> float | None:
        """The earliest ``send_after`` later than ``after`` of an approved draft (None:
        none waits)."""
        rows = await self._query("SELECT MIN(send_after) FROM drafts WHERE status = ? "
                                 "AND send_after > ?", (Status.APPROVED, float(after)))
        return None if not rows or rows[0][0] is None else float(rows[0][0])

    async def send_unknown(self, pipeline: str | None = None) -> list[Draft]:
        return await self._by_status((Status.SEND_UNKNOWN,), pipeline)

    async def waiting(self, pipeline: str | None = None, limit: int = 100) -> list[Draft]:
        """Drafts not drafted yet (``queued`` or ``drafting``), oldest first."""
        return await self._by_status((Status.QUEUED, Status.DRAFTING), pipeline,
                                     f"ORDER BY id LIMIT {int(limit)}")

    async def recent(self, pipeline: str, statuses: Iterable[str], limit: int = 10) -> list[Draft]:
        """The newest ``limit`` drafts of ``pipeline`` in ``statuses``, newest first (what
        ``status`` lists with item ids and reasons, for ``replay``)."""
        wanted = tuple(dict.fromkeys(statuses))
        if not wanted:
            return []
        return await self._by_status(wanted, pipeline, f"ORDER BY id DESC LIMIT {int(limit)}")

    async def stale_cards(self, limit: int = 50) -> list[Draft]:
        """Drafts whose card is marked stale, oldest id first."""
        return await self._select_drafts("card_stale = 1", (), f"ORDER BY id LIMIT {int(limit)}")
