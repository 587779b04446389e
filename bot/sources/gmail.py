"""Source ``gmail``: new mail of one account matching a search query.

::

    source: {type: gmail, account: support, query: "in:inbox -category:promotions",
             label: Support, backfill: 0, max_body: 200kB}

Incremental sync: every tick asks ``history.list`` for what was added since the stored
historyId (one call, 2 quota units, when nothing is new). A full ``messages.list`` with
the query runs only on the first run (to record the cursor; old mail is drafted only
if ``backfill: N`` asks) and when Gmail answers 404 because the historyId is too old.
The new cursor is always taken BEFORE listing, so mail arriving meanwhile is seen by
the next ``history.list``; the store's seen marks (``ctx.unseen``) make sure nothing
is admitted twice across the fallback.

The stored cursor is ``{"historyId": ..., "synced": T, "first": T0}``: besides the
historyId, when it was taken (``synced``, this host's clock, taken before the call)
and when the first run took its own (``first``). The fallback lists only mail newer
than ``synced`` less a margin (:data:`RESYNC_MARGIN`), never older than
``resync_window`` and never older than the first run, so mail that was in the box
at install time (deliberately not drafted) is not drafted by a later fallback. A
cursor stored as a bare historyId (before this format) still works; its fallback is
bounded by ``resync_window`` alone until a tick has recorded ``synced``.

Mail can also enter the pipeline after it arrived: marked "not spam" into the inbox,
or given the pipeline's label later by a filter or a colleague. History records that
as ``labelsAdded``, so history is read for ``labelAdded`` too, and a message given the
pipeline's label (or a label the query asks for, INBOX for ``in:inbox``) is a
candidate like a new one; the seen marks make a second label change harmless. (Mail
that was in the box at install time and is moved in later is drafted then: a person
moved it.)

History reports every added message, so candidates are re-checked: sent mail, drafts,
spam and trash are dropped (not work), mail from one of our own addresses is kept as an
item that ``filters.skip_own`` (on by default) records as skipped with the reason, and
the ids are intersected with a
``messages.list`` of the query bounded to the candidates' dates (one extra call, only
on ticks that have candidates). Bodies are fetched as ``format=raw`` through Gmail's
batch endpoint (up to 50 messages per request, see :meth:`GmailClient.get_many`),
those requests with bounded concurrency in the account's thread pool, and parsed by
:func:`bot.mail.mime.parse_email`;
an unparseable message becomes a skipped item with the reason.

At most ``ctx.limit`` (the pipeline's ``max_per_tick``) unseen ids are downloaded per
tick, oldest first. The ids found but not taken (new in history, listed for a backfill
or a resync) are kept in the cursor as ``"backlog": [[id, kind], ...]`` (see
:data:`.gmail_cursor._KINDS`); the next tick takes them before anything history adds after them.
So the historyId always moves on, nothing found is skipped, and memory and the
cursor hold ids, never bodies, for what waits.

Gmail's search index can lag behind history: a message that just arrived may be
missing from that ``messages.list`` although it matches. The cursor moves past it, so
a candidate the search missed is not simply dropped: while it is young (internalDate
within :data:`RECHECK_WINDOW`) its id and internalDate are kept in the cursor
(``"recheck": [[id, ms], ...]``, at most :data:`RECHECK_MAX`) and each later tick
runs the search again for them (the same one call as for new candidates; none when
the list is empty, so an idle tick stays one ``history.list``). One the search now
returns is downloaded and admitted; one still missing once it is older than the
window is dropped with an INFO line naming it (it does not match the query); one
deleted meanwhile (404) is dropped. Every tick whose candidates do not all match
logs how many did not, at INFO.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import os
import threading
import time
from collections.abc import Sequence

from ..config.load import PipelineConfig, Settings
from ..config.options import FilterOptions, GmailSourceOptions, expect
from ..context.thread import Thread
from ..errors import SourceError
from ..gmail.batch import MAX_PARTS
from ..gmail.client import GmailClient
from ..gmail.errors import Cancelled, NotFound, RateLimited
from ..gmail.files import attachment_files
from ..mail.mime import DEFAULT_MAX_BODY, UnparseableMessage, parse_email
from ..models import FetchResult, Item, Message
from ..stages import FetchContext
from . import filters as _filters
from . import gmail_thread
from .gmail_cursor import Cursor, join_queues
from .gmail_labels import NEVER as _NEVER
from .gmail_labels import bounded, by_labels, entering_labels, history_ids, label_terms

log = logging.getLogger("draftgate.sources.gmail")

_PAGE = 500  # Gmail's maximum page size for list and history
# How far before the last successful sync the history-expired fallback still lists:
# clock differences between this host and Gmail, and mail stamped before it arrived.
RESYNC_MARGIN = 600.0
# How long after it arrived (internalDate) a candidate the query's search did not
# return is searched for again. Gmail's index usually catches up within seconds and
# rarely takes minutes; 15 minutes leaves a wide margin while keeping the cost (one
# messages.list on the ticks that have something to re-check) and the cursor small.
# Whatever the window and the schedule, a kept id is searched for on at least one
# later tick before it is dropped.
RECHECK_WINDOW = 900.0
# The most ids the cursor keeps to re-check (the oldest go first, logged): about 20 kB
# of cursor, one page of search results.
RECHECK_MAX = 500


class GmailSource:
    """See the module docstring."""

    def __init__(self, client: GmailClient, options: GmailSourceOptions,
                 filters: FilterOptions = FilterOptions()):
        self.client = client
        self.account = options.account
        self.scope = f"gmail:{self.account}"
        self.query = options.query.strip() or GmailSourceOptions.query
        self.label = options.label
        self.backfill = max(0, options.backfill)
        # source.max_body, else filters.max_body (a message over it is skipped anyway)
        self.max_body = (filters.max_body if options.max_body is None else options.max_body) \
            or DEFAULT_MAX_BODY
        self.resync_window = options.resync_window
        self.concurrency = max(1, options.concurrency)
        self.filters = filters
        self._own = {a.lower() for a in filters.own_addresses if a}
        if client.address:
            self._own.add(client.address.lower())
        self.page_size = _PAGE
        self.recheck_window = RECHECK_WINDOW
        self._label_id: str | None = None
        self._not_before = 0.0  # honour a long Retry-After across ticks

    # -- helpers --------------------------------------------------------------------------
    async def _read(self, make, what: str) -> dict:
        try:
            return await self.client.aread(make, what)
        except RateLimited as exc:
            if exc.retry_after:
                self._not_before = time.time() + exc.retry_after
            raise

    async def _label(self) -> str | None:
        """The label id for the configured label name (system labels are their own id)."""
        if not self.label:
            return None
        if self._label_id is None:
            resp = await self._read(lambda s: s.users().labels().list(userId="me"), "labels.list")
            labels = resp.get("labels", [])
            for lbl in labels:
                if self.label in (lbl.get("id"), lbl.get("name")) or \
                        str(lbl.get("name", "")).lower() == self.label.lower():
                    self._label_id = lbl["id"]
                    break
            else:
                raise SourceError(f"Gmail account {self.account!r} has no label {self.label!r}; "
                                  f"create it in Gmail or fix source.label")
        return self._label_id

    def _q(self, extra: str = "") -> str:
        q = f"({self.query})"
        if self.label and self._label_id is None:
            q += f' label:"{self.label}"'
        return f"{q} {extra}".strip()

    async def _list_ids(self, q: str, label_id: str | None, limit: int | None = None) -> list[str]:
        """Ids matching ``q`` (newest first), following pages up to ``limit``."""
        ids: list[str] = []
        token = None
        while True:
            def make(s, token=token):
                return s.users().messages().list(
                    userId="me", q=q, labelIds=[label_id] if label_id else None,
                    maxResults=min(self.page_size, limit - len(ids)) if limit else self.page_size,
                    pageToken=token)
            resp = await self._read(make, "messages.list")
            ids.extend(m["id"] for m in resp.get("messages", []) or [])
            token = resp.get("nextPageToken")
            if not token or (limit and len(ids) >= limit):
                return ids[:limit] if limit else ids

    async def _profile(self) -> dict:
        profile = await self._read(lambda s: s.users().getProfile(userId="me"), "getProfile")
        if profile.get("emailAddress"):
            self._own.add(str(profile["emailAddress"]).lower())
        return profile

    def _fetch_chunk(self, ids: list[str], cancel: threading.Event | None = None
                     ) -> list[tuple[dict, Item | None]]:
        """In a pool thread: download up to one batch of messages (raw, one request)
        and parse them, so neither the I/O nor parsing a 5 MB message runs on the
        event loop. A message deleted meanwhile (404) is left out."""
        got = self.client.get_many("messages", ids, cancel, format="raw")
        out = []
        for gid in ids:
            resource = got.get(gid)
            if resource is None:
                log.info("gmail %s: message %s vanished before it was fetched", self.account, gid)
                continue
            item = self._item(gid, resource)  # the id asked for, never one from the answer
            resource.pop("raw", None)  # only ids, labels and dates are needed from here on
            resource["id"] = gid  # (get_many matched it by id; read by id below)
            out.append((resource, item))
        return out

    def _item(self, gid: str, resource: dict) -> Item | None:
        labels = list(resource.get("labelIds") or [])
        if set(labels) & _NEVER:
            return None  # our own sent mail and drafts, spam, trash: not work
        try:
            raw = base64.urlsafe_b64decode(gmail_thread.padded(resource.get("raw") or ""))
        except (ValueError, TypeError):
            raw = b""
        stub = Message(source_id=gid, thread_id=str(resource.get("threadId") or ""),
                       labels=labels, size=len(raw))
        if not raw:
            return Item(gid, stub, skip_reason="Gmail returned no raw message content")
        try:
            msg = parse_email(raw, max_body=self.max_body, source_id=gid)
        except UnparseableMessage as exc:
            return Item(gid, stub, skip_reason=f"unparseable message: {exc}")
        except Exception as exc:  # never let one message stop the tick
            log.exception("gmail %s: parse failed for %s", self.account, gid)
            return Item(gid, stub, skip_reason=f"unparseable message ({type(exc).__name__})")
        msg.thread_id = stub.thread_id
        msg.labels = labels
        # Our own address (the profile's may be known only here): skipped with the
        # reason under filters.skip_own, or drafted when skip_own is off; never dropped.
        return Item(gid, msg, skip_reason=_filters.own_reason(
            msg, self.filters, own_addresses=sorted(self._own)))

    async def _fetch_items(self, ids: list[str], ctx: FetchContext, progress: bool = False
                           ) -> tuple[list[Item], list[dict]]:
        # The account's pool bounds the concurrency; the semaphore keeps this source
        # within its own setting when the pool is shared with a sender.
        sem = asyncio.Semaphore(self.concurrency)
        done = 0
        total = len(ids)
        # The first failure fails the tick. Then no other download starts or retries
        # (``stop``), and the tick ends only once the ones in flight have answered:
        # nothing keeps calling Gmail for a tick that is over.
        stop = threading.Event()
        first: list[Exception] = []

        async def one(chunk: list[str]):
            nonlocal done
            async with sem:
                if stop.is_set():
                    return []
                try:
                    res = await self.client.run(self._fetch_chunk, chunk, stop)
                except BaseException as exc:
                    if isinstance(exc, Exception) and not isinstance(exc, Cancelled) and not first:
                        first.append(exc)
                    stop.set()
                    if isinstance(exc, RateLimited) and exc.retry_after:
                        self._not_before = time.time() + exc.retry_after
                    raise
            done += len(chunk)
            if progress and ctx.progress:
                ctx.progress(done, total)
            return res

        chunks = [ids[n:n + MAX_PARTS] for n in range(0, len(ids), MAX_PARTS)]
        try:
            gathered = await asyncio.gather(*(one(c) for c in chunks), return_exceptions=True)
        except BaseException:  # the tick itself was cancelled
            stop.set()
            raise
        errors: Sequence[BaseException] = first or [
            r for r in gathered if isinstance(r, BaseException)]
        if errors:
            raise errors[0]
        # (Past the raise none is an exception; the isinstance tells the type checker.)
        results = [r for chunk in gathered if not isinstance(chunk, BaseException) for r in chunk]
        items = [item for _, item in results if item is not None]
        return items, [resource for resource, _ in results]

    async def _search(self, oldest_ms: int, label_id: str | None) -> set[str]:
        """Ids Gmail's search returns for the query among mail since ``oldest_ms``
        (internalDate): one ``messages.list``, more only for a page beyond 500."""
        return set(await self._list_ids(self._q(f"after:{max(0, oldest_ms // 1000 - 1)}"),
                                        label_id))

    # -- fetch -------------------------------------------------------------------------------
    async def fetch(self, ctx: FetchContext) -> FetchResult:
        wait = self._not_before - time.time()
        if wait > 0:
            raise SourceError(f"Gmail account {self.account!r} is rate-limited; backing off "
                              f"for {wait:.0f}s more (Retry-After)")
        start_calls = self.client.calls
        if not ctx.cursor:
            result = await self._first_run(ctx)
        else:
            stored = Cursor.parse(ctx.cursor)
            try:
                if not stored.history_id:
                    raise NotFound("no historyId in the stored cursor", 404)
                result = await self._incremental(ctx, stored)
            except NotFound:
                result = await self._resync(ctx, stored)
        result.api_calls = self.client.calls - start_calls
        return result

    async def _incremental(self, ctx: FetchContext, stored: Cursor) -> FetchResult:
        label_id = await self._label()
        candidates: dict[str, None] = {}  # insertion-ordered set: O(1) per history entry
        started = time.time()  # every record after the cursor below is newer than this
        token, history_id = None, stored.history_id
        entering = entering_labels(self.query, label_id)
        while True:
            def make(s, token=token):
                return s.users().history().list(
                    userId="me", startHistoryId=stored.history_id,
                    historyTypes=["messageAdded", "labelAdded"] if entering else ["messageAdded"],
                    labelId=label_id, maxResults=self.page_size, pageToken=token)
            resp = await self._read(make, "history.list")
            for gid in history_ids(resp, entering):
                candidates.setdefault(gid)
            if token is None:
                # The FIRST page's historyId: it is the mailbox's current record when
                # that page is served, and Gmail does not promise that records added
                # while paging appear on later pages, whose historyId is newer. From
                # here, such a record is listed again next tick (seen marks dedupe).
                history_id = str(resp.get("historyId") or history_id)
            token = resp.get("nextPageToken")
            if not token:
                break

        cursor = Cursor(history_id, synced=started, first=stored.first)
        if not candidates and not stored.recheck and not stored.backlog:
            return FetchResult([], cursor=cursor.dump())  # idle: the one history.list
        queue = join_queues(stored.backlog, [(gid, "h") for gid in candidates])
        items, cursor.recheck, cursor.backlog = await self._take(
            ctx, queue, stored.recheck, label_id, stored.first)
        return FetchResult(items, cursor=cursor.dump(), more=bool(cursor.backlog))

    async def _take(self, ctx: FetchContext, queue: list[tuple[str, str]],
                    recheck: list[tuple[str, int]], label_id: str | None,
                    first: float | None, progress: bool = False
                    ) -> tuple[list[Item], list[tuple[str, int]], list[tuple[str, str]]]:
        """Download and match the first ``ctx.limit`` unseen ids of ``queue`` (oldest
        first; see _KINDS). Returns the items (in queue order), what to keep
        re-checking, and the unseen rest of the queue: the backlog the cursor keeps,
        so the next tick goes on exactly there (the historyId has moved past them)."""
        unseen = await ctx.unseen([gid for gid, _ in queue]) if queue else set()
        todo = [(gid, kind) for gid, kind in queue if gid in unseen]
        limit = ctx.limit if ctx.limit is not None else len(todo)
        taken, rest = todo[:limit], todo[limit:]
        if progress and ctx.progress:
            ctx.progress(0, len(taken))
        listed = [gid for gid, kind in taken if kind != "h"]
        items: list[Item] = []
        if listed:
            got, resources = await self._fetch_items(listed, ctx, progress=progress)
            kinds, early = dict(taken), set()
            if first is not None:  # in the box at install time: never drafted
                early = {str(r.get("id")) for r in resources if kinds.get(str(r.get("id")))
                         == "r" and int(r.get("internalDate") or 0) < first * 1000}
            items += [it for it in got if it.item_id not in early]
        fresh = [gid for gid, kind in taken if kind == "h"]
        if fresh or recheck:
            matched, recheck = await self._matching(ctx, fresh, recheck, label_id)
            items += matched
        order = {gid: n for n, (gid, _) in enumerate(taken)}
        items.sort(key=lambda it: order.get(it.item_id, len(order)))  # late re-checks last
        return items, recheck, rest

    async def _matching(self, ctx: FetchContext, candidates: list[str],
                        recheck: list[tuple[str, int]], label_id: str | None
                        ) -> tuple[list[Item], list[tuple[str, int]]]:
        """The items among ``candidates`` (new in history) and ``recheck`` (kept by
        earlier ticks) that match the query, and what to keep searching for: by their
        labels when the query is only label terms (``in:inbox -category:promotions``),
        else with one ``messages.list`` bounded to their dates."""
        listed = set(candidates)
        # Kept ids admitted meanwhile (a resync) need nothing more; one that history
        # lists again is a candidate like the others.
        pending = {i: d for i, d in recheck if i not in listed}
        new = await ctx.unseen(candidates + list(pending))
        ids = [i for i in candidates if i in new]
        pending = {i: d for i, d in pending.items() if i in new}
        terms = label_terms(self.query)
        if terms is not None:
            ids += list(pending)  # kept under an earlier query: labels decide now
            pending = {}
        if not ids and not pending:
            return [], []
        items, resources = await self._fetch_items(ids, ctx) if ids else ([], [])
        if terms is not None:
            return by_labels(items, resources, terms, self.account, self.query), []
        if not items and not pending:
            return [], []  # nothing that is work (sent, drafts, spam): no search
        # An arrival "in the future" (imported mail dated by its header, a clock ahead)
        # counts as now, so the recheck window still ends.
        now_ms = int(time.time() * 1000)
        dates = {str(r.get("id")): min(int(r.get("internalDate") or 0), now_ms) for r in resources}
        found = await self._search(
            min([dates[it.item_id] for it in items] + list(pending.values())), label_id)
        cutoff = (time.time() - self.recheck_window) * 1000  # after the search answered
        missed = [it.item_id for it in items if it.item_id not in found]
        keep = [(gid, dates[gid]) for gid in missed if dates[gid] >= cutoff]
        if missed:
            log.info("gmail %s: %d of %d new message(s) not returned by the query %r: "
                     "%d kept to search for again until %s after arrival (Gmail's search "
                     "can lag behind), %d older dropped as not matching: %s",
                     self.account, len(missed), len(items), self.query, len(keep),
                     _minutes(self.recheck_window), len(missed) - len(keep),
                     ", ".join(missed))
        items = [it for it in items if it.item_id in found]
        late = [gid for gid in pending if gid in found]
        if late:  # the index has caught up; one deleted meanwhile (404) is logged and gone
            log.info("gmail %s: %d message(s) the search had missed now match: %s",
                     self.account, len(late), ", ".join(late))
            items += (await self._fetch_items(late, ctx))[0]
        expired = [gid for gid, d in pending.items() if gid not in found and d < cutoff]
        if expired:
            log.info("gmail %s: dropped %s: still not returned by the query %r %s after "
                     "arrival, so not a match", self.account, ", ".join(expired), self.query,
                     _minutes(self.recheck_window))
        keep += [(gid, d) for gid, d in pending.items() if gid not in found and d >= cutoff]
        return items, bounded(keep, self.account, self.query, RECHECK_MAX)

    async def _first_run(self, ctx: FetchContext) -> FetchResult:
        label_id = await self._label()
        started = time.time()
        history_id = str((await self._profile())["historyId"])  # before listing: nothing missed
        cursor = Cursor(history_id, synced=started, first=started).dump()
        if not self.backfill:
            return FetchResult([], cursor=cursor,
                               note="first run: cursor recorded, old mail not drafted "
                                    "(set backfill: N to draft the newest N)")
        ids = await self._list_ids(self._q("-in:sent -in:drafts"), label_id, limit=self.backfill)
        # Listed newest first; drafted oldest first, max_per_tick per tick.
        items, _, rest = await self._take(ctx, [(gid, "b") for gid in reversed(ids)], [],
                                          label_id, None, progress=True)
        cursor = Cursor(history_id, synced=started, first=started, backlog=rest).dump()
        later = f", {len(rest)} more on the next ticks" if rest else ""
        return FetchResult(items, cursor=cursor, more=bool(rest),
                           note=f"first run: cursor recorded, {len(items)} backfilled{later}")

    async def _resync(self, ctx: FetchContext, stored: Cursor) -> FetchResult:
        """history.list said 404: the stored historyId is too old. List the query back
        to the last successful sync (less a margin; at most ``resync_window``, never
        before the first run) and admit whatever is not seen yet."""
        log.warning("gmail %s: historyId %s expired; resyncing with messages.list",
                    self.account, stored.history_id or "(none)")
        label_id = await self._label()
        started = time.time()
        history_id = str((await self._profile())["historyId"])  # before listing: nothing missed
        since = min(ctx.scheduled_for or started, started) - self.resync_window
        if stored.synced is not None:
            since = max(since, stored.synced - RESYNC_MARGIN)
        if stored.first is not None:
            since = max(since, stored.first)
        # after: counts whole seconds; the first run's bound is applied exactly below.
        after = max(0, int(since) - 1)
        listed = await self._list_ids(self._q(f"after:{after} -in:sent -in:drafts"), label_id)
        # Ids kept to search for again and not listed now go on being searched for by
        # the ticks after this one (the listing here may lag behind too).
        returned = set(listed)
        keep = [(gid, d) for gid, d in stored.recheck if gid not in returned]
        items, again, rest = await self._take(
            ctx, join_queues(stored.backlog, [(gid, "r") for gid in reversed(listed)]), [],
            label_id, stored.first)
        keep += [(gid, d) for gid, d in again if gid not in {g for g, _ in keep}]
        cursor = Cursor(history_id, synced=started, first=stored.first, recheck=keep,
                         backlog=rest).dump()
        when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(since))
        later = f", {len(rest)} more on the next ticks" if rest else ""
        return FetchResult(items, cursor=cursor, more=bool(rest),
                           note=f"history expired: resynced by query since {when}, "
                                f"{len(items)} new{later}")

    async def attachment_files(self, message: Message) -> list[tuple[str, bytes]]:
        """The attachments of a message this source admitted (📎 Files)."""
        return await attachment_files(self.client, message.source_id)

    async def thread(self, message: Message, limit: int) -> Thread:
        """The earlier messages of ``message``'s thread its sender took part in."""
        return await gmail_thread.read(self.client, self._own, message, limit)

    async def close(self) -> None:
        await self.client.aclose()


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:g} min" if seconds >= 60 else f"{seconds:g}s"


def create(pipeline: PipelineConfig, settings: Settings) -> GmailSource:
    """Build the source from its checked ``source:`` options (no I/O)."""
    o = expect(pipeline.source, GmailSourceOptions)
    client = GmailClient(o.account, settings.gmail_accounts[o.account], base_dir=settings.base_dir,
                         workers=max(1, o.concurrency), config_file=os.path.abspath(settings.file))
    return GmailSource(client, o, pipeline.filters)
