"""Shared plumbing for tests that run the real CLI in a subprocess and kill it."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

ORDER_EMAIL = b"""From: Alice Buyer <alice@customer.example>
To: support@acme.example
Subject: Where is my order #1234?
Message-ID: <order-1234@customer.example>
Date: Sun, 29 Nov 2026 10:02:00 +0000

Hi, where is my order #1234? It was due Friday.
"""


def start_bot(cfg: Path, log: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    """``python -m bot run -c cfg`` with no stdin, output appended to ``log``."""
    with log.open("ab") as out:  # the child keeps its own copy of the descriptor
        return subprocess.Popen([sys.executable, "-m", "bot", "run", "-c", str(cfg)],
                                cwd=ROOT, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, env=env or dict(os.environ))


def reap(proc: subprocess.Popen) -> None:
    """Kill ``proc`` if it still runs, and wait for it (no zombie, no warning)."""
    if proc.poll() is None:
        proc.kill()
        proc.wait(10)


def sqlite_rows(db: Path, sql: str) -> list[tuple]:
    con = sqlite3.connect(db, timeout=10)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()
