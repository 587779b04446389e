"""The process's wall clock, in epoch seconds.

Tests skew it with ``DRAFTGATE_TEST_CLOCK_OFFSET`` (seconds, may be negative) to run
hosts whose clocks disagree. Nothing that decides a lease on a shared store reads
it: those times come from the database (see ``bot.store.postgres``).
"""

from __future__ import annotations

import os
import time

_ENV = "DRAFTGATE_TEST_CLOCK_OFFSET"


def _offset() -> float:
    raw = os.environ.get(_ENV, "").strip()
    if not raw:
        return 0.0
    try:
        return float(raw)
    except ValueError:
        raise SystemExit(f"{_ENV}={raw!r} is not a number of seconds; unset it "
                         "(it exists only for tests)") from None


_OFFSET = _offset()


def wall() -> float:
    """time.time(), plus the test offset if one is set."""
    return time.time() + _OFFSET


def utc_day(t: float) -> str:
    """The UTC date of epoch seconds ``t`` (the key of daily budgets and notices)."""
    return time.strftime("%Y-%m-%d", time.gmtime(t))
