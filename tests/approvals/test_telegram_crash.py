"""Crash test: the real CLI (``python -m bot run``) with the Telegram channel against the
fake Bot API, SIGKILLed after a card was posted and before the tap.

Approval cards live in the store, not in memory: after a restart the tap on the card
the dead process posted still approves and sends exactly once, and SIGTERM then stops
the bot cleanly.
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest

from tests._proc import sqlite_rows, start_bot, telegram_maildir_config
from tests.fakes.telegram import FakeTelegram

pytestmark = pytest.mark.slow
ANNA, CHAT = 42, 1001



def _config(tmp_path: Path, fake: FakeTelegram) -> Path:
    return telegram_maildir_config(tmp_path, fake, ANNA, CHAT)


def _start(cfg: Path, fake: FakeTelegram, log: Path) -> subprocess.Popen:
    return start_bot(cfg, log, env=dict(os.environ, DG_CRASH_TELEGRAM_TOKEN=fake.token))


def _rows(db: Path, sql: str) -> list[tuple]:
    return sqlite_rows(db, sql)


def test_a_tap_on_a_card_posted_before_a_sigkill_approves_and_sends_once(tmp_path):
    log = tmp_path / "bot.log"
    db = tmp_path / "state.db"
    with FakeTelegram() as fake:
        cfg = _config(tmp_path, fake)
        proc = _start(cfg, fake, log)
        try:
            card = fake.wait_for(lambda: fake.chat_messages(CHAT), 30)[0]
            # The card is in the chat; wait until its message id is committed too.
            fake.wait_for(lambda: _rows(db, "SELECT status FROM drafts") == [("awaiting",)], 30)
            fake.wait_for(lambda: fake.calls_of("getUpdates"), 30)
            proc.send_signal(signal.SIGKILL)
            assert proc.wait(10) == -signal.SIGKILL
            assert "✅ Approve & send" in str(card.reply_markup)
            data = card.reply_markup["inline_keyboard"][0][0]["callback_data"]
            tap = fake.tap(ANNA, CHAT, card.message_id, data, "Anna")

            proc = _start(cfg, fake, log)
            answer = fake.wait_for(lambda: fake.answers.get(tap["callback_query"]["id"]), 30)
            assert answer["text"] == "✅ Sent.", log.read_text()
            assert len(fake.chat_messages(CHAT)) == 1  # no second card after the restart
            assert fake.message(CHAT, card.message_id).text.startswith("✅ Sent by Anna at ")
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(30) == 0, log.read_text()
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
    assert _rows(db, "SELECT status, version FROM drafts") == [("sent", 1)]
    assert len(list((tmp_path / "outbox").glob("*.eml"))) == 1
    approvals = _rows(db, "SELECT actor FROM audit WHERE action = 'approve'")
    assert approvals == [(f"tg:{ANNA} (Anna)",)]
