"""Pipeline leases: one holder of a pipeline at a time, in this process and across hosts.

A lease is a short row in the store's lock table, renewed while held, so a process
that dies holding it blocks the others (or its own restart) for seconds, not minutes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
import uuid
from typing import Callable

from .errors import StoreError, describe_error
from .process import Heartbeat, gone_here, process_home
from .store import Store

log = logging.getLogger("draftgate.engine")


class Leases:
    """The pipeline leases of this process (``holder``) and its heartbeat."""

    def __init__(self, store: Store, names, now: Callable[[], float | None],
                 spawn: Callable[..., asyncio.Task]):
        self.store, self.now, self._spawn = store, now, spawn
        self.holder = f"{process_home()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.ttl = 15.0
        self._locks = {name: asyncio.Lock() for name in names}
        self.lost: dict[str, asyncio.Event] = {}  # set when a held lease is lost
        self.heartbeat = Heartbeat(store, self.holder, self.ttl, now)

    @contextlib.asynccontextmanager
    async def hold(self, pipeline: str):
        """Held while fetching, drafting and posting for ``pipeline``: one holder per
        pipeline in this process (asyncio lock) and across hosts (the lease row).
        Yields whether it is held (False: another process runs the pipeline)."""
        name = f"pipeline:{pipeline}"
        async with self._locks[pipeline]:
            held = await self.store.try_lock(name, self.holder, self.ttl, now=self.now())
            if not held and await self._holder_is_dead(name):
                held = await self.store.try_lock(name, self.holder, self.ttl, now=self.now())
            lost = self.lost[pipeline] = asyncio.Event()
            renew = self._spawn(self._renew(name, lost)) if held else None
            try:
                yield held
            finally:
                if renew is not None:
                    renew.cancel()
                    await asyncio.gather(renew, return_exceptions=True)
                if held:
                    try:
                        await self.store.unlock(name, self.holder)
                    except Exception:
                        log.exception("%s: releasing the pipeline lock", pipeline)

    async def _holder_is_dead(self, name: str) -> bool:
        """If ``name`` is held by a process of this same machine and pid namespace
        that no longer exists (it was killed), release it now instead of waiting out
        its lease: a restart after a crash resumes at once. A holder elsewhere, or one
        whose pid is alive, is never touched."""
        holder = await self.store.lock_holder(name)
        if not holder or holder == self.holder or not gone_here(holder):
            return False
        log.warning("%s: held by %s, a process of this machine that is gone; taking it over",
                    name, holder)
        await self.store.unlock(name, holder)
        return True

    async def _renew(self, name: str, lost: asyncio.Event) -> None:
        """Renew the lease every third of its life. A failed renewal is retried; once
        the lease may have run out (or another process holds it), ``lost`` is set and
        the tick stops at its next step, so two ticks of a pipeline never overlap."""
        renewed = time.monotonic()
        while True:
            await asyncio.sleep(self.ttl / 3)
            try:
                # Bounded: a hung store connection must count as a failed renewal.
                ok: bool | None = await asyncio.wait_for(
                    self.store.try_lock(name, self.holder, self.ttl, now=self.now()),
                    timeout=self.ttl / 3)
            except Exception as exc:
                ok = None
                log.warning("%s: renewing the lock failed: %s", name, describe_error(exc))
            if ok:
                renewed = time.monotonic()
                continue
            if ok is False or time.monotonic() - renewed > self.ttl * 0.75:
                log.warning("%s: lost the lock; this tick stops at its next step", name)
                lost.set()
                return

    def is_lost(self, pipeline: str) -> bool:
        lost = self.lost.get(pipeline)
        return lost is not None and lost.is_set()

    def still_held(self, pipeline: str) -> None:
        """Raise if the pipeline's lease was lost during this tick (see _renew)."""
        if self.is_lost(pipeline):
            raise StoreError(f"{pipeline}: lost the pipeline lock (the store did not renew it "
                             "in time); the tick stopped so that no other tick overlaps it")
