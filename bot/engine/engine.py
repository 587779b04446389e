"""One tick of one pipeline, and the facade over the engine's parts.

A tick::

    fetch (at most max_per_tick new items) -> filter -> admit (bot.engine.admit: batches,
          each one transaction) -> claim/draft/finish (bot.engine.drafting, bounded in
          flight), each card posted as its draft is stored -> post cards still ready
          (bot.engine.channels) -> send approved drafts -> check unknown sends (bot.engine.sending)
    and one pipeline_runs row with the counts and the error, if any. When the source
    had more than max_per_tick, the pipeline's loop (bot.engine.loop) runs the next tick at once.

A tick holds its pipeline's lease (bot.engine.lease); operator decisions (made at the
operator desk, bot.desk, which uses the engine's parts) do not wait for ticks. The engine never holds a store transaction across a network call:
every store method is its own short transaction, and drafting, posting and sending
happen between them.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from typing import Any, Awaitable, Callable

from .. import scheduler
from ..clock import wall
from ..config.load import PipelineConfig, Settings
from ..errors import DraftgateError, StoreError, StoreUnavailable, Throttled, describe_error
from ..models import RunCounts
from ..service import logfmt, metrics
from ..sources import filters as _filters
from ..stages import ApprovalChannel, Drafter, FetchContext, Sender, Source, Triager
from ..store import Store, SweepResult
from .admit import admit_fetched
from .build import build_drafter, build_sender, build_source, build_triager, import_models
from .channels import Channels
from .drafting import Drafting
from .followups import Followups
from .lease import Leases
from .loop import Loop
from .notes import StyleNoteJobs
from .reminders import Reminders
from .sending import Sends

log = logging.getLogger("draftgate.engine")

#: The status and error text of a run cut off by a deliberate stop (Ctrl-C, SIGTERM).
STOPPED = "stopped"
STOPPED_TEXT = "stopped: draftgate was stopped during this tick (Ctrl-C or SIGTERM)"


class Engine:
    """Drives every configured pipeline: builds its parts and runs the ticks. The
    operator desk (:class:`bot.desk.desk.OperatorDesk`) decides through its parts
    (``channels``, ``drafting``, ``sends``)."""

    def __init__(self, settings: Settings, store: Store,
                 channels: dict[str, ApprovalChannel] | None = None, *,
                 clock: Callable[[], float] | None = None,
                 drafters: dict[str, Drafter] | None = None,
                 senders: dict[str, Sender] | None = None, sources: dict[str, Source] | None = None,
                 send_check_delay: float = 5.0, host: str | None = None,
                 progress: Callable[[str, int, int], None] | None = None):
        self.settings = settings
        self.store = store
        self.by_name = dict(channels or {})
        # An injected clock (a test's, a simulation's) decides leases too; without one
        # the store's clock does (see lease_now).
        self.clock = clock or wall
        self._own_clock = clock is not None
        self.pipelines = {p.name: p for p in settings.pipelines}
        self._drafters = dict(drafters or {})
        self._senders = dict(senders or {})
        self._sources = dict(sources or {})
        self._triagers: dict[str, Triager | None] = {}
        self._progress = progress  # (label, done, total): backfills on the CLI
        self._tasks: set[asyncio.Task] = set()
        self._due: asyncio.Task | None = None  # the due-time loop (start_due)
        self._signatures: Any = None  # bot.gmail.signature.Signatures, on first use
        self.leases = Leases(store, self.pipelines, self.lease_now, self.spawn, home=host)
        self.channels = Channels(settings, store, self.by_name, self.clock)
        self.sends = Sends(settings, store, self.leases, self.channels, self.sender, self.clock,
                           self.spawn, send_check_delay)
        self.drafting = Drafting(settings, store, self.leases, self.channels, self.drafter,
                                 self.clock, self.triager, self.source, self._models_imported,
                                 signature=self.signature)
        self.reminders = Reminders(settings, store, self.channels, self.clock)
        self.followups = Followups(settings, store, self.channels, self.clock)
        self.notes = StyleNoteJobs(settings, store, self.channels, self.clock)
        self.loop = Loop(settings, store, self.channels, self.tick, self.clock, self.reminders)
        self.notify = self.channels.notify
        self.held = self.loop.outage.held  # "store unreachable since …", or None

    # -- stages (each built once, on first use) ------------------------------------------
    def source(self, p: PipelineConfig) -> Source:
        return _built(self._sources, p, build_source, self.settings)

    def drafter(self, p: PipelineConfig) -> Drafter:
        return _built(self._drafters, p, build_drafter, self.settings)

    def triager(self, p: PipelineConfig) -> Triager | None:
        return _built(self._triagers, p, build_triager, self.settings)

    async def _models_imported(self, p: PipelineConfig) -> None:
        """Before ``p``'s drafter and triage are first built: their SDKs imported off
        the event loop (:func:`bot.engine.build.import_models`)."""
        if p.name not in self._drafters or p.name not in self._triagers:
            await import_models(p, self.settings)

    async def signature(self, p: PipelineConfig) -> str:
        """``drafter.signature: gmail``: the Gmail account's own, fetched once a day
        (bot.gmail.signature; imported here, so a deployment without Gmail never loads
        the Gmail client)."""
        account = gmail_account(p, self.settings)
        if account is None:
            return ""
        if self._signatures is None:
            from ..gmail.signature import Signatures

            self._signatures = Signatures(self.settings, self.clock)
        return await self._signatures.get(account)

    def sender(self, p: PipelineConfig) -> Sender:
        return _built(self._senders, p, build_sender, self.settings)

    def pipeline(self, name: str) -> PipelineConfig:
        return self.settings.pipeline(name)

    # -- lifecycle ------------------------------------------------------------------
    async def start(self) -> None:
        """Recover from a crash (sends a crash cut short). The approval channels are
        bound to the desk and started by :class:`bot.app.App` around this."""
        await self.sends.recover()

    def start_due(self) -> None:
        """Start the due-time loop of deferred sends (undo window, send later, sending
        hours; :meth:`Sends.run_due`), once the channels run. Stopped by :meth:`stop`."""
        if self._due is None or self._due.done():
            self._due = asyncio.create_task(self.sends.run_due(), name="due-sends")

    async def stop_tasks(self) -> None:
        """Cancel the background work decisions started, and wait for it."""
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    async def stop(self) -> None:
        """Let in-flight work finish its current transition, then close channels and
        stages."""
        if self._due is not None:
            self._due.cancel()
            await asyncio.gather(self._due, return_exceptions=True)
            self._due = None
        await self.stop_tasks()
        for ch in self.channels.running():
            try:
                await ch.stop()
            except Exception:
                log.exception("stopping approval channel %s", getattr(ch, "name", ch))
        stages: list[Source | Drafter | Sender | Triager] = [
            *self._sources.values(), *self._drafters.values(), *self._senders.values(),
            *filter(None, self._triagers.values())]
        for stage in stages:
            try:
                await stage.close()
            except Exception:
                log.exception("closing %r", stage)
        await self.drafting.context.close()  # the background embedding (issue 24)
        # Last: until here a send may still be in flight, and without the heartbeat
        # another host would take it for abandoned.
        await self.leases.heartbeat.stop()

    def lease_now(self) -> float | None:
        """``now`` for store calls that decide leases: None lets the store use its own
        clock (on PostgreSQL the database's, the one clock all hosts share, so a host
        whose clock is off neither takes a live lease nor strands another's send),
        unless a clock was injected: then that clock decides."""
        return self.clock() if self._own_clock else None

    def spawn(self, coro) -> asyncio.Task:
        """Run ``coro`` in the background; :meth:`stop` cancels and awaits it."""
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        task.add_done_callback(_log_task_error)
        return task

    async def run_forever(self, stop: asyncio.Event,
                          sweep: Callable[[], Awaitable[SweepResult]]) -> None:
        """Every pipeline's loop of ticks, reminders and the digest, and the daily
        ``sweep``, until ``stop`` is set."""
        await self.loop.run_forever(stop, sweep)

    # -- one tick -------------------------------------------------------------------
    @logfmt.about_pipeline
    async def tick(self, name: str, scheduled_for: float | None = None, *,
                   until: float | None = None) -> RunCounts:
        """Run one tick of pipeline ``name`` for slot ``scheduled_for`` (default: the
        newest due slot). Never overlaps another tick of the same pipeline, in this
        process (lock) or on another host (lease row in the store). With ``until``
        (the schedule's loop), drafting claims nothing from then on and what is still
        queued is drafted by the next tick, beside its fetch."""
        p = self.pipeline(name)
        if scheduled_for is None:
            scheduled_for = scheduler.last_due(p, self.clock())
        counts = RunCounts()
        await self.channels.resync_cards()
        # Set again only by a fetch of this tick that stops short (so a tick that does
        # not get that far, whatever the reason, never makes the loop hurry).
        self.loop.backlog.discard(name)
        async with self.leases.hold(name) as held:
            if held:
                await self._tick_locked(p, scheduled_for, counts, until)
            else:
                log.info("%s: another process is running this pipeline; tick skipped", name)
        if not held and until is not None:
            await self._help(p, until)
        return counts

    async def _followups(self, p: PipelineConfig) -> None:
        """Queue ``p``'s due follow-ups (and cancel answered ones) before this tick
        drafts: a failure is logged, the tick goes on."""
        if p.followup is None:
            return
        try:
            await self.followups.check(p)
        except StoreUnavailable:
            raise
        except Exception as exc:
            log.warning("%s: follow-ups: %s", p.name, describe_error(exc),
                        exc_info=not isinstance(exc, DraftgateError))

    async def _help(self, p: PipelineConfig, until: float) -> None:
        """Another process runs ``p``'s tick (fetch, admit, outbox, sends): this one
        drafts beside it until ``until``, each item under its own claim and fence, and
        posts the cards of what it drafted. So several hosts share one pipeline's
        drafting, the slow part, while its ticks still never overlap."""
        counts = RunCounts()
        try:
            await self.drafting.draft_queued(p, counts, until, helping=True)
        except Exception as exc:
            log.warning("%s: drafting beside another process's tick failed: %s", p.name,
                        describe_error(exc), exc_info=not isinstance(exc, DraftgateError))
        if counts.drafted:
            log.info("%s: drafted %d beside another process's tick (posted %d)", p.name,
                     counts.drafted, counts.posted)

    async def _tick_locked(self, p: PipelineConfig, scheduled_for: float, counts: RunCounts,
                           until: float | None) -> None:
        started = self.clock()
        try:
            run_id = await self.store.start_run(p.name, scheduled_for, now=started)
        except StoreUnavailable:
            raise  # the loop holds the ticks (bot.engine.outage)
        except Exception as exc:
            log.error("%s: store unavailable, tick not run: %s", p.name, describe_error(exc))
            return
        logfmt.bind(run_id=run_id)
        error: str | None = None
        # What an earlier tick left queued (see ``until``) is drafted and posted while
        # this one fetches: the approval channel, the slowest stage, keeps working.
        early = asyncio.create_task(self.drafting.draft_queued(p, counts, until)) \
            if until is not None else None
        try:
            try:
                await self._fetch_and_admit(p, scheduled_for, counts)
            except StoreUnavailable:
                raise
            except Exception as exc:
                error = describe_error(exc)
                log.warning("%s: fetch failed: %s", p.name, error,
                            exc_info=not isinstance(exc, DraftgateError))
                if isinstance(exc, Throttled):  # `status` says held, until Retry-After
                    await self.drafting.hold(p, error, exc.until)
            await self._followups(p)
            try:
                # A post that failed early is the one try of this tick (see _drain).
                await self._drain(p, counts, until, draft=early is None or await early)
            except StoreUnavailable:
                raise
            except Exception as exc:
                error = error or describe_error(exc)
                log.warning("%s: %s", p.name, error, exc_info=not isinstance(exc, DraftgateError))
        except StoreUnavailable as exc:
            await self._cut_by_outage(p, run_id, counts, early, exc, started)
            raise
        except asyncio.CancelledError:
            if early is not None:
                early.cancel()
                await asyncio.gather(early, return_exceptions=True)
            # Stopped mid-tick (Ctrl-C, SIGTERM): close the run row instead of leaving
            # it "running". A deliberate stop is no failure: recorded as stopped, not
            # red, and nobody is notified.
            with contextlib.suppress(Exception):
                await asyncio.shield(self.store.end_run(
                    run_id, STOPPED, counts.to_dict(), STOPPED_TEXT, now=self.clock()))
            metrics.tick_done(p.name, STOPPED, counts, self.clock() - started)
            raise
        await self.notes.tick(p)  # style notes: the weekly distill, unposted cards
        await self._record_run(p, run_id, counts, error, started)

    async def _record_run(self, p: PipelineConfig, run_id: int, counts: RunCounts,
                          error: str | None, started: float) -> None:
        """Close the run row; tell the operators when the pipeline changes colour."""
        status = "error" if error else "ok"
        metrics.tick_done(p.name, status, counts, self.clock() - started)
        try:
            recent = await self.store.recent_runs(p.name, limit=10)
            # The colour before this run: stopped runs in between change nothing.
            previous = next((r for r in recent[1:] if r.status in ("ok", "error")), None)
            await self.store.end_run(run_id, status, counts.to_dict(), error, now=self.clock())
        except StoreUnavailable:
            ended = self.clock()
            self.loop.outage.after_outage(functools.partial(
                self.store.end_run, run_id, status, counts.to_dict(), error, now=ended))
            raise
        except Exception as exc:
            log.error("%s: could not record the run: %s", p.name, describe_error(exc))
            return
        if previous is not None and previous.status in ("ok", "error") and previous.status != status:
            if status == "error":
                await self.channels.notify(f"❌ {p.name} turned red: {error}")
            else:
                await self.channels.notify(f"✅ {p.name} is green again")
        elif previous is None and status == "error":
            await self.channels.notify(f"❌ {p.name} failed: {error}")

    async def _cut_by_outage(self, p: PipelineConfig, run_id: int, counts: RunCounts,
                             early: asyncio.Task | None, exc: StoreUnavailable,
                             started: float) -> None:
        """The store went away mid-tick: stop the drafting begun beside the fetch, and
        record the run as failed once the store is back (nothing else to do now: what
        was not admitted is fetched again, a claim not finished goes back to the queue)."""
        if early is not None:
            early.cancel()
            await asyncio.gather(early, return_exceptions=True)
        metrics.tick_done(p.name, "error", counts, self.clock() - started)
        ended = self.clock()
        self.loop.outage.after_outage(functools.partial(
            self.store.end_run, run_id, "error", counts.to_dict(),
            f"the store became unreachable: {describe_error(exc)}", now=ended))

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
                                      check=lambda: self.leases.still_held(p.name), clock=self.clock)
        if refused:
            # Left unseen and the cursor not moved past them: the next tick fetches them
            # again (a full disk frees up; a store that keeps refusing keeps the run red).
            raise StoreError(
                f"{len(refused)} new item(s) could not be stored and are fetched again next "
                f"tick: " + "; ".join(f"{i}: {e}" for i, e in refused[:3])
                + (f"; and {len(refused) - 3} more" if len(refused) > 3 else ""))
        if result.more:
            self.loop.backlog.add(p.name)
            log.info("%s: %d new item(s) taken (max_per_tick %d); more wait at the source "
                     "for the next tick", p.name, counts.fetched, p.max_per_tick)

    async def drain(self, name: str) -> RunCounts:
        """Draft what is queued, post what is ready, send what is approved (skipped
        if another process holds the pipeline: its tick does the same)."""
        counts = RunCounts()
        p = self.pipeline(name)
        async with self.leases.hold(name) as held:
            if held:
                await self._drain(p, counts)
        # Drained means done: an unknown send this process made is checked by its own
        # delayed task (not by _drain, see Sends.check_unknown), so wait for those too.
        await self.sends.checks_done(p)
        return counts

    async def _drain(self, p: PipelineConfig, counts: RunCounts, until: float | None = None,
                     draft: bool = True) -> None:
        # draft_queued is False when a post failed: one try per tick.
        if draft and await self.drafting.draft_queued(p, counts, until):
            await self._post_ready(p, counts)
        await self.sends.send_approved(p, counts)
        await self.sends.check_unknown(p, counts)

    async def _post_ready(self, p: PipelineConfig, counts: RunCounts) -> None:
        batch = 100
        while True:
            waiting = await self.store.unposted(p.name, limit=batch, now=self.leases.now())
            for d in waiting:
                self.leases.still_held(p.name)
                if not await self.channels.post_counted(p, d, counts):
                    return  # the channel is unreachable: the rest wait in ready
            if len(waiting) < batch:
                return

    async def post_unposted(self) -> int:
        """Post every ``ready`` draft (the outbox pattern: cards survive restarts)."""
        n = 0
        for p in self.pipelines.values():
            async with self.leases.hold(p.name) as held:
                if held:
                    counts = RunCounts()
                    await self._post_ready(p, counts)
                    n += counts.posted
        return n

    async def wait_idle(self) -> None:
        """Wait for the background work decisions started (a regenerate's drafting, a
        delayed check of an unknown send) to finish."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)


def gmail_account(p: PipelineConfig, settings: Settings) -> str | None:
    """The Gmail account of ``p``'s sender, else of its source (None: neither is one)."""
    for options in (p.sender, p.source):
        account = getattr(options, "account", None)
        if account and account in settings.gmail_accounts:
            return str(account)
    return None


def _built(cache: dict, p: PipelineConfig, build: Callable, settings: Settings):
    if p.name not in cache:
        cache[p.name] = build(p, settings)
    return cache[p.name]


def _own_addresses(p: PipelineConfig, settings: Settings) -> list[str]:
    own = list(p.filters.own_addresses)
    account = getattr(p.source, "account", None)  # a Gmail source's
    if account and account in settings.gmail_accounts:
        addr = settings.gmail_accounts[account].address
        if addr:
            own.append(str(addr))
    sender_from = getattr(p.sender, "from_addr", None)  # an outbox sender's
    if sender_from:
        own.append(sender_from.addr_spec)
    return [a for a in own if a]


def _log_task_error(task: asyncio.Task) -> None:
    if not task.cancelled() and (exc := task.exception()) is not None:
        if isinstance(exc, StoreUnavailable):  # the outage is reported once, by the loop
            log.info("background task stopped: %s", describe_error(exc))
        else:
            log.error("background task failed", exc_info=exc)
