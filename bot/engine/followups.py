"""Follow-ups (issue 28): a sent reply whose recipient has not answered in the thread
within ``followup.after`` gets one follow-up work item, drafted and approved like any
other, up to ``followup.max`` per reply.

Each is a new work item keyed ``pipeline|followup|<item>|<n>`` (see
bot.store.followups_sql), so whichever tick, host or restart sees it due first queues
it, and nobody a second time. An answer is any item the source admitted after the
last send, from the recipient, in the same thread (Gmail thread id, References, or the
subject): it works for every mail source alike. It cancels what is pending of the
chain, with the reason, and ends it. Replies sent longer ago than the whole chain could
last plus 30 days (draftgate was down for weeks) are not followed up any more.
"""

from __future__ import annotations

import logging
import re
from typing import Callable

from .. import scheduler
from ..config.load import PipelineConfig, Settings
from ..models import Draft
from ..store import Store
from ..store.transitions import CANCEL
from .channels import Channels

log = logging.getLogger("draftgate.engine")

FOLLOWUP = "followup"  # the scope of follow-up items (bot.store.followups_sql.FOLLOWUP)
_RE = re.compile(r"^\s*((re|aw|sv|fwd?|wg)\s*:\s*)+", re.I)


def _subject(text: str) -> str:
    return " ".join(_RE.sub("", text or "").split()).lower()


def recipient(d: Draft) -> str:
    return (d.message.reply_to or d.message.from_addr).strip().lower()


def answer_to(last: Draft, arrivals: list[Draft]) -> Draft | None:
    """The first item among ``arrivals`` that answers ``last`` (sent): admitted after
    it was sent, from its recipient, in its thread."""
    m, who = last.message, recipient(last)
    for d in arrivals:
        a = d.message
        if d.created_at <= last.updated_at or a.kind != "email" or a.from_addr.strip().lower() != who:
            continue
        if (m.thread_id and a.thread_id == m.thread_id) or (
                m.message_id and m.message_id in a.references) or (
                _subject(a.subject) == _subject(m.subject)):
            return d
    return None


def due_at(p: PipelineConfig, sent_at: float) -> float:
    f = p.followup
    assert f is not None
    if f.working_days:
        return scheduler.after_working_days(sent_at, int(f.after // 86400), p.timezone)
    return sent_at + f.after


class Followups:
    def __init__(self, settings: Settings, store: Store, operators: Channels,
                 clock: Callable[[], float]):
        self.settings, self.store, self.operators, self.clock = settings, store, operators, clock

    async def check(self, p: PipelineConfig) -> int:
        """Queue the follow-ups of ``p`` that are due, and cancel those an answer made
        needless. How many were queued (by this call)."""
        f = p.followup
        if f is None:
            return 0
        now = self.clock()
        horizon = now - f.max * (f.after * 7 / 5 + 4 * 86400) - 30 * 86400
        chains: dict[str, Draft] = {}  # item -> its newest sent reply (or follow-up)
        for d in await self.store.sent_since(p.name, horizon):
            last = chains.get(d.item_id)
            if d.message.kind == "email" and (last is None or d.updated_at >= last.updated_at):
                chains[d.item_id] = d
        if not chains:
            return 0
        arrivals = await self.store.arrived_since(p.name, min(d.updated_at for d in chains.values()))
        queued = 0
        for item, last in chains.items():
            if (answer := answer_to(last, arrivals)) is not None:
                await self._cancel(p, item, answer)
                continue
            n = int(last.recipe) + 1 if last.scope == FOLLOWUP else 1
            if n > f.max or due_at(p, last.updated_at) > now:
                continue
            if await self._queue(p, last, n, now) is not None:
                queued += 1
        return queued

    async def _queue(self, p: PipelineConfig, last: Draft, n: int, now: float) -> Draft | None:
        f = p.followup
        assert f is not None
        m = last.message
        since = scheduler.local_label(last.updated_at, p.timezone).split()[0]
        line = f"↪️ Follow-up {n} of {f.max} to {m.from_name or recipient(last)} · no answer since {since}"
        instruction = (f"{f.instruction}\n\nThis is follow-up {n} of {f.max}. Our reply, "
                       f"sent {scheduler.local_label(last.updated_at, p.timezone)}, that was "
                       f"not answered:\n{last.body}")
        d = await self.store.queue_followup(p.name, last.item_id, n, m, instruction, line, now=now)
        if d is not None:
            log.info("%s: %s (#%d)", p.name, line, d.id)
        return d

    async def _cancel(self, p: PipelineConfig, item: str, answer: Draft) -> None:
        for d in await self.store.followups_of(p.name, item):
            if d.status not in CANCEL.src:
                continue
            when = scheduler.local_label(answer.created_at, p.timezone)
            reason = f"{answer.message.from_name or recipient(d)} answered ({when}): no follow-up needed"
            after = await self.store.cancel(d.id, reason, now=self.clock())
            if after is not None and after.approval_message_id:
                await self.operators.update_card(after)
            if after is not None:
                log.info("%s #%d: follow-up cancelled: %s", p.name, d.id, reason)

