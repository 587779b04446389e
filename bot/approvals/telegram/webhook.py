"""``telegram.receive: webhook``: a small receiver for Telegram's POSTs that feeds the
application's update queue (PTB's "custom webhook" pattern: the bot's own
``set_webhook``, our server, ``application.update_queue``).

PTB's built-in webhook server (tornado) reads a request's whole body, up to 100 MB,
before it checks the secret header: six 90 MB POSTs from a stranger took a process
from 61 to 863 MB. Here the request's head decides first. A wrong or missing
``X-Telegram-Bot-Api-Secret-Token`` is answered 403, a ``Content-Length`` over
:data:`MAX_BODY` 413, a body without a length (chunked) 411: all without reading a
byte of the body. Telegram's updates are a few kB and always carry their length.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
from typing import Any, Awaitable, Callable

from telegram import Update
from telegram.ext import ExtBot

from ...service import health, metrics
from ...service.listener import Listener, bind

log = logging.getLogger("draftgate.telegram")

#: The largest update accepted (Telegram's are a few kB; a long message about 20 kB).
MAX_BODY = 1_000_000
#: How long the body of an accepted head may take to arrive.
BODY_TIMEOUT = 30.0
_CONNECTIONS = 64  # Telegram opens at most 40 (set_webhook's max_connections)
_REASONS = {200: "OK", 400: "Bad Request", 403: "Forbidden", 404: "Not Found",
            405: "Method Not Allowed", 411: "Length Required", 413: "Content Too Large",
            415: "Unsupported Media Type"}


class WebhookReceiver:
    """Serves ``path`` on ``host:port`` for the application ``app`` once started."""

    def __init__(self, path: str, secret: str):
        self.path = "/" + path.strip("/")
        self._secret = secret.encode()
        self._listener: Listener | None = None
        self._app: Any = None

    @property
    def running(self) -> bool:
        return self._listener is not None

    async def start(self, app: Any, host: str, port: int) -> None:
        """Listen (raises OSError when the address is taken); a second start is a no-op."""
        if self._listener is None:
            self._app = app
            self._listener = Listener(bind(host, port), self._answer, cap=_CONNECTIONS,
                                      head_timeout=10.0, name="telegram webhook")

    async def stop(self) -> None:
        listener, self._listener = self._listener, None
        if listener is not None:
            await listener.close()

    async def _answer(self, head: bytes, read: Callable[[int], Awaitable[bytes]]) -> bytes:
        method, target, headers = _parse(head)
        status = self._refusal(method, target, headers)
        if status:
            log.debug("webhook: %s %s refused with %d", method, target[:80], status)
            return _reply(status)
        length = int(headers["content-length"])
        try:
            body = await asyncio.wait_for(read(length), BODY_TIMEOUT)
            update = Update.de_json(json.loads(body), self._app.bot) if len(body) == length else None
        except asyncio.TimeoutError:
            return _reply(400)
        except Exception as exc:  # not JSON, or not an update
            log.warning("webhook: an update that could not be read was refused (%s)",
                        type(exc).__name__)
            return _reply(400)
        if update is None:
            return _reply(400)
        if isinstance(self._app.bot, ExtBot):
            self._app.bot.insert_callback_data(update)  # as PTB's own server does
        await self._app.update_queue.put(update)
        return _reply(200)

    def _refusal(self, method: str, target: str, headers: dict[str, str]) -> int:
        """The status refusing this head, or 0 to read its body. Checked in this order:
        the path, the method, the secret, then the length."""
        if target.split("?", 1)[0].rstrip("/") != self.path.rstrip("/"):
            return 404
        if method != "POST":
            return 405
        if not hmac.compare_digest(headers.get("x-telegram-bot-api-secret-token", "").encode(),
                                   self._secret):
            return 403
        if "transfer-encoding" in headers or "content-length" not in headers:
            return 411
        length = headers["content-length"]
        if not length.isdigit() or headers.get("\0duplicate"):
            return 400
        if int(length) > MAX_BODY:
            return 413
        if headers.get("content-type", "").split(";")[0].strip().lower() != "application/json":
            return 415
        return 0


def _parse(head: bytes) -> tuple[str, str, dict[str, str]]:
    """Method, target and headers (names in lower case) of a request head. A
    Content-Length given twice is marked: a smuggling attempt, refused."""
    lines = head.decode("latin-1").split("\r\n")
    method, target, *_ = lines[0].split(" ") + ["", ""]
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, colon, value = line.partition(":")
        name = name.strip().lower()
        if not colon or not name:
            continue
        if name == "content-length" and name in headers:
            headers["\0duplicate"] = "1"
        headers[name] = value.strip()
    return method, target, headers


def _reply(status: int) -> bytes:
    body = json.dumps({"ok": True} if status == 200 else {"error": _REASONS.get(status, "")}).encode()
    return (f"HTTP/1.1 {status} {_REASONS.get(status, '')}\r\nContent-Type: application/json"
            f"\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode() + body


async def _answers(host: str, port: int, request: bytes) -> bool:
    """Does the HTTP server at ``host:port`` answer ``request`` within 5 s?"""
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), 5)
    except (OSError, asyncio.TimeoutError):
        return False
    try:
        writer.write(request)
        return (await asyncio.wait_for(reader.readline(), 5)).startswith(b"HTTP/")
    except (OSError, asyncio.TimeoutError):
        return False
    finally:
        writer.close()


async def watch(wh: Any, alive: Callable[[], bool]) -> None:
    """Ask our own webhook server for an answer every
    :data:`~bot.service.health.WEBHOOK_PROBE_EVERY` seconds (a GET, which it refuses
    with 405: no update is made); an answer, or ``alive()`` (a reconnect still trying),
    is the receiver's sign of life for /healthz and the systemd watchdog."""
    host = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(wh.listen, wh.listen)
    request = (f"GET /{wh.path.lstrip('/')} HTTP/1.1\r\nHost: localhost\r\n"
               f"Connection: close\r\n\r\n").encode()
    while True:
        if alive() or await _answers(host, wh.port, request):
            metrics.progress(health.WEBHOOK)
        await asyncio.sleep(health.WEBHOOK_PROBE_EVERY)
