"""`draftgate run` as a service: the optional HTTP listener and systemd's notifications.

``observability.listen: HOST:PORT`` serves, on a small asyncio HTTP/1.1 server:

* ``/metrics``: Prometheus text (:mod:`bot.service.metrics`);
* ``/healthz``: 200 while every pipeline loop and the Telegram receiver (polling, or
  the webhook server) make progress (:mod:`bot.service.health`), else 503 with a JSON body
  naming what is stuck;
* ``/readyz``: 200 when the store answers a trivial query, else 503 (and 503 while
  the store is held unreachable, :mod:`bot.engine.outage`).

While the store is unreachable ``/healthz`` stays 200 with ``"status": "held"`` and
``"held": "store unreachable since …"``: the process is alive and waiting, and a
restart would not bring the store back.

None of them calls the model, Gmail or Telegram. Under systemd (``$NOTIFY_SOCKET``)
the same health decides the watchdog's pings (:mod:`bot.service.sdnotify`).
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

from .. import version
from ..config.load import Settings
from ..errors import describe_error
from . import metrics
from .health import WEBHOOK, Health, telegram_bound, webhook_bound
from .listener import Listener, bind
from .sdnotify import Notifier

log = logging.getLogger("draftgate.observe")

_REASONS = {200: "OK", 404: "Not Found", 405: "Method Not Allowed", 503: "Service Unavailable"}
#: How long /readyz waits for the store before it answers 503.
READY_TIMEOUT = 5.0
#: How long a client has to send its request's head (a scraper sends it at once).
HEAD_TIMEOUT = 5.0
#: At most this many connections open at once, and never more than a quarter of the
#: process's descriptors (RLIMIT_NOFILE): idle connections cannot starve the sends,
#: fetches and the store of descriptors. At the cap the oldest idle one is dropped.
MAX_CONNECTIONS = 128


class Service:
    """Started by ``run`` once the store is open; :meth:`ready` once the engine runs,
    :meth:`stopping` when a stop begins, :meth:`close` at the end."""

    def __init__(self, settings: Settings, store: Any, notifier: Notifier | None = None):
        self.settings, self.store = settings, store
        self.notifier = notifier or Notifier()
        watched = settings.listen is not None or self.notifier.watchdog is not None
        self.observer: metrics.Observer | None = None
        if watched:
            self.observer = metrics.Observer(
                metrics.Metrics(version()) if settings.listen is not None else None, Health())
            t = settings.telegram
            if t is not None and t.receive == "polling":
                self.observer.health.expect("telegram", telegram_bound(t))
            elif t is not None and t.receive == "webhook":
                self.observer.health.expect(WEBHOOK, webhook_bound())
        self._listener: Listener | None = None
        self._watchdog: asyncio.Task | None = None
        self._stopping = False

    async def start(self) -> "Service":
        metrics.install(self.observer)
        if self.settings.listen is not None:
            host, port = self.settings.listen
            try:
                socks = bind(host, port)
            except OSError as exc:
                metrics.install(None)
                from ..errors import ConfigError

                raise ConfigError(f"{self.settings.file}: observability.listen: cannot listen "
                                  f"on {host}:{port}: {exc.strerror or exc}; pick a free "
                                  f"port or another address") from None
            self._listener = Listener(socks, self._answer, cap=MAX_CONNECTIONS,
                                      head_timeout=HEAD_TIMEOUT)
            log.info("observability: /metrics, /healthz, /readyz on http://%s:%d (at most %d "
                     "connections at once)", host, port, self._listener.cap)
        return self

    def ready(self) -> None:
        self.notifier.send("READY=1\nSTATUS=running")
        if self.observer is not None and self.notifier.watchdog is not None:
            self._watchdog = asyncio.create_task(
                self.notifier.watch(self.observer.health.stuck), name="systemd-watchdog")

    def stopping(self) -> None:
        if self._stopping:
            return
        self._stopping = True
        self.notifier.send("STOPPING=1\nSTATUS=stopping")
        if self._watchdog is not None:
            self._watchdog.cancel()

    async def close(self) -> None:
        if self._watchdog is not None:
            self._watchdog.cancel()
            await asyncio.gather(self._watchdog, return_exceptions=True)
        if self._listener is not None:
            await self._listener.close()
        if metrics.installed() is self.observer:
            metrics.install(None)
        self.notifier.close()

    # -- HTTP ------------------------------------------------------------------------------
    async def _answer(self, head: bytes, read: Any) -> bytes:  # (a body is never read)
        method, path, *_ = head.split(b"\r\n", 1)[0].decode("latin-1").split(" ") + ["", ""]
        status, ctype, body = await self._route(method, path.split("?", 1)[0])
        return (f"HTTP/1.1 {status} {_REASONS.get(status, '')}\r\nContent-Type: {ctype}\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
                + (b"" if method == "HEAD" else body))

    async def _route(self, method: str, path: str) -> tuple[int, str, bytes]:
        if path not in ("/metrics", "/healthz", "/readyz"):
            return _json(404, {"error": "not found; try /metrics, /healthz or /readyz"})
        if method not in ("GET", "HEAD"):
            return _json(405, {"error": "only GET and HEAD"})
        assert self.observer is not None
        held = self.observer.health.held()  # the store is unreachable: see bot.engine.outage
        if path == "/healthz":
            # Held is alive (a restart would not bring the store back): 200, saying so.
            stuck = self.observer.health.stuck()
            return _json(503 if stuck else 200,
                         {"status": "stuck" if stuck else "held" if held else "ok",
                          "stuck": stuck, **({"held": held} if held else {})})
        if path == "/readyz":
            if held:  # a full SQLite disk still answers the ping
                return _json(503, {"status": "store unavailable", "error": held})
            try:
                await asyncio.wait_for(self.store.ping(), READY_TIMEOUT)
            except Exception as exc:
                return _json(503, {"status": "store unavailable", "error": describe_error(exc)})
            return _json(200, {"status": "ok"})
        from prometheus_client import CONTENT_TYPE_PLAIN_0_0_4

        try:
            if not held:  # else the gauges keep their last values, read before the outage
                await self.observer.refresh_store(self.store)
        except Exception as exc:  # the counters are still worth serving
            log.warning("metrics: could not read the store's gauges: %s", describe_error(exc))
        return 200, CONTENT_TYPE_PLAIN_0_0_4, self.observer.exposition()


async def held_by_service(settings: Settings, timeout: float = 2.0) -> str | None:
    """What the running service's ``/healthz`` says it is held by (``store unreachable
    since …``), for ``draftgate status``; None when it is not held, not listening, or
    not running."""
    if settings.listen is None:
        return None
    host, port = settings.listen
    host = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(host, host)
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout)
        try:
            writer.write(f"GET /healthz HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n"
                         f"\r\n".encode())
            answer = await asyncio.wait_for(reader.read(65536), timeout)
        finally:
            writer.close()
        body = json.loads(answer.split(b"\r\n\r\n", 1)[1])
    except (OSError, asyncio.TimeoutError, ValueError, IndexError):
        return None
    held = body.get("held") if isinstance(body, dict) else None
    return held if isinstance(held, str) else None


def _json(status: int, payload: dict) -> tuple[int, str, bytes]:
    return status, "application/json", json.dumps(payload).encode() + b"\n"
