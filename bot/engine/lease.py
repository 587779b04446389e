"""Leases: which process holds what, and whether a holder is still alive.

A holder name is ``home:pid:nonce``; ``home`` is host name, boot id and pid namespace,
so two holders with the same home share a process table and a pid gone there is truly
gone. A process elsewhere is known alive only by its heartbeat: a lock row
``process:<holder>`` it renews every few seconds while it runs.

A pipeline lease (``pipeline:<name>``) is held by one tick at a time, in this process
and across hosts; it is short and renewed while held, so a process that dies holding
it blocks the others (or its own restart) for seconds, not minutes.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import socket
import time
import uuid
from pathlib import Path
from typing import Callable

from ..errors import StoreError, StoreUnavailable, describe_error
from ..store import Store
from ..store.base import HEARTBEAT_PREFIX

log = logging.getLogger("draftgate.engine")


@functools.lru_cache(maxsize=1)
def process_home() -> str:
    """Host name, boot and pid namespace of this process."""
    boot = ""
    with contextlib.suppress(OSError):
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()[:8]
    pidns = ""
    with contextlib.suppress(OSError):
        pidns = os.readlink("/proc/self/ns/pid").strip("pid:[]")
    return f"{socket.gethostname()}/{boot}/{pidns}"


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by someone else
    return True


def gone_here(holder: str, here: str | None = None) -> bool:
    """True if ``holder`` is a process of this machine and pid namespace (``here``,
    default :func:`process_home`), not this one, that no longer exists."""
    home, _, rest = holder.rpartition(":")[0].rpartition(":")
    try:
        pid = int(rest)
    except ValueError:
        return False
    return home == (here or process_home()) and pid != os.getpid() and not pid_alive(pid)


class Heartbeat:
    """The ``process:<holder>`` lease row of a running process, renewed every third of
    ``ttl`` until :meth:`stop`. Sends are begun only under a fresh one, so no other
    host takes a send in flight for abandoned."""

    def __init__(self, store: Store, holder: str, ttl: float, now: Callable[[], float | None]):
        self.store, self.holder, self.ttl, self._now = store, holder, ttl, now
        self.name = HEARTBEAT_PREFIX + holder
        self._task: asyncio.Task | None = None

    async def beat(self) -> None:
        """Renew it now (raises StoreError if that fails) and keep renewing it."""
        if not await self.store.try_lock(self.name, self.holder, self.ttl, now=self._now()):
            raise StoreError(f"could not record this process's heartbeat ({self.name})")
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._renew(), name="heartbeat")

    async def _renew(self) -> None:
        while True:  # until stop(): a failed renewal is retried, never given up
            await asyncio.sleep(self.ttl / 3)
            await renew_once(self.store, self.name, self.holder, self.ttl, self._now,
                             "renewing this process's heartbeat failed")

    async def stop(self) -> None:
        """Stop renewing and delete the row (nothing of this process is in flight)."""
        if self._task is None:
            return
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
        self._task = None
        with contextlib.suppress(Exception):
            await self.store.unlock(self.name, self.holder)


async def renew_once(store: Store, name: str, holder: str, ttl: float,
                now: Callable[[], float | None], failed: str) -> bool | None:
    """Renew lease ``name`` once: the store's answer, or None (logged with ``failed``)
    if it failed or did not answer within a third of ``ttl`` (a hung connection)."""
    try:
        return await asyncio.wait_for(store.try_lock(name, holder, ttl, now=now()), timeout=ttl / 3)
    except Exception as exc:
        # An unreachable store is reported once, by the loop (bot.engine.outage).
        log.log(logging.DEBUG if isinstance(exc, StoreUnavailable) else logging.WARNING,
                "%s: %s", failed, describe_error(exc))
        return None


class Leases:
    """The pipeline leases of this process (``holder``) and its heartbeat."""

    def __init__(self, store: Store, names, now: Callable[[], float | None],
                 spawn: Callable[..., asyncio.Task], home: str | None = None):
        """``home``: this process's machine (default :func:`process_home`); a
        simulation of several hosts in one machine gives each its own."""
        self.store, self.now, self._spawn = store, now, spawn
        self.home = home or process_home()
        self.holder = f"{self.home}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
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
                    except StoreUnavailable as exc:  # it runs out by itself (ttl)
                        log.debug("%s: releasing the pipeline lock: %s", pipeline, exc)
                    except Exception:
                        log.exception("%s: releasing the pipeline lock", pipeline)

    async def _holder_is_dead(self, name: str) -> bool:
        """If ``name`` is held by a process of this same machine and pid namespace
        that no longer exists (it was killed), release it now instead of waiting out
        its lease: a restart after a crash resumes at once. A holder elsewhere, or one
        whose pid is alive, is never touched."""
        holder = await self.store.lock_holder(name)
        if not holder or holder == self.holder or not gone_here(holder, self.home):
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
            ok = await renew_once(self.store, name, self.holder, self.ttl, self.now,
                             f"{name}: renewing the lock failed")
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
