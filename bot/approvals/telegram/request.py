"""python-telegram-bot's HTTP transport, counted: every Bot API call's answer (or the
network error instead of one) goes to :mod:`bot.service.metrics` by method name, and counts as
a sign of life of the Telegram receiver. The URL (it holds the token) is never kept."""

from __future__ import annotations

from typing import Any

from telegram.error import NetworkError, TimedOut
from telegram.request import HTTPXRequest

from ...service import metrics


class CountedRequest(HTTPXRequest):
    async def do_request(self, url: str, method: str, *args: Any, **kwargs: Any
                         ) -> tuple[int, bytes]:
        name = url.rsplit("/", 1)[-1]  # the Bot API method: sendMessage, getUpdates...
        try:
            code, payload = await super().do_request(url, method, *args, **kwargs)
        except TimedOut:
            metrics.telegram_call(name, None, "timeout")
            raise
        except NetworkError:
            metrics.telegram_call(name, None, "network")
            raise
        metrics.telegram_call(name, code)
        return code, payload


def requests(receive: str) -> tuple[CountedRequest, CountedRequest | None]:
    """ApplicationBuilder's ``request`` and (unless nothing is received) its
    ``get_updates_request``, with draftgate's timeouts: a long poll is read for 10 s
    past its own timeout."""
    request = CountedRequest(connect_timeout=10, read_timeout=30, write_timeout=30, pool_timeout=30)
    if receive == "off":
        return request, None
    return request, CountedRequest(connection_pool_size=1, read_timeout=10)
