"""Operator decisions: approve, edit, regenerate, reject, retry a send; and the sweep.

The one owner of the transitions an operator causes (and the sweep's expiry of
approvals nobody decided) and of the card updates after them. Decisions do not wait for ticks: Approve sends at once, and a Regenerate's new
version is drafted at once by its own fenced claim (see _redraft).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Callable

from . import metrics
from .config import PipelineConfig, Settings
from .drafting import Drafting
from .errors import ConfigError, describe_error
from .models import AWAITING, EXPIRED, SEND_UNKNOWN, Draft, RunCounts
from .operators import Operators
from .ops import sweep
from .sending import Sends
from .stages import Sender
from .store import Store, SweepResult

#: The audit key under which a prompt message (chat, message id) records its draft.
PROMPT_KEY = "prompt|{chat}|{message_id}"

log = logging.getLogger("draftgate.engine")


class Decisions:
    """Implements :class:`bot.stages.Decisions`."""

    def __init__(self, settings: Settings, store: Store, operators: Operators, drafting: Drafting,
                 sends: Sends, sender: Callable[[PipelineConfig], Sender],
                 clock: Callable[[], float], spawn: Callable[..., asyncio.Task]):
        self.settings, self.store, self.operators = settings, store, operators
        self.drafting, self.sends, self._sender = drafting, sends, sender
        self.clock, self._spawn = clock, spawn

    async def _require_configured(self, draft_id: int, d: Draft | None = None) -> Draft | None:
        """The draft (``d`` if the caller read it already), refusing one whose pipeline
        left the configuration: it could be approved but never sent (no sender), a
        silent dead end. Reject still works."""
        if d is None or d.id != draft_id:
            d = await self.store.get_draft(draft_id)
        if d is not None and not self.settings.has_pipeline(d.pipeline):
            raise ConfigError(
                f"Pipeline {d.pipeline!r} is not configured any more: restore its YAML file "
                "and restart to act on this draft (Reject still works).")
        return d

    async def approve(self, draft_id: int, version: int, actor: str,
                      draft: Draft | None = None) -> Draft | None:
        """``draft``: the row the channel read to check the tap, so it is not read
        again; the CAS below is the check that it is still this version, awaiting."""
        await self._require_configured(draft_id, draft)
        d = await self.store.approve(draft_id, version, actor, now=self.clock())
        if d is None:
            return None
        metrics.decided(d, "approved")
        log.info("%s #%d v%d approved by %s", d.pipeline, d.id, d.version, actor)
        return await self.sends.send(d)

    async def edit(self, draft_id: int, version: int, body: str, actor: str) -> Draft | None:
        body = body.strip()
        if not body:
            return None
        await self._require_configured(draft_id)
        d = await self.store.edit(draft_id, version, body, actor, now=self.clock())
        if d is not None:
            await self.operators.post_card(self.settings.pipeline(d.pipeline), d)
            d = await self.store.get_draft(d.id)
        return d

    async def regenerate(self, draft_id: int, version: int, actor: str,
                         instruction: str = "") -> Draft | None:
        d = await self._require_configured(draft_id)
        if d is not None:
            await self.drafting.refuse_if_waiting(d)
        d = await self.store.regenerate(draft_id, version, actor, instruction, now=self.clock())
        if d is not None:
            self._spawn(self._redraft(d))
        return d

    async def _redraft(self, d: Draft) -> None:
        """Draft a regenerated version at once, on its own: an operator's decision does
        not wait for the pipeline's lock or behind a tick's bulk drafting (nor for a
        drafting slot: it is one call more than max_in_flight, for a moment). The
        claim is the same fenced CAS as a tick's, so exactly one of them drafts it: if
        a tick's worker claimed it first, that worker drafts and posts it."""
        p = self.settings.pipeline(d.pipeline)
        claimed = await self.store.claim_key(d.key, p.lease, now=self.clock())
        if claimed is None:
            return
        drafted: list[Draft] = []
        await self.drafting.draft_one(p, claimed, RunCounts(), drafted.append)
        for ready in drafted:  # a card that cannot be updated now waits in ready
            await self.operators.post_card(p, ready)

    async def reject(self, draft_id: int, version: int, actor: str, reason: str = "") -> Draft | None:
        d = await self.store.reject(draft_id, version, actor, reason, now=self.clock())
        metrics.decided(d, "rejected")
        return await self.operators.update_card(d)

    async def retry_send(self, draft_id: int, actor: str) -> Draft | None:
        d = await self._require_configured(draft_id)
        if d is not None and d.status == SEND_UNKNOWN:
            # Ask once more before sending again: a reply that did arrive meanwhile
            # must not go out twice because Retry was tapped before the check ran.
            try:
                found = await self._sender(self.settings.pipeline(d.pipeline)).check(d)
            except Exception as exc:  # cannot tell: the operator chose to send again
                log.info("#%d: check before Retry failed: %s", d.id, describe_error(exc))
                found = None
            if found and (after := await self.sends.found_sent(d, found)) is not None:
                log.info("#%d: Retry found the reply already sent (%s)", d.id, found)
                return after
        d = await self.store.retry_send(draft_id, actor, now=self.clock())
        return None if d is None else await self.sends.send(d)

    async def sweep(self, days: float | None,
                    lease_now: Callable[[], float | None]) -> SweepResult:
        now = self.clock()
        ttl = self.settings.approval_ttl_days
        # Cards of approvals the sweep is about to expire: re-rendered afterwards, so
        # their buttons go and they say why (the sweep itself is one SQL statement).
        due = [] if ttl is None else [
            d for d in await self.store.pending()
            if d.status == AWAITING and d.updated_at < now - ttl * 86400.0]
        # lease_now: on a shared store the sweep's lease expiry is the database's call.
        result = await sweep(self.store, self.settings, days=days, now=lease_now())
        for d in due:
            fresh = await self.store.get_draft(d.id)
            if fresh is not None and fresh.status == EXPIRED and self.settings.has_pipeline(d.pipeline):
                await self.operators.update_card(fresh)
        return result

    # -- what a channel reads and records (a channel never touches the store itself) -----
    async def draft(self, draft_id: int) -> Draft | None:
        """The draft as stored now (None: there is none)."""
        return await self.store.get_draft(draft_id)

    async def record_prompt(self, chat: int | str, message_id: int | str, record: str,
                            actor: str) -> None:
        """Remember what a prompt message asks about (``record``, the channel's own
        format), so a reply to it finds its draft, also after a restart."""
        await self.store.audit(actor, "prompt", detail=record,
                               draft_key=PROMPT_KEY.format(chat=chat, message_id=message_id))

    async def prompt_record(self, chat: int | str, message_id: int | str) -> str | None:
        """What :meth:`record_prompt` kept for that message (None: not a prompt)."""
        entries = await self.store.audit_log(
            draft_key=PROMPT_KEY.format(chat=chat, message_id=message_id), limit=1)
        return entries[0].detail if entries else None

    async def adopt_card(self, d: Draft, chat: str, message_id: str) -> Draft:
        """A card of ``d``'s version exists (an operator tapped it) though ``d`` still
        waits to be posted: Telegram delivered a post whose answer was lost. That card
        becomes its card, so no second one is posted. The draft afterwards."""
        adopted = await self.store.mark_posted(d.id, d.version, chat, message_id)
        if adopted is None:
            return await self.store.get_draft(d.id) or d
        log.info("#%d: adopted card %s/%s, whose post had looked failed", d.id, chat, message_id)
        return adopted

    async def card_stale(self, draft_id: int, stale: bool) -> None:
        """Remember (or forget) that ``draft_id``'s card shows an old state."""
        await self.store.mark_card_stale(draft_id, stale)

    async def stale_cards(self, limit: int = 50) -> list[Draft]:
        """Drafts whose card shows an old state, oldest first."""
        return await self.store.stale_cards(limit=limit)
