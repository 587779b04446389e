"""The process's wall clock, in epoch seconds.

Nothing that decides a lease on a shared store reads it: those times come from the
database (see ``bot.store.postgres``). Code that must run at another time (tests, a
simulation) injects a clock of its own (``Engine(clock=...)``).
"""

from __future__ import annotations

import time


def wall() -> float:
    """time.time()."""
    return time.time()


def utc_day(t: float) -> str:
    """The UTC date of epoch seconds ``t`` (the key of daily budgets and notices)."""
    return time.strftime("%Y-%m-%d", time.gmtime(t))


def hhmm(t: float | None) -> str:
    """``HH:MM`` (UTC) of epoch seconds ``t``; ``--:--`` for none."""
    if not t:
        return "--:--"
    return time.strftime("%H:%M", time.gmtime(t))
