"""Restart during a model call, with the real CLI in a subprocess.

The fake Anthropic server holds the drafting request; the bot is SIGKILLed while it
waits; the restarted bot drafts the item again once the lease has expired; the
abandoned call's answer, released afterwards, changes nothing. The operator sees one
card and the store holds one draft.
"""

from __future__ import annotations

import signal

import pytest

from tests.fakes.llm import FakeLLM
from tests.support.drafting_crash import (  # noqa: F401
    EMAIL,
    ROOT,
    Bot,
    _config,
    _drafts,
    await_drafts,
)

pytestmark = pytest.mark.slow











def test_sigkill_during_the_model_call_gives_one_draft_and_one_card(tmp_path):
    with FakeLLM() as fake:
        held = fake.hold(then=fake.reply("LATE answer of the killed process"))
        fake.script(held, fake.reply("Hi Alice, your order ships today."))
        cfg = _config(tmp_path, fake.url)

        first = Bot(cfg)
        try:
            assert held.arrived.wait(30), "".join(first.lines)
            assert [s for s, _, _ in _drafts(tmp_path / "state.db")] == ["drafting"]
        finally:
            assert first.stop(signal.SIGKILL) == -signal.SIGKILL

        second = Bot(cfg)
        try:
            second.wait_for("Hi Alice, your order ships today.")
            # The abandoned call answers now; its process is gone and its claim too.
            held.release()
            assert held.finished.wait(10)
            # Further ticks of the running bot (one a second) call the model no more.
            assert fake.wait_requests(3, timeout=3) is False
            want = [("awaiting", 1, "Hi Alice, your order ships today.")]
            assert await_drafts(tmp_path / "state.db", want) == want
        finally:
            assert second.stop(signal.SIGTERM) == 0, "".join(second.lines)

        cards = [line for line in first.lines + second.lines if line.startswith("📨 support")]
        assert cards == ["📨 support · #1 v1\n"]
        assert len(fake.requests) == 2
        assert not (tmp_path / "outbox").exists() or not list((tmp_path / "outbox").iterdir())
