"""One tick of one pipeline, the operator decisions, and the loop that runs ticks.

A tick::

    fetch (at most max_per_tick new items) -> filter -> admit (bot.admit: batches,
          each one transaction) -> claim/draft/finish (bounded in flight), each card
          posted as its draft is stored -> post cards still ready -> send approved
          drafts -> check unknown sends
    and one pipeline_runs row with the counts and the error, if any. When the source
    had more than max_per_tick, the pipeline's loop runs the next tick at once.

Operator decisions do not wait for ticks: Approve sends at once, and a Regenerate's
new version is drafted at once by its own fenced claim (see _redraft).

The engine never holds a store transaction across a network call: every store method
is its own short transaction, and drafting, posting and sending happen between them.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import time
import uuid
from datetime import datetime, timezone
from typing import Callable

from . import filters as _filters
from . import scheduler
from .admit import admit_fetched
from .build import build_drafter, build_sender, build_source
from .clock import wall
from .config import PipelineConfig, Settings
from .errors import (ApprovalError, BudgetExhausted, ConfigError, DrafterError,
                     DrafterRetryable, DrafterSetupError, DraftgateError, SendFailed,
                     SendUnknown, StoreError)
from .models import AWAITING, EXPIRED, FAILED, SEND_UNKNOWN, Draft, DraftRequest, RunCounts
from .process import Heartbeat
from .process import gone_here as _gone_here
from .process import process_home as _process_home
from .stages import ApprovalChannel, Drafter, FetchContext, Sender, Source
from .store import Store
from .redact import scrub

log = logging.getLogger("draftgate.engine")

#: How the error text of a send cut off by a crash (recover_sending) or a shutdown
#: begins: such a row is checked at once by whoever runs next, unlike a send that has
#: just ended unknown in a running process (that process checks it after a delay).
RECOVERED_SEND = "interrupted"

#: Longest a model's Retry-After holds a pipeline's drafting (a larger or endless one
#: is cut to this, so drafting is never stopped for good by one answer).
MAX_MODEL_HOLD = 3600.0

#: The status and error text of a run cut off by a deliberate stop (Ctrl-C, SIGTERM).
STOPPED = "stopped"
STOPPED_TEXT = "stopped: draftgate was stopped during this tick (Ctrl-C or SIGTERM)"


def describe_error(exc: BaseException) -> str:
    """A one-line error text for runs, cards and notifications."""
    if isinstance(exc, DraftgateError):
        text = str(exc)
    elif isinstance(exc, (asyncio.TimeoutError, TimeoutError)):
        text = "timed out"
    else:
        text = f"{type(exc).__name__}: {exc}"
    return " ".join(scrub(text).split())[:500] or type(exc).__name__  # scrubbed before cut


def utc_day(t: float) -> str:
    return datetime.fromtimestamp(t, tz=timezone.utc).strftime("%Y-%m-%d")


class Engine:
    """Drives every configured pipeline. Implements :class:`bot.stages.Decisions`."""

    def __init__(self, settings: Settings, store: Store,
                 channels: dict[str, ApprovalChannel] | None = None, *,
                 clock: Callable[[], float] | None = None,
                 drafters: dict[str, Drafter] | None = None,
                 senders: dict[str, Sender] | None = None,
                 sources: dict[str, Source] | None = None,
                 send_check_delay: float = 5.0,
                 progress: Callable[[str, int, int], None] | None = None):
        self.settings = settings
        self.store = store
        self.channels = dict(channels or {})
        self.clock = clock or wall
        self.pipelines = {p.name: p for p in settings.pipelines}
        self._drafters = dict(drafters or {})
        self._senders = dict(senders or {})
        self._sources = dict(sources or {})
        self._tick_locks = {name: asyncio.Lock() for name in self.pipelines}
        self._in_flight = asyncio.Semaphore(settings.max_in_flight)
        self._send_check_delay = send_check_delay
        self._progress = progress  # (label, done, total): backfills on the CLI
        self._tasks: set[asyncio.Task] = set()
        self._notice_lock = asyncio.Lock()
        # Model trouble (429, 5xx, timeouts) is the provider's, not the items': after a
        # retryable failure a pipeline drafts one item per tick (a probe) until a draft
        # succeeds, and not at all until a Retry-After has passed, so an outage costs
        # one attempt per tick instead of one per queued item.
        self._model_trouble: set[str] = set()
        self._draft_not_before: dict[str, float] = {}
        # Pipelines known to have no drafting hold recorded in the store (see _hold),
        # so a working pipeline does not write "no hold" after every draft.
        self._not_held: set[str] = set()
        self._lock_lost: dict[str, asyncio.Event] = {}  # set when a held lease is lost
        # Unknown sends a _check_later task of this process will check:
        # draft id -> (pipeline, task).
        self._checking: dict[int, tuple[str, asyncio.Task]] = {}
        # Pipelines whose last fetch stopped at max_per_tick: their loop ticks again at
        # once instead of waiting for the next slot, in bounded steps.
        self._backlog: set[str] = set()
        self._posting: set[tuple[int, int]] = set()  # (draft, version) being posted now
        self.holder = f"{_process_home()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.lock_ttl = 15.0
        # Only for `sending` rows with no send_holder (begun by a version that did not
        # record one): longer than any one send call can last, since such a row may be
        # another host's send in flight. Rows with a holder are recovered as soon as
        # that process is seen gone (see _recover_sending).
        self.send_grace = 300.0
        self._heartbeat = Heartbeat(store, self.holder, self.lock_ttl, self._lease_now)

    # -- stages ---------------------------------------------------------------------
    def source(self, p: PipelineConfig) -> Source:
        if p.name not in self._sources:
            self._sources[p.name] = build_source(p, self.settings)
        return self._sources[p.name]

    def drafter(self, p: PipelineConfig) -> Drafter:
        if p.name not in self._drafters:
            self._drafters[p.name] = build_drafter(p, self.settings)
        return self._drafters[p.name]

    def sender(self, p: PipelineConfig) -> Sender:
        if p.name not in self._senders:
            self._senders[p.name] = build_sender(p, self.settings)
        return self._senders[p.name]

    def channel(self, p: PipelineConfig) -> ApprovalChannel:
        name = p.approval.channel
        try:
            return self.channels[name]
        except KeyError:
            raise ApprovalError(f"pipeline {p.name}: approval channel {name!r} is not running") from None

    def ops_channel(self) -> ApprovalChannel | None:
        return self.channels.get("telegram") or next(iter(self.channels.values()), None)

    def pipeline(self, name: str) -> PipelineConfig:
        return self.settings.pipeline(name)

    async def _require_configured(self, draft_id: int) -> Draft | None:
        """The draft, refusing one whose pipeline left the configuration: it could be
        approved but never sent (no sender), a silent dead end. Reject still works."""
        d = await self.store.get_draft(draft_id)
        if d is not None and not self.settings.has_pipeline(d.pipeline):
            raise ConfigError(
                f"Pipeline {d.pipeline!r} is not configured any more: restore its YAML file "
                "and restart to act on this draft (Reject still works).")
        return d

    # -- lifecycle ------------------------------------------------------------------
    async def start(self) -> None:
        """Recover from a crash, start the approval channels, post what waits."""
        await self._recover_sending()
        for ch in {id(c): c for c in self.channels.values()}.values():
            await ch.start(self)
        await self._resync_cards()

    async def stop(self) -> None:
        """Let in-flight work finish its current transition, then close stages."""
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        for ch in {id(c): c for c in self.channels.values()}.values():
            try:
                await ch.stop()
            except Exception:
                log.exception("stopping approval channel %s", getattr(ch, "name", ch))
        for stage in [*self._sources.values(), *self._drafters.values(), *self._senders.values()]:
            try:
                await stage.close()
            except Exception:
                log.exception("closing %r", stage)
        # Last: until here a send may still be in flight, and without the heartbeat
        # another host would take it for abandoned.
        await self._heartbeat.stop()

    def _lease_now(self) -> float | None:
        """``now`` for store calls that decide leases: None lets the store use its own
        clock (on PostgreSQL the database's, the one clock all hosts share, so a host
        whose clock is off neither takes a live lease nor strands another's send)."""
        # Unless a test drives time with a clock of its own: then that clock decides.
        return None if self.clock is wall else self.clock()

    def _spawn(self, coro) -> asyncio.Task:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        task.add_done_callback(_log_task_error)
        return task

    # -- one tick -------------------------------------------------------------------
    async def tick(self, name: str, scheduled_for: float | None = None) -> RunCounts:
        """Run one tick of pipeline ``name`` for slot ``scheduled_for`` (default: the
        newest due slot). Never overlaps another tick of the same pipeline, in this
        process (lock) or on another host (lease row in the store)."""
        p = self.pipeline(name)
        if scheduled_for is None:
            scheduled_for = scheduler.last_due(p, self.clock())
        counts = RunCounts()
        await self._resync_cards()
        # Set again only by a fetch of this tick that stops short (so a tick that does
        # not get that far, whatever the reason, never makes the loop hurry).
        self._backlog.discard(name)
        async with self._pipeline_lock(p) as held:
            if held:
                await self._tick_locked(p, scheduled_for, counts)
            else:
                log.info("%s: another process is running this pipeline; tick skipped", name)
        return counts

    @contextlib.asynccontextmanager
    async def _pipeline_lock(self, p: PipelineConfig):
        """Held while fetching, drafting and posting for ``p``: one holder per
        pipeline in this process (asyncio lock) and across hosts (a lease row in the
        store). The lease is short and renewed while held, so a process that dies
        holding it blocks the others (or its own restart) for seconds, not minutes."""
        name = f"pipeline:{p.name}"
        async with self._tick_locks[p.name]:
            held = await self.store.try_lock(name, self.holder, self.lock_ttl,
                                             now=self._lease_now())
            if not held and await self._holder_is_dead(name):
                held = await self.store.try_lock(name, self.holder, self.lock_ttl,
                                                 now=self._lease_now())
            lost = self._lock_lost[p.name] = asyncio.Event()
            renew = self._spawn(self._renew_lock(name, lost)) if held else None
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
                        log.exception("%s: releasing the pipeline lock", p.name)

    async def _holder_is_dead(self, name: str) -> bool:
        """If ``name`` is held by a process of this same machine and pid namespace
        that no longer exists (it was killed), release it now instead of waiting out
        its lease: a restart after a crash resumes at once. A holder elsewhere, or one
        whose pid is alive, is never touched."""
        holder = await self.store.lock_holder(name)
        if not holder or holder == self.holder or not _gone_here(holder):
            return False
        log.warning("%s: held by %s, a process of this machine that is gone; taking it over",
                    name, holder)
        await self.store.unlock(name, holder)
        return True

    async def _renew_lock(self, name: str, lost: asyncio.Event) -> None:
        """Renew the lease every third of its life. A failed renewal is retried; once
        the lease may have run out (or another process holds it), ``lost`` is set and
        the tick stops at its next step, so two ticks of a pipeline never overlap."""
        renewed = time.monotonic()
        while True:
            await asyncio.sleep(self.lock_ttl / 3)
            try:
                # Bounded: a hung store connection must count as a failed renewal.
                ok: bool | None = await asyncio.wait_for(
                    self.store.try_lock(name, self.holder, self.lock_ttl, now=self._lease_now()),
                    timeout=self.lock_ttl / 3)
            except Exception as exc:
                ok = None
                log.warning("%s: renewing the lock failed: %s", name, describe_error(exc))
            if ok:
                renewed = time.monotonic()
                continue
            if ok is False or time.monotonic() - renewed > self.lock_ttl * 0.75:
                log.warning("%s: lost the lock; this tick stops at its next step", name)
                lost.set()
                return

    def _lost(self, p: PipelineConfig) -> bool:
        lost = self._lock_lost.get(p.name)
        return lost is not None and lost.is_set()

    def _still_held(self, p: PipelineConfig) -> None:
        """Raise if the pipeline's lock was lost during this tick (see _renew_lock)."""
        if self._lost(p):
            raise StoreError(f"{p.name}: lost the pipeline lock (the store did not renew it "
                             "in time); the tick stopped so that no other tick overlaps it")

    async def _tick_locked(self, p: PipelineConfig, scheduled_for: float, counts: RunCounts) -> None:
        started = self.clock()
        try:
            run_id = await self.store.start_run(p.name, scheduled_for, now=started)
        except Exception as exc:
            log.error("%s: store unavailable, tick not run: %s", p.name, describe_error(exc))
            return
        error: str | None = None
        try:
            try:
                await self._fetch_and_admit(p, scheduled_for, counts)
            except Exception as exc:
                error = describe_error(exc)
                log.warning("%s: fetch failed: %s", p.name, error,
                            exc_info=not isinstance(exc, DraftgateError))
            try:
                await self._drain(p, counts)
            except Exception as exc:
                error = error or describe_error(exc)
                log.warning("%s: %s", p.name, error, exc_info=not isinstance(exc, DraftgateError))
        except asyncio.CancelledError:
            # Stopped mid-tick (Ctrl-C, SIGTERM): close the run row instead of leaving
            # it "running". A deliberate stop is no failure: recorded as stopped, not
            # red, and nobody is notified.
            with contextlib.suppress(Exception):
                await asyncio.shield(self.store.end_run(
                    run_id, STOPPED, counts.to_dict(), STOPPED_TEXT, now=self.clock()))
            raise
        status = "error" if error else "ok"
        try:
            recent = await self.store.recent_runs(p.name, limit=10)
            # The colour before this run: stopped runs in between change nothing.
            previous = next((r for r in recent[1:] if r.status in ("ok", "error")), None)
            await self.store.end_run(run_id, status, counts.to_dict(), error, now=self.clock())
        except Exception as exc:
            log.error("%s: could not record the run: %s", p.name, describe_error(exc))
            return
        if previous is not None and previous.status in ("ok", "error") and previous.status != status:
            if status == "error":
                await self.notify(f"❌ {p.name} turned red: {error}")
            else:
                await self.notify(f"✅ {p.name} is green again")
        elif previous is None and status == "error":
            await self.notify(f"❌ {p.name} failed: {error}")

    async def _fetch_and_admit(self, p: PipelineConfig, scheduled_for: float,
                               counts: RunCounts) -> None:
        source = self.source(p)
        cursor = await self.store.get_cursor(p.name, source.scope)

        async def unseen(ids: list[str]) -> set[str]:
            return await self.store.unseen(p.name, source.scope, ids)

        progress = None
        if self._progress is not None:
            progress = functools.partial(self._progress, f"{p.name} backfill")
        ctx = FetchContext(p.name, source.scope, scheduled_for, cursor, unseen, progress,
                           limit=p.max_per_tick)
        result = await source.fetch(ctx)
        counts.fetched = len(result.items)
        own = _own_addresses(p, self.settings)
        for item in result.items:
            if item.skip_reason is None:
                item.skip_reason = _filters.skip_reason(item.message, p.filters, own_addresses=own)
        refused = await admit_fetched(self.store, p, source.scope, result, counts,
                                      check=lambda: self._still_held(p), clock=self.clock)
        if refused:
            # Left unseen and the cursor not moved past them: the next tick fetches them
            # again (a full disk frees up; a store that keeps refusing keeps the run red).
            raise StoreError(
                f"{len(refused)} new item(s) could not be stored and are fetched again next "
                f"tick: " + "; ".join(f"{i}: {e}" for i, e in refused[:3])
                + (f"; and {len(refused) - 3} more" if len(refused) > 3 else ""))
        if result.more:
            self._backlog.add(p.name)
            log.info("%s: %d new item(s) taken (max_per_tick %d); more wait at the source "
                     "for the next tick", p.name, counts.fetched, p.max_per_tick)

    async def drain(self, name: str) -> RunCounts:
        """Draft what is queued, post what is ready, send what is approved (skipped
        if another process holds the pipeline: its tick does the same)."""
        counts = RunCounts()
        p = self.pipeline(name)
        async with self._pipeline_lock(p) as held:
            if held:
                await self._drain(p, counts)
        # Drained means done: an unknown send this process made is checked by its own
        # delayed task (not by _drain, see _check_unknown), so wait for those too.
        await self._checks_done(p)
        return counts

    async def _checks_done(self, p: PipelineConfig) -> None:
        while pending := [t for name, t in list(self._checking.values())
                          if name == p.name and not t.done()]:
            await asyncio.gather(*pending, return_exceptions=True)

    async def _drain(self, p: PipelineConfig, counts: RunCounts) -> None:
        if await self._draft_queued(p, counts):  # False: a post failed; one try per tick
            await self._post_ready(p, counts)
        await self._send_approved(p, counts)
        await self._check_unknown(p, counts)

    # -- drafting -------------------------------------------------------------------
    async def _budget_spent(self, p: PipelineConfig) -> int | None:
        """Today's tokens if the pipeline's daily budget is spent, else None."""
        if not p.daily_token_budget:
            return None
        used = await self.store.tokens_used(p.name, utc_day(self.clock()))
        return used if used >= p.daily_token_budget else None

    async def _budget_left(self, p: PipelineConfig) -> bool:
        used = await self._budget_spent(p)
        if used is None:
            return True
        day = utc_day(self.clock())
        midnight = (int(self.clock() // 86400) + 1) * 86400.0
        await self._hold(p, f"daily token budget spent ({used:,} of {p.daily_token_budget:,} "
                            f"tokens); drafting resumes at 00:00 UTC, or raise "
                            f"daily_token_budget in {p.file}", until=midnight)
        await self._notify_once(
            f"budget|{p.name}|{day}",
            f"⏸ {p.name}: daily token budget spent ({used:,} of {p.daily_token_budget:,} "
            f"tokens on {day} UTC). Items stay queued and are drafted tomorrow; raise "
            f"daily_token_budget in {p.file} to continue today.")
        return False

    async def _refuse_if_drafting_waits(self, d: Draft) -> None:
        """A Regenerate that nothing would act on soon is refused with the reason, and
        the card stays as it is (otherwise it would sit at 'Regenerating…')."""
        p = self.pipeline(d.pipeline)
        used = await self._budget_spent(p)
        if used is not None:
            raise BudgetExhausted(
                f"Not regenerated: {p.name}'s daily token budget is spent ({used:,} of "
                f"{p.daily_token_budget:,}). Try tomorrow (UTC), or raise "
                f"daily_token_budget in {p.file}.")
        wait = self._draft_not_before.get(p.name, 0.0) - self.clock()
        if wait > 0:
            raise DrafterRetryable(f"Not regenerated: the model asked to wait; try again in "
                                   f"{max(1, round(wait / 60))} min.")

    async def _draft_queued(self, p: PipelineConfig, counts: RunCounts) -> bool:
        """Draft what is queued, posting each card as its draft is stored. False if
        the approval channel was unreachable for one of them (the rest wait in ready)."""
        # A lease left by a crashed or hung worker goes back to the queue here, on
        # every tick, rather than waiting for the daily sweep.
        _requeued, failed = await self.store.requeue_expired(
            p.name, max_attempts=p.max_attempts, now=self._lease_now())
        if failed:
            counts.failed += failed
            await self.notify(f"⚠️ {p.name}: {failed} draft(s) failed: their drafting lease "
                              f"expired on the last attempt. /pending and /status show them; "
                              f"/replay retries one.")
        wait = self._draft_not_before.get(p.name, 0.0) - self.clock()
        if wait > 0:
            log.info("%s: the model asked to wait; drafting resumes in %.0fs", p.name, wait)
            return True
        workers = 1 if p.name in self._model_trouble else max(1, self.settings.max_in_flight)
        stop = asyncio.Event()
        channel_down = asyncio.Event()

        async def worker() -> None:
            while not stop.is_set():
                if not await self._budget_left(p):
                    stop.set()
                    return
                drafted: list[Draft] = []
                async with self._in_flight:
                    if stop.is_set() or self._lost(p):
                        stop.set()
                        return
                    claimed = await self.store.claim(p.name, p.lease, limit=1,
                                                     now=self._lease_now())
                    if not claimed:
                        stop.set()
                        return
                    if not await self._draft_one(p, claimed[0], counts, drafted.append):
                        stop.set()
                # Its card goes out now, not after the whole queue is drafted. Through
                # the outbox all the same: the row is `ready` until posted, so a crash
                # here leaves it to post_unposted / the next tick.
                for d in drafted:
                    if not channel_down.is_set() and not self._lost(p):
                        if not await self._post_counted(p, d, counts):
                            channel_down.set()  # the rest wait in ready for _post_ready

        tasks = [asyncio.create_task(worker()) for _ in range(workers)]
        try:
            await asyncio.gather(*tasks)
        except BaseException:
            # One worker failed (or the tick was cancelled): stop the others too, so
            # none goes on claiming and drafting after the tick and its lock are gone.
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise
        self._still_held(p)
        return not channel_down.is_set()

    async def _draft_one(self, p: PipelineConfig, d: Draft, counts: RunCounts,
                         ready: Callable[[Draft], None] | None = None) -> bool:
        """Draft one claimed item; False when the model is in trouble (stop claiming).
        ``ready`` gets the stored draft (status ``ready``) when one was made."""
        request = DraftRequest(pipeline=p.name, message=d.message, instruction=d.instruction,
                               previous_body=d.body, draft_key=d.key)
        try:
            # The drafter times out on its own; this bound keeps a misbehaving one
            # inside its lease so a stale answer can never race a newer claim.
            result = await asyncio.wait_for(self.drafter(p).draft(request), timeout=p.lease * 0.9)
        except BudgetExhausted as exc:
            await self.store.release(d.id, d.fence)
            await self._hold(p, describe_error(exc))
            await self.notify(f"⏸ {p.name}: {exc}")
            return False
        except DrafterSetupError as exc:
            # The model cannot be used at all (key, model name, base_url, prompt file):
            # every item would fail alike. The item waits, uncounted; later ticks probe
            # with one item; the operators hear of it once a day.
            await self.store.release(d.id, d.fence)
            self._model_trouble.add(p.name)
            await self._hold(p, f"setup error: {describe_error(exc)}; fix it (then restart "
                                f"draftgate if you changed the configuration or an "
                                f"environment variable)")
            await self._notify_once(
                f"setup|{p.name}|{utc_day(self.clock())}",
                f"⚠️ {p.name}: drafting is stopped: {describe_error(exc)}. Items wait in the "
                f"queue; fix it (then restart draftgate if you changed the configuration "
                f"or an environment variable).")
            return False
        except asyncio.CancelledError:
            # Shutting down mid-call: hand the item straight back to the queue (fenced)
            # instead of leaving it to wait out its lease.
            with contextlib.suppress(Exception):
                await asyncio.shield(self.store.release(d.id, d.fence))
            raise
        except Exception as exc:
            retryable = not isinstance(exc, DrafterError) or isinstance(exc, DrafterRetryable)
            reason = describe_error(exc)
            spent = int(getattr(exc, "tokens", 0) or 0)  # an unusable answer was still paid for
            if spent:
                counts.tokens += spent
                await self.store.add_tokens(p.name, spent, now=self.clock())
            if not isinstance(exc, DraftgateError):
                log.exception("%s: drafter crashed on %s", p.name, d.key)
            after = await self.store.fail_draft(d.id, d.fence, reason, retryable=retryable,
                                                max_attempts=p.max_attempts, now=self.clock())
            if after is not None and after.status == FAILED:
                counts.failed += 1
                if p.mark_seen == "on_success":  # final, like skipped (see bot.admit)
                    await self.store.mark_seen(p.name, d.scope, [d.item_id], now=self.clock())
                if after.approval_message_id:  # a regenerate that failed: say so on the card
                    await self._update_card(after)
                # The channel offers the replay (a button, or the command to type).
                await self.notify(f"⚠️ {p.name} #{d.id}: drafting failed after {after.attempt} "
                                  f"attempt(s): {reason}.", retry_draft=after)
            if retryable:  # a 429, 5xx, timeout or crash: the model may be in trouble
                self._model_trouble.add(p.name)
                wait = getattr(exc, "retry_after", None)
                if isinstance(exc, DrafterRetryable) and wait is not None and wait > 0:
                    wait = min(wait, MAX_MODEL_HOLD)  # inf too; nan is not > 0
                    self._draft_not_before[p.name] = self.clock() + wait
                    await self._hold(p, f"the model asked to wait ({reason}); drafting "
                                        f"resumes by itself", until=self.clock() + wait)
                    if wait > 300:
                        await self._notify_once(
                            f"hold|{p.name}|{utc_day(self.clock())}",
                            f"⏸ {p.name}: the model asked to wait {wait / 60:.0f} min "
                            f"({reason}); items stay queued and drafting resumes then.")
                else:
                    await self._hold(p, f"the model is failing ({reason}); one item per "
                                        f"tick is tried until a draft succeeds")
                return False
            return True
        self._model_trouble.discard(p.name)
        await self._hold(p, None)  # drafting works (again)
        body = (result.body or "").strip()
        stored = await self.store.finish_draft(d.id, d.fence, body, tokens_in=result.tokens_in,
                                               tokens_out=result.tokens_out, now=self.clock())
        counts.tokens += result.tokens_in + result.tokens_out
        if stored is None:
            # The lease was lost (swept and re-claimed): this answer is stale.
            log.warning("%s: draft for %s arrived after its lease was lost; discarded",
                        p.name, d.key)
            await self.store.add_tokens(p.name, result.tokens_in + result.tokens_out, now=self.clock())
            return True
        counts.drafted += 1
        if p.mark_seen == "on_success":
            await self.store.mark_seen(p.name, d.scope, [d.item_id], now=self.clock())
        if ready is not None:
            ready(stored)
        return True

    async def _hold(self, p: PipelineConfig, reason: str | None, until: float | None = None) -> None:
        """Record in the store why drafting of ``p`` is held (``None``: it is not), so
        `status` in any process shows it. "Not held" is written once per process."""
        if reason is None and p.name in self._not_held:
            return
        try:
            await self.store.set_hold(p.name, reason, until)
        except Exception as exc:
            log.warning("%s: could not record the drafting hold: %s", p.name, describe_error(exc))
            return
        (self._not_held.add if reason is None else self._not_held.discard)(p.name)

    # -- approval -------------------------------------------------------------------
    async def _post_ready(self, p: PipelineConfig, counts: RunCounts) -> None:
        batch = 100
        while True:
            waiting = await self.store.unposted(p.name, limit=batch)
            for d in waiting:
                self._still_held(p)
                if not await self._post_counted(p, d, counts):
                    return  # the channel is unreachable: the rest wait in ready
            if len(waiting) < batch:
                return

    async def _post_counted(self, p: PipelineConfig, d: Draft, counts: RunCounts) -> bool:
        """Post ``d``'s card and count it; False if the channel is unreachable."""
        if (d.id, d.version) in self._posting:
            return True  # a Regenerate or an Edit is posting it right now
        posted = await self._post_one(p, d)
        if posted is None:
            return False
        counts.posted += 1
        if posted.status == "sent":  # a channel that decides at once (demo mode)
            counts.sent += 1
        return True

    async def _post_one(self, p: PipelineConfig, d: Draft) -> Draft | None:
        """Post (or re-render) the card of a ready draft; the draft afterwards, or
        None if the channel is unreachable (the draft waits in ready). A version whose
        card this process is posting already (a Regenerate's own drafting next to a
        tick's posting) is left to that post: one post per card, not two."""
        if (d.id, d.version) in self._posting:
            return d
        self._posting.add((d.id, d.version))
        try:
            channel = self.channel(p)
            ref = await channel.post(d)
            posted = await self.store.mark_posted(d.id, d.version, ref.chat, ref.message_id)
        except ApprovalError as exc:
            log.warning("%s: cannot post #%d yet (%s); it waits in ready", p.name, d.id, exc)
            return None
        finally:
            self._posting.discard((d.id, d.version))
        if posted is None:
            # Meanwhile a tap adopted an earlier card of this draft (one whose post had
            # looked failed): the card just posted is a second one, so take it away.
            fresh = await self.store.get_draft(d.id)
            if (fresh is not None and fresh.approval_message_id is not None
                    and (fresh.approval_chat, fresh.approval_message_id)
                    != (ref.chat, ref.message_id)):
                await channel.discard(ref, fresh)
            return fresh or d
        await channel.on_posted(posted)  # outside the guard: it may post a new version
        return await self.store.get_draft(d.id) or posted

    async def post_unposted(self) -> int:
        """Post every ``ready`` draft (the outbox pattern: cards survive restarts)."""
        n = 0
        for p in self.pipelines.values():
            async with self._pipeline_lock(p) as held:
                if held:
                    counts = RunCounts()
                    await self._post_ready(p, counts)
                    n += counts.posted
        return n

    # -- decisions (called by approval channels) ----------------------------------------
    async def approve(self, draft_id: int, version: int, actor: str) -> Draft | None:
        await self._require_configured(draft_id)
        d = await self.store.approve(draft_id, version, actor, now=self.clock())
        if d is None:
            return None
        log.info("%s #%d v%d approved by %s", d.pipeline, d.id, d.version, actor)
        return await self._send(d)

    async def edit(self, draft_id: int, version: int, body: str, actor: str) -> Draft | None:
        body = body.strip()
        if not body:
            return None
        await self._require_configured(draft_id)
        d = await self.store.edit(draft_id, version, body, actor, now=self.clock())
        if d is not None:
            await self._post_one(self.pipeline(d.pipeline), d)
            d = await self.store.get_draft(d.id)
        return d

    async def regenerate(self, draft_id: int, version: int, actor: str,
                         instruction: str = "") -> Draft | None:
        d = await self._require_configured(draft_id)
        if d is not None:
            await self._refuse_if_drafting_waits(d)
        d = await self.store.regenerate(draft_id, version, actor, instruction, now=self.clock())
        if d is not None:
            self._spawn(self._redraft(d))
        return d

    async def _redraft(self, d: Draft) -> None:
        """Draft a regenerated version at once, on its own: an operator's decision does
        not wait for the pipeline's lock or behind a tick's bulk drafting (nor for a
        drafting slot: it is one call more than max_in_flight, for a moment). The
        claim is the same fenced CAS as a tick's, so exactly one of them drafts it: if
        a tick's worker claimed it first, that worker drafts and posts it."""
        p = self.pipeline(d.pipeline)
        claimed = await self.store.claim_key(d.key, p.lease, now=self.clock())
        if claimed is None:
            return
        drafted: list[Draft] = []
        await self._draft_one(p, claimed, RunCounts(), drafted.append)
        for ready in drafted:  # a card that cannot be updated now waits in ready
            await self._post_one(p, ready)

    async def reject(self, draft_id: int, version: int, actor: str, reason: str = "") -> Draft | None:
        d = await self.store.reject(draft_id, version, actor, reason, now=self.clock())
        if d is not None:
            await self._update_card(d)
        return d

    async def retry_send(self, draft_id: int, actor: str) -> Draft | None:
        d = await self._require_configured(draft_id)
        if d is not None and d.status == SEND_UNKNOWN:
            # Ask once more before sending again: a reply that did arrive meanwhile
            # must not go out twice because Retry was tapped before the check ran.
            try:
                found = await self.sender(self.pipeline(d.pipeline)).check(d)
            except Exception as exc:  # cannot tell: the operator chose to send again
                log.info("#%d: check before Retry failed: %s", d.id, describe_error(exc))
                found = None
            if found and (after := await self._found_sent(d, found)) is not None:
                log.info("#%d: Retry found the reply already sent (%s)", d.id, found)
                return after
        d = await self.store.retry_send(draft_id, actor, now=self.clock())
        if d is None:
            return None
        return await self._send(d)

    # -- sending ------------------------------------------------------------------------
    async def _send_approved(self, p: PipelineConfig, counts: RunCounts) -> None:
        # Approved but never begun: the process stopped between approve and send. A
        # human approved exactly this version, so sending it now keeps the promise.
        for d in await self.store.approved(p.name):
            self._still_held(p)
            after = await self._send(d)
            if after is not None and after.status == "sent":
                counts.sent += 1

    async def _send(self, d: Draft) -> Draft | None:
        p = self.pipeline(d.pipeline)
        sender = self.sender(p)  # built before `sending`: a bad sender sends nothing
        await self._heartbeat.beat()  # a send begins only under a fresh heartbeat
        sending = await self.store.begin_send(d.id, self.holder)
        if sending is None:
            return await self.store.get_draft(d.id)
        try:
            result = await sender.send(sending)
        except SendFailed as exc:
            after = await self.store.mark_send_failed(d.id, describe_error(exc))
            log.warning("%s #%d: send failed: %s", p.name, d.id, exc)
        except asyncio.CancelledError:
            await asyncio.shield(self.store.mark_send_unknown(d.id, "interrupted during send"))
            raise
        except Exception as exc:
            # Timeouts, resets, 5xx and anything unexpected: it may have gone out.
            reason = describe_error(exc)
            if not isinstance(exc, SendUnknown):
                log.exception("%s #%d: unexpected error while sending", p.name, d.id)
            after = await self.store.mark_send_unknown(d.id, reason)
            # Registered before the task runs: this tick's _check_unknown must leave it.
            self._checking[d.id] = (p.name, self._spawn(self._check_later(d.id)))
        else:
            after = await self.store.mark_sent(d.id, result.sent_id, now=self.clock())
            log.info("%s #%d sent (%s)", p.name, d.id, result.sent_id)
        if after is not None:
            await self._update_card(after)
        return after

    async def _found_sent(self, d: Draft, sent_id: str) -> Draft | None:
        """The other side has the reply: mark it sent and show it on the card."""
        after = await self.store.mark_sent(d.id, sent_id, now=self.clock())
        if after is not None:
            await self._update_card(after)
        return after

    async def _check_later(self, draft_id: int) -> None:
        try:
            await asyncio.sleep(self._send_check_delay)
            d = await self.store.get_draft(draft_id)
            if d is not None and d.status == SEND_UNKNOWN:
                await self._check_one(self.pipeline(d.pipeline), d)
        finally:
            if self._checking.get(draft_id, ("", None))[1] is asyncio.current_task():
                del self._checking[draft_id]

    async def _recover_sending(self) -> None:
        """Sends whose process is gone -> send_unknown, to be checked before anything
        is sent again. A sender of this machine is gone when its pid is (seen at once,
        e.g. on the restart after a SIGKILL); one elsewhere when its heartbeat lapses
        (``lock_ttl``). A send in flight in a live process is never touched. Run at
        start and on every tick."""
        holders = await self.store.sending_holders()
        dead = [h for h in holders if h != self.holder and _gone_here(h)]
        stuck = await self.store.recover_abandoned_sends(
            dead=dead, alive=self.holder, grace=self.send_grace, now=self._lease_now())
        if stuck:
            log.warning("%d draft(s) were left mid-send by a stopped process; marked "
                        "send_unknown and will be checked before anything is sent again", stuck)

    async def _check_unknown(self, p: PipelineConfig, counts: RunCounts) -> None:
        await self._recover_sending()
        for d in await self.store.send_unknown(p.name):
            # A send that just ended unknown (here or in another process) is checked
            # by that process's _check_later after a delay; asked at once, the other
            # side may not show it yet and the operator would be told "not sent, tap
            # Retry" about a reply that did go out. One recovered after a crash or a
            # restart is checked now.
            if d.id in self._checking or (
                    time.time() - d.updated_at < self._send_check_delay
                    and not (d.error or "").startswith(RECOVERED_SEND)):
                continue  # (another process's fresh unknown send: its own check runs)
            self._still_held(p)
            if await self._check_one(p, d):
                counts.sent += 1

    async def _check_one(self, p: PipelineConfig, d: Draft) -> bool:
        """Ask the other side whether an unknown send arrived. Never resends."""
        try:
            found = await self.sender(p).check(d)
        except SendUnknown as exc:
            log.info("%s #%d: outcome still unknown: %s", p.name, d.id, exc)
            await self._notify_once(
                _unknown_episode(d),
                f"❓ {p.name} #{d.id}: cannot tell whether the reply was sent ({d.error}; "
                f"{exc}). Check the mailbox; Retry sends it again.", retry_draft=d)
            return False
        except Exception as exc:
            log.warning("%s #%d: checking the send failed: %s", p.name, d.id, describe_error(exc))
            return False
        if found:
            return await self._found_sent(d, found) is not None
        await self._notify_once(
            _unknown_episode(d),
            f"❓ {p.name} #{d.id}: the send timed out or failed midway ({d.error}) and the "
            f"message is not in Sent. Nothing was resent; tap Retry to send it.", retry_draft=d)
        return False

    async def _update_card(self, d: Draft) -> None:
        try:
            await self.channel(self.pipeline(d.pipeline)).update(d)
        except Exception as exc:
            log.warning("%s #%d: could not update the card: %s", d.pipeline, d.id, describe_error(exc))

    async def _resync_cards(self) -> None:
        """Cards whose last update failed are re-rendered until one succeeds."""
        for ch in {id(c): c for c in self.channels.values()}.values():
            try:
                await ch.resync_cards()
            except Exception as exc:
                log.warning("re-rendering stale cards failed: %s", describe_error(exc))

    async def _notify_once(self, tag: str, text: str, *, retry_draft: Draft | None = None) -> None:
        """Notify once per ``tag`` across restarts and hosts: the audit log remembers
        which notices went out."""
        key = f"notice|{tag}"
        async with self._notice_lock:
            try:
                if await self.store.audit_log(draft_key=key, limit=1):
                    return
                await self.store.audit("draftgate", "notice", draft_key=key, detail=scrub(text)[:300],
                                       now=self.clock())
            except Exception as exc:
                log.warning("could not record a notice (%s); sending it anyway",
                            describe_error(exc))
        await self.notify(text, retry_draft=retry_draft)

    async def notify(self, text: str, *, retry_draft: Draft | None = None) -> None:
        text = scrub(text)  # notices quote errors, which may quote an answer with a secret
        ch = self.ops_channel()
        if getattr(ch, "name", None) != "console":  # a console prints it: not twice
            log.info("notify: %s", text)
        if ch is None:
            return
        try:
            await ch.notify(text, retry_draft=retry_draft)
        except Exception as exc:
            log.warning("could not notify the operators: %s", describe_error(exc))

    # -- operator controls ---------------------------------------------------------------
    async def pause(self, name: str, actor: str) -> None:
        self.pipeline(name)
        await self.store.set_paused(name, True, actor)

    async def resume(self, name: str, actor: str) -> None:
        self.pipeline(name)
        await self.store.set_paused(name, False, actor)

    async def wait_idle(self) -> None:
        """Wait for the background work decisions started (a regenerate's drafting, a
        delayed check of an unknown send) to finish."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def run_now(self, name: str) -> RunCounts:
        return await self.tick(name)

    async def sweep(self, days: float | None = None):
        from . import ops

        now = self.clock()
        ttl = self.settings.approval_ttl_days
        # Cards of approvals the sweep is about to expire: re-rendered afterwards, so
        # their buttons go and they say why (the sweep itself is one SQL statement).
        due = [] if ttl is None else [
            d for d in await self.store.pending()
            if d.status == AWAITING and d.updated_at < now - ttl * 86400.0]
        # _lease_now: on a shared store the sweep's lease expiry is the database's call.
        result = await ops.sweep(self.store, self.settings, days=days, now=self._lease_now())
        for d in due:
            fresh = await self.store.get_draft(d.id)
            if fresh is not None and fresh.status == EXPIRED and self.settings.has_pipeline(d.pipeline):
                await self._update_card(fresh)
        return result

    # -- the loop ------------------------------------------------------------------------
    async def run_forever(self, stop: asyncio.Event) -> None:
        """Tick every pipeline on its schedule until ``stop`` is set. Pipelines run
        concurrently; a slow tick coalesces the slots it overran into one catch-up
        tick (the source's catch-up policy decides what that admits)."""
        loops = [asyncio.create_task(self._supervised_loop(p, stop), name=f"loop:{p.name}")
                 for p in self.pipelines.values() if p.enabled]
        loops.append(asyncio.create_task(self._sweep_loop(stop), name="sweep"))
        await stop.wait()
        for t in loops:
            t.cancel()
        await asyncio.gather(*loops, return_exceptions=True)

    async def _supervised_loop(self, p: PipelineConfig, stop: asyncio.Event,
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
                await self._notify_once(
                    f"loop|{p.name}|{utc_day(self.clock())}",
                    f"⚠️ {p.name}: its schedule stopped working ({describe_error(exc)}); "
                    f"retrying every minute. Check `schedule` in {p.file}.")
            try:
                await asyncio.wait_for(stop.wait(), timeout=restart_after)
                return
            except asyncio.TimeoutError:
                pass

    async def _pipeline_loop(self, p: PipelineConfig, stop: asyncio.Event) -> None:
        due = scheduler.last_due(p, self.clock())  # catch up at start
        while not stop.is_set():
            wait = due - self.clock()
            if wait > 0:
                try:
                    await asyncio.wait_for(stop.wait(), timeout=wait)
                    return
                except asyncio.TimeoutError:
                    pass
            slot = scheduler.last_due(p, self.clock())
            try:
                if p.name in await self.store.paused():
                    log.debug("%s is paused", p.name)
                    self._backlog.discard(p.name)
                else:
                    await self.tick(p.name, scheduled_for=slot)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("%s: tick crashed", p.name)
                self._backlog.discard(p.name)
            # More new items wait at the source (max_per_tick): the next bounded tick
            # runs now rather than at the next slot, so a flood drains steadily.
            due = self.clock() if p.name in self._backlog else \
                scheduler.next_due(p, max(slot, self.clock()))

    async def _sweep_loop(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), timeout=self.settings.sweep_every)
                return
            except asyncio.TimeoutError:
                pass
            try:
                result = await self.sweep()
                log.info("daily sweep: %s", result.to_dict())
            except Exception:
                log.exception("sweep failed")


def _unknown_episode(d: Draft) -> str:
    # One notice per unknown outcome: a Retry that ends unknown again is a new episode.
    return f"unknown|{d.key}|v{d.version}|{d.updated_at:.6f}"


def _own_addresses(p: PipelineConfig, settings: Settings) -> list[str]:
    own = list(p.filters.own_addresses)
    account = getattr(p.source, "account", None)  # a Gmail source's
    if account and account in settings.gmail_accounts:
        addr = settings.gmail_accounts[account].get("address")
        if addr:
            own.append(str(addr))
    sender_from = getattr(p.sender, "from_addr", None)  # an outbox sender's
    if sender_from:
        own.append(sender_from.addr_spec)
    return [a for a in own if a]


def _log_task_error(task: asyncio.Task) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("background task failed", exc_info=task.exception())
