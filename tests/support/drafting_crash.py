"""Shared test helpers (moved from test_drafter_crash.py, which other tests imported)."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the repository (this file is in tests/support)


EMAIL = b"""From: Alice Buyer <alice@customer.example>
To: support@shop.example
Subject: Where is my order #1234?
Message-ID: <order-1234@customer.example>
Date: Sat, 29 Nov 2025 10:02:00 +0000

Hi, where is my order #1234? It was due Friday.
"""


def _config(tmp: Path, url: str) -> Path:
    (tmp / "inbox").mkdir()
    (tmp / "inbox" / "1.eml").write_bytes(EMAIL)
    (tmp / "prompt.md").write_text("You answer customer email for Example Shop.\n")
    (tmp / "pipelines").mkdir()
    # lease 2s > timeout 0.5s x 1 attempt: a healthy call never outlives its claim.
    (tmp / "pipelines" / "support.yaml").write_text(
        "name: support\nschedule: 1s\nsource: {type: maildir, path: inbox}\n"
        "drafter: {model: claude, prompt: prompt.md}\napproval: {channel: console}\n"
        "sender: {type: outbox, path: outbox, from: 'Shop <support@shop.example>'}\n"
        "lease: 2s\nmax_attempts: 3\n")
    cfg = tmp / "draftgate.yaml"
    cfg.write_text(
        f"store: sqlite:///{tmp}/state.db\n"
        f"models:\n  claude:\n    provider: anthropic\n    base_url: {url}\n"
        f"    model: claude-test\n    api_key_env: DG_CRASH_KEY\n    timeout: 0.5s\n"
        f"    retries: 0\n")
    return cfg


class Bot:
    """``python -m bot run`` with its stdout read line by line in a thread."""

    def __init__(self, cfg: Path):
        env = {k: v for k, v in os.environ.items() if not k.startswith("ANTHROPIC")}
        env["DG_CRASH_KEY"] = "test-key"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "bot", "run", "-c", str(cfg)], cwd=ROOT, env=env,
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        self.lines: list[str] = []
        self._cond = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            with self._cond:
                self.lines.append(raw.decode("utf-8", "replace"))
                self._cond.notify_all()

    def wait_for(self, text: str, timeout: float = 60) -> None:
        with self._cond:
            ok = self._cond.wait_for(lambda: any(text in line for line in self.lines), timeout)
        assert ok, f"no {text!r} in the output:\n{''.join(self.lines)}"

    def stop(self, sig: int) -> int:
        self.proc.send_signal(sig)
        try:
            return self.proc.wait(20)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait(5)
            self._reader.join(10)  # the pipe is at EOF once the process is gone
            assert self.proc.stdout is not None
            self.proc.stdout.close()


def _drafts(db: Path) -> list[tuple[str, int, str]]:
    con = sqlite3.connect(db, timeout=10)
    try:
        return con.execute("SELECT status, version, body FROM drafts").fetchall()
    finally:
        con.close()


def await_drafts(db: Path, want: list, timeout: float = 30) -> list:
    """The drafts once they are ``want`` (or what they are at the deadline): the card's
    text reaches the bot's output a moment before the store records it as posted."""
    deadline = time.monotonic() + timeout
    while (found := _drafts(db)) != want and time.monotonic() < deadline:
        time.sleep(0.05)
    return found


