"""Operators and a started app for tests that drive the operator desk directly."""

from __future__ import annotations

import re
from typing import Any

from bot.app import App
from bot.desk.operator import CONSOLE, SYSTEM, Operator, telegram

__all__ = ["CONSOLE", "SYSTEM", "op", "started"]


def op(actor: str) -> Operator:
    """The operator an actor string names: ``"tg:42 (Anna)"`` is Telegram user 42,
    anything else a console-like operator of that name (the audit shows the name)."""
    m = re.fullmatch(r"tg:(\d+)(?: \((.*)\))?", actor)
    if m:
        return telegram(int(m.group(1)), m.group(2) or "")
    return Operator(None, actor)


async def started(settings: Any, store: Any, channels: dict | None = None, **engine: Any) -> App:
    """An App on an opened ``store`` with ``channels``, started (channels bound to its
    desk, crash recovery done). ``await app.close()`` stops it (the store stays open)."""
    app = App(settings, channels if channels is not None else {}, store=store, **engine)
    return await app.start()
