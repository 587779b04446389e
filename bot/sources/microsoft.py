"""Source ``microsoft``: new mail in one folder of a Microsoft 365 / Outlook.com
mailbox, through Microsoft Graph.

::

    source: {type: microsoft, account: office, folder: inbox, backfill: 0, max_body: 200kB}

The cursor is the folder's ``messages/delta`` ``@odata.deltaLink`` (and when the last
tick synced, and when the first run was). A tick follows it (``@odata.nextLink`` page
by page) and gets the new deltaLink; an idle tick is that one call. Delta lists
changed messages too (read, flagged): the item id is the ``internetMessageId`` (else
``graph:<id>``), stable across folders and resyncs, and only ids the store has not
seen are downloaded, as MIME (``$value``, 20 to a JSON ``$batch``) so the same parser
serves every provider.

When Graph answers ``410 Gone`` (or ``syncStateNotFound`` / ``resyncRequired``) the
delta token is dead: a new delta query from the last sync (less a margin, never
before the first run, never longer ago than ``resync_window``), filtered on
``receivedDateTime``, lists the window again, and the seen marks keep anything from
being drafted twice. The first run records the cursor and drafts no old mail unless
``backfill: N`` asks for the newest N. When a tick stops at its limit the cursor is
not moved: the next tick reads the same changes and takes the rest.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from urllib.parse import quote

from ..config.load import PipelineConfig, Settings
from ..config.microsoft import MicrosoftSourceOptions
from ..config.options import FilterOptions, expect
from ..context.thread import Thread
from ..microsoft import client as graph
from ..microsoft.client import GraphClient, GraphError
from ..models import FetchResult, Item, Message
from ..stages import FetchContext
from .mailbox import MailboxSource, load_cursor

log = logging.getLogger("draftgate.sources.microsoft")

RESYNC_MARGIN = 600.0  # seconds before the last sync a resync still looks (clock skew)
RESET_CODES = {"syncstatenotfound", "resyncrequired", "syncstateinvalid"}
_SELECT = "id,internetMessageId,receivedDateTime,conversationId,isDraft"


def iso(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class Cursor:
    delta: str  # the deltaLink
    synced: float  # this host's clock, taken before the tick's first call
    first: float  # when the first run took its cursor

    def dump(self) -> str:
        return json.dumps({"delta": self.delta, "synced": self.synced, "first": self.first})

    @classmethod
    def load(cls, text: str | None) -> "Cursor | None":
        return load_cursor(text, lambda d: cls(str(d["delta"]), float(d.get("synced", 0)),
                                               float(d.get("first", 0))), log, "microsoft")


def item_id(entry: dict) -> str:
    mid = " ".join(str(entry.get("internetMessageId") or "").split())
    return mid or f"graph:{entry.get('id')}"


class MicrosoftSource(MailboxSource):
    """See the module docstring."""

    kind, log = "microsoft", log
    options: MicrosoftSourceOptions

    def __init__(self, options: MicrosoftSourceOptions, account, token_path: str,
                 filters: FilterOptions = FilterOptions(), clock=time.time):
        super().__init__(options, account, filters, clock, graph.lease(account, token_path),
                         [account.address] if account.address else [])
        self.token_path = token_path

    @property
    def client(self) -> GraphClient:
        return self._lease.client

    def _delta(self, since: float) -> str:
        return (f"me/mailFolders/{quote(self.folder, safe='')}/messages/delta?$select={_SELECT}"
                f"&$filter=receivedDateTime ge {iso(since)}")

    async def fetch(self, ctx: FetchContext) -> FetchResult:
        started = self.clock()
        stored = Cursor.load(ctx.cursor)
        if stored is None:
            return await self._first_run(ctx, started)
        try:
            entries, link = await self.client.pages(stored.delta)
        except GraphError as exc:
            if exc.status == 410 or exc.code.lower() in RESET_CODES:
                return await self._resync(ctx, stored, started, exc)
            raise
        items, more = await self._take(ctx, entries)
        if more or link is None:
            return FetchResult(items, cursor=ctx.cursor, more=more)
        return FetchResult(items, cursor=Cursor(link, started, stored.first or started).dump())

    async def _first_run(self, ctx: FetchContext, started: float) -> FetchResult:
        # What this listing holds arrived before the cursor was taken (receivedDateTime
        # has whole seconds, so "ge now" can list mail of this very second): old mail.
        _, link = await self.client.pages(self._delta(started))
        entries: list[dict] = []
        if self.options.backfill:
            page = await self.client.get_json(
                f"me/mailFolders/{quote(self.folder, safe='')}/messages?$select={_SELECT}"
                f"&$orderby=receivedDateTime desc&$top={self.options.backfill}")
            entries = list(page.get("value") or [])
        items, _ = await self._take(ctx, entries)  # the rest of a backfill is not taken later
        if link is None:
            raise GraphError("Microsoft Graph: the delta query ended without a deltaLink")
        return FetchResult(items, cursor=Cursor(link, started, started).dump(),
                           note=f"first run: cursor recorded, {len(items)} backfilled")

    async def _resync(self, ctx: FetchContext, stored: Cursor, started: float,
                      exc: GraphError) -> FetchResult:
        since = max(stored.synced - RESYNC_MARGIN, started - self.options.resync_window,
                    stored.first)
        entries, link = await self.client.pages(self._delta(since))
        items, more = await self._take(ctx, entries)
        log.warning("microsoft %s: the delta token of %s was refused (%s); listed %d message(s) "
                    "since %s again, %d new", self.account.name, self.folder, exc, len(entries),
                    iso(since), len(items))
        # Stopped at the limit: keep the dead token, so the next tick lists the window again.
        cursor = ctx.cursor if more or link is None else \
            Cursor(link, started, stored.first).dump()
        return FetchResult(items, cursor=cursor, more=more,
                           note=f"delta token reset: listed since {iso(since)}, "
                                f"{len(items)} new")

    async def _take(self, ctx: FetchContext, entries: list[dict]) -> tuple[list[Item], bool]:
        """The unseen messages among ``entries``, downloaded and parsed, oldest first;
        and whether ``ctx.limit`` left some."""
        by_id: dict[str, dict] = {}
        for e in entries:
            if "@removed" not in e and e.get("id") and not e.get("isDraft"):
                by_id.setdefault(item_id(e), e)
        if not by_id:
            return [], False
        unseen = await ctx.unseen(sorted(by_id))
        todo = sorted((by_id[i] for i in unseen if i in by_id),
                      key=lambda e: (str(e.get("receivedDateTime") or ""), str(e["id"])))
        more = ctx.limit is not None and len(todo) > ctx.limit
        todo = todo[:ctx.limit] if more and ctx.limit is not None else todo
        if not todo:
            return [], more
        raws = await self.client.mime([e["id"] for e in todo], self.options.batch)
        if ctx.progress:
            ctx.progress(len(raws), len(todo))
        # Parsing is CPU work: off the event loop, the whole lot in one thread hop.
        items = await asyncio.to_thread(
            lambda: [self._item(e, raws[e["id"]]) for e in todo if e["id"] in raws])
        return items, more

    def _item(self, entry: dict, raw: bytes) -> Item:
        iid, where = item_id(entry), str(entry["id"])
        stub = Message(source_id=where, size=len(raw), message_id=iid,
                       thread_id=str(entry.get("conversationId") or ""))
        return self._parsed(iid, stub, raw, where, thread_id=stub.thread_id)

    async def thread(self, message: Message, limit: int) -> Thread:
        from ..microsoft.thread import thread

        return await thread(self.client, self.account, message, limit)


def create(pipeline: PipelineConfig, settings: Settings) -> MicrosoftSource:
    """Build the source from its checked ``source:`` options (no I/O)."""
    o = expect(pipeline.source, MicrosoftSourceOptions)
    account = settings.microsoft_accounts[o.account]
    return MicrosoftSource(o, account, str(settings.resolve(account.token_file)),
                           pipeline.filters)
