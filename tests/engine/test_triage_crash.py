"""SIGKILL between triage and drafting, with the real CLI in a subprocess (issue 13).

The fake model server answers the triage call (reply) and holds the drafting request
that follows; the bot is SIGKILLed while it waits. The restarted bot finds the
decision stored with the draft key and drafts without asking again: one triage call
in total, one card, one draft.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests._proc import sqlite_rows
from tests.fakes.llm import FakeLLM
from tests.support.drafting_crash import (
    REPLY,
    _config,
    assert_one_card,
    killed_while_held,
    restarted_to_one_draft,
)

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
        fake.script(triage, held, fake.reply(REPLY))
        cfg = _with_triage(_config(tmp_path, fake.url))

        def decided() -> None:
            # The decision is stored with the draft before drafting starts.
            con_rows = sqlite_rows(tmp_path / "state.db",
                                   "SELECT status, triage, triage_reason FROM drafts")
            assert con_rows == [("drafting", "reply", "A customer asks about an order.")]

        first = killed_while_held(cfg, held, decided)
        second = restarted_to_one_draft(cfg, held)

        assert_one_card(first, second)
        asked = ["output_config" in r.body for r in fake.requests]
        assert asked == [True, False, False]  # one triage call, two drafting calls
