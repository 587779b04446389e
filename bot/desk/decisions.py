"""Operator decisions: approve (with a quorum), edit, regenerate, reject, retry a send,
draft on demand (/reply); and the sweep.

The one owner of the transitions an operator causes (and the sweep's expiry of
approvals nobody decided) and of the card updates after them. Who may decide is the
desk's check (:class:`bot.desk.desk.OperatorDesk`), made before any method here runs.
Decisions do not wait for ticks: Approve sends at once, and a Regenerate's new version
is drafted at once by its own fenced claim (see _redraft).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Callable

from .. import scheduler
from ..config.load import PipelineConfig, Settings
from ..context import grounded
from ..engine.channels import Channels
from ..engine.drafting import Drafting
from ..engine.sending import Sends
from ..errors import ConfigError, NeedsConfirmation, describe_error
from ..models import Draft, RunCounts, Status, operator_id, unsupported_of
from ..service import metrics
from ..stages import Sender
from ..store import Store, SweepResult
from .reports import sweep

log = logging.getLogger("draftgate.engine")


def send_after(p: PipelineConfig, now: float, later: str | None = None) -> float | None:
    """When a reply approved at ``now`` may be sent: the 🕘 Later choice ``later``, or
    after the undo window at the next sending hour; None: at once."""
    if later is not None:
        return scheduler.later(later, now, p.timezone)
    at = now + p.approval.undo
    if p.approval.send_hours is not None:
        at = scheduler.within_hours(p.approval.send_hours, at, p.timezone)
    return at if at > now else None


class Decisions:
    """The transitions of operator decisions (authorization is the desk's)."""

    def __init__(self, settings: Settings, store: Store, operators: Channels, drafting: Drafting,
                 sends: Sends, sender: Callable[[PipelineConfig], Sender],
                 clock: Callable[[], float], spawn: Callable[..., asyncio.Task]):
        self.settings, self.store, self.operators = settings, store, operators
        self.drafting, self.sends, self._sender = drafting, sends, sender
        self.clock, self._spawn = clock, spawn

    async def _decidable(self, draft_id: int, d: Draft | None = None) -> Draft | None:
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
                      draft: Draft | None = None, later: str | None = None,
                      confirmed: bool = False) -> Draft | None:
        """``draft``: the row the channel read to check the tap, so it is not read
        again; the CAS below is the check that it is still this version, awaiting.
        Below the pipeline's quorum the vote is recorded and the draft comes back
        still ``awaiting`` (None: the vote did not count, e.g. an old version).
        The deciding approval's send waits (``send_after``) for the pipeline's undo
        window and sending hours, or for ``later`` (a 🕘 Later choice: ``hour``,
        ``tomorrow``, ``monday``, by the pipeline's clock). Under ``grounding: confirm``
        a version with claims its sources do not support raises
        :class:`NeedsConfirmation` (nothing counted) unless ``confirmed``."""
        seen = await self._decidable(draft_id, draft)
        p = None if seen is None else self.settings.pipeline(seen.pipeline)
        same = seen is not None and seen.version == version
        claims = self._to_confirm(seen) if same and seen else []
        if claims and not confirmed:
            raise NeedsConfirmation(claims)
        quorum = 1 if p is None else p.approval.quorum
        now = self.clock()
        d = await self.store.approve(draft_id, version, actor, now=now, quorum=quorum,
                                     body=seen.body if same and seen else None,
                                     key=seen.key if seen else None,
                                     send_after=None if p is None else send_after(p, now, later),
                                     note="sent anyway: " + " · ".join(claims) if claims else "")
        if d is None:
            if quorum > 1 and seen is not None and any(
                    v.operator == operator_id(actor)
                    for v in await self.store.votes(draft_id, version)):
                return seen  # counted; the quorum is not met yet
            return None
        metrics.decided(d, "approved")
        log.info("%s #%d v%d approved by %s", d.pipeline, d.id, d.version, actor)
        if d.send_after is not None and d.send_after > self.clock():
            # Deferred (the undo window): the due-time loop sends it when it is due.
            self.sends.wake()
            return await self.operators.update_card(d)
        return await self.sends.send(d)

    async def undo(self, draft_id: int, version: int, actor: str) -> Draft | None:
        """Undo (or Cancel) a deferred send that has not begun: the draft awaits a
        decision again, same version, votes cleared (None: too late, or not this one)."""
        d = await self.store.undo(draft_id, version, actor, now=self.clock())
        if d is None:
            return None
        log.info("%s #%d v%d: send undone by %s", d.pipeline, d.id, d.version, actor)
        self.sends.wake()
        return await self.operators.update_card(d)

    def _to_confirm(self, d: Draft) -> list[str]:
        """The claims an Approve of ``d`` must confirm (``grounding: confirm``), or []."""
        if d.status != Status.AWAITING or not self.settings.has_pipeline(d.pipeline) or \
                self.settings.pipeline(d.pipeline).drafter.grounding != "confirm":
            return []
        return unsupported_of(d.used)

    @staticmethod
    async def votes_of(settings: Settings, store: Store, d: Draft) -> tuple[list[str], int]:
        """(who approved ``d``'s current version so far, the quorum), for its card."""
        quorum = settings.pipeline(d.pipeline).approval.quorum if settings.has_pipeline(
            d.pipeline) else 1
        if quorum <= 1 or d.status != Status.AWAITING:
            return [], quorum
        return [v.actor for v in await store.votes(d.id, d.version)], quorum

    # -- on demand: /reply ----------------------------------------------------
    async def reply(self, pipeline: str, item_id: str, instruction: str, actor: str) -> str:
        """/reply: draft (again) a reply to an admitted item, as a normal card, with the
        operator's ``instruction`` for the model. What happened, for the operator."""
        p = self.settings.pipeline(pipeline)  # ConfigError names the known ones
        found = await self.store.item_drafts(pipeline, item_id)
        if not found:
            await self.store.audit(actor, "reply", now=self.clock(),
                                   detail=f"not found: {pipeline} {item_id}")
            return (f"{pipeline} {item_id}: no such admitted item; /emails {pipeline} lists "
                    "the newest with their ids.")
        d = found[-1]  # the newest recipe's
        why = "it was sent already; a sent item is never drafted again" if d.status == Status.SENT \
            else None
        if why is None:
            await self.drafting.refuse_if_waiting(d)
            after = await self.store.redraft(d.id, actor, instruction, now=self.clock())
            if after is not None:
                if after.approval_message_id:  # its card says so until the new version is up
                    await self.operators.update_card(after)
                self._spawn(self._redraft(after))
                return f"✍️ {p.name} #{d.id}: drafting v{after.version}; its card follows."
            why = f"it is {d.status} now; wait for it to finish"
        await self.store.audit(actor, "reply", draft_key=d.key, now=self.clock(),
                               detail=f"refused: {why}")
        return f"{pipeline} {item_id}: not drafted: {why}."

    async def edit(self, draft_id: int, version: int, body: str, actor: str) -> Draft | None:
        body = body.strip()
        if not body:
            return None
        before = await self._decidable(draft_id)
        d = await self.store.edit(draft_id, version, body, actor, now=self.clock(),
                                  used=grounded.for_edit(self.settings, before, body))
        if d is not None:
            await self.operators.post_card(self.settings.pipeline(d.pipeline), d)
            d = await self.store.get_draft(d.id)
        return d

    async def regenerate(self, draft_id: int, version: int, actor: str,
                         instruction: str = "") -> Draft | None:
        if (d := await self._decidable(draft_id)) is not None:
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

    # -- FYI cards (triage said notify) --------------------------------------------------
    async def draft_reply(self, draft_id: int, version: int, actor: str) -> Draft | None:
        """Draft a reply on an FYI card: the item is drafted after all, without triage
        (a human asked), at once like a Regenerate; its card becomes the draft's card."""
        if (d := await self._decidable(draft_id)) is not None:
            await self.drafting.refuse_if_waiting(d)
        d = await self.store.draft_reply(draft_id, version, actor, now=self.clock())
        if d is not None:
            log.info("%s #%d: %s asked for a reply to an FYI", d.pipeline, d.id, actor)
            self._spawn(self._redraft(d))
        return d

    async def dismiss(self, draft_id: int, version: int, actor: str) -> Draft | None:
        """Dismiss an FYI card: the item ends there (audited; /replay drafts it)."""
        return await self.operators.update_card(
            await self.store.dismiss(draft_id, version, actor, now=self.clock()))

    async def retry_send(self, draft_id: int, actor: str) -> Draft | None:
        d = await self._decidable(draft_id)
        if d is not None and d.status == Status.SEND_UNKNOWN:
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

    async def check_send(self, draft_id: int, actor: str) -> tuple[Draft | None, str]:
        """Check again, on an unknown send's card: ask the mailbox; never sends."""
        d = await self._decidable(draft_id)
        if d is None or d.status != Status.SEND_UNKNOWN:
            return d, ""
        return await self.sends.check_again(d)

    async def mark_sent(self, draft_id: int, actor: str) -> Draft | None:
        """Mark as sent, on an unknown send's card: the operator saw it arrive."""
        d = await self._decidable(draft_id)
        if d is None or d.status != Status.SEND_UNKNOWN:
            return None
        return await self.operators.update_card(await self.store.mark_sent(
            draft_id, f"marked sent by {actor}", now=self.clock(), actor=actor))

    async def sweep(self, days: float | None, lease_now: Callable[[], float | None]) -> SweepResult:
        now = self.clock()
        ttl = self.settings.approval_ttl_days
        # Cards of approvals the sweep is about to expire: re-rendered afterwards, so
        # their buttons go and they say why (the sweep itself is one SQL statement).
        due = [] if ttl is None else [
            d for d in await self.store.pending()
            if d.status in (Status.AWAITING, Status.NOTIFIED) and d.updated_at < now - ttl * 86400.0]
        # lease_now: on a shared store the sweep's lease expiry is the database's call.
        result = await sweep(self.store, self.settings, days=days, now=lease_now())
        for d in due:
            fresh = await self.store.get_draft(d.id)
            if fresh is not None and fresh.status == Status.EXPIRED and self.settings.has_pipeline(d.pipeline):
                await self.operators.update_card(fresh)
        return result

    @staticmethod
    async def adopt(store: Store, d: Draft, chat: str, message_id: str, now: float) -> Draft:
        """A card of ``d``'s version exists (an operator tapped it) though ``d`` still
        waits to be posted: Telegram delivered a post whose answer was lost. That card
        becomes its card, so no second one is posted. The draft afterwards."""
        adopted = await store.mark_posted(d.id, d.version, chat, message_id, now=now)
        if adopted is None:
            return await store.get_draft(d.id) or d
        log.info("#%d: adopted card %s/%s, whose post had looked failed", d.id, chat, message_id)
        return adopted
