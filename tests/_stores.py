"""Store operations only tests use (not in the Store contract: the engine recovers
sends with ``recover_abandoned_sends`` and admit stores cursors), on the SQL stores'
own primitives."""

from __future__ import annotations

import time

from bot.models import Draft
from bot.store.rows import CURSOR_SQL
from bot.store.transitions import RECOVER_SEND, cas


async def get_draft_by_key(store, key: str) -> Draft | None:
    found = await store._select_drafts("key = ?", (key,))
    return found[0] if found else None


async def set_cursor(store, pipeline: str, scope: str, value: str | None) -> None:
    await store._execute(CURSOR_SQL, (pipeline, scope, value, time.time()))


async def recover_sending(store, older_than: float | None = None, now: float | None = None) -> int:
    """Every ``sending`` row -> ``send_unknown``; with ``older_than``, only rows that
    began sending more than that many seconds before ``now``."""
    clock, arg = store._db_clock(now)
    return await store._execute(*cas(
        RECOVER_SEND, "error = ?, updated_at = ?",
        ("interrupted mid-send by a restart; it may have been delivered", store._now(now)),
        f"(CAST(? AS float8) IS NULL OR updated_at < {clock} - ?)",
        (older_than, arg, older_than)))
