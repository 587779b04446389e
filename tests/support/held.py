"""A coroutine function held at its door: the test sees a call begin and lets it go on."""

from __future__ import annotations

import asyncio


class Held:
    """Wraps the coroutine function ``fn``: a call sets ``entered``, waits for ``release``,
    then returns what ``fn`` returns."""

    def __init__(self, fn) -> None:
        self.fn = fn
        self.entered, self.release = asyncio.Event(), asyncio.Event()

    async def __call__(self, *args, **kw):
        self.entered.set()
        await self.release.wait()
        return await self.fn(*args, **kw)
