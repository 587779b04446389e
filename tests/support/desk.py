"""Operators and a started app for tests that drive the operator desk directly."""

from __future__ import annotations

import re
from typing import Any

from bot.app import App
from bot.desk.operator import CONSOLE, SYSTEM, Operator, telegram

__all__ = ["CONSOLE", "SYSTEM", "close_console_world", "op", "open_console_world", "started"]


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


async def open_console_world(world: Any) -> None:
    """Loads ``world.config``, opens its store and starts the app with a non-interactive
    console channel (``world.auto_approve``) writing to ``world.out``; sets ``settings``,
    ``store``, ``out``, ``channel``, ``app``, ``engine`` and ``desk`` on ``world``."""
    import io

    from bot.approvals.console import ConsoleChannel
    from bot.config.load import load_settings
    from bot.store import create_store

    world.settings = load_settings(world.config)
    world.store = create_store(world.settings.store)
    await world.store.open()
    world.out = io.StringIO()
    world.channel = ConsoleChannel(auto_approve=world.auto_approve, interactive=False,
                                   out=world.out)
    world.app = await started(world.settings, world.store, {"console": world.channel},
                              send_check_delay=0.0)
    world.engine, world.desk = world.app.engine, world.app.desk


async def close_console_world(world: Any) -> None:
    """Stops what :func:`open_console_world` started (engine first, then the store)."""
    try:
        if world.engine:
            await world.engine.stop()
    finally:
        if world.store:
            await world.store.close()
