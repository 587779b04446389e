"""Shared test helpers (moved from test_service.py, which other tests imported)."""

from __future__ import annotations

import socket
import urllib.error
import urllib.request

from tests._proc import ORDER_EMAIL


def _email(n: int, sender: str = "Alice Buyer <alice@customer.example>") -> bytes:
    return ORDER_EMAIL.replace(b"Alice Buyer <alice@customer.example>", sender.encode()) \
        .replace(b"<order-1234@customer.example>", f"<order-{n}@customer.example>".encode())


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(port: int, path: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=30) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


