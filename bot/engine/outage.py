"""A store that goes away, met as a service that expected it: ticks are held, not crashed.

A store call that fails with :class:`~bot.errors.StoreUnavailable` (the PostgreSQL
server down, the SQLite disk full) means every call would fail alike, so::

    ok --down()--> held: ONE warning; the pipelines' loops wait; /healthz says held,
                   /readyz 503; one task probes the store (ping), backing off
        probe answers --> the loops may tick again (still held)
            a tick reaches the store --up()--> ok: ONE info line with the length
            a tick fails again --down()--> held, quietly, probing again

A ping alone does not end an outage: a full SQLite disk still answers reads. The
operators are told once when an outage outlasts ``outage.notify_after`` and once when
it ends. Nothing is lost meanwhile: what a source listed but could not be admitted is
unseen and fetched again; a run the outage cut off is recorded when the store is back.

Nothing here writes to the store while it is down; the notices go to the approval
channel directly (:meth:`Operators.notify`), not through the audit log.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Awaitable, Callable

from ..config.load import PipelineConfig
from ..errors import describe_error
from ..service import metrics
from ..service.health import held_text, length

log = logging.getLogger("draftgate.engine")

#: Probing backs off from the first to the last delay (seconds), doubling.
PROBE_FIRST, PROBE_LAST = 0.5, 5.0
#: A held pipeline loop tells the health it is waiting, this many seconds at a time.
HOLD_STEP = 5.0


class Outage:
    """Whether this process finds the store reachable; shared by every loop."""

    def __init__(self, probe: Callable[[], Awaitable[object]],
                 notify: Callable[[str], Awaitable[None]], clock: Callable[[], float], *,
                 notify_after: float = 120.0, monotonic: Callable[[], float] = time.monotonic):
        self._probe, self._notify, self.clock = probe, notify, clock
        self.notify_after = notify_after
        self._monotonic = monotonic
        self.since: float | None = None  # when it began (the engine's clock); None: ok
        self.error = ""
        self._began = 0.0  # the same, monotonic
        self._clear = asyncio.Event()  # set while ticks may run (ok, or probing by a tick)
        self._clear.set()
        self._watcher: asyncio.Task | None = None
        self._told = False  # the operators heard of this outage
        self._later: list[Callable[[], Awaitable[object]]] = []

    def held(self) -> str | None:
        """``store unreachable since …`` while held, else None."""
        return None if self.since is None else held_text(self.since, self.clock(), self.error)

    def down(self, exc: BaseException) -> None:
        """A store call failed with StoreUnavailable: hold the ticks (warned once)."""
        self.error = describe_error(exc)
        self._clear.clear()
        if self.since is not None:
            log.debug("store still unreachable: %s", self.error)
            return
        self.since, self._began = self.clock(), self._monotonic()
        log.warning("store unreachable: %s. Ticks are held until it answers; mail waits "
                    "at its source and nothing is lost", self.error)
        metrics.store_held(self.since, self.error)
        self._watcher = asyncio.create_task(self._watch(), name="store-outage")

    def up(self) -> None:
        """A tick reached the store: the outage, if any, is over."""
        if self.since is None:
            return
        took = length(self._monotonic() - self._began)
        self.since = None
        self._clear.set()
        metrics.store_held(None)
        log.info("store is back after %s; ticks resume", took)
        later, self._later = self._later, []
        told, self._told = self._told, False
        self._watcher = asyncio.create_task(self._back(took, told, later), name="store-back")

    def after_outage(self, record: Callable[[], Awaitable[object]]) -> None:
        """Run ``record`` (a store write the outage prevented) once the store is back."""
        self._later.append(record)

    async def wait(self, p: PipelineConfig, stop: asyncio.Event) -> bool:
        """Until ``p``'s loop may tick (True) or ``stop`` is set (False). A held loop
        reports itself waiting, a step at a time: it is held, not stuck."""
        while not self._clear.is_set():
            metrics.loop_waiting(p, HOLD_STEP)
            waits = [asyncio.ensure_future(e.wait()) for e in (self._clear, stop)]
            await asyncio.wait(waits, timeout=HOLD_STEP, return_when=asyncio.FIRST_COMPLETED)
            for w in waits:
                w.cancel()
            if stop.is_set():
                return False
        return not stop.is_set()

    async def close(self) -> None:
        if self._watcher is not None:
            self._watcher.cancel()
            await asyncio.gather(self._watcher, return_exceptions=True)

    # -- the watcher ---------------------------------------------------------------------
    async def _watch(self) -> None:
        """Probe the store, backing off, while held; tell the operators once past
        ``notify_after``. A probe that answers lets the loops try a tick."""
        delay = PROBE_FIRST
        while self.since is not None:
            due = self._began + self.notify_after - self._monotonic()
            await asyncio.sleep(max(0.0, min(delay, due) if not self._told else delay))
            if self.since is None:
                return
            if not self._told and self._monotonic() - self._began >= self.notify_after:
                self._told = True
                await self._say(f"⚠️ The store is unreachable since {self._since_text()}: "
                                f"{self.error}. Ticks are held and retried by themselves; new "
                                f"mail waits at its source and nothing is lost.")
            if self._clear.is_set():
                continue  # a tick is trying the store
            try:
                await asyncio.wait_for(self._probe(), PROBE_LAST * 2)
            except Exception as exc:
                self.error = describe_error(exc) if not isinstance(
                    exc, asyncio.TimeoutError) else self.error
                delay = min(delay * 2, PROBE_LAST)
                continue
            self._clear.set()  # a tick decides: up() or down() again
            delay = min(delay * 2, PROBE_LAST)

    async def _back(self, took: str, told: bool,
                    later: list[Callable[[], Awaitable[object]]]) -> None:
        for record in later:
            try:
                await record()
            except Exception as exc:
                log.debug("recording a run the outage cut off failed: %s", describe_error(exc))
        if told:
            await self._say(f"✅ The store is back after {took}; ticks resume, and mail that "
                            f"came meanwhile is drafted now.")

    def _since_text(self) -> str:
        text = self.held() or ""
        return text.removeprefix("store unreachable since ").split(": ", 1)[0]

    async def _say(self, text: str) -> None:
        try:
            await self._notify(text)
        except Exception as exc:  # notify logs its own failures; this is a last resort
            log.warning("could not tell the operators about the store: %s", describe_error(exc))
