"""Prometheus metrics and the loops' liveness, for ``observability.listen`` and systemd.

One :class:`Observer` per ``draftgate run``, with its own ``CollectorRegistry`` (never
prometheus_client's global one, so that several can live in one process, as in tests)
and its :class:`~bot.service.health.Health`. The engine, drafting, sending, Gmail and Telegram
code call the functions below, one line each; while no observer is installed (every
command but ``run`` with observability or a systemd watchdog on) each is one test of a
global.

Labels are low-cardinality by rule: pipeline, model and account names from the
configuration, outcomes and statuses from fixed sets, Telegram method names. Never an
item id, a draft id or an address. With several hosts each process counts its own
work; the gauges read from the shared store say so in their help text.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Info,
    disable_created_metrics,
    generate_latest,
)

from .. import scoreboard
from ..models import Draft, DraftRequest, DraftResult, Status
from .health import Health, pipeline_bound

#: Store-read gauges are refreshed at most this often, however often /metrics is scraped.
STORE_CACHE_SECONDS = 5.0
#: The scoreboard gauges (a month of decisions, edit sizes measured) less often.
SCOREBOARD_CACHE_SECONDS = 300.0
SCOREBOARD_DAYS = 30
#: The scoreboard figures exported as gauges (a fixed set: the ``figure`` label).
SCOREBOARD_FIGURES = ("decided", "sent", "sent_as_drafted", "as_drafted_share", "edited",
                      "edit_size_median", "regenerations_per_sent", "rejected",
                      "decision_p50", "decision_p90", "overridden", "flagged_per_draft",
                      "flagged_sent")
_SHARED = " Read from the store: with several hosts on one store, every host reports " \
          "the same value."
_SEND_OUTCOME: dict[str, str] = {Status.SENT: "sent", Status.SEND_FAILED: "failed", Status.SEND_UNKNOWN: "unknown"}


class Metrics:
    """Every metric draftgate exposes, in one registry."""

    def __init__(self, version: str):
        disable_created_metrics()  # no *_created series: a counter's start is not news
        r = self.registry = CollectorRegistry(auto_describe=True)
        Info("draftgate_build", "The running draftgate's version.", registry=r).info(
            {"version": version})
        pl = ["pipeline"]
        self.ticks = Counter("draftgate_ticks", "Ticks by outcome (ok, error, stopped).",
                             pl + ["outcome"], registry=r)
        self.tick_seconds = Histogram(
            "draftgate_tick_duration_seconds", "How long a tick took.", pl, registry=r,
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600))
        self.items = Counter("draftgate_items", "Items by what a tick did with them: admitted "
                             "(new, queued), skipped (a filter), drafted, failed (drafting "
                             "gave up). Counted when the tick ends.", pl + ["outcome"], registry=r)
        self.sends = Counter("draftgate_sends", "Send attempts by outcome (sent, failed, "
                             "unknown).", pl + ["outcome"], registry=r)
        self.model_calls = Counter("draftgate_model_calls", "Drafter calls by model (the "
                                   "models: key) and outcome.", ["model", "outcome"], registry=r)
        self.model_seconds = Histogram(
            "draftgate_model_call_duration_seconds", "Drafter call latency.",
            ["model", "outcome"], registry=r,
            buckets=(0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 30, 60, 120))
        self.tokens = Counter("draftgate_model_tokens", "Tokens the model reported, by "
                              "direction (input, output).", ["model", "direction"], registry=r)
        self.telegram_errors = Counter(
            "draftgate_telegram_api_errors", "Telegram Bot API calls that failed, by method "
            "and error (an HTTP status, or network/timeout).", ["method", "error"], registry=r)
        self.telegram_429 = Counter(
            "draftgate_telegram_rate_limited", "Telegram 429 answers (flood control), by "
            "method; also counted in draftgate_telegram_api_errors_total.", ["method"], registry=r)
        self.gmail_units = Counter("draftgate_gmail_quota_units", "Gmail API quota units "
                                   "spent (each attempt of each call), by account.",
                                   ["account"], registry=r)
        self.last_ok = Gauge("draftgate_last_successful_tick_timestamp_seconds",
                             "When this process's last ok tick of the pipeline ended (Unix "
                             "time).", pl, registry=r)
        self.decision_wait = Histogram(
            "draftgate_card_decision_wait_seconds", "From an item's draft being queued to "
            "an operator's decision on its card (approved, rejected): how long customers "
            "wait on the team.", pl + ["decision"], registry=r,
            buckets=(60, 300, 900, 1800, 3600, 7200, 14400, 28800, 86400, 172800, 604800))
        self.drafts = Gauge("draftgate_drafts", "Drafts by pipeline and status." + _SHARED,
                            pl + ["status"], registry=r)
        self.oldest_card = Gauge("draftgate_oldest_undecided_card_age_seconds",
                                 "Age of the oldest draft awaiting a decision (0: none)."
                                 + _SHARED, pl, registry=r)
        self.scoreboard = Gauge(
            "draftgate_scoreboard", "The scoreboard of the last 30 days by pipeline (what "
            "`draftgate stats --json` gives as total; README \"Scoreboard\"): figure is one "
            f"of {', '.join(SCOREBOARD_FIGURES)}; seconds for decision_p50/p90, 0-1 for "
            "shares and the edit size. Refreshed at most every "
            f"{SCOREBOARD_CACHE_SECONDS:g}s." + _SHARED, pl + ["figure"], registry=r)
        self._children: dict[tuple, Any] = {}

    def child(self, metric: Any, *labels: str) -> Any:
        """``metric.labels(*labels)``, remembered: the per-event calls skip the
        library's label checks and lock (the labels are few by design)."""
        key = (metric, labels)
        found = self._children.get(key)
        if found is None:
            found = self._children[key] = metric.labels(*labels)
        return found


