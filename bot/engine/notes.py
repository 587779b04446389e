"""Style notes learned from edits (issue 25): distilling a proposal from a pipeline's
edit pairs (``draftgate memory distill``, or weekly with ``style_notes: weekly``) and
posting its card through the pipeline's approval channel (the outbox pattern: a
proposal made by the CLI is posted by the running draftgate at the pipeline's next
tick). Only a version an operator approved reaches a prompt (bot.engine.drafting)."""

from __future__ import annotations

import logging
from typing import Callable

from ..config.load import PipelineConfig, Settings
from ..drafters.distill import MAX_PAIRS, MIN_PAIRS
from ..drafters.distill import distill as distill_rules
from ..drafters.llm import LLMDrafter
from ..errors import DrafterSetupError, DraftgateError, StoreUnavailable, describe_error
from ..models import StyleNotes
from ..store import Store
from .build import build_model
from .channels import Channels

log = logging.getLogger("draftgate.notes")

WEEK = 7 * 86400.0
#: After a weekly distill failed (model trouble), the next try waits this long.
RETRY_AFTER = 86400.0


class TooFewEdits(DraftgateError):
    """Fewer edit pairs than style notes need."""


async def distill(settings: Settings, store: Store, p: PipelineConfig, actor: str,
                  now: float | None = None) -> StyleNotes:
    """A proposed version of ``p``'s notes from its newest edit pairs (audited, its
    tokens counted in the pipeline's usage). Raises :class:`TooFewEdits` below
    :data:`MIN_PAIRS`, DrafterError when the model gives no usable rules."""
    pairs = await store.edit_pairs(p.name, MAX_PAIRS)
    if len(pairs) < MIN_PAIRS:
        raise TooFewEdits(
            f"{p.name}: {len(pairs)} edited repl{'y' if len(pairs) == 1 else 'ies'} to learn "
            f"from; style notes need at least {MIN_PAIRS} (replies an operator edited and "
            f"sent, recorded since draftgate kept the first draft). Try again after more "
            f"edits.")
    llm = build_model(p, settings, p.drafter.model)
    if not isinstance(llm, LLMDrafter):
        raise DrafterSetupError(f"{p.file}: drafter.model: the template model cannot learn "
                                f"style notes; its drafts follow the template file")
    current = await store.approved_notes(p.name)
    try:
        rules, tokens = await distill_rules(llm, pairs, current.rules if current else [])
    finally:
        await llm.close()
    await store.add_tokens(p.name, tokens, now=now)
    return await store.add_notes(p.name, rules, actor, now=now,
                                 detail=f"{len(rules)} rule(s) from {len(pairs)} edit(s)")


class StyleNoteJobs:
    """At each tick of a pipeline: the weekly distill when due, then the cards of
    proposals not posted yet."""

    def __init__(self, settings: Settings, store: Store, channels: Channels,
                 clock: Callable[[], float]):
        self.settings, self.store, self.channels, self.clock = settings, store, channels, clock
        self._tried: dict[str, float] = {}

    async def tick(self, p: PipelineConfig) -> None:
        try:
            if p.style_notes == "weekly":
                await self._weekly(p)
            await self.post(p)
        except StoreUnavailable:
            raise  # the loop holds the ticks (bot.engine.outage)
        except Exception as exc:  # never the tick's failure: the mail goes on
            log.warning("%s: style notes: %s", p.name, describe_error(exc),
                        exc_info=not isinstance(exc, DraftgateError))

    async def _weekly(self, p: PipelineConfig) -> None:
        now = self.clock()
        last = await self.store.last_notes_at(p.name)
        if (last is not None and now - last < WEEK) or now - self._tried.get(p.name, -WEEK) < \
                RETRY_AFTER:
            return
        self._tried[p.name] = now
        try:
            notes = await distill(self.settings, self.store, p, "system (weekly)", now=now)
        except TooFewEdits as exc:
            log.info("%s", exc)
            return
        log.info("%s: style notes v%d proposed (%d rules)", p.name, notes.version,
                 len(notes.rules))

    async def post(self, p: PipelineConfig) -> None:
        """Post the cards of ``p``'s proposals that have none (a channel without style
        note cards, the console, leaves them to `draftgate memory notes`)."""
        channel = self.channels.channel(p)
        post = getattr(channel, "post_notes", None)
        if post is None:
            return
        for notes in await self.store.unposted_notes():
            if notes.pipeline != p.name:
                continue
            ref = await post(notes)
            await self.store.notes_posted(notes.id, ref.chat, ref.message_id)
