"""Source ``imap``: new mail in one folder of an IMAP account.

::

    source: {type: imap, account: shop, folder: INBOX, backfill: 0, max_body: 200kB}

The cursor is the folder's ``UIDVALIDITY`` and the last UID taken (and when the last
tick synced, and when the first run was). A tick asks ``UID SEARCH UID n+1:*`` and
downloads what is new with ``UID FETCH ... (UID BODY.PEEK[])`` (never sets \\Seen), up
to ``batch`` messages per command, at most ``ctx.limit`` per tick, oldest first. An
idle tick is one SELECT and one SEARCH on the connection kept open from the last tick.

The item id is the Message-ID (else ``sha256:`` of the message), not the UID, so it
survives a UIDVALIDITY change: then the folder is scanned again from the last sync
(less a margin, never before the first run, never longer ago than ``resync_window``)
by the messages' Message-IDs alone, and only those the store has not seen are
downloaded and admitted. So nothing is drafted twice and nothing that arrived around
the change is lost. The first run records the cursor and drafts no old mail unless
``backfill: N`` asks for the newest N.
"""

from __future__ import annotations

import asyncio
import email.parser
import email.policy
import hashlib
import json
import logging
import time
from dataclasses import dataclass

from ..config.load import PipelineConfig, Settings
from ..config.options import FilterOptions, ImapSourceOptions, expect
from ..context.thread import Thread
from ..imap import idle, pool
from ..imap.client import ImapClient
from ..models import FetchResult, Item, Message
from ..stages import FetchContext
from .mailbox import MailboxSource, load_cursor

log = logging.getLogger("draftgate.sources.imap")

RESYNC_MARGIN = 600.0  # seconds before the last sync a rescan still looks (clock skew)


@dataclass
class Cursor:
    uidvalidity: int
    uid: int  # the last UID taken
    synced: float  # this host's clock, taken before the tick's SELECT
    first: float  # when the first run took its cursor

    def dump(self) -> str:
        return json.dumps({"uidvalidity": self.uidvalidity, "uid": self.uid,
                           "synced": self.synced, "first": self.first})

    @classmethod
    def load(cls, text: str | None) -> "Cursor | None":
        return load_cursor(text, lambda d: cls(int(d["uidvalidity"]), int(d["uid"]),
                                               float(d.get("synced", 0)),
                                               float(d.get("first", 0))), log, "imap")


def item_id(raw: bytes) -> str:
    """The Message-ID of ``raw``, else a digest of the whole message."""
    mid = _message_id(raw)
    return mid or "sha256:" + hashlib.sha256(raw).hexdigest()


def _message_id(raw: bytes) -> str:
    head = raw.split(b"\r\n\r\n", 1)[0].split(b"\n\n", 1)[0]
    parsed = email.parser.BytesHeaderParser(policy=email.policy.compat32).parsebytes(head)
    return " ".join(str(parsed.get("Message-ID", "") or "").split())


