"""When ticks run. Pure functions of (schedule, time) first, tested by table; the loop
that uses them lives in :mod:`bot.loop`.

Slots come from the scheduled time, never from ``now()``: a catch-up run for 10:00
that happens at 10:07 is still the 10:00 slot, so it produces the same draft key as
the original run would have.

Interval schedules are aligned to the Unix epoch (``5m`` -> :00, :05, :10 UTC), so
every host and every restart agrees on the slots. Cron schedules are evaluated in UTC.
"""

from __future__ import annotations

import math
import time
from datetime import datetime, timezone
from typing import Protocol


class _Schedule(Protocol):  # read-only: PipelineConfig and options.Context are frozen
    @property
    def interval(self) -> float | None: ...
    @property
    def cron(self) -> str | None: ...


def validate_cron(expr: str) -> str | None:
    """None if ``expr`` is a valid 5-field cron expression, else the reason."""
    from croniter import croniter

    if len(expr.split()) != 5:
        return f"{expr!r} has {len(expr.split())} fields, cron needs 5 (minute hour day month weekday)"
    try:
        it = croniter(expr, datetime.fromtimestamp(time.time(), tz=timezone.utc))
    except (ValueError, KeyError) as exc:
        return f"{expr!r}: {exc}"
    try:
        # A valid expression can still name no real date (31 February): croniter
        # accepts it and only fails when asked for the next run.
        it.get_next(float)
    except (ValueError, KeyError, OverflowError):
        return (f"{expr!r} never fires: no calendar date matches its day-of-month and month "
                f"fields (like 31 February or 31 April)")
    return None


def next_due(p: _Schedule, after: float) -> float:
    """The first slot time strictly after ``after``."""
    if p.interval:
        step = p.interval
        return (math.floor(after / step) + 1) * step
    from croniter import croniter

    start = datetime.fromtimestamp(after, tz=timezone.utc)
    return float(croniter(_cron(p), start).get_next(float))


def last_due(p: _Schedule, at: float) -> float:
    """The newest slot time ``<= at``."""
    if p.interval:
        return math.floor(at / p.interval) * p.interval
    from croniter import croniter

    start = datetime.fromtimestamp(at + 1e-6, tz=timezone.utc)
    return float(croniter(_cron(p), start).get_prev(float))


def _cron(p: _Schedule) -> str:
    # The loader gives every pipeline either an interval or a cron expression.
    assert p.cron is not None, "a schedule without an interval needs a cron expression"
    return p.cron


def slots_between(p: _Schedule, after: float, until: float, limit: int = 1000) -> list[float]:
    """Slot times ``t`` with ``after < t <= until``, oldest first; when there are more
    than ``limit``, the newest ``limit`` are kept."""
    if until <= after or limit <= 0:
        return []
    if p.interval:
        first = next_due(p, after)
        if first > until:
            return []
        count = int(math.floor((until - first) / p.interval)) + 1
        skip = max(0, count - limit)
        return [first + (skip + i) * p.interval for i in range(count - skip)]
    out: list[float] = []
    t = last_due(p, until)
    while t > after and len(out) < limit:
        out.append(t)
        t = last_due(p, t - 1)
    return sorted(out)


def slot_id(t: float, fmt: str = "%Y-%m-%dT%H:%M") -> str:
    """The readable slot id for scheduled time ``t`` (UTC)."""
    return datetime.fromtimestamp(t, tz=timezone.utc).strftime(fmt)


def describe(p: _Schedule) -> str:
    if p.interval:
        s = p.interval
        for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
            if s >= size and s % size == 0:
                return f"every {int(s // size)}{unit}"
        return f"every {s:g}s"
    return f"cron {p.cron}"


def now() -> float:
    return time.time()
