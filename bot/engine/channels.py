"""What the operators see: each draft's card on its approval channel, and notices.

Every post, re-render and notice goes through here, best effort where it must be: a
card that cannot be posted waits in ``ready`` (the outbox), one that cannot be
updated is re-rendered later (``resync_cards``), a notice that fails is logged.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Callable

from ..config.load import PipelineConfig, Settings
from ..errors import ApprovalError, StoreUnavailable, describe_error
from ..models import Draft, RunCounts
from ..redact import scrub
from ..stages import ApprovalChannel, PostedRef
from ..store import Store

log = logging.getLogger("draftgate.engine")


class Channels:
    def __init__(self, settings: Settings, store: Store, channels: dict[str, ApprovalChannel],
                 clock: Callable[[], float]):
        self.settings, self.store, self.channels, self.clock = settings, store, channels, clock
        self._posting: set[tuple[int, int]] = set()  # (draft, version) being posted now
        # Cards posted whose message id the store could not take (it went away between
        # the post and the record): recorded at the next try instead of posted twice.
        self._unrecorded: dict[tuple[int, int], PostedRef] = {}
        self._notice_lock = asyncio.Lock()

    def channel(self, p: PipelineConfig) -> ApprovalChannel:
        name = p.approval.channel
        try:
            return self.channels[name]
        except KeyError:
            raise ApprovalError(f"pipeline {p.name}: approval channel {name!r} is not running") from None

    def ops_channel(self) -> ApprovalChannel | None:
        return self.channels.get("telegram") or next(iter(self.channels.values()), None)

    def running(self) -> list[ApprovalChannel]:
        """Each channel once (one may serve under several names)."""
        return list({id(c): c for c in self.channels.values()}.values())

    # -- cards ------------------------------------------------------------------------
    async def post_card(self, p: PipelineConfig, d: Draft) -> Draft | None:
        """Post (or re-render) the card of a ready draft; the draft afterwards, or
        None if the channel is unreachable (the draft waits in ready). A version whose
        card this process is posting already (a Regenerate's own drafting next to a
        tick's posting) is left to that post: one post per card, not two."""
        if (d.id, d.version) in self._posting:
            return d
        self._posting.add((d.id, d.version))
        try:
            channel = self.channel(p)
            ref = self._unrecorded.pop((d.id, d.version), None) or await channel.post(d)
            try:
                posted = await self.store.mark_posted(d.id, d.version, ref.chat,
                                                      ref.message_id, now=self.clock())
            except StoreUnavailable:
                self._unrecorded[(d.id, d.version)] = ref
                raise
        except ApprovalError as exc:
            log.warning("%s: cannot post #%d yet (%s); it waits in ready", p.name, d.id, exc)
            return None
        finally:
            self._posting.discard((d.id, d.version))
        if posted is None:
            # Meanwhile a tap adopted an earlier card of this draft (one whose post had
            # looked failed): the card just posted is a second one, so take it away.
            fresh = await self.store.get_draft(d.id)
            if (fresh is not None and fresh.approval_message_id is not None
                    and (fresh.approval_chat, fresh.approval_message_id)
                    != (ref.chat, ref.message_id)):
                await channel.discard(ref, fresh)
            return fresh or d
        # Outside the guard: it may post a new version.
        if await channel.on_posted(posted):
            return await self.store.get_draft(d.id) or posted
        return posted

    async def post_counted(self, p: PipelineConfig, d: Draft, counts: RunCounts) -> bool:
        """Post ``d``'s card and count it; False if the channel is unreachable."""
        if (d.id, d.version) in self._posting:
            return True  # a Regenerate or an Edit is posting it right now
        posted = await self.post_card(p, d)
        if posted is None:
            return False
        counts.posted += 1
        if posted.status == "sent":  # a channel that decides at once (demo mode)
            counts.sent += 1
        return True

    async def update_card(self, d: Draft | None) -> Draft | None:
        """Re-render ``d``'s card after a transition (None: there was none); ``d``."""
        if d is None:
            return None
        try:
            await self.channel(self.settings.pipeline(d.pipeline)).update(d)
        except Exception as exc:
            log.warning("%s #%d: could not update the card: %s", d.pipeline, d.id, describe_error(exc))
        return d

    async def resync_cards(self) -> None:
        """Cards whose last update failed are re-rendered until one succeeds."""
        for ch in self.running():
            try:
                await ch.resync_cards()
            except Exception as exc:  # an unreachable store is reported once, by the loop
                log.log(logging.DEBUG if isinstance(exc, StoreUnavailable) else logging.WARNING,
                        "re-rendering stale cards failed: %s", describe_error(exc))

    async def remind(self, p: PipelineConfig, d: Draft, text: str) -> None:
        """A reminder of ``d``'s undecided card, where the card is (best effort)."""
        try:  # a channel without cards has the base class's no-op
            await self.channel(p).remind(d, text)
        except Exception as exc:
            log.warning("%s #%d: could not send a reminder: %s", p.name, d.id, describe_error(exc))

    # -- notices ----------------------------------------------------------------------
    async def notify_once(self, tag: str, text: str, *, retry_draft: Draft | None = None) -> None:
        """Notify once per ``tag`` across restarts and hosts: the audit log remembers
        which notices went out."""
        key = f"notice|{tag}"
        async with self._notice_lock:
            try:
                if await self.store.audit_log(draft_key=key, limit=1):
                    return
                await self.store.audit("draftgate", "notice", draft_key=key, detail=scrub(text)[:300],
                                       now=self.clock())
            except Exception as exc:
                log.warning("could not record a notice (%s); sending it anyway",
                            describe_error(exc))
        await self.notify(text, retry_draft=retry_draft)

    async def notify(self, text: str, *, retry_draft: Draft | None = None) -> None:
        text = scrub(text)  # notices quote errors, which may quote an answer with a secret
        ch = self.ops_channel()
        if getattr(ch, "name", None) != "console":  # a console prints it: not twice
            log.info("notify: %s", text)
        if ch is None:
            return
        try:
            await ch.notify(text, retry_draft=retry_draft)
        except Exception as exc:
            log.warning("could not notify the operators: %s", describe_error(exc))
