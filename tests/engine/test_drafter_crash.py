"""Restart during a model call, with the real CLI in a subprocess.

The fake Anthropic server holds the drafting request; the bot is SIGKILLed while it
waits; the restarted bot drafts the item again once the lease has expired; the
abandoned call's answer, released afterwards, changes nothing. The operator sees one
card and the store holds one draft.
"""

from __future__ import annotations

import pytest

from tests.fakes.llm import FakeLLM
from tests.support.drafting_crash import (
    REPLY,
    _config,
    _drafts,
    assert_one_card,
    killed_while_held,
    restarted_to_one_draft,
)

pytestmark = pytest.mark.slow


def test_sigkill_during_the_model_call_gives_one_draft_and_one_card(tmp_path):
    with FakeLLM() as fake:
        held = fake.hold(then=fake.reply("LATE answer of the killed process"))
        fake.script(held, fake.reply(REPLY))
        cfg = _config(tmp_path, fake.url)

        def drafting() -> None:
            assert [s for s, _, _ in _drafts(tmp_path / "state.db")] == ["drafting"]

        def no_more_calls() -> None:
            # Further ticks of the running bot (one a second) call the model no more.
            assert fake.wait_requests(3, timeout=3) is False

        first = killed_while_held(cfg, held, drafting)
        # The abandoned call answers after the restart; its process is gone and its
        # claim too.
        second = restarted_to_one_draft(cfg, held, no_more_calls)

        assert_one_card(first, second)
        assert len(fake.requests) == 2
        assert not (tmp_path / "outbox").exists() or not list((tmp_path / "outbox").iterdir())
