"""Store operations only tests use (not in the Store contract: the engine recovers
sends with ``recover_abandoned_sends`` and admit stores cursors), on the SQL stores'
own primitives."""

from __future__ import annotations

import time

from bot.models import Draft
from bot.store.rows import CURSOR_SQL


async def get_draft_by_key(store, key: str) -> Draft | None:
    found = await store._select_drafts("key = ?", (key,))
    return found[0] if found else None


async def set_cursor(store, pipeline: str, scope: str, value: str | None) -> None:
    await store._execute(CURSOR_SQL, (pipeline, scope, value, time.time()))
