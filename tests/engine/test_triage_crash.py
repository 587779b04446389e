"""SIGKILL between triage and drafting, with the real CLI in a subprocess (issue 13).

The fake model server answers the triage call (reply) and holds the drafting request
that follows; the bot is SIGKILLed while it waits. The restarted bot finds the
decision stored with the draft key and drafts without asking again: one triage call
in total, one card, one draft.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from tests.fakes.llm import FakeLLM
from tests.support.drafting_crash import Bot, _config, await_drafts

pytestmark = pytest.mark.slow


def _with_triage(cfg: Path) -> Path:
    support = cfg.parent / "pipelines" / "support.yaml"
    support.write_text(support.read_text() + "triage:\n  rules: Reply to customers asking "
                                              "about orders. Skip newsletters.\n")
    return cfg


def test_sigkill_between_triage_and_drafting_triages_once_and_posts_one_card(tmp_path):
    with FakeLLM() as fake:
        triage = fake.reply(json.dumps({"action": "reply", "reason": "A customer asks "
                                                                     "about an order."}))
        held = fake.hold(then=fake.reply("LATE answer of the killed process"))
        fake.script(triage, held, fake.reply("Hi Alice, your order ships today."))
        cfg = _with_triage(_config(tmp_path, fake.url))

        first = Bot(cfg)
        try:
            assert held.arrived.wait(30), "".join(first.lines)
            # The decision is stored with the draft before drafting starts.
            con_rows = _rows(tmp_path / "state.db")
            assert con_rows == [("drafting", "reply", "A customer asks about an order.")]
        finally:
            assert first.stop(signal.SIGKILL) == -signal.SIGKILL

        second = Bot(cfg)
        try:
            second.wait_for("Hi Alice, your order ships today.")
            held.release()
            assert held.finished.wait(10)
            want = [("awaiting", 1, "Hi Alice, your order ships today.")]
            assert await_drafts(tmp_path / "state.db", want) == want
        finally:
            assert second.stop(signal.SIGTERM) == 0, "".join(second.lines)

        cards = [line for line in first.lines + second.lines if line.startswith("📨 support")]
        assert cards == ["📨 support · #1 v1\n"]
        asked = ["output_config" in r.body for r in fake.requests]
        assert asked == [True, False, False]  # one triage call, two drafting calls


def _rows(db: Path) -> list[tuple]:
    import sqlite3

    con = sqlite3.connect(db, timeout=10)
    try:
        return con.execute("SELECT status, triage, triage_reason FROM drafts").fetchall()
    finally:
        con.close()
