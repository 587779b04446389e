"""A process writing to a shared store, for the audit chain test on PostgreSQL:
``python -m tests._audit_writer URL NAME N``. Prints ``ready`` once its store is open,
waits for a line on stdin (so the writers start together), then takes N items of its
own pipeline through admit, draft, post and approve, with a note each: 4 audit rows
per item, written through the store like `draftgate run` writes them."""

from __future__ import annotations

import asyncio
import sys

from bot.models import Item, Message
from bot.store import create_store


async def main(url: str, name: str, n: int) -> None:
    async with create_store(url) as store:
        print("ready", flush=True)
        await asyncio.to_thread(sys.stdin.readline)
        for i in range(n):
            await store.admit(name, "inbox", "v1", [Item(f"<{name}-{i}@x>", Message(subject=f"{i}"))])
            [d] = await store.claim(name, 60)
            d = await store.finish_draft(d.id, d.fence, f"reply {i}", tokens_in=1, tokens_out=2,
                                         model="m")
            d = await store.mark_posted(d.id, d.version, "1", str(i))
            assert await store.approve(d.id, d.version, name) is not None
            await store.audit(name, "note", d.key, detail=str(i))
    print("done", flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
