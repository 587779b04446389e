"""The store's half of follow-ups and attached files (issue 28): a follow-up is a new work item keyed
``pipeline|followup|<item>|<n>``, so the key's uniqueness makes it exactly once across
restarts and hosts; an answer from the recipient cancels what is pending of it."""

from __future__ import annotations

import json

from ..models import Draft, Message, Status, draft_key
from .base import Backend
from .rows import SYSTEM, Change, select_drafts
from .transitions import ATTACH, CANCEL, Step

FOLLOWUP = "followup"  # the scope of follow-up work items


class FollowupSql(Backend):
    """See the module docstring."""

    async def _change(self, change: Change) -> Draft | None:  # SqlStore's
        raise NotImplementedError

    async def queue_followup(self, pipeline: str, item_id: str, n: int, message: Message,
                             instruction: str, line: str, now: float | None = None
                             ) -> Draft | None:
        """Queue follow-up ``n`` of ``item_id`` (drafted like any item, with
        ``instruction`` for the model; ``line`` is what its card says of it). None if
        it exists already (another host or an earlier tick queued it). Audited."""
        t = self._now(now)
        key = draft_key(pipeline, FOLLOWUP, item_id, str(n))

        async def tx(db) -> Draft | None:
            rows = await db.rows(
                "INSERT INTO drafts (key, pipeline, scope, item_id, recipe, status, payload, "
                "instruction, triage_reason, created_at, updated_at) VALUES "
                "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (key) DO NOTHING RETURNING id",
                (key, pipeline, FOLLOWUP, item_id, str(n), Status.QUEUED,
                 self._clean(message.to_json()), self._clean(instruction), self._clean(line), t, t))
            if not rows:
                return None
            await self._append(db, [self._audit_row(t, SYSTEM, "followup", key, None, line)])
            found = await select_drafts(db, "id = ?", (rows[0][0],))
            return found[0] if found else None

        return await self._run(tx)

    async def cancel(self, draft_id: int, reason: str, now: float | None = None) -> Draft | None:
        """CAS a follow-up not sent yet to ``cancelled`` with ``reason``. Audited."""
        t = self._now(now)
        return await self._change(Change((Step(
            CANCEL, "error = ?, lease_until = NULL, send_after = NULL, updated_at = ?",
            (self._clean(reason), t), "id = ?", (draft_id,)),),
            action="cancel", actor=SYSTEM, at=t, detail=lambda d, _: reason))

    async def attach(self, draft_id: int, version: int, paths: list[str], actor: str,
                     now: float | None = None) -> Draft | None:
        """📎 Attach: CAS on ``awaiting`` and ``version``: the files ``paths`` go with the
        reply from version + 1 on (status ``ready``: its card is re-rendered, and it
        needs its own approval). Audited."""
        t = self._now(now)
        names = ", ".join(p.rsplit("/", 1)[-1] for p in paths)
        return await self._change(Change((Step(
            ATTACH, "attached = ?, version = version + 1, updated_at = ?",
            (self._clean(json.dumps(paths)), t), "id = ? AND version = ?", (draft_id, version)),),
            action="attach", actor=actor, at=t,
            detail=lambda d, _: f"v{version} -> v{d.version}: {names}"))

    async def sent_since(self, pipeline: str, since: float) -> list[Draft]:
        """``pipeline``'s drafts sent at or after ``since`` (their ``updated_at``)."""
        return await self._select_drafts("pipeline = ? AND status = ? AND updated_at >= ?",
                                         (pipeline, Status.SENT, float(since)), "ORDER BY id")

    async def arrived_since(self, pipeline: str, since: float, limit: int = 5000) -> list[Draft]:
        """Items ``pipeline`` admitted after ``since`` (not follow-ups): where an answer
        from a recipient shows up, whatever the source."""
        return await self._select_drafts(
            "pipeline = ? AND scope <> ? AND created_at > ?", (pipeline, FOLLOWUP, float(since)),
            f"ORDER BY id LIMIT {int(limit)}")

    async def followups_of(self, pipeline: str, item_id: str) -> list[Draft]:
        """The follow-ups of ``item_id``, oldest first."""
        return await self._select_drafts("pipeline = ? AND scope = ? AND item_id = ?",
                                         (pipeline, FOLLOWUP, item_id))
