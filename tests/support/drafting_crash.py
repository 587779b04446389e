"""Shared test helpers (moved from test_drafter_crash.py, which other tests imported)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from tests._proc import ORDER_EMAIL, ROOT, console_model_config, sqlite_rows

#: The order email of tests/_proc.py, to the Example Shop, a year earlier.
EMAIL = ORDER_EMAIL.replace(b"support@acme.example", b"support@shop.example").replace(
    b"Sun, 29 Nov 2026", b"Sat, 29 Nov 2025")


def _config(tmp: Path, url: str) -> Path:
    # lease 2s > timeout 0.5s x 1 attempt: a healthy call never outlives its claim.
    return console_model_config(
        tmp, email=EMAIL, pipeline="support", lease="2s", model="claude",
        model_yaml=f"    provider: anthropic\n    base_url: {url}\n    model: claude-test\n"
                   f"    api_key_env: DG_CRASH_KEY\n    timeout: 0.5s\n    retries: 0\n",
        prompt_for="Example Shop", sender="Shop <support@shop.example>")


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
    return sqlite_rows(db, "SELECT status, version, body FROM drafts")


def await_drafts(db: Path, want: list, timeout: float = 30) -> list:
    """The drafts once they are ``want`` (or what they are at the deadline): the card's
    text reaches the bot's output a moment before the store records it as posted."""
    deadline = time.monotonic() + timeout
    while (found := _drafts(db)) != want and time.monotonic() < deadline:
        time.sleep(0.05)
    return found




REPLY = "Hi Alice, your order ships today."  # what the drafting call after the restart says


def killed_while_held(cfg: Path, held, check) -> Bot:
    """Run the bot until the fake model holds its drafting request (``held``), call
    ``check()`` then, and SIGKILL it; the killed bot (its output lines)."""
    first = Bot(cfg)
    try:
        assert held.arrived.wait(30), "".join(first.lines)
        check()
    finally:
        assert first.stop(signal.SIGKILL) == -signal.SIGKILL
    return first


def restarted_to_one_draft(cfg: Path, held, after_release=lambda: None) -> Bot:
    """Run the bot again until it drafts REPLY; release the abandoned call (``held``),
    call ``after_release()``; the store ends with one draft of REPLY, awaiting; stop the
    bot with SIGTERM (exit 0). The stopped bot."""
    second = Bot(cfg)
    try:
        second.wait_for(REPLY)
        held.release()
        assert held.finished.wait(10)
        after_release()
        want = [("awaiting", 1, REPLY)]
        assert await_drafts(cfg.parent / "state.db", want) == want
    finally:
        assert second.stop(signal.SIGTERM) == 0, "".join(second.lines)
    return second


def assert_one_card(*bots: Bot) -> None:
    """The bots' output, together, shows one card: #1 v1 of support."""
    cards = [line for bot in bots for line in bot.lines if line.startswith("📨 support")]
    assert cards == ["📨 support · #1 v1\n"]
