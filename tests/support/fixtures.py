"""Fixtures several test folders share, imported by their conftest.py (or by a module
that needs another one under the same name): ``from tests.support.fixtures import
fake_telegram as fake``. Pytest registers an imported fixture under the name it is
imported as."""

from __future__ import annotations

import pytest

from tests.fakes.gmail import GmailWorld
from tests.fakes.llm import FakeLLM
from tests.fakes.telegram import FakeTelegram
from tests.fakes.webhook import FakeWebhook


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
def fake_webhook():
    """A fake webhook receiver on 127.0.0.1."""
    with FakeWebhook() as f:
        yield f


@pytest.fixture
async def gmail_world(tmp_path):
    """An opened :class:`tests.fakes.gmail.GmailWorld` in ``tmp_path``, closed at the end."""
    w = await GmailWorld(tmp_path).open()
    try:
        yield w
    finally:
        await w.close()


@pytest.fixture
async def worlds():
    """A list a test appends the Telegram worlds it starts to; each is stopped at the end
    (see :func:`tests.support.telegram_world.start_world`)."""
    started: list = []
    yield started
    for w in started:
        await w.stop()
