"""The fixtures the approval tests share: ``fake`` (a fake Telegram Bot API; a module may
define its own), ``llm`` (a fake model server) and ``worlds`` (Telegram worlds stopped at
the end)."""

from __future__ import annotations

from tests.support.fixtures import fake_llm as llm  # noqa: F401
from tests.support.fixtures import fake_telegram as fake  # noqa: F401
from tests.support.fixtures import worlds  # noqa: F401
