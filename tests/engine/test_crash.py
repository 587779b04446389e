"""Crash tests: the real CLI in a subprocess, killed with SIGKILL at an exact point.

The fake model server holds the drafting request, which is the moment after the
claim and before the draft is stored. The process is killed there and restarted; the
item must be drafted again once its lease expires, approved and sent exactly once,
and no row may be left in a state that nothing will ever move.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from bot.config.load import load_settings
from bot.models import TERMINAL_STATUSES
from bot.store import create_store
from tests._proc import (
    console_model_config,
    gmail_every_second,
    reap,
    rows_once_migrated,
    sqlite_rows,
    start_bot,
)
from tests.fakes.llm import FakeLLM
from tests.support.desk import op, started

pytestmark = pytest.mark.slow


def _config(tmp_path: Path, llm_url: str) -> Path:
    return console_model_config(
        tmp_path, pipeline="crash", lease="3s", model="local",
        model_yaml=f"    provider: openai\n    base_url: {llm_url}\n    model: fake-model\n"
                   "    timeout: 2s\n    retries: 0\n")


def _start(cfg: Path, log: Path) -> subprocess.Popen:
    return start_bot(cfg, log, env={k: v for k, v in os.environ.items()
                                    if not k.startswith("OPENAI")})


def _statuses(db: Path) -> list[tuple[str, int]]:
    return sqlite_rows(db, "SELECT status, version FROM drafts")


def _wait_for(cond, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


async def test_sigkill_while_drafting_drafts_again_once_and_sends_once(tmp_path):
    with FakeLLM() as fake:
        held = fake.hold()
        fake.script(held)  # the first drafting request hangs until released
        cfg = _config(tmp_path, fake.openai_url)
        log = tmp_path / "bot.log"
        db = tmp_path / "state.db"

        first = _start(cfg, log)
        try:
            assert held.arrived.wait(30), log.read_text()
            assert _statuses(db) == [("drafting", 1)]
            first.send_signal(signal.SIGKILL)
            first.wait(10)
        finally:
            reap(first)

        second = _start(cfg, log)
        try:
            _wait_for(lambda: _statuses(db) == [("awaiting", 1)], 60, "the card after restart")
            second.send_signal(signal.SIGTERM)
            assert second.wait(20) == 0, log.read_text()
        finally:
            reap(second)

        # The operator approves the card (from another process, as a phone would).
        settings = load_settings(cfg)
        store = create_store(settings.store)
        await store.open()
        try:
            import io

            from bot.approvals.console import ConsoleChannel

            app = await started(settings, store, {"console": ConsoleChannel(
                out=io.StringIO(), interactive=False)})
            engine, desk = app.engine, app.desk
            [d] = await store.pending("crash")
            assert (await desk.approve(op("anna"), d.id, d.version)).status == "sent"
            assert await desk.approve(op("anna"), d.id, d.version) is None
            # The abandoned call now answers; nothing may change because of it.
            held.release()
            assert held.finished.wait(10)
            await engine.drain("crash")
            await engine.stop()
            rows = _statuses(db)
            assert rows == [("sent", 1)]
            assert all(status in TERMINAL_STATUSES for status, _ in rows)
            assert len(list((tmp_path / "outbox").glob("*.eml"))) == 1
            assert len(fake.requests) == 2  # the held call and exactly one redraft
        finally:
            await store.close()


async def test_sigkill_during_a_gmail_send_is_checked_and_finished_within_30s(tmp_path):
    """The process sending a reply is SIGKILLed while Gmail holds the request (Gmail
    then delivers it). The restarted process sees the sender gone, asks Gmail, finds
    the reply in Sent and marks it sent within 30 s (not after a five-minute grace),
    without a second messages.send."""
    import asyncio

    from tests.fakes.gmail import FakeGmail, simple_message

    with FakeGmail() as gmail:
        cfg = gmail_every_second(tmp_path, gmail)
        log, db = tmp_path / "bot.log", tmp_path / "state.db"

        def rows(sql: str) -> list[tuple]:
            return rows_once_migrated(db, sql)

        first = _start(cfg, log)
        try:
            _wait_for(lambda: rows("SELECT 1 FROM cursors"), 60, "the first tick's cursor")
            gmail.add_message(simple_message(1))
            _wait_for(lambda: rows("SELECT 1 FROM drafts WHERE status = 'awaiting'"), 60,
                      "the card")
            release = gmail.hold("messages.send")
            settings = load_settings(cfg)
            store = create_store(settings.store)
            await store.open()
            try:  # the operator approves; the running process sends it on its next tick
                [d] = await store.pending("support")
                assert (await store.approve(d.id, d.version, "anna")).status == "approved"
            finally:
                await store.close()
            assert await asyncio.to_thread(gmail.reached("messages.send").wait, 30), \
                log.read_text()
            assert rows("SELECT status FROM drafts") == [("sending",)]
            first.send_signal(signal.SIGKILL)
            first.wait(10)
        finally:
            reap(first)
        release.set()  # Gmail goes on and delivers the reply; its answer is lost
        assert await asyncio.to_thread(gmail.accepted.wait, 10)

        second = _start(cfg, log)
        try:
            restarted = time.monotonic()
            _wait_for(lambda: rows("SELECT status FROM drafts") == [("sent",)], 30,
                      "the reply to be checked and marked sent after the restart")
            took = time.monotonic() - restarted
            second.send_signal(signal.SIGTERM)
            assert second.wait(20) == 0, log.read_text()
        finally:
            reap(second)
        assert took < 30
        assert len(gmail.calls_to("messages.send")) == 1 and len(gmail.sent()) == 1
        [(sent_id,)] = rows("SELECT sent_id FROM drafts")
        assert sent_id == gmail.sent()[0].id