class Observer:
    """What one ``run`` process watches: its metrics (None when no listener serves
    them) and its loops' health."""

    def __init__(self, metrics: Metrics | None, health: Health | None = None):
        self.metrics = metrics
        self.health = health or Health()
        self._store_read = -STORE_CACHE_SECONDS
        self._scoreboard_read = -SCOREBOARD_CACHE_SECONDS
        self._store_lock = asyncio.Lock()

    async def refresh_store(self, store: Any, now: float | None = None) -> None:
        """Update the store-read gauges, at most every :data:`STORE_CACHE_SECONDS` (the
        scoreboard's every :data:`SCOREBOARD_CACHE_SECONDS`); ``now``: the wall clock."""
        m = self.metrics
        async with self._store_lock:
            if m is None or time.monotonic() - self._store_read < STORE_CACHE_SECONDS:
                return
            counts, oldest = await store.draft_gauges()
            m.drafts.clear()
            for (pipeline, status), n in counts.items():
                m.drafts.labels(pipeline, status).set(n)
            m.oldest_card.clear()
            now = time.time() if now is None else now
            for pipeline, _status in {k for k in counts if k[1] == Status.AWAITING}:
                m.oldest_card.labels(pipeline).set(max(0.0, now - oldest[pipeline]))
            self._store_read = time.monotonic()
            if self._store_read - self._scoreboard_read >= SCOREBOARD_CACHE_SECONDS:
                await self._refresh_scoreboard(m, store, now)
                self._scoreboard_read = time.monotonic()

    @staticmethod
    async def _refresh_scoreboard(m: Metrics, store: Any, now: float) -> None:
        since = now - SCOREBOARD_DAYS * scoreboard.DAY
        decisions, overrides = await store.quality(since, now)
        board = await asyncio.to_thread(scoreboard.build, decisions, overrides, since=since,
                                        until=now)
        m.scoreboard.clear()
        for pipeline, f in board.pipelines.items():
            values = f.to_dict()
            for figure in SCOREBOARD_FIGURES:
                if values[figure] is not None:
                    m.scoreboard.labels(pipeline, figure).set(values[figure])

    def exposition(self) -> bytes:
        assert self.metrics is not None
        return generate_latest(self.metrics.registry)


_active: Observer | None = None


def install(observer: Observer | None) -> None:
    """Make ``observer`` the one the functions below report to (None: none)."""
    global _active
    _active = observer


def installed() -> Observer | None:
    return _active


def _m() -> Metrics | None:
    return None if _active is None else _active.metrics


# -- what the loops call --------------------------------------------------------------------

def loop_waiting(p: Any, seconds: float) -> None:
    """Pipeline ``p``'s loop sleeps ``seconds`` until its next slot."""
    if (o := _active) is not None:
        o.health.expect(p.name, pipeline_bound(p, time.time()))
        o.health.waiting(p.name, seconds)


def loop_busy(name: str) -> None:
    if (o := _active) is not None:
        o.health.busy(name)


def progress(name: str) -> None:
    if (o := _active) is not None:
        o.health.progress(name)


def store_held(since: float | None, error: str = "") -> None:
    """The store is unreachable since ``since`` (None: reachable again)."""
    if (o := _active) is not None:
        o.health.hold(since, error)


