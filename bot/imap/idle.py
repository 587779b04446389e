"""IMAP IDLE (RFC 2177): new mail starts a tick at once, between the scheduled ones.

One watcher per account and folder that an enabled ``imap`` source reads, on its own
connection (an IDLE holds its connection), and on several hosts only in the process
that holds the store lease ``idle:<account>:<folder>``. While IDLE runs the scheduled
ticks still run (a lost IDLE never loses mail), but one whose folder IDLE reported
no change since the last fetch sends nothing at all (:func:`quiet`). IDLE is renewed
(DONE, then IDLE again) well before the 29 minutes after which servers may drop it,
and every renewal makes the next tick poll once, so a server that never notifies
delays mail by one renewal at most. A broken IDLE marks the folder not quiet (ticks
poll as usual) and reconnects with backoff.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
import uuid
from dataclasses import dataclass
from typing import Callable

import aioimaplib

from ..config.imap import ImapAccount
from ..errors import describe_error
from .client import ImapClient

log = logging.getLogger("draftgate.imap")

RENEW = 24 * 60.0  # well inside RFC 2177's 29 minutes
LEASE_TTL = 60.0


@dataclass
class IdleState:
    """What a watcher knows about its folder, read by the source."""

    healthy: bool = False  # an IDLE is established and renewed in time
    dirty: bool = True  # something may have changed since the last fetch began


_STATES: dict[tuple[int, str], IdleState] = {}


def _key(account: ImapAccount, folder: str) -> tuple[int, str]:
    return id(account), folder  # one loaded configuration's account object


def quiet(account: ImapAccount, folder: str) -> bool:
    """True when IDLE watches ``folder`` and saw nothing since the last fetch: the
    fetch may skip the server. Calling it starts a new period (a push from now on
    makes the next call False)."""
    state = _STATES.get(_key(account, folder))
    if state is None or not state.healthy:
        return False
    was_dirty, state.dirty = state.dirty, False
    return not was_dirty


def unfinished(account: ImapAccount, folder: str) -> None:
    """The last fetch left mail behind (``max_per_tick``): the next one must look."""
    state = _STATES.get(_key(account, folder))
    if state is not None:
        state.dirty = True


class IdleWatcher:
    """See the module docstring. ``wake()`` is called when mail arrives."""

    def __init__(self, account: ImapAccount, folder: str, wake: Callable[[], None], store=None,
                 *, renew: float = RENEW, backoff: float = 1.0, max_backoff: float = 300.0,
                 clock: Callable[[], float] = time.time):
        self.account, self.folder, self.wake, self.store = account, folder, wake, store
        self.renew, self.backoff, self.max_backoff, self.clock = renew, backoff, max_backoff, clock
        self.state = IdleState()
        self.holder = f"{os.uname().nodename}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.lease = f"idle:{account.name}:{folder}"
        self.client: ImapClient | None = None
        self.renewals = 0  # IDLE commands sent (the bench reads it)

    async def run(self, stop: asyncio.Event) -> None:
        _STATES[_key(self.account, self.folder)] = self.state
        delay = self.backoff
        try:
            while not stop.is_set():
                if not await self._leased():
                    await _wait(stop, LEASE_TTL / 2)
                    continue
                try:
                    await self._watch(stop)
                    delay = self.backoff
                except asyncio.CancelledError:
                    raise
                except _NoIdle:
                    return  # the schedule alone, as for a server without IDLE
                except Exception as exc:
                    log.warning("imap %s: IDLE on %s broke (%s); the schedule goes on, "
                                "reconnecting in %gs", self.account.name, self.folder,
                                describe_error(exc), delay)
                    await _wait(stop, delay)
                    delay = min(delay * 2, self.max_backoff)
                finally:
                    self.state.healthy, self.state.dirty = False, True
                    await self._close()
        finally:
            _STATES.pop(_key(self.account, self.folder), None)
            if self.store is not None:
                try:
                    await self.store.unlock(self.lease, self.holder)
                except Exception as exc:
                    log.debug("releasing %s: %s", self.lease, exc)

    async def _leased(self) -> bool:
        if self.store is None:
            return True
        try:
            return bool(await self.store.try_lock(self.lease, self.holder, LEASE_TTL,
                                                  now=self.clock()))
        except Exception as exc:
            log.warning("imap %s: IDLE lease not readable: %s", self.account.name,
                        describe_error(exc))
            return False

    async def _watch(self, stop: asyncio.Event) -> None:
        self.client = ImapClient(self.account)
        await self.client.select(self.folder)
        if "IDLE" not in self.client.capabilities:
            log.info("imap %s: the server has no IDLE; polling on the schedule",
                     self.account.name)
            raise _NoIdle
        imap = self.client._imap
        assert imap is not None
        lost = asyncio.Event()
        imap.protocol.conn_lost_cb = lambda exc: lost.set()
        first = True
        while not stop.is_set():
            if not await self._leased():
                return
            mail = await self._idle_once(imap, lost, stop, first)
            first = False
            self.state.dirty = True  # a renewal, or mail: the next tick polls once
            if mail:
                log.info("imap %s: IDLE reports new mail in %s", self.account.name, self.folder)
                self.wake()

    async def _idle_once(self, imap, lost: asyncio.Event, stop: asyncio.Event,
                         first: bool = False) -> bool:
        """One IDLE until mail, the renewal time, a stop or a lost connection."""
        self.renewals += 1
        idle = await imap.idle_start(timeout=self.renew)
        self.state.healthy = True
        if first:
            # Mail that came while no IDLE watched (before it, or between a broken
            # connection and this one) sends no push: one tick looks now.
            self.state.dirty = True
            self.wake()
        mail = False
        try:
            while True:
                push = asyncio.ensure_future(imap.wait_server_push(timeout=self.renew + 60))
                broke = asyncio.ensure_future(lost.wait())
                stopping = asyncio.ensure_future(stop.wait())
                done, pending = await asyncio.wait({push, broke, stopping},
                                                   return_when=asyncio.FIRST_COMPLETED)
                for t in pending:
                    t.cancel()
                if broke in done:
                    raise ConnectionError("the server closed the IDLE connection")
                if stopping in done:
                    break
                lines = push.result()
                if lines == aioimaplib.STOP_WAIT_SERVER_PUSH:
                    break  # time to renew
                if any(b"EXISTS" in bytes(x) or b"RECENT" in bytes(x) for x in lines):
                    mail = True
                    break
        finally:
            if imap.has_pending_idle() and not lost.is_set():
                imap.idle_done()
                await asyncio.wait_for(idle, 10)
        return mail

    async def _close(self) -> None:
        client, self.client = self.client, None
        if client is not None:
            try:
                await asyncio.wait_for(client.close(), 5)
            except Exception as exc:
                log.debug("closing the IDLE connection: %s", exc)


class _NoIdle(Exception):
    pass


async def _wait(stop: asyncio.Event, seconds: float) -> None:
    try:
        await asyncio.wait_for(stop.wait(), timeout=seconds)
    except asyncio.TimeoutError:
        pass


def watchers(settings, store, wake: Callable[[str], None]) -> list[IdleWatcher]:
    """One watcher per account and folder of the enabled ``imap`` sources whose
    account has ``idle`` on; mail wakes every pipeline reading that folder."""
    from ..config.imap import ImapSourceOptions

    readers: dict[tuple[str, str], list[str]] = {}
    for p in settings.pipelines:
        o = p.source
        if p.enabled and isinstance(o, ImapSourceOptions) and o.account in settings.imap_accounts:
            account = settings.imap_accounts[o.account]
            if account.idle:
                readers.setdefault((o.account, o.folder or account.folder), []).append(p.name)
    def waker(names: list[str]) -> Callable[[], None]:
        def wake_all() -> None:
            for n in names:
                wake(n)
        return wake_all

    return [IdleWatcher(settings.imap_accounts[name], folder, waker(names), store)
            for (name, folder), names in readers.items()]
