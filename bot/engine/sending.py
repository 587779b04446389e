"""Sending approved drafts, and finding out what became of a send that ended unknown.

A send is begun only under a fresh heartbeat of this process; one whose outcome is
unknown is checked on the other side, never sent again by itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from functools import partial
from typing import Awaitable, Callable

from ..config.load import PipelineConfig, Settings
from ..errors import SendFailed, SendUnknown, StoreUnavailable, describe_error
from ..models import Draft, RunCounts, Status
from ..service import logfmt, metrics
from ..stages import Sender
from ..store import Store
from .channels import Channels
from .lease import Leases, gone_here

log = logging.getLogger("draftgate.engine")

#: How the error text of a send cut off by a crash (recover) or a shutdown begins:
#: such a row is checked at once by whoever runs next, unlike a send that has just
#: ended unknown in a running process (that process checks it after a delay).
RECOVERED_SEND = "interrupted"


class Sends:
    def __init__(self, settings: Settings, store: Store, leases: Leases, operators: Channels,
                 sender: Callable[[PipelineConfig], Sender], clock: Callable[[], float],
                 spawn: Callable[..., asyncio.Task], check_delay: float):
        self.settings, self.store, self.leases, self.operators = settings, store, leases, operators
        self._sender, self.clock, self._spawn, self.check_delay = sender, clock, spawn, check_delay
        # Unknown sends this process's _check_later tasks will check: id -> (pipeline, task).
        self._checking: dict[int, tuple[str, asyncio.Task]] = {}
        # Send outcomes the store could not take (it was unreachable): id -> the write.
        self._unrecorded: dict[int, Callable[[], Awaitable[Draft | None]]] = {}
        # Only for `sending` rows with no send_holder (begun by a version that did not
        # record one): longer than any one send call can last, since such a row may be
        # another host's send in flight. Rows with a holder are recovered as soon as
        # that process is seen gone (see recover).
        self.grace = 300.0
        # The due-time loop (run_due): woken at once when a deferred send is approved
        # here, and polling at most every ``poll`` seconds for other hosts' ones.
        self.poll = 30.0
        self._asked = 0  # wake-ups asked for (wake's ticket numbers)
        self.due_served = 0  # the newest ticket a whole pass of run_due began after
        self._wake = asyncio.Event()

    async def _recorded(self, draft_id: int,
                        write: Callable[[], Awaitable[Draft | None]]) -> Draft | None:
        """A send's outcome written to the store. If the store is unreachable the write
        is kept, and made first at the next tick: the row stays ``sending`` meanwhile
        (this process's, so no other takes it while its heartbeat lives), and is never
        sent again for it."""
        try:
            return await write()
        except StoreUnavailable:
            self._unrecorded[draft_id] = write
            raise

    async def send_approved(self, p: PipelineConfig, counts: RunCounts) -> None:
        for draft_id, write in list(self._unrecorded.items()):  # outcomes an outage held
            await self.operators.update_card(await write())
            del self._unrecorded[draft_id]
        # Approved but never begun: the process stopped between approve and send. A
        # human approved exactly this version, so sending it now keeps the promise.
        for d in await self.store.approved(p.name, now=self.clock()):
            self.leases.still_held(p.name)
            after = await self.send(d)
            if after is not None and after.status == "sent":
                counts.sent += 1

    @logfmt.about_draft
    async def send(self, d: Draft) -> Draft | None:
        p = self.settings.pipeline(d.pipeline)
        sender = self._sender(p)  # built before `sending`: a bad sender sends nothing
        await self.leases.heartbeat.beat()  # a send begins only under a fresh heartbeat
        sending = await self.store.begin_send(d.id, self.leases.holder, now=self.clock())
        if sending is None:
            return await self.store.get_draft(d.id)
        try:
            result = await sender.send(sending)
        except SendFailed as exc:
            after = await self._recorded(d.id, partial(self.store.mark_send_failed, d.id,
                                                       describe_error(exc)))
            log.warning("%s #%d: send failed: %s", p.name, d.id, exc)
        except asyncio.CancelledError:
            # Stopped mid-call (SIGTERM): it may have gone out. Recorded as unknown, so
            # the next start checks it instead of sending it again, and shown on the
            # card now (bounded: the stop must not wait on an unreachable channel).
            after = await asyncio.shield(self.store.mark_send_unknown(d.id, "interrupted during send"))
            log.warning("%s #%d: stopped during the send; it may have gone out, the next "
                        "start checks", p.name, d.id)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.shield(self.operators.update_card(after)), 5)
            raise
        except Exception as exc:
            # Timeouts, resets, 5xx and anything unexpected: it may have gone out.
            reason = describe_error(exc)
            if not isinstance(exc, SendUnknown):
                log.exception("%s #%d: unexpected error while sending", p.name, d.id)
            after = await self._recorded(d.id, partial(self.store.mark_send_unknown, d.id, reason))
            # Registered before the task runs: this tick's check_unknown must leave it.
            self._checking[d.id] = (p.name, self._spawn(self._check_later(d.id)))
        else:
            after = await self._recorded(d.id, partial(self.store.mark_sent, d.id, result.sent_id,
                                                       now=self.clock()))
            log.info("%s #%d sent (%s)", p.name, d.id, result.sent_id)
        metrics.sent(after)
        return await self.operators.update_card(after)

    # -- deferred sends (undo window, send later, sending hours) -----------------------
    def wake(self) -> int:
        """A deferred send was approved (or undone) here: :meth:`run_due` looks again
        now. Its ticket: :attr:`due_served` reaches it once a pass has looked."""
        self._asked += 1
        self._wake.set()
        return self._asked

    async def send_due(self) -> int:
        """Send every deferred draft whose ``send_after`` has passed, of any pipeline
        (any host may: the claim is the store's CAS). How many were sent."""
        n = 0
        for d in await self.store.due_sends(now=self.clock()):
            if not self.settings.has_pipeline(d.pipeline):
                continue  # its pipeline left the configuration: it waits for it
            after = await self.send(d)
            n += (after is not None and after.status == Status.SENT
                  and after.send_holder == self.leases.holder)  # sent here, not by another
        return n

    async def run_due(self) -> None:
        """The due-time loop: sends each deferred draft when its time comes, waking at
        the earliest ``send_after`` in the store (so a restart, or another host's
        approval, is picked up: at start, and at least every :attr:`poll` seconds)."""
        while True:
            asked = self._asked
            self._wake.clear()
            upcoming = None
            try:
                await self.send_due()
                upcoming = await self.store.next_send_after(after=self.clock())
            except asyncio.CancelledError:
                raise
            except StoreUnavailable as exc:
                log.warning("deferred sends: %s", describe_error(exc))
            except Exception:
                log.exception("deferred sends failed; trying again")
            self.due_served = asked
            wait = self.poll if upcoming is None else min(self.poll, upcoming - self.clock())
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._wake.wait(), max(wait, 0.01))

    async def found_sent(self, d: Draft, sent_id: str) -> Draft | None:
        """The other side has the reply: mark it sent and show it on the card."""
        return await self.operators.update_card(
            await self.store.mark_sent(d.id, sent_id, now=self.clock()))

    async def check_again(self, d: Draft) -> tuple[Draft | None, str]:
        """An operator's Check again on an unknown send: ask the other side once more
        (never sends). The draft after it, and what to tell the operator."""
        try:
            found = await self._sender(self.settings.pipeline(d.pipeline)).check(d)
        except SendUnknown as exc:
            return d, f"❓ Still unknown: {exc}"[:190]
        except Exception as exc:
            return d, f"❓ Could not check: {describe_error(exc)}"[:190]
        if found:
            return await self.found_sent(d, found), "✅ Found it in the mailbox: marked sent."
        return d, "Not in the mailbox: it was not sent. Send again sends it."

    async def _check_later(self, draft_id: int) -> None:
        try:
            await asyncio.sleep(self.check_delay)
            d = await self.store.get_draft(draft_id)
            if d is not None and d.status == Status.SEND_UNKNOWN:
                await self._check_one(self.settings.pipeline(d.pipeline), d)
        finally:
            if self._checking.get(draft_id, ("", None))[1] is asyncio.current_task():
                del self._checking[draft_id]

    async def checks_done(self, p: PipelineConfig) -> None:
        """Wait for this process's delayed checks of ``p``'s unknown sends."""
        while pending := [t for name, t in list(self._checking.values())
                          if name == p.name and not t.done()]:
            await asyncio.gather(*pending, return_exceptions=True)

    async def recover(self) -> None:
        """Sends whose process is gone -> send_unknown, to be checked before anything
        is sent again. A sender of this machine is gone when its pid is (seen at once,
        e.g. on the restart after a SIGKILL); one elsewhere when its heartbeat lapses
        (the lease ttl). A send in flight in a live process is never touched. Run at
        start and on every tick."""
        holder = self.leases.holder
        dead = [h for h in await self.store.sending_holders() if h != holder and gone_here(h, self.leases.home)]
        stuck = await self.store.recover_abandoned_sends(
            dead=dead, alive=holder, grace=self.grace, now=self.leases.now())
        if stuck:
            log.warning("%d draft(s) were left mid-send by a stopped process; marked "
                        "send_unknown and will be checked before anything is sent again", stuck)

    async def check_unknown(self, p: PipelineConfig, counts: RunCounts) -> None:
        await self.recover()
        for d in await self.store.send_unknown(p.name):
            # A send that just ended unknown (here or in another process) is checked
            # by that process's _check_later after a delay; asked at once, the other
            # side may not show it yet and the operator would be told "not sent, tap
            # Retry" about a reply that did go out. One recovered after a crash or a
            # restart is checked now.
            if d.id in self._checking or (
                    time.time() - d.updated_at < self.check_delay
                    and not (d.error or "").startswith(RECOVERED_SEND)):
                continue  # (another process's fresh unknown send: its own check runs)
            self.leases.still_held(p.name)
            if await self._check_one(p, d):
                counts.sent += 1

    async def _check_one(self, p: PipelineConfig, d: Draft) -> bool:
        """Ask the other side whether an unknown send arrived. Never resends."""
        try:
            found = await self._sender(p).check(d)
        except SendUnknown as exc:
            log.info("%s #%d: outcome still unknown: %s", p.name, d.id, exc)
            await self.operators.notify_once(
                _unknown_episode(d),
                f"❓ {p.name} #{d.id}: cannot tell whether the reply was sent ({d.error}; "
                f"{exc}). Check the mailbox; Retry sends it again.", retry_draft=d)
            return False
        except Exception as exc:
            log.warning("%s #%d: checking the send failed: %s", p.name, d.id, describe_error(exc))
            return False
        if found:
            return await self.found_sent(d, found) is not None
        await self.operators.notify_once(
            _unknown_episode(d),
            f"❓ {p.name} #{d.id}: the send timed out or failed midway ({d.error}) and the "
            f"message is not in Sent. Nothing was resent; tap Retry to send it.", retry_draft=d)
        return False


def _unknown_episode(d: Draft) -> str:
    # One notice per unknown outcome: a Retry that ends unknown again is a new episode.
    return f"unknown|{d.key}|v{d.version}|{d.updated_at:.6f}"
