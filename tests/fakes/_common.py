"""What the fake servers share: a JSON answer, and faults queued for a route or method."""

from __future__ import annotations

import json
from http.server import BaseHTTPRequestHandler
from typing import Any


def send_head(h: BaseHTTPRequestHandler, status: int, content_type: str, length: int,
              headers: dict | None = None) -> None:
    """The head of ``h``'s answer: ``status``, the body's type and length, ``headers``."""
    h.send_response(status)
    h.send_header("Content-Type", content_type)
    h.send_header("Content-Length", str(length))
    for k, v in (headers or {}).items():
        h.send_header(k, v)
    h.end_headers()


def send_json(h: BaseHTTPRequestHandler, status: int, payload: Any, headers: dict | None = None,
              content_type: str = "application/json") -> None:
    """Answer ``h``'s request: ``status``, ``payload`` as JSON, then ``headers``."""
    data = json.dumps(payload).encode()
    send_head(h, status, content_type, len(data), headers)
    h.wfile.write(data)


def take_fault(queues: dict, key: str):
    """The first fault queued for ``key`` (None: none), one of its ``times`` used; it
    leaves the queue once they are all used."""
    queue = queues.get(key)
    if not queue:
        return None
    fault = queue[0]
    fault.times -= 1
    if fault.times <= 0:
        queue.pop(0)
    return fault
