"""Which process is this, is another one still alive, and the heartbeat that tells
other hosts so.

A holder name is ``home:pid:nonce``; ``home`` is host name, boot id and pid namespace,
so two holders with the same home share a process table and a pid gone there is truly
gone. A process elsewhere is known alive only by its heartbeat: a lock row
``process:<holder>`` it renews every few seconds while it runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import socket
from pathlib import Path
from typing import Callable

from .errors import StoreError
from .store import Store
from .store.base import HEARTBEAT_PREFIX

log = logging.getLogger("draftgate.process")


@functools.lru_cache(maxsize=1)
def process_home() -> str:
    """Host name, boot and pid namespace of this process. DRAFTGATE_TEST_HOST replaces
    it, so a test can run a process as if on another machine."""
    if os.environ.get("DRAFTGATE_TEST_HOST"):
        return os.environ["DRAFTGATE_TEST_HOST"]
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


def gone_here(holder: str) -> bool:
    """True if ``holder`` is a process of this machine and pid namespace, not this
    one, that no longer exists."""
    home, _, rest = holder.rpartition(":")[0].rpartition(":")
    try:
        pid = int(rest)
    except ValueError:
        return False
    return home == process_home() and pid != os.getpid() and not pid_alive(pid)


class Heartbeat:
    """The ``process:<holder>`` lease row of a running process, renewed every third of
    ``ttl`` until :meth:`stop`. Sends are begun only under a fresh one, so no other
    host takes a send in flight for abandoned."""

    def __init__(self, store: Store, holder: str, ttl: float,
                 now: Callable[[], float | None]):
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
            try:
                await asyncio.wait_for(self.store.try_lock(
                    self.name, self.holder, self.ttl, now=self._now()), timeout=self.ttl / 3)
            except Exception as exc:
                log.warning("renewing this process's heartbeat failed: %s",
                            " ".join(str(exc).split())[:300] or type(exc).__name__)

    async def stop(self) -> None:
        """Stop renewing and delete the row (nothing of this process is in flight)."""
        if self._task is None:
            return
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
        self._task = None
        with contextlib.suppress(Exception):
            await self.store.unlock(self.name, self.holder)
