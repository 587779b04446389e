"""The team desk's timers: reminders of cards nobody decided, and the daily digest.

Both are notices that must go out once, whatever restarts or hosts there are: each is
claimed first as a unique row in the store (``claim_notice``), then sent. A reminder is
claimed only while its draft's version still awaits a decision, so none follows a
decision. A claim whose send then fails is not repeated (once beats twice).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Callable

from .. import scheduler, scoreboard
from ..config.load import PipelineConfig, Settings
from ..errors import StoreUnavailable, describe_error
from ..models import Draft, Status
from ..store import Store
from .channels import Channels

log = logging.getLogger("draftgate.engine")

#: Reminders per card version at most: after the third, the card waits in /pending.
MAX_REMINDERS = 3
#: A digest slot missed by more than this (draftgate was down) is skipped, not sent late.
DIGEST_GRACE = 3600.0
#: The window of the digest's scoreboard line (and of the /metrics scoreboard gauges).
DIGEST_DAYS = 30
_RUNS = 5000  # runs read for one digest period (a 1m schedule makes 1,440 a day)


def _age(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit}"
    return f"{seconds:.0f}s"


def _k(n: int) -> str:
    return f"{n / 1000:.1f}k" if n >= 10_000 else str(n)


class Reminders:
    def __init__(self, settings: Settings, store: Store, operators: Channels,
                 clock: Callable[[], float]):
        self.settings, self.store, self.operators, self.clock = settings, store, operators, clock

    @property
    def every(self) -> float | None:
        """How often :meth:`run` looks for due reminders and digests (None: nothing to do)."""
        waits = [p.approval.remind_after for p in self.settings.pipelines
                 if p.approval.remind_after]
        digest = self.settings.telegram is not None and self.settings.telegram.digest
        if not waits and not digest:
            return None
        return max(1.0, min([w / 2 for w in waits] + [60.0]))

    async def run(self, stop: asyncio.Event) -> None:
        """Remind and digest every :attr:`every` seconds until ``stop`` is set."""
        every = self.every
        while every is not None and not stop.is_set():
            try:
                await self.remind()
                await self.digest()
            except Exception as exc:  # an unreachable store is reported once, by the loop
                log.log(logging.DEBUG if isinstance(exc, StoreUnavailable) else logging.WARNING,
                        "reminders and digest: %s", describe_error(exc))
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=every)

    # -- reminders ------------------------------------------------------------------------
    async def remind(self) -> int:
        """One pass: a card undecided for n x ``remind_after`` (n up to 3) gets its n-th
        reminder, once. Returns how many were sent."""
        sent = 0
        for p in self.settings.pipelines:
            if p.approval.remind_after:
                for d in await self.store.pending(p.name):
                    sent += await self._remind(p, d, p.approval.remind_after)
        return sent

    async def _remind(self, p: PipelineConfig, d: Draft, every: float) -> int:
        now = self.clock()
        n = min(MAX_REMINDERS, int((now - d.updated_at) // every))
        if d.status != Status.AWAITING or n < 1 or not await self.store.claim_notice(
                f"remind|{d.id}|{d.version}|{n}", now, draft_id=d.id, version=d.version):
            return 0
        waited = _age(now - d.updated_at)
        last = " (last reminder)" if n == MAX_REMINDERS else ""
        await self.operators.remind(p, d, f"⏰ #{d.id} v{d.version} has waited {waited} for a "
                                          f"decision: reminder {n} of {MAX_REMINDERS}{last}.")
        return 1

    # -- the digest -----------------------------------------------------------------------
    async def digest(self) -> bool:
        """Send the digest of the newest ``telegram.digest`` slot, once per slot; True
        if this call sent it."""
        cron = self.settings.telegram.digest if self.settings.telegram else None
        if not cron:
            return False
        tz = self.settings.telegram.timezone if self.settings.telegram else "UTC"
        now, schedule = self.clock(), scheduler.Cron(cron, tz)
        slot = scheduler.last_due(schedule, now)
        if now - slot > DIGEST_GRACE or not await self.store.claim_notice(
                f"digest|{scheduler.slot_id(slot, tz=tz)}", now):
            return False
        since = scheduler.last_due(schedule, slot - 1)
        await self.operators.notify(await self.digest_text(since, slot, now, tz))
        return True

    async def digest_text(self, since: float, until: float, now: float, tz: str = "UTC") -> str:
        """One message: per pipeline, drafts made, sent, rejected, failed, still
        waiting (the oldest's age) and tokens in ``[since, until)``; the period in
        ``tz`` (``telegram.timezone``), named in the header."""
        lines = [f"📊 Digest {scheduler.slot_id(since, '%d %b %H:%M', tz=tz)} – "
                 f"{scheduler.slot_id(until, '%d %b %H:%M', tz=tz)} {tz}"]
        for p in self.settings.pipelines:
            runs = [r for r in await self.store.recent_runs(p.name, limit=_RUNS)
                    if since <= r.started_at < until]
            made = sum(r.counts.get("drafted", 0) for r in runs)
            tokens = sum(r.counts.get("tokens", 0) for r in runs)
            prefix = f"{p.name}|"
            sent = await self.store.count_audit("sent", prefix, since, until)
            rejected = await self.store.count_audit("reject", prefix, since, until)
            failed = sum(1 for d in await self.store.recent(p.name, (Status.FAILED, Status.SEND_FAILED), 1000)
                         if since <= d.updated_at < until)
            waiting = [d for d in await self.store.pending(p.name) if d.status == Status.AWAITING]
            oldest = f" (oldest {_age(now - min(d.updated_at for d in waiting))})" \
                if waiting else ""
            lines.append(f"{p.name}: drafted {made} · sent {sent} · rejected {rejected} · "
                         f"failed {failed} · waiting {len(waiting)}{oldest} · tokens {_k(tokens)}")
        lines.append(await self.scoreboard_line(until))
        return "\n".join(lines)

    async def scoreboard_line(self, until: float) -> str:
        """The digest's line of the scoreboard: every pipeline, the DIGEST_DAYS before
        ``until`` (what `draftgate stats --since 30d` shows in full)."""
        since = until - DIGEST_DAYS * scoreboard.DAY
        decisions, overrides = await self.store.quality(since, until)
        board = await asyncio.to_thread(scoreboard.build, decisions, overrides, since=since,
                                        until=until)
        return f"📈 last {DIGEST_DAYS} days: {scoreboard.figures_line(board.total)}"
