"""Undo's window survives a SIGKILL (issue 28): the real CLI (``python -m bot run``)
with the Telegram channel against the fake Bot API, killed inside the window.

The send time is in the store, so the restarted process sends the reply once, when it
is due: never before ``send_after`` (the times recorded say so, not a stopwatch).
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from tests._proc import reap, sqlite_rows, start_bot, telegram_maildir_config
from tests.fakes.telegram import FakeTelegram

pytestmark = pytest.mark.slow
ANNA, CHAT = 42, 1001


def _config(tmp_path: Path, fake: FakeTelegram) -> Path:
    return telegram_maildir_config(tmp_path, fake, ANNA, CHAT,
                                   approval="{channel: telegram, undo: 4s}")


def test_sigkill_inside_the_undo_window_then_a_restart_sends_once_when_due(tmp_path):
    log, db = tmp_path / "bot.log", tmp_path / "state.db"
    env = dict(os.environ, DG_CRASH_TELEGRAM_TOKEN="")
    with FakeTelegram() as fake:
        env["DG_CRASH_TELEGRAM_TOKEN"] = fake.token
        cfg = _config(tmp_path, fake)
        proc = start_bot(cfg, log, env)
        try:
            card = fake.wait_for(lambda: fake.chat_messages(CHAT), 30)[0]
            fake.wait_for(lambda: sqlite_rows(db, "SELECT status FROM drafts") == [("awaiting",)], 30)
            data = card.reply_markup["inline_keyboard"][0][0]["callback_data"]
            tap = fake.tap(ANNA, CHAT, card.message_id, data, "Anna")
            answer = fake.wait_for(lambda: fake.answers.get(tap["callback_query"]["id"]), 30)
            assert answer["text"].startswith("✅ Approved. 📤 Sending in 4 s"), log.read_text()
            proc.send_signal(signal.SIGKILL)
            assert proc.wait(10) == -signal.SIGKILL
            (status, send_after), = sqlite_rows(db, "SELECT status, send_after FROM drafts")
            assert status == "approved" and not list((tmp_path / "outbox").glob("*.eml"))

            proc = start_bot(cfg, log, env)
            fake.wait_for(lambda: sqlite_rows(db, "SELECT status FROM drafts") == [("sent",)], 60)
            fake.wait_for(lambda: fake.message(CHAT, card.message_id).text.startswith(
                "✅ Sent by Anna"), 30)
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(30) == 0, log.read_text()
        finally:
            reap(proc)
    assert len(list((tmp_path / "outbox").glob("*.eml"))) == 1
    (sent_at,), = sqlite_rows(db, "SELECT at FROM audit WHERE action = 'sent'")
    assert sent_at >= send_after
