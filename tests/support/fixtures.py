"""Fixtures several test folders share, imported by their conftest.py (or by a module
that needs another one under the same name): ``from tests.support.fixtures import
fake_telegram as fake``. Pytest registers an imported fixture under the name it is
imported as."""

from __future__ import annotations

import pytest

from tests.fakes.llm import FakeLLM
from tests.fakes.telegram import FakeTelegram


@pytest.fixture
def fake_telegram():
    """A fake Telegram Bot API on 127.0.0.1."""
    with FakeTelegram() as f:
        yield f


@pytest.fixture
def fake_llm():
    """A fake LLM server (OpenAI and Anthropic APIs) on 127.0.0.1."""
    with FakeLLM() as f:
        yield f


@pytest.fixture
async def worlds():
    """A list a test appends the Telegram worlds it starts to; each is stopped at the end
    (see :func:`tests.support.telegram_world.start_world`)."""
    started: list = []
    yield started
    for w in started:
        await w.stop()
