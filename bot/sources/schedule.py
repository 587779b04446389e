"""Source ``schedule``: one item per schedule slot, for pipelines that draft posts on a
timetable instead of answering mail.

::

    schedule: "0 9 * * MON"
    source: {type: schedule, topic: "Weekly product tip", slot_format: "%Y-%m-%dT%H:%M"}
    catchup: {policy: all, max: 4}

The item id is the slot, formatted from the *scheduled* time of the tick (UTC), never
from ``now()``: a tick that runs late, or a catch-up run after downtime, produces the
same id, hence the same draft key ``pipeline|slot|<slot id>|recipe``, as the on-time
run would have, and the store's seen marks make it a no-op if it was drafted already.
Changing the pipeline's ``recipe`` is the intended way to get a fresh draft for a slot
(the recipe is part of the key).

The cursor is the time of the newest slot admitted. After downtime, ``catchup``
decides which missed slots (after the cursor, up to this tick's slot) become items:

* ``latest`` (default): only the newest due slot.
* ``all``: every missed slot, at most ``catchup.max`` of them (the newest are kept).
* ``none``: only this tick's own slot; missed ones are dropped. (The engine always
  ticks for the newest due slot, so in practice this matches ``latest``; it differs
  when a tick is run for an older slot explicitly.)

The first run (no cursor) admits just the slot of the tick.
"""

from __future__ import annotations

from datetime import datetime, timezone

from .. import scheduler
from ..config import Checker, PipelineConfig, Settings
from ..errors import ConfigError
from ..models import FetchResult, Item, Message

DEFAULT_SLOT_FORMAT = "%Y-%m-%dT%H:%M"
_OPTIONS = {"type", "topic", "slot_format"}
# A fixed reference (Monday 2026-01-05 00:00 UTC) for checking slot_format without I/O.
_REFERENCE = 1767571200.0
_CHECKED_SLOTS = 50  # consecutive slots whose ids must differ (catches "9,21" with %Y-%m-%d)


class ScheduleSource:
    """Yields the slots a tick is due for."""

    scope = "slot"

    def __init__(self, pipeline: PipelineConfig, topic: str, slot_format: str = DEFAULT_SLOT_FORMAT):
        self._p = pipeline
        self.topic = topic
        self.slot_format = slot_format

    def slots(self, scheduled_for: float, cursor: str | None) -> list[float]:
        """Slot times to admit for a tick scheduled at ``scheduled_for``. Pure."""
        p = self._p
        current = scheduler.last_due(p, scheduled_for)
        last = _parse_cursor(cursor)
        if last is None:
            return [current]
        if current <= last:
            return []
        if p.catchup == "all":
            return scheduler.slots_between(p, last, current, max(1, p.catchup_max))
        if p.catchup == "latest":
            return scheduler.slots_between(p, last, current, 1)
        return [current]  # "none"

    async def fetch(self, ctx) -> FetchResult:
        times = self.slots(ctx.scheduled_for, ctx.cursor)  # oldest first
        limit = getattr(ctx, "limit", None)
        more = limit is not None and len(times) > limit
        if more:  # the cursor stops at the last slot taken: the next tick goes on from it
            times = times[:limit]
        items = [Item(scheduler.slot_id(t, self.slot_format), self._message(t)) for t in times]
        cursor = repr(max(times)) if times else None
        return FetchResult(items, cursor=cursor, more=more)

    async def close(self) -> None:
        return None

    def _message(self, t: float) -> Message:
        slot = scheduler.slot_id(t, self.slot_format)
        return Message(kind="slot", slot=slot, subject=self.topic, body="",
                       date=datetime.fromtimestamp(t, tz=timezone.utc).isoformat(),
                       source_id=slot)


def _parse_cursor(cursor: str | None) -> float | None:
    if not cursor:
        return None
    try:
        return float(cursor)
    except ValueError:
        # Not ours (hand-edited, or another source type's): treat as a first run
        # rather than stop the pipeline; the seen marks still prevent duplicates.
        return None


def create(pipeline: PipelineConfig, settings: Settings) -> ScheduleSource:
    """Check ``source:`` options and build the source (no I/O)."""
    ck = Checker(pipeline.file)
    opts = pipeline.source
    ck.unknown(opts, _OPTIONS, "source")
    topic = ck.get(opts, "topic", "source", str)
    if topic is not None and not topic.strip():
        ck.error("source.topic", "expected what the posts are about, e.g. 'Weekly product tip'")
    fmt = ck.get(opts, "slot_format", "source", str, default=DEFAULT_SLOT_FORMAT)
    if fmt is not None:
        problem = _check_format(pipeline, fmt)
        if problem:
            ck.error("source.slot_format", problem)
    if ck.errors:
        raise ConfigError(ck.errors)
    return ScheduleSource(pipeline, topic.strip(), fmt)


def _check_format(p: PipelineConfig, fmt: str) -> str | None:
    if "%" not in fmt:
        return f"expected a strftime format such as {DEFAULT_SLOT_FORMAT}, got {fmt!r}"
    if not (p.interval or p.cron):
        return None  # the schedule itself is reported by the config loader
    try:
        times, t = [], _REFERENCE
        for _ in range(_CHECKED_SLOTS):
            t = scheduler.next_due(p, t)
            times.append(t)
        ids = [scheduler.slot_id(t, fmt) for t in times]
    except (ValueError, KeyError) as exc:
        return f"cannot format a slot with {fmt!r}: {exc}"
    for a, b in zip(ids, ids[1:]):
        if a == b:
            return (f"{fmt!r} gives two consecutive slots the same id ({a!r}); use a finer "
                    f"format such as {DEFAULT_SLOT_FORMAT}")
    return None