class ImapSource(MailboxSource):
    """See the module docstring."""

    kind, log = "imap", log
    options: ImapSourceOptions

    def __init__(self, options: ImapSourceOptions, account, filters: FilterOptions = FilterOptions(),
                 clock=time.time):
        super().__init__(options, account, filters, clock, pool.lease(account),
                         [a for a in (account.address, account.username) if a and "@" in a])

    @property
    def client(self) -> ImapClient:
        return self._lease.client

    async def fetch(self, ctx: FetchContext) -> FetchResult:
        started = self.clock()
        stored = Cursor.load(ctx.cursor)
        if stored is not None and idle.quiet(self.account, self.folder):
            # IDLE watches the folder and saw nothing since the last fetch: no command.
            return FetchResult([], cursor=ctx.cursor)
        sel = await self.client.select(self.folder)
        if stored is None:
            return await self._first_run(ctx, sel.uidvalidity, sel.uidnext, started)
        if stored.uidvalidity != sel.uidvalidity:
            return await self._rescan(ctx, stored, sel.uidvalidity, started)
        uids = [u for u in await self.client.search(self.folder, "UID", f"{stored.uid + 1}:*")
                if u > stored.uid]  # n+1:* always matches the last message (RFC 3501)
        more = ctx.limit is not None and len(uids) > ctx.limit
        uids = uids[:ctx.limit] if more and ctx.limit is not None else uids
        items = await self._download(uids, sel.uidvalidity, ctx)
        last = max(uids, default=stored.uid)
        cursor = Cursor(sel.uidvalidity, last, started, stored.first or started)
        if more:
            idle.unfinished(self.account, self.folder)
        return FetchResult(items, cursor=cursor.dump(), more=more)

    async def _first_run(self, ctx: FetchContext, uidvalidity: int, uidnext: int,
                         started: float) -> FetchResult:
        uids = await self.client.search(self.folder, "ALL") if self.options.backfill else []
        uids = uids[-self.options.backfill:] if self.options.backfill else []
        if ctx.limit is not None:
            uids = uids[:ctx.limit]  # the rest of a backfill is not fetched later
        items = await self._download(uids, uidvalidity, ctx)
        last = max(uidnext - 1, max(uids, default=0))
        return FetchResult(items, cursor=Cursor(uidvalidity, last, started, started).dump(),
                           note=f"first run: cursor recorded, {len(items)} backfilled")

    async def _rescan(self, ctx: FetchContext, stored: Cursor, uidvalidity: int,
                      started: float) -> FetchResult:
        """UIDVALIDITY changed: every old UID is void. Look at the folder's messages
        from the last sync on (by Message-ID) and take those the store has not seen."""
        # Not before the first run (no margin there: whatever arrived after it was taken
        # by UID and is known by its id; what came before was left undrafted on purpose).
        since = max(stored.synced - RESYNC_MARGIN, started - self.options.resync_window,
                    stored.first)
        day = time.strftime("%d-%b-%Y", time.gmtime(since))
        uids = await self.client.search(self.folder, "SINCE", day)
        heads: dict[int, tuple[float, bytes]] = {}
        for i in range(0, len(uids), self.options.batch):
            heads.update(await self.client.heads(self.folder, uids[i:i + self.options.batch],
                                                 uidvalidity))
        # SINCE counts whole days: the arrival time (INTERNALDATE) bounds it exactly, so
        # mail that was in the box before the first run stays undrafted.
        # (INTERNALDATE has whole seconds: one in since's own second counts.)
        ids = {uid: _message_id(head) for uid, (when, head) in heads.items()
               if not when or when > since - 1}
        # Without a Message-ID the id is the digest of the body: download those to know.
        bare = [u for u, mid in ids.items() if not mid]
        for uid, raw in (await self._fetch_batched(bare, "BODY.PEEK[]", uidvalidity)).items():
            ids[uid] = item_id(raw)
        unseen = await ctx.unseen(sorted(set(ids.values()))) if ids else set()
        todo = [u for u in sorted(ids) if ids[u] in unseen]
        more = ctx.limit is not None and len(todo) > ctx.limit
        todo = todo[:ctx.limit] if more and ctx.limit is not None else todo
        items = await self._download(todo, uidvalidity, ctx)
        # Go on after the last UID taken: what the limit left waits above it (and
        # seen messages among it are not admitted twice: the store knows their ids).
        last = todo[-1] if more else max(uids, default=0)
        log.warning("imap %s: %s changed UIDVALIDITY (%d -> %d); rescanned %d message(s) "
                    "since %s, %d new", self.account.name, self.folder, stored.uidvalidity,
                    uidvalidity, len(ids), day, len(items))
        cursor = Cursor(uidvalidity, last, started, stored.first)
        if more:
            idle.unfinished(self.account, self.folder)
        return FetchResult(items, cursor=cursor.dump(), more=more,
                           note=f"UIDVALIDITY changed: rescanned since {day}, "
                                f"{len(items)} new")

    async def _fetch_batched(self, uids: list[int], part: str, uidvalidity: int
                             ) -> dict[int, bytes]:
        out: dict[int, bytes] = {}
        step = self.options.batch
        for i in range(0, len(uids), step):
            out.update(await self.client.fetch(self.folder, uids[i:i + step], part,
                                               uidvalidity=uidvalidity))
        return out

    async def _download(self, uids: list[int], uidvalidity: int, ctx: FetchContext
                        ) -> list[Item]:
        if not uids:
            return []
        raws = await self._fetch_batched(uids, "BODY.PEEK[]", uidvalidity)
        if ctx.progress:
            ctx.progress(len(raws), len(uids))
        # Parsing is CPU work: off the event loop, all of the batch in one thread hop.
        return await asyncio.to_thread(
            lambda: [self._item(uidvalidity, uid, raws[uid]) for uid in uids if uid in raws])

    def _item(self, uidvalidity: int, uid: int, raw: bytes) -> Item:
        stub = Message(source_id=f"{uidvalidity}:{uid}", size=len(raw),
                       message_id=_message_id(raw))
        return self._parsed(item_id(raw), stub, raw, f"UID {uid}")

    async def thread(self, message: Message, limit: int) -> Thread:
        from ..imap.thread import thread

        return await thread(self.client, self.account, self.folder, message, limit)


def create(pipeline: PipelineConfig, settings: Settings) -> ImapSource:
    """Build the source from its checked ``source:`` options (no I/O)."""
    o = expect(pipeline.source, ImapSourceOptions)
    return ImapSource(o, settings.imap_accounts[o.account], pipeline.filters)
