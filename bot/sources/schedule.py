"""Source ``schedule``: one item per schedule slot, for pipelines that draft posts on a
timetable instead of answering mail.

::

    schedule: "0 9 * * MON"
    source: {type: schedule, topic: "Weekly product tip", slot_format: "%Y-%m-%dT%H:%M"}
    catchup: {policy: all, max: 4}

The item id is the slot, formatted from the *scheduled* time of the tick (in the
pipeline's ``timezone``, default UTC), never
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

from datetime import datetime

from .. import scheduler
from ..config.load import PipelineConfig, Settings
from ..config.options import ScheduleSourceOptions, expect
from ..models import FetchResult, Item, Message


class ScheduleSource:
    """Yields the slots a tick is due for."""

    scope = "slot"

    def __init__(self, pipeline: PipelineConfig):
        self._p = pipeline
        options = expect(pipeline.source, ScheduleSourceOptions)
        self.topic = options.topic
        self.slot_format = options.slot_format

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
        items = [Item(self._slot(t), self._message(t)) for t in times]
        cursor = repr(max(times)) if times else None
        return FetchResult(items, cursor=cursor, more=more)

    async def close(self) -> None:
        return None

    def _slot(self, t: float) -> str:
        return scheduler.slot_id(t, self.slot_format, self._p.timezone)

    def _message(self, t: float) -> Message:
        slot = self._slot(t)
        return Message(kind="slot", slot=slot, subject=self.topic, body="",
                       date=datetime.fromtimestamp(t, scheduler.zone(self._p.timezone)
                                                   ).isoformat(),
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
    """Build the source from its checked ``source:`` options (no I/O)."""
    return ScheduleSource(pipeline)
