"""SIGTERM stops ``draftgate run`` within seconds, whatever a worker thread is doing.

A call running in a thread cannot be cancelled: a Gmail read that never answers used
to hold the stop (closing the Gmail client waits for it, ``asyncio.run`` waits for the
default executor, the interpreter joins pool threads at exit) for as long as the read
took, and a pathological parse for hours.
"""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import pytest

from tests._proc import gmail_every_second, reap, rows_once_migrated, sqlite_rows, start_bot
from tests.fakes.gmail import FakeGmail, simple_message, write_deployment

pytestmark = pytest.mark.slow

# bot.cli.main.STOP_GRACE (10 s) and a margin for a loaded machine; well under the
# 30 s after which the fake answers the held read at last.
EXIT_WITHIN = 20


def test_sigterm_stops_run_within_seconds_while_a_gmail_read_never_answers(tmp_path):
    with FakeGmail() as fake:
        fake.add_message(simple_message(1))
        cfg = write_deployment(
            tmp_path, fake,
            source='{type: gmail, account: support, query: "in:inbox", backfill: 1}',
            # The read would wait five minutes for an answer, and is not retried.
            account_extra="backoff: 0.01\n      timeout: 300s\n      read_attempts: 1")
        fake.hold("batch")  # the download gets no answer (for 30 s)
        arrived = fake.reached("batch")
        log = tmp_path / "bot.log"
        proc = start_bot(Path(cfg), log)
        try:
            assert arrived.wait(60), log.read_text()
            proc.send_signal(signal.SIGTERM)
            try:
                code = proc.wait(EXIT_WITHIN)
            except subprocess.TimeoutExpired:
                pytest.fail(f"still running {EXIT_WITHIN}s after SIGTERM:\n"
                            + log.read_text())
        finally:
            reap(proc)
    text = log.read_text()
    # The orderly stop could not finish (the Gmail client waits for its read): exit 1,
    # saying what was left behind.
    assert code == 1, text
    assert "the stop has not finished" in text and "gmail-support" in text, text
    # Nothing was admitted, so the next start fetches the message again.
    assert sqlite_rows(tmp_path / "state.db", "SELECT count(*) FROM drafts") == [(0,)]


def test_sigterm_during_a_send_leaves_it_send_unknown_and_tells_the_operator(tmp_path):
    """Gmail holds the messages.send of an approved reply when SIGTERM arrives: the row
    is send_unknown ('interrupted during send', so the next start checks it and never
    sends it blindly), the operator's card says so, and only one send was made."""
    import asyncio
    import time

    from bot.config.load import load_settings
    from bot.store import create_store

    with FakeGmail() as gmail:
        cfg = gmail_every_second(tmp_path, gmail)
        log, db = tmp_path / "bot.log", tmp_path / "state.db"

        def rows(sql: str) -> list[tuple]:
            return rows_once_migrated(db, sql)

        def wait_for(cond, what: str, timeout: float = 60) -> None:
            deadline = time.monotonic() + timeout
            while not cond():
                if time.monotonic() > deadline:
                    pytest.fail(f"timed out waiting for {what}:\n{log.read_text()}")
                time.sleep(0.05)

        async def approve() -> None:
            store = create_store(load_settings(cfg).store)
            await store.open()
            try:  # the operator approves; the running process sends on its next tick
                [d] = await store.pending("support")
                assert (await store.approve(d.id, d.version, "anna")).status == "approved"
            finally:
                await store.close()

        proc = start_bot(cfg, log)
        try:
            wait_for(lambda: rows("SELECT 1 FROM cursors"), "the first tick's cursor")
            gmail.add_message(simple_message(1))
            wait_for(lambda: rows("SELECT 1 FROM drafts WHERE status = 'awaiting'"), "the card")
            release = gmail.hold("messages.send")
            asyncio.run(approve())
            assert gmail.reached("messages.send").wait(60), log.read_text()
            assert rows("SELECT status FROM drafts") == [("sending",)]
            proc.send_signal(signal.SIGTERM)
            wait_for(lambda: rows("SELECT status FROM drafts") == [("send_unknown",)],
                     "the interrupted send to be recorded")
            release.set()  # Gmail answers the abandoned call; nothing may change for it
            try:
                proc.wait(EXIT_WITHIN)
            except subprocess.TimeoutExpired:
                pytest.fail(f"still running {EXIT_WITHIN}s after SIGTERM:\n" + log.read_text())
        finally:
            reap(proc)
    text = log.read_text()
    [(status, error)] = rows("SELECT status, error FROM drafts")
    assert (status, error) == ("send_unknown", "interrupted during send")
    assert "❓ Send outcome unknown · #1: interrupted during send" in text, text
    assert len(gmail.calls_to("messages.send")) == 1
