"""Telegram's flood limits, as the channel keeps to them: one message per 1/29 s, a
short RetryAfter waited out by PTB's limiter, a long one (a flood ban) failing at once
so the card waits in ready instead of holding every request."""

from __future__ import annotations

import datetime as dt
import warnings
from typing import Any

from telegram.error import RetryAfter, TelegramError
from telegram.ext import AIORateLimiter
from telegram.warnings import PTBDeprecationWarning

# Telegram's flood limits: ~30 messages/s per bot, 20/min per group. One message per
# 1/29 s with no burst keeps every one-second window at or under 30.
_OVERALL_RATE = 29.0
_MAX_RETRIES = 3  # RetryAfter only: by Telegram's contract a 429 delivered nothing
_MAX_RETRY_WAIT = 60.0  # longer flood waits are not slept through: the card waits in ready


class FloodWait(TelegramError):
    """Telegram asked for a pause longer than :data:`_MAX_RETRY_WAIT`."""


class _Limiter(AIORateLimiter):
    """PTB's limiter, except that a long RetryAfter (a flood ban) fails at once instead
    of holding every request, and the engine's tick, for minutes or hours."""

    async def process_request(self, callback, args, kwargs, endpoint, data, rate_limit_args):
        async def capped(*a: Any, **kw: Any) -> Any:
            try:
                return await callback(*a, **kw)
            except RetryAfter as exc:
                seconds = _retry_seconds(exc)
                if seconds > _MAX_RETRY_WAIT:
                    raise FloodWait(f"Telegram flood control: retry in {seconds:.0f} s") from exc
                raise

        return await super().process_request(capped, args, kwargs, endpoint, data, rate_limit_args)


def _retry_seconds(exc: RetryAfter) -> float:
    """The wait Telegram asked for, in seconds. ``retry_after`` is an int, or a timedelta
    under ``PTB_TIMEDELTA=true``; in PTB 22.x reading it warns that it will become a
    timedelta, which the next line handles, so the warning is not repeated in the log."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PTBDeprecationWarning)
        wait = exc.retry_after
    return wait.total_seconds() if isinstance(wait, dt.timedelta) else float(wait)
