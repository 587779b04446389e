"""The schedule: each pipeline's loop of ticks, kept alive, and the sweep's timer."""

from __future__ import annotations

import asyncio
import logging
from typing import Awaitable, Callable

from .. import scheduler
from ..clock import utc_day
from ..config.load import PipelineConfig, Settings
from ..errors import StoreUnavailable, describe_error
from ..models import RunCounts
from ..service import metrics
from ..store import Store, SweepResult
from .channels import Channels
from .outage import Outage
from .reminders import Reminders

log = logging.getLogger("draftgate.engine")


async def _stopped(stop: asyncio.Event, within: float) -> bool:
    """Wait up to ``within`` seconds; True if ``stop`` was set meanwhile."""
    try:
        await asyncio.wait_for(stop.wait(), timeout=within)
        return True
    except asyncio.TimeoutError:
        return False


class Loop:
    def __init__(self, settings: Settings, store: Store, operators: Channels,
                 tick: Callable[..., Awaitable[RunCounts]], clock: Callable[[], float],
                 reminders: Reminders | None = None, outage: Outage | None = None):
        self.settings, self.store, self.operators = settings, store, operators
        self._tick, self.clock, self.reminders = tick, clock, reminders
        # The store unreachable: every loop holds its ticks until it answers again.
        self.outage = outage or Outage(store.ping, operators.notify, clock,
                                       notify_after=settings.outage.notify_after)
        # Pipelines whose last fetch stopped at max_per_tick: their loop ticks again at
        # once instead of waiting for the next slot, in bounded steps.
        self.backlog: set[str] = set()
        # Set by an IMAP IDLE watcher when mail arrives: the pipeline ticks now.
        self.wake: dict[str, asyncio.Event] = {}

    async def run_forever(self, stop: asyncio.Event,
                          sweep: Callable[[], Awaitable[SweepResult]]) -> None:
        """Tick every pipeline on its schedule until ``stop`` is set. Pipelines run
        concurrently; a slow tick coalesces the slots it overran into one catch-up
        tick (the source's catch-up policy decides what that admits)."""
        loops = [asyncio.create_task(self.supervised(p, stop), name=f"loop:{p.name}")
                 for p in self.settings.pipelines if p.enabled]
        loops.append(asyncio.create_task(self._sweep_loop(stop, sweep), name="sweep"))
        if self.reminders is not None:  # reminders and the digest
            loops.append(asyncio.create_task(self.reminders.run(stop), name="reminders"))
        loops += [asyncio.create_task(w.run(stop), name=f"idle:{w.lease}")
                  for w in self._idle_watchers()]
        await stop.wait()
        for t in loops:
            t.cancel()
        await asyncio.gather(*loops, return_exceptions=True)
        await self.outage.close()

    def _idle_watchers(self) -> list:
        """IMAP IDLE watchers of the enabled imap sources (none without any)."""
        if not self.settings.imap_accounts:
            return []
        from ..imap.idle import watchers

        return watchers(self.settings, self.store,
                        lambda name: self.wake.setdefault(name, asyncio.Event()).set())

    async def _woken(self, p: PipelineConfig, stop: asyncio.Event, within: float) -> bool:
        """Wait up to ``within`` seconds for the next slot or an IDLE wake-up; True if
        ``stop`` was set meanwhile."""
        wake = self.wake.setdefault(p.name, asyncio.Event())
        waits = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(wake.wait())]
        try:
            await asyncio.wait(waits, timeout=within, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()
        wake.clear()
        return stop.is_set()

    async def supervised(self, p: PipelineConfig, stop: asyncio.Event,
                         restart_after: float = 60.0) -> None:
        """A pipeline's loop that cannot die silently: if its scheduling fails (a bug,
        a schedule that can never fire), the error is logged, the operators are told
        once a day, and the loop starts again a minute later."""
        while not stop.is_set():
            try:
                await self._pipeline_loop(p, stop)
                return
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.exception("%s: the pipeline loop failed; restarting it in %gs",
                              p.name, restart_after)
                await self.operators.notify_once(
                    f"loop|{p.name}|{utc_day(self.clock())}",
                    f"⚠️ {p.name}: its schedule stopped working ({describe_error(exc)}); "
                    f"retrying every minute. Check `schedule` in {p.file}.")
            metrics.loop_waiting(p, restart_after)
            if await _stopped(stop, restart_after):
                return

    async def _pipeline_loop(self, p: PipelineConfig, stop: asyncio.Event) -> None:
        due = scheduler.last_due(p, self.clock())  # catch up at start
        while not stop.is_set():
            wait = due - self.clock()
            metrics.loop_waiting(p, wait)
            if wait > 0 and await self._woken(p, stop, wait):
                return
            if not await self.outage.wait(p, stop):  # held while the store is unreachable
                return
            metrics.loop_busy(p.name)
            slot = scheduler.last_due(p, self.clock())
            try:
                if p.name in await self.store.paused():
                    log.debug("%s is paused", p.name)
                    self.backlog.discard(p.name)
                else:
                    # Drafting stops claiming one interval after the tick began: the
                    # next tick fetches new mail while the rest of the queue is drafted
                    # and posted, so the channel never waits on a fetch.
                    step = scheduler.next_due(p, slot) - slot
                    await self._tick(p.name, slot, until=self.clock() + step)
                self.outage.up()  # the store answered
            except asyncio.CancelledError:
                raise
            except StoreUnavailable as exc:
                # Said once, by the outage; the next tick runs as soon as the store is back.
                self.outage.down(exc)
                self.backlog.discard(p.name)
                due = self.clock()
                continue
            except Exception:
                log.exception("%s: tick crashed", p.name)
                self.backlog.discard(p.name)
            # More new items wait at the source (max_per_tick): the next bounded tick
            # runs now rather than at the next slot, so a flood drains steadily. A tick
            # that overran its interval is followed at once by one catch-up tick for
            # the slots it overran (not at the slot after them: the mail that came
            # meanwhile would wait up to a whole interval more, and the channel idle).
            due = self.clock() if p.name in self.backlog else scheduler.next_due(p, slot)

    async def _sweep_loop(self, stop: asyncio.Event,
                          sweep: Callable[[], Awaitable[SweepResult]]) -> None:
        while not stop.is_set():
            if await _stopped(stop, self.settings.sweep_every):
                return
            if self.outage.held():
                log.info("sweep skipped: %s", self.outage.held())
                continue
            try:
                result = await sweep()
                log.info("daily sweep: %s", result.to_dict())
            except StoreUnavailable as exc:
                log.warning("sweep failed: %s", describe_error(exc))
            except Exception:
                log.exception("sweep failed")
