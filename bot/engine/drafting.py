"""Drafting queued items with the model, and when not to: budgets and model trouble.

Model trouble (429, 5xx, timeouts) is the provider's, not the items': after a
retryable failure a pipeline drafts one item per tick (a probe) until a draft
succeeds, and not at all until a Retry-After has passed, so an outage costs one
attempt per tick instead of one per queued item. Why drafting is held is recorded in
the store (``set_hold``) so `status` in any process shows it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Awaitable, Callable

from ..clock import utc_day
from ..config.load import PipelineConfig, Settings
from ..context import grounded
from ..context.builder import ContextBuilder
from ..errors import (
    BudgetExhausted,
    DrafterError,
    DrafterRetryable,
    DrafterSetupError,
    DraftgateError,
    describe_error,
)
from ..models import Draft, DraftRequest, RunCounts, Status
from ..service import logfmt
from ..stages import Drafter, Source, Triager
from ..store import Store
from .channels import Channels
from .lease import Leases

log = logging.getLogger("draftgate.engine")

#: Longest a model's Retry-After holds a pipeline's drafting (a larger or endless one
#: is cut to this, so drafting is never stopped for good by one answer).
MAX_MODEL_HOLD = 3600.0

#: A process helping with another's tick (see ``draft_queued``) posts the cards of its
#: drafts itself; the tick's outbox leaves them to it for this long (a post that
#: failed, or a helper that died, is posted by a tick after it).
HELPER_POST_LEASE = 60.0


class Drafting:
    def __init__(self, settings: Settings, store: Store, leases: Leases, operators: Channels,
                 drafter: Callable[[PipelineConfig], Drafter], clock: Callable[[], float],
                 triager: Callable[[PipelineConfig], Triager | None] = lambda p: None,
                 source: Callable[[PipelineConfig], Source] | None = None,
                 prepare: Callable[[PipelineConfig], Awaitable[None]] | None = None,
                 signature: Callable[[PipelineConfig], Awaitable[str | None]] | None = None):
        self.settings, self.store, self.leases, self.operators = settings, store, leases, operators
        self._drafter, self.clock, self._triager = drafter, clock, triager
        # Awaited before the drafter and triager are used (the engine imports their
        # SDKs there, off the event loop).
        self._prepare = prepare
        self._signature = signature  # drafter.signature: gmail, fetched (Engine.signature)
        # What a draft is based on besides the email (thread, examples, knowledge).
        self.context = ContextBuilder(store, source or (lambda p: None), settings)
        self._in_flight = asyncio.Semaphore(settings.max_in_flight)
        self._model_trouble: set[str] = set()
        self._not_before: dict[str, float] = {}
        # Pipelines known to have no drafting hold recorded in the store (see _hold),
        # so a working pipeline does not write "no hold" after every draft.
        self._not_held: set[str] = set()

    async def signature(self, p: PipelineConfig) -> str | None:
        """The signature fetched for ``p`` (``signature: gmail``); None: its configured one."""
        if self._signature is None or p.drafter.signature != "gmail":
            return None
        return await self._signature(p)

    # -- when not to draft ------------------------------------------------------------
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
        await self.operators.notify_once(
            f"budget|{p.name}|{day}",
            f"⏸ {p.name}: daily token budget spent ({used:,} of {p.daily_token_budget:,} "
            f"tokens on {day} UTC). Items stay queued and are drafted tomorrow; raise "
            f"daily_token_budget in {p.file} to continue today.")
        return False

    async def refuse_if_waiting(self, d: Draft) -> None:
        """A Regenerate that nothing would act on soon is refused with the reason, and
        the card stays as it is (otherwise it would sit at 'Regenerating…')."""
        p = self.settings.pipeline(d.pipeline)
        used = await self._budget_spent(p)
        if used is not None:
            raise BudgetExhausted(
                f"Not regenerated: {p.name}'s daily token budget is spent ({used:,} of "
                f"{p.daily_token_budget:,}). Try tomorrow (UTC), or raise "
                f"daily_token_budget in {p.file}.")
        wait = self._not_before.get(p.name, 0.0) - self.clock()
        if wait > 0:
            raise DrafterRetryable(f"Not regenerated: the model asked to wait; try again in "
                                   f"{max(1, round(wait / 60))} min.")

    async def hold(self, p: PipelineConfig, reason: str, until: float) -> None:
        """Record that ``p`` waits for its mail service (throttled) until ``until``."""
        await self._hold(p, reason, until)

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

    # -- drafting ---------------------------------------------------------------------
    async def draft_queued(self, p: PipelineConfig, counts: RunCounts,
                           until: float | None = None, *, helping: bool = False) -> bool:
        """Draft what is queued, posting each card as its draft is stored; no claim
        starts at or after ``until`` (the rest stay queued for the next tick). False if
        the approval channel was unreachable for one of them (the rest wait in ready).
        ``helping``: another process runs the pipeline's tick and this one only drafts
        beside it (each item under its own claim) and posts what it drafted."""
        if not helping:  # (the tick does that)
            await self._requeue_expired(p, counts)
        wait = self._not_before.get(p.name, 0.0) - self.clock()
        if wait > 0:
            log.info("%s: the model asked to wait; drafting resumes in %.0fs", p.name, wait)
            return True
        workers = 1 if p.name in self._model_trouble else max(1, self.settings.max_in_flight)
        stop = asyncio.Event()
        channel_down = asyncio.Event()
        lost = lambda: self.leases.is_lost(p.name)  # noqa: E731
        post_lease = HELPER_POST_LEASE if helping else None

        async def worker() -> None:
            while not stop.is_set():
                if until is not None and self.clock() >= until:
                    stop.set()
                    return
                if not await self._budget_left(p):
                    stop.set()
                    return
                drafted: list[Draft] = []
                async with self._in_flight:
                    if stop.is_set() or lost():
                        stop.set()
                        return
                    claimed = await self.store.claim(p.name, p.lease, limit=1,
                                                     now=self.leases.now())
                    if not claimed:
                        stop.set()
                        return
                    if not await self.draft_one(p, claimed[0], counts, drafted.append,
                                                post_lease=post_lease):
                        stop.set()
                # Its card goes out now, not after the whole queue is drafted. Through
                # the outbox all the same: the row is `ready` until posted, so a crash
                # here leaves it to post_unposted / the next tick.
                for d in drafted:
                    if not channel_down.is_set() and not lost():
                        if not await self.operators.post_counted(p, d, counts):
                            channel_down.set()  # the rest wait in ready for post_ready

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
        self.leases.still_held(p.name)
        return not channel_down.is_set()

    async def _requeue_expired(self, p: PipelineConfig, counts: RunCounts) -> None:
        """A lease left by a crashed or hung worker goes back to the queue here, on
        every tick, rather than waiting for the daily sweep."""
        _requeued, failed = await self.store.requeue_expired(
            p.name, max_attempts=p.max_attempts, now=self.leases.now())
        if failed:
            counts.failed += failed
            await self.operators.notify(f"⚠️ {p.name}: {failed} draft(s) failed: their drafting lease "
                                    f"expired on the last attempt. /pending and /status show them; "
                                    f"/replay retries one.")

    @logfmt.about_draft
    async def draft_one(self, p: PipelineConfig, d: Draft, counts: RunCounts,
                        ready: Callable[[Draft], None] | None = None, *,
                        post_lease: float | None = None) -> bool:
        """Draft one claimed item; False when the model is in trouble (stop claiming).
        ``ready`` gets the stored draft (status ``ready``) when one was made, or the
        ``notified`` one whose FYI card is to be posted when triage said notify.
        ``post_lease``: the caller posts that card, and no outbox does for so long
        (``Store.finish_draft``)."""
        if self._prepare is not None:
            await self._prepare(p)
        triaged = await self._triaged(p, d, counts, ready, post_lease)
        if triaged is None:
            return True
        d = triaged
        request = await self._request(p, d)
        context = request.context
        try:
            # The drafter times out on its own; this bound keeps a misbehaving one
            # inside its lease so a stale answer can never race a newer claim.
            result = await asyncio.wait_for(self._drafter(p).draft(request), timeout=p.lease * 0.9)
        except (BudgetExhausted, DrafterSetupError) as exc:
            await self._stopped(p, d, exc)
            return False
        except asyncio.CancelledError:
            # Shutting down mid-call: hand the item straight back to the queue (fenced)
            # instead of leaving it to wait out its lease.
            with contextlib.suppress(Exception):
                await asyncio.shield(self.store.release(d.id, d.fence))
            raise
        except Exception as exc:
            return await self._failed(p, d, exc, counts)
        self._model_trouble.discard(p.name)
        await self._hold(p, None)  # drafting works (again)
        body = (result.body or "").strip()
        # The check is CPU work on up to max_input characters per source: off the loop,
        # so taps and other drafts are not held up by it.
        used = await asyncio.to_thread(grounded.check, p, request, body, (
            result.used if result.used is not None else context.used()))
        stored = await self.store.finish_draft(d.id, d.fence, body, tokens_in=result.tokens_in,
                                               tokens_out=result.tokens_out,
                                               model=result.model, now=self.clock(),
                                               used=used, post_lease=post_lease,
                                               lease_now=self.leases.now())
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

    async def _request(self, p: PipelineConfig, d: Draft) -> DraftRequest:
        """What the model is given for ``d``: the email, its context, the signature and
        the pipeline's approved style notes (only approved ones)."""
        context = await self.context.build(p, d)
        notes = await self.store.approved_notes(p.name)
        return DraftRequest(pipeline=p.name, message=d.message, instruction=d.instruction,
                            previous_body=d.body, draft_key=d.key, context=context,
                            signature=await self.signature(p),
                            style_notes=tuple(notes.rules) if notes else ())

    async def _stopped(self, p: PipelineConfig, d: Draft,
                       exc: BudgetExhausted | DrafterSetupError) -> None:
        """Drafting must stop for ``p``: the budget is spent, or the model cannot be used
        at all (key, model name, base_url, prompt file), so every item would fail alike.
        The item goes back to the queue, uncounted; later ticks probe with one item."""
        await self.store.release(d.id, d.fence)
        if isinstance(exc, BudgetExhausted):
            await self._hold(p, describe_error(exc))
            await self.operators.notify(f"⏸ {p.name}: {exc}")
            return
        self._model_trouble.add(p.name)
        await self._hold(p, f"setup error: {describe_error(exc)}; fix it (then restart "
                            f"draftgate if you changed the configuration or an "
                            f"environment variable)")
        await self.operators.notify_once(
            f"setup|{p.name}|{utc_day(self.clock())}",
            f"⚠️ {p.name}: drafting is stopped: {describe_error(exc)}. Items wait in the "
            f"queue; fix it (then restart draftgate if you changed the configuration "
            f"or an environment variable).")

    async def _triaged(self, p: PipelineConfig, d: Draft, counts: RunCounts,
                       ready: Callable[[Draft], None] | None,
                       post_lease: float | None = None) -> Draft | None:
        """Triage a claimed draft before drafting it: the draft to draft now, or None
        when there is nothing to draft (notified, skipped, or its lease was lost).
        Only version 1 is triaged, once: the decision is stored with the draft (a
        claim after a crash finds it), and a later version is one a human asked for
        (replay, Draft a reply, regenerate)."""
        # A follow-up (issue 28) answers our own reply: nothing to sort.
        triager = self._triager(p) if d.version == 1 and d.scope != "followup" else None
        if triager is None or d.triage is not None:
            return d
        try:
            decision = await triager.triage(d.message)
        except asyncio.CancelledError:  # shutting down: the item goes straight back
            with contextlib.suppress(Exception):
                await asyncio.shield(self.store.release(d.id, d.fence))
            raise
        counts.tokens += decision.tokens
        after = await self.store.record_triage(
            d.id, d.fence, decision.action, decision.reason, tokens=decision.tokens,
            lease_seconds=p.lease, now=self.clock(), post_lease=post_lease,
            lease_now=self.leases.now())
        if decision.failed:
            counts.triage_failed += 1
            await self.operators.notify_once(
                f"triage|{p.name}|{utc_day(self.clock())}",
                f"⚠️ {p.name}: triage is not working ({decision.reason}). Every email is "
                f"drafted until it works again; check the triage model in {p.file}.")
        if after is None:  # the lease was lost: the new claim finds no decision, or this one
            log.warning("%s: triage of %s arrived after its lease was lost", p.name, d.key)
            await self.store.add_tokens(p.name, decision.tokens, now=self.clock())
            return None
        log.info("%s #%d: triage %s: %s", p.name, d.id, decision.action, decision.reason)
        if after.status in (Status.SKIPPED, Status.NOTIFIED):
            if after.status == Status.SKIPPED:
                counts.skipped += 1
            else:
                counts.notified += 1
            if p.mark_seen == "on_success":  # final (or up to an operator), like skipped
                await self.store.mark_seen(p.name, d.scope, [d.item_id], now=self.clock())
            if after.status == Status.NOTIFIED and ready is not None:
                ready(after)  # its FYI card goes out like a draft's card
            return None
        return after

    async def _failed(self, p: PipelineConfig, d: Draft, exc: Exception, counts: RunCounts) -> bool:
        """Record a failed drafting call; False when the model may be in trouble."""
        retryable = not isinstance(exc, DrafterError) or isinstance(exc, DrafterRetryable)
        reason = describe_error(exc)
        spent = int(getattr(exc, "tokens", 0) or 0)  # an unusable answer was still paid for
        if spent:
            counts.tokens += spent
            await self.store.add_tokens(p.name, spent, now=self.clock())
        if not isinstance(exc, DraftgateError):
            log.exception("%s: drafter crashed on %s", p.name, d.key, exc_info=exc)
        after = await self.store.fail_draft(d.id, d.fence, reason, retryable=retryable,
                                            max_attempts=p.max_attempts, now=self.clock())
        if after is not None and after.status == Status.FAILED:
            counts.failed += 1
            if p.mark_seen == "on_success":  # final, like skipped (see bot.engine.admit)
                await self.store.mark_seen(p.name, d.scope, [d.item_id], now=self.clock())
            if after.approval_message_id:  # a regenerate that failed: say so on the card
                await self.operators.update_card(after)
            # The channel offers the replay (a button, or the command to type).
            await self.operators.notify(f"⚠️ {p.name} #{d.id}: drafting failed after {after.attempt} "
                                    f"attempt(s): {reason}.", retry_draft=after)
        if not retryable:
            return True
        self._model_trouble.add(p.name)  # a 429, 5xx, timeout or crash: the model may be in trouble
        wait = getattr(exc, "retry_after", None)
        if isinstance(exc, DrafterRetryable) and wait is not None and wait > 0:
            wait = min(wait, MAX_MODEL_HOLD)  # inf too; nan is not > 0
            self._not_before[p.name] = self.clock() + wait
            await self._hold(p, f"the model asked to wait ({reason}); drafting "
                                f"resumes by itself", until=self.clock() + wait)
            if wait > 300:
                await self.operators.notify_once(
                    f"hold|{p.name}|{utc_day(self.clock())}",
                    f"⏸ {p.name}: the model asked to wait {wait / 60:.0f} min "
                    f"({reason}); items stay queued and drafting resumes then.")
        else:
            await self._hold(p, f"the model is failing ({reason}); one item per "
                                f"tick is tried until a draft succeeds")
        return False
