"""Are this process's loops alive? What ``/healthz`` and the systemd watchdog ask.

Each loop (a pipeline's schedule, the Telegram receiver: polling, or the webhook
server, which the channel asks for an answer every :data:`WEBHOOK_PROBE_EVERY`) reports when it waits and
until when, when it starts work, and each step of progress it makes (a tick ended, an
item drafted, a send, a Telegram call answered). A loop is stuck when it has worked
without progress for longer than its bound, or has overslept its wake-up by as much:
the event loop is blocked, or a call that never answers holds it. A loop that is
failing but still trying (Gmail down, Telegram unreachable) is alive: restarting the
process would not help it. So is one *held* by a store that cannot be reached
(:mod:`bot.engine.outage`): it waits for the store, and the health says so.

Nothing here calls the model, Gmail, Telegram or the store.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Callable

from .. import scheduler
from ..config.load import PipelineConfig, TelegramConfig

#: The longest pause between two Telegram calls of a live receiver beyond its long-poll
#: timeout: the read timeout of getUpdates (10 s), PTB's longest back-off after a
#: failed poll (30 s) or the channel's longest reconnect delay (60 s), and some slack.
_TELEGRAM_SLACK = 100.0
#: The webhook receiver's name here: its own, since Bot API calls answered (cards
#: posted) tell nothing of whether the webhook server still takes Telegram's posts.
WEBHOOK = "telegram webhook"
#: How often a channel receiving by webhook asks its own webhook server for an answer.
WEBHOOK_PROBE_EVERY = 10.0


def pipeline_bound(p: PipelineConfig, now: float) -> float:
    """Seconds without progress after which ``p``'s loop counts as stuck: twice its
    schedule's period (a tick may take a slot to catch up) plus its lease (one
    drafting call is bounded by it)."""
    period = p.interval or (scheduler.next_due(p, now) - scheduler.last_due(p, now))
    return 2 * period + p.lease


def telegram_bound(t: TelegramConfig) -> float:
    return float(t.poll_timeout) + _TELEGRAM_SLACK


def webhook_bound() -> float:
    """The webhook server must answer a probe within this (the slack, as for polling,
    covers the channel's reconnect delays, during which it counts as alive)."""
    return WEBHOOK_PROBE_EVERY + _TELEGRAM_SLACK


def length(seconds: float) -> str:
    """``7s``, ``2 min 5s``, ``3 h 12 min``: an outage's length, for people."""
    s = max(0, round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60} min" + (f" {s % 60}s" if s % 60 else "")
    return f"{s // 3600} h" + (f" {s % 3600 // 60} min" if s % 3600 // 60 else "")


def held_text(since: float, now: float, error: str) -> str:
    """``store unreachable since 2026-12-03 16:53:29 UTC (12s): <error>``."""
    when = datetime.fromtimestamp(since, timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    return f"store unreachable since {when} ({length(now - since)}): {error}"


@dataclass
class _Beat:
    bound: float
    busy_since: float | None = None  # working (a tick): since when, or since the last progress
    wake_at: float = 0.0  # waiting: when it should wake up


class Health:
    """The loops' liveness, on the monotonic clock."""

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self.clock = clock
        self._beats: dict[str, _Beat] = {}
        self._held: tuple[float, str] | None = None  # (since, error) of a store outage

    def hold(self, since: float | None, error: str = "") -> None:
        """The store is unreachable since ``since`` (wall clock), or again reachable (None)."""
        self._held = None if since is None else (since, error)

    def held(self) -> str | None:
        """Why this process is held (``store unreachable since …``), or None."""
        if self._held is None:
            return None
        since, error = self._held
        return held_text(since, time.time(), error)

    def expect(self, name: str, bound: float) -> None:
        """Watch loop ``name``: it must show a sign of life within ``bound`` seconds."""
        if name not in self._beats:
            self._beats[name] = _Beat(bound, wake_at=self.clock())

    def waiting(self, name: str, seconds: float) -> None:
        beat = self._beats.get(name)
        if beat is not None:
            beat.busy_since, beat.wake_at = None, self.clock() + max(0.0, seconds)

    def busy(self, name: str) -> None:
        beat = self._beats.get(name)
        if beat is not None:
            beat.busy_since = self.clock()

    def progress(self, name: str) -> None:
        """A step done: a working loop's clock starts again (a waiting one's is its wake-up)."""
        beat = self._beats.get(name)
        if beat is not None:
            now = self.clock()
            if beat.busy_since is not None:
                beat.busy_since = now
            else:
                beat.wake_at = max(beat.wake_at, now)

    def stuck(self) -> dict[str, str]:
        """Each stuck loop's name and why, in words; empty when all are alive."""
        now = self.clock()
        out: dict[str, str] = {}
        for name, beat in sorted(self._beats.items()):
            if beat.busy_since is not None:
                idle = now - beat.busy_since
                if idle > beat.bound:
                    out[name] = f"no progress for {idle:.0f}s (bound {beat.bound:.0f}s)"
            elif now - beat.wake_at > beat.bound:
                out[name] = (f"{now - beat.wake_at:.0f}s late waking up (bound {beat.bound:.0f}s)")
        return out
