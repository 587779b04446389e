"""When ticks run. Pure functions of (schedule, time) first, tested by table; the loop
that uses them lives in :mod:`bot.engine.loop`.

Slots come from the scheduled time, never from ``now()``: a catch-up run for 10:00
that happens at 10:07 is still the 10:00 slot, so it produces the same draft key as
the original run would have.

Interval schedules are aligned to the Unix epoch (``5m`` -> :00, :05, :10 UTC), so
every host and every restart agrees on the slots. Cron schedules are evaluated in the
pipeline's ``timezone`` (an IANA name; default UTC), by the local wall clock:

* ``0 9 * * *`` in Europe/Berlin fires at 09:00 local every day, winter and summer
  (23 or 25 hours apart across a change): one firing per local time that matches.
* A local time the spring-forward change skips (02:30 on the last Sunday of March in
  Berlin) fires once, shifted by the jump: 03:30 summer time, the instant 02:30 winter
  time would be. Several skipped times landing on one instant fire once.
* A local time the autumn change repeats (02:30 on the last Sunday of October) fires
  once, at its first occurrence (summer time), not again an hour later.

Slot ids are the local time of the slot in the same zone; a slot in the repeated hour
after the autumn change (possible with interval schedules) gets its UTC offset appended
(``2026-10-25T02:30+0100``), so a slot id is unique per firing.
"""

from __future__ import annotations

import functools
import math
import re
import time
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone, tzinfo
from typing import Iterator, Protocol
from zoneinfo import ZoneInfo


class _Schedule(Protocol):  # read-only: PipelineConfig and options.Context are frozen
    @property
    def interval(self) -> float | None: ...
    @property
    def cron(self) -> str | None: ...
    @property
    def timezone(self) -> str: ...


@dataclass(frozen=True)
class Cron:
    """A cron expression in a time zone, for timers that are not pipelines (the digest):
    ``next_due(Cron("0 8 * * *", "Europe/Berlin"), now)``."""

    cron: str
    timezone: str = "UTC"
    interval: float | None = None


@functools.lru_cache(maxsize=64)
def zone(name: str) -> tzinfo:
    """The tzinfo of an IANA zone name (checked at load; see Checker.timezone)."""
    return timezone.utc if name in ("", "UTC") else ZoneInfo(name)


def _local(t: float, tz: tzinfo) -> datetime:
    """The naive local wall time of instant ``t``."""
    return datetime.fromtimestamp(t, tz).replace(tzinfo=None)


def _instant(wall: datetime, tz: tzinfo) -> float:
    """The instant of naive local time ``wall``: its first occurrence when the clocks
    repeat it; shifted by the jump when they skip it (fold=0, PEP 495)."""
    return wall.replace(tzinfo=tz, fold=0).timestamp()


def _walls(p: _Schedule, start: datetime, forward: bool) -> Iterator[datetime]:
    from croniter import croniter

    it = croniter(_cron(p), start)
    while True:
        yield it.get_next(datetime) if forward else it.get_prev(datetime)


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
    tz = zone(p.timezone)
    for wall in _walls(p, _local(after, tz), True):
        t = _instant(wall, tz)
        if t > after:  # a skipped time's shifted instant may lie before `after`
            return t
    raise AssertionError("unreachable")


def last_due(p: _Schedule, at: float) -> float:
    """The newest slot time ``<= at``."""
    if p.interval:
        return math.floor(at / p.interval) * p.interval
    tz = zone(p.timezone)
    start = _local(at, tz) + timedelta(microseconds=1)
    for wall in _walls(p, start, False):
        t = _instant(wall, tz)
        if t <= at:
            return t
    raise AssertionError("unreachable")


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


def slot_id(t: float, fmt: str = "%Y-%m-%dT%H:%M", tz: str = "UTC") -> str:
    """The readable slot id for scheduled time ``t``, in local time of zone ``tz``; in
    the hour the autumn change repeats, the second pass carries its UTC offset."""
    local = datetime.fromtimestamp(t, zone(tz))
    return local.strftime(fmt) + (local.strftime("%z") if local.fold else "")


def duration_text(seconds: float) -> str:
    """``seconds`` as a YAML duration: 2d, 3h, 5m, or 90s when no larger unit fits."""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"


def describe(p: _Schedule) -> str:
    if p.interval:
        return f"every {duration_text(p.interval)}"
    return f"cron {p.cron}" + (f" {p.timezone}" if p.timezone not in ("", "UTC") else "")


def now() -> float:
    return time.time()


# -- send times (issue 28): send later, sending hours --------------------------------------
# By the pipeline's wall clock, as cron schedules are: "Tomorrow 09:00" is 09:00 local on
# either side of a daylight-saving change; a skipped local time is shifted by the jump.

DAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
_HOURS = re.compile(r"^\s*(?P<days>[A-Za-z,\- ]+?)\s+(?P<h1>\d{1,2}):(?P<m1>\d{2})\s*-\s*"
                    r"(?P<h2>\d{1,2}):(?P<m2>\d{2})\s*$")
_HOURS_HELP = ('expected days and hours like "Mon-Fri 08:00-18:00" or "Mon,Wed,Fri '
               '09:00-17:30" (days Mon..Sun, a range or a list; 24-hour times, the end '
               'after the start)')


@dataclass(frozen=True)
class SendHours:
    """``approval.send_hours``: the days (0 = Monday) and the local span (minutes after
    midnight, ``end`` up to 1440) in which replies go out."""

    days: frozenset[int]
    start: int
    end: int

    def __str__(self) -> str:
        days = ",".join(DAYS[d] for d in sorted(self.days))
        return f"{days} {self.start // 60:02d}:{self.start % 60:02d}-{self.end // 60:02d}:{self.end % 60:02d}"


def _day(name: str) -> int:
    key = name.strip().lower()
    for i, d in enumerate(DAYS):
        if len(key) >= 3 and key[:3] == d.lower():  # Mon, mon, Monday
            return i
    raise ValueError(f"{name.strip()!r} is not a day (Mon, Tue, Wed, Thu, Fri, Sat, Sun)")


def parse_send_hours(value: object) -> SendHours:
    """``"Mon-Fri 08:00-18:00"`` -> SendHours. Raises ValueError saying what is wrong."""
    m = _HOURS.match(value if isinstance(value, str) else "")
    if not m:
        raise ValueError(f"{_HOURS_HELP}, got {value!r}")
    days: set[int] = set()
    for part in m["days"].split(","):
        first, _, last = part.partition("-")
        a = _day(first)
        b = _day(last) if last else a
        days.update((a + i) % 7 for i in range((b - a) % 7 + 1))  # Sat-Mon wraps
    start, end = int(m["h1"]) * 60 + int(m["m1"]), int(m["h2"]) * 60 + int(m["m2"])
    if int(m["m1"]) > 59 or int(m["m2"]) > 59 or start >= 1440 or end > 1440 or end <= start:
        raise ValueError(f"{_HOURS_HELP}, got {value!r}")
    return SendHours(frozenset(days), start, end)


def _wall_at(day: datetime, minutes: int, tz: tzinfo) -> float:
    return _instant(day.replace(hour=0, minute=0, second=0, microsecond=0)
                    + timedelta(minutes=minutes), tz)


def within_hours(hours: SendHours, t: float, tz_name: str) -> float:
    """The earliest instant ``>= t`` inside ``hours`` (``t`` itself if it is inside)."""
    tz = zone(tz_name)
    today = _local(t, tz)
    for i in range(8):
        day = today + timedelta(days=i)
        if day.weekday() not in hours.days:
            continue
        opens, closes = _wall_at(day, hours.start, tz), _wall_at(day, hours.end, tz)
        if opens <= t < closes:
            return t
        if opens > t:
            return opens
    raise AssertionError("unreachable: send hours name at least one day")


LATER = {"hour": "In 1 hour", "tomorrow": "Tomorrow 09:00", "monday": "Monday 09:00"}


def later(choice: str, t: float, tz_name: str) -> float:
    """When a 🕘 Later choice sends, chosen at ``t``: ``hour`` (t + 1h), ``tomorrow``
    (09:00 local tomorrow) or ``monday`` (the next Monday 09:00 local after ``t``)."""
    if choice == "hour":
        return t + 3600.0
    tz = zone(tz_name)
    today = _local(t, tz)
    if choice == "tomorrow":
        return _wall_at(today + timedelta(days=1), 9 * 60, tz)
    if choice == "monday":
        for i in range(8):
            at = _wall_at(today + timedelta(days=i), 9 * 60, tz)
            if (today + timedelta(days=i)).weekday() == 0 and at > t:
                return at
    raise ValueError(f"unknown later choice {choice!r}")


def local_label(t: float, tz_name: str) -> str:
    """``Mon 09:00``: instant ``t`` by the wall clock of zone ``tz_name``."""
    local = datetime.fromtimestamp(t, zone(tz_name))
    return f"{DAYS[local.weekday()]} {local:%H:%M}"


def after_working_days(t: float, days: int, tz_name: str) -> float:
    """``t`` plus ``days`` working days (Mon-Fri) by the wall clock of ``tz_name``: the
    same local time on the day the count ends (a Friday's 3 days end on Wednesday)."""
    tz = zone(tz_name)
    day = _local(t, tz)
    while days > 0:
        day += timedelta(days=1)
        if day.weekday() < 5:
            days -= 1
    return _instant(day, tz)
