"""A fake webhook receiver on 127.0.0.1 for the webhook sender's tests.

It records every request and answers POSTs according to ``mode``::

    with FakeWebhook() as hook:
        hook.mode = "ok"        # 200 {"id": "wh-<n>"}
        hook.mode = "no_id"     # 202 with an empty JSON object
        hook.mode = "bad"       # 400 with a JSON error body
        hook.mode = "error"     # 500
        hook.mode = "busy"      # 429 with Retry-After
        hook.mode = "drop"      # read the whole request, then close without answering
        hook.mode = "reset"     # read the whole request, then reset the connection (RST)
        hook.mode = "hang"      # read the whole request, answer only after release()
        hook.mode = "redirect"  # 307 to /elsewhere
        hook.mode = "echo"      # hook.echo_status (default 500) with the request's
                                # headers echoed in the body, Authorization included
        hook.mode = "page"      # hook.echo_status with hook.page (bytes) as an HTML body

``hook.received`` is set whenever a request has been fully read (before the answer),
so a test can wait for it instead of sleeping. ``GET /status?key=...`` answers 200
with the id of an accepted POST with that draft key, or 404.
"""

from __future__ import annotations

import json
import socket
import struct
import threading
import urllib.parse
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from tests.fakes._common import send_json

__all__ = ["FakeWebhook", "Request"]


@dataclass
class Request:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes

    def json(self):
        return json.loads(self.body)


class FakeWebhook:
    def __init__(self) -> None:
        self.mode = "ok"
        self.echo_status = 500
        self.page = b""
        self.requests: list[Request] = []
        self.accepted: dict[str, str] = {}  # draft key -> id
        self.received = threading.Event()
        self._release = threading.Event()
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.02},
                                        daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    @property
    def posts(self) -> list[Request]:
        return [r for r in self.requests if r.method == "POST"]

    def release(self) -> None:
        """Let a held ("hang") request answer."""
        self._release.set()

    def __enter__(self) -> "FakeWebhook":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._release.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def _handler(self):
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # keep test output quiet
                pass

            def _record(self) -> Request:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                req = Request(self.command, self.path, dict(self.headers.items()), body)
                with fake._lock:
                    fake.requests.append(req)
                fake.received.set()
                return req

            def _answer(self, status: int, data, headers: dict | None = None) -> None:
                send_json(self, status, data, headers)

            def do_POST(self):
                req = self._record()
                mode = fake.mode
                if mode == "ok":
                    key = req.json().get("key", "")
                    with fake._lock:
                        ident = fake.accepted.setdefault(key, f"wh-{len(fake.accepted) + 1}")
                    self._answer(200, {"id": ident})
                elif mode == "no_id":
                    self._answer(202, {})
                elif mode == "bad":
                    self._answer(400, {"error": "field 'to' is not an address we serve"})
                elif mode == "error":
                    self._answer(500, {"error": "database unavailable"})
                elif mode == "busy":
                    self._answer(429, {"error": "slow down"}, {"Retry-After": "30"})
                elif mode == "echo":  # a receiver that quotes the request in its error
                    auth = req.headers.get("Authorization", "(none)")
                    self._answer(fake.echo_status, {"error": f"rejected Authorization: {auth}",
                                                    "request_headers": req.headers})
                elif mode == "page":  # a proxy's error page, as large as it likes
                    self.send_response(fake.echo_status)
                    self.send_header("Content-Type", "text/html; charset=utf-8")
                    self.send_header("Content-Length", str(len(fake.page)))
                    self.end_headers()
                    self.wfile.write(fake.page)
                elif mode == "redirect":
                    self._answer(307, {}, {"Location": "/elsewhere"})
                elif mode == "drop":
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                elif mode == "reset":
                    self.close_connection = True
                    # SO_LINGER with a zero timeout makes close() send a RST.
                    self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                               struct.pack("ii", 1, 0))
                    self.connection.close()
                elif mode == "hang":
                    fake._release.wait(timeout=30)
                    self.close_connection = True
                else:  # pragma: no cover - a typo in a test
                    self._answer(599, {"error": f"unknown fake mode {mode}"})

            def do_GET(self):
                req = self._record()
                query = urllib.parse.parse_qs(urllib.parse.urlsplit(req.path).query)
                key = (query.get("key") or [""])[0]
                with fake._lock:
                    ident = fake.accepted.get(key)
                if ident:
                    self._answer(200, {"id": ident})
                else:
                    self._answer(404, {"error": "unknown key"})

        return Handler
