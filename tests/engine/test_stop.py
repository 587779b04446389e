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

from tests._proc import reap, sqlite_rows, start_bot
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
