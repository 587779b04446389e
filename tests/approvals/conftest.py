"""The fake Telegram Bot API the tests here share (a module may define its own ``fake``)."""

from __future__ import annotations

import pytest

from tests.fakes.telegram import FakeTelegram


@pytest.fixture
def fake():
    """A fake Telegram Bot API on 127.0.0.1."""
    with FakeTelegram() as f:
        yield f