# -- what the engine, drafting, sending and the channels call -------------------------------

def tick_done(pipeline: str, status: str, counts: Any, seconds: float) -> None:
    """A tick ended with ``status`` (ok, error, stopped) and ``counts`` (RunCounts)."""
    progress(pipeline)
    if (m := _m()) is None:
        return
    m.child(m.ticks, pipeline, status).inc()
    m.child(m.tick_seconds, pipeline).observe(seconds)
    for outcome, n in (("admitted", counts.new), ("skipped", counts.skipped),
                       ("drafted", counts.drafted), ("failed", counts.failed)):
        if n:
            m.child(m.items, pipeline, outcome).inc(n)
    if status == "ok":
        m.child(m.last_ok, pipeline).set(time.time())


def sent(after: Draft | None) -> None:
    """A send ended: ``after`` is the draft as it ended (sent, send_failed, send_unknown)."""
    if after is None:
        return
    progress(after.pipeline)
    if (m := _m()) is not None and (outcome := _SEND_OUTCOME.get(after.status)):
        m.child(m.sends, after.pipeline, outcome).inc()


def decided(after: Draft | None, decision: str) -> None:
    """An operator's decision (approved, rejected) took effect on ``after``."""
    if after is None or (m := _m()) is None:
        return
    waited = (after.decided_at or time.time()) - after.created_at
    m.child(m.decision_wait, after.pipeline, decision).observe(max(0.0, waited))


def telegram_call(method: str, status: int | None, error: str | None = None) -> None:
    """A Bot API call ended: HTTP ``status``, or ``error`` (network, timeout) without one.
    Any answer is a sign of life of the Telegram receiver."""
    progress("telegram")
    if (m := _m()) is None or (status is not None and status < 400):
        return
    m.child(m.telegram_errors, method, str(status) if status is not None else error or "other").inc()
    if status == 429:
        m.child(m.telegram_429, method).inc()


#: Gmail's published quota units per method (the ones draftgate calls).
GMAIL_UNITS = {"getProfile": 1, "labels.list": 1, "history.list": 2, "messages.list": 5,
               "messages.get": 5, "messages.modify": 5, "drafts.list": 5,
               "drafts.create": 10, "threads.get": 10, "messages.send": 100}


def gmail_call(account: str, method_id: object) -> None:
    """A Gmail request is issued (``method_id`` as googleapiclient names it,
    ``gmail.users.messages.get``)."""
    if (m := _m()) is not None:
        route = str(method_id or "").removeprefix("gmail.users.")
        m.child(m.gmail_units, account).inc(GMAIL_UNITS.get(route, 0))


def watch_drafter(drafter: Any, pipeline: str, model: str) -> Any:
    """``drafter`` timed and counted (and each answer a sign of its pipeline's progress),
    when an observer is installed; else as it is."""
    return drafter if _active is None else _TimedDrafter(drafter, pipeline, model)


class _TimedDrafter:
    """A drafter whose calls are counted and timed by model and outcome."""

    def __init__(self, inner: Any, pipeline: str, model: str):
        self._inner, self._pipeline, self._model = inner, pipeline, model
        self.name = inner.name

    def __getattr__(self, name: str) -> Any:  # opts, close, ... of the drafter itself
        return getattr(self._inner, name)

    async def draft(self, request: DraftRequest) -> DraftResult:
        started = time.monotonic()
        try:
            result = await self._inner.draft(request)
        except asyncio.CancelledError:
            self._done("cancelled", started, None)
            raise
        except Exception as exc:
            self._done(_model_outcome(exc), started, None)
            raise
        self._done("ok", started, result)
        return result

    def _done(self, outcome: str, started: float, result: DraftResult | None) -> None:
        seconds = time.monotonic() - started
        progress(self._pipeline)
        if (m := _m()) is None:
            return
        m.child(m.model_calls, self._model, outcome).inc()
        m.child(m.model_seconds, self._model, outcome).observe(seconds)
        if result is not None:
            for direction, n in (("input", result.tokens_in), ("output", result.tokens_out)):
                if n > 0:
                    m.child(m.tokens, self._model, direction).inc(n)


def _model_outcome(exc: BaseException) -> str:
    from ..errors import BudgetExhausted, DrafterRetryable, DrafterSetupError

    for kind, label in ((BudgetExhausted, "budget"), (DrafterSetupError, "setup_error"),
                        (DrafterRetryable, "retryable"), (TimeoutError, "timeout")):
        if isinstance(exc, kind):
            return label
    return "error"
