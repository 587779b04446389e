"""SQLite backend of the store (aiosqlite, one connection per store object).

Why it is built the way it is:

* Every read-modify-write runs in ``BEGIN IMMEDIATE``. A deferred transaction that
  upgrades to a write gets SQLITE_BUSY at once in WAL mode, without consulting
  ``busy_timeout``; IMMEDIATE takes the write lock up front, where the timeout applies.
  A single statement runs without BEGIN: it takes its write lock up front too, and
  saves the two thread hops of BEGIN and COMMIT.
* Statements go through aiosqlite's public API, each one hop to its worker thread; an
  ``asyncio.Lock`` held for a whole transaction keeps every other task's statement out
  of it (they share the one connection).
* SQLITE_BUSY that survives ``busy_timeout`` (many processes) is retried with bounded
  backoff, so "database is locked" does not escape under contention.
* Fence tokens grow per draft (``fence = fence + 1`` on every claim and every expired
  lease). Fenced updates match on ``id`` and ``fence`` together, so a per-row counter
  is enough to make a stale worker's update match 0 rows, with no hot global row that
  every claim in every process would have to write.
"""

from __future__ import annotations

import asyncio
import random
import sqlite3
import time
from pathlib import Path
from typing import Any, Awaitable, Callable, Iterable, Sequence, TypeVar

import aiosqlite

from ..errors import StoreError, StoreUnavailable
from ..models import Draft, Item, Status, draft_key
from . import chain
from .base import AdmitResult, StoreMissing
from .rows import CURSOR_SQL, DRAFT_COLS, TOKENS_SQL, Db, Tokens, admit_record, draft_from_row
from .schema import LATEST, MIGRATIONS
from .sql import SqlStore
from .transitions import CLAIM, cas

T = TypeVar("T")

_CHUNK = 400  # ids per IN (...) list (twice in admit), below SQLite's old 999-variable limit


def _path_from_url(url: str) -> str:
    if not url.startswith("sqlite://"):
        raise StoreError(f"not a SQLite store URL: {url!r}; expected sqlite:////absolute/path/state.db or sqlite:///relative/path.db")
    rest = url[len("sqlite://"):]
    if not rest.startswith("/") or "?" in rest:
        raise StoreError(
            f"bad SQLite store URL {url!r}: expected sqlite:////absolute/path/state.db "
            "(sqlite:// then the path: four slashes for an absolute one; no host, no ?options)")
    path = rest[1:]
    if not path:
        raise StoreError(f"bad SQLite store URL {url!r}: the database path is empty; "
                         "expected sqlite:////absolute/path/state.db")
    if path == ":memory:":
        return path
    return str(Path(path).expanduser().absolute())


def _is_busy(exc: BaseException) -> bool:
    if not isinstance(exc, sqlite3.OperationalError):
        return False
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None:
        return code & 0xFF in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)
    text = str(exc)
    return "locked" in text or "busy" in text


#: Result codes that say the disk, not the statement, is the trouble: full, failing,
#: gone or made read-only. Raised as StoreUnavailable (see bot.engine.outage).
_UNAVAILABLE_CODES = (sqlite3.SQLITE_FULL, sqlite3.SQLITE_IOERR, sqlite3.SQLITE_CANTOPEN,
                      sqlite3.SQLITE_READONLY)


def _unavailable(exc: BaseException) -> bool:
    code = getattr(exc, "sqlite_errorcode", None)
    return code is not None and code & 0xFF in _UNAVAILABLE_CODES


def _chunks(seq: list, size: int = _CHUNK) -> Iterable[list]:
    for i in range(0, len(seq), size):
        yield seq[i:i + size]


# admit's inserts: each says which rows it wrote (a seen mark or a draft already there
# is left as it is), so admit needs no read first; the drafts' also say the audit
# chain's head, which admit's audit rows follow.
_SEEN_INSERT = ("INSERT INTO seen_items (pipeline, scope, item_id, seen_at) VALUES {} "
                "ON CONFLICT (pipeline, scope, item_id) DO NOTHING RETURNING item_id")
_DRAFT_INSERT = ("INSERT INTO drafts (key, pipeline, scope, item_id, recipe, status, payload, "
                 "error, created_at, updated_at) VALUES {} ON CONFLICT (key) DO NOTHING "
                 "RETURNING key, (SELECT seq FROM audit_head WHERE one = 1), "
                 "(SELECT hash FROM audit_head WHERE one = 1)")
_probe = sqlite3.connect(":memory:")  # this SQLite's limit (32766 since 3.32)
_MAX_VARS = _probe.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER)
_probe.close()


async def _inserted(db: Db, sql: str, rows: list[tuple]) -> dict[Any, Any]:
    """``sql`` (an INSERT ... VALUES {} ... RETURNING) over ``rows``, as few statements
    as the variable limit allows: each row it returned, by its first column."""
    found: dict[Any, Any] = {}
    if rows:
        one = "(" + ",".join("?" * len(rows[0])) + ")"
        for chunk in _chunks(rows, max(1, _MAX_VARS // len(rows[0]))):
            found.update((r[0], r) for r in await db.rows(
                sql.format(",".join([one] * len(chunk))), [v for row in chunk for v in row]))
    return found


async def _unseen(db: Db, pipeline: str, scope: str, ids: list[str]) -> set[str]:
    """Those of ``ids`` (no repeats) without a seen mark."""
    fresh = set(ids)
    for chunk in _chunks(ids):
        fresh -= {r[0] for r in await db.rows(
            "SELECT item_id FROM seen_items WHERE pipeline = ? AND scope = ? "
            f"AND item_id IN ({','.join('?' * len(chunk))})", (pipeline, scope, *chunk))}
    return fresh


class _Db:
    """The store's connection inside ``_run`` (see :class:`~bot.store.sql.Db`)."""

    def __init__(self, conn: aiosqlite.Connection):
        self.conn = conn

    async def rows(self, sql: str, args: Iterable[Any] = ()) -> list[Any]:
        return list(await self.conn.execute_fetchall(sql, tuple(args)))

    async def run(self, sql: str, args: Iterable[Any] = ()) -> int:
        cursor = await self.conn.execute(sql, tuple(args))
        return cursor.rowcount

    async def many(self, sql: str, rows: list[tuple]) -> int:
        # The cursor is not closed (that would be another trip to aiosqlite's thread,
        # as for ``run``): it holds no rows, and sqlite3 finalizes it when it is dropped.
        return (await self.conn.executemany(sql, rows)).rowcount if rows else 0


async def _in_transaction(db: _Db, fn: Callable[[_Db], Awaitable[T]]) -> T:
    try:
        await db.run("BEGIN IMMEDIATE")
        result = await fn(db)
        await db.run("COMMIT")
        return result
    except BaseException:
        # rollback() is a no-op when no transaction is open by the time it runs on the
        # worker thread (a BEGIN still queued when the caller was cancelled runs first,
        # or it failed);
        # shielded, so a second cancellation cannot leave the transaction open.
        await asyncio.shield(db.conn.rollback())
        raise


async def _run_migrations(db: Db, path: str) -> None:
    current = (await db.rows("PRAGMA user_version"))[0][0]
    if current > LATEST:
        raise StoreError(
            f"SQLite store {path} has schema version {current}, but this draftgate only "
            f"knows versions up to {LATEST}: upgrade draftgate, or point `store:` at "
            "another file")
    for version in range(current, LATEST):
        for statement in MIGRATIONS[version]:  # a callable: a step written in Python
            await (statement(db) if callable(statement) else db.run(statement))
    if current != LATEST:
        await db.run(f"PRAGMA user_version = {LATEST}")


class SQLiteStore(SqlStore):
    """The embedded store: ``SQLiteStore("sqlite:////var/lib/draftgate/state.db")``."""

    DRAFTS_BY = "drafts INDEXED BY {}"

    def __init__(self, url: str, *, busy_timeout_ms: int = 5000, retry_for: float = 60.0):
        self.url = url
        self.path = _path_from_url(url)
        self._busy_timeout_ms = int(busy_timeout_ms)
        self._retry_for = float(retry_for)  # total backoff budget after busy_timeout
        self._conn: aiosqlite.Connection | None = None
        self._lock = asyncio.Lock()
        #: How often SQLITE_BUSY outlasted busy_timeout and was retried (observability).
        self.busy_retries = 0

    async def _run(self, fn: Callable[[Db], Awaitable[T]], *, tx: bool = True) -> T:
        async with self._lock:
            conn = self._conn  # read under the lock: close() may have run meanwhile
            if conn is None:
                raise StoreError(f"SQLite store {self.path} is not open; call open() first")
            db = _Db(conn)
            deadline = time.monotonic() + self._retry_for
            delay = 0.005
            while True:
                try:
                    return await (_in_transaction(db, fn) if tx else fn(db))
                except sqlite3.Error as exc:
                    if _is_busy(exc) and time.monotonic() < deadline:
                        self.busy_retries += 1
                        await asyncio.sleep(delay * random.uniform(0.5, 1.5))
                        delay = min(delay * 2, 0.5)
                        continue
                    if _is_busy(exc):
                        raise StoreError(
                            f"SQLite store {self.path} stayed locked for more than "
                            f"{self._retry_for:g}s: another process keeps a write "
                            "transaction open (a hung process or a tool holding the file)"
                        ) from exc
                    kind = StoreUnavailable if _unavailable(exc) else StoreError
                    raise kind(f"SQLite store {self.path}: {exc}") from exc

    # -- lifecycle -----------------------------------------------------------------------

    async def open(self, *, create: bool = True) -> None:
        """Connect, set the connection pragmas, run pending numbered migrations."""
        if self._conn is not None:
            return
        if self.path != ":memory:":
            if not create and not Path(self.path).exists():
                raise StoreMissing(
                    f"no store at {self.path}: nothing has run with this configuration yet, "
                    "or `store:` names the wrong file; nothing was created")
            try:
                Path(self.path).parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise StoreError(
                    f"cannot create the directory of SQLite store {self.path}: {exc}; "
                    "check `store:` in draftgate.yaml and the directory permissions") from exc
            try:
                # Opened once here first: when aiosqlite's own open fails, its worker
                # thread stops without being waited for and reports to a closed event
                # loop later (a traceback at exit).
                await asyncio.to_thread(lambda: sqlite3.connect(self.path).close())
            except sqlite3.Error as exc:
                raise StoreError(f"cannot open SQLite store {self.path}: {exc}") from exc
        conn = aiosqlite.connect(self.path, isolation_level=None)
        try:
            await conn
        except sqlite3.Error as exc:
            raise StoreError(f"cannot open SQLite store {self.path}: {exc}") from exc
        conn.row_factory = sqlite3.Row
        await conn.create_function("draftgate_row_hash", 8, chain.sqlite_row_hash,
                                   deterministic=True)
        self._conn = conn
        try:
            await self._run(self._configure, tx=False)
            if (await self._query("PRAGMA user_version"))[0][0] != LATEST:
                await self._run(lambda db: _run_migrations(db, self.path))
            await self._execute(chain.HEAD_FOLLOWS_SQL)
        except BaseException:
            await self.close()
            raise

    async def _configure(self, db: Db) -> None:
        # busy_timeout first: switching a fresh file to WAL needs a lock that another
        # process opening it at the same moment may hold.
        await db.run(f"PRAGMA busy_timeout = {self._busy_timeout_ms}")
        mode = (await db.rows("PRAGMA journal_mode = WAL"))[0][0]
        if self.path != ":memory:" and str(mode).lower() != "wal":
            raise StoreError(
                f"SQLite store {self.path} could not switch to WAL mode (got {mode!r}); "
                "put the database on a local disk")
        await db.run("PRAGMA synchronous = NORMAL")

    async def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            # New calls now fail fast with "not open"; one already running finishes
            # first, and aiosqlite's worker thread is stopped (it would block exit).
            async with self._lock:
                await conn.close()

    # -- fetch side ----------------------------------------------------------------------

    async def unseen(self, pipeline: str, scope: str, item_ids: list[str]) -> set[str]:
        ids = list(dict.fromkeys(item_ids))
        return await self._run(lambda db: _unseen(db, pipeline, scope, ids), tx=False)

    async def admit(self, pipeline: str, scope: str, recipe: str, items: list[Item], *,
                    cursor: str | None = None, mark_seen: bool = True,
                    now: float | None = None) -> AdmitResult:
        t = self._now(now)
        unique: dict[str, Item] = {}
        for item in items:
            unique.setdefault(item.item_id, item)
        duplicates = len(items) - len(unique)
        keys = {item_id: draft_key(pipeline, scope, item_id, recipe) for item_id in unique}
        if not unique and cursor is None:
            return AdmitResult()

        async def tx(db: Db) -> AdmitResult:
            ids = list(unique)
            if mark_seen:
                # Marked and told apart in one statement: the ones not returned were
                # marked before. Also the items whose draft exists but whose mark the sweep
                # removed (a source that lists old mail again) are marked afresh, so that
                # a later recipe change does not draft them again.
                fresh = set(await _inserted(db, _SEEN_INSERT,
                                            [(pipeline, scope, i, t) for i in ids]))
            else:
                fresh = await _unseen(db, pipeline, scope, ids)
            rows = [(keys[i], pipeline, scope, i, recipe,
                     Status.SKIPPED if unique[i].skip_reason else Status.QUEUED, unique[i].message.to_json(),
                     unique[i].skip_reason, t, t) for i in ids if i in fresh]
            made = await _inserted(db, _DRAFT_INSERT, rows)  # no draft by that key yet
            rows = [r for r in rows if r[0] in made]
            result = AdmitResult(already_seen=len(ids) - len(rows) + duplicates)
            for r in rows:
                (result.skipped if r[7] else result.new).append(r[0])
            if rows:  # chained here, after the head the inserts returned (NULL: no head)
                first = next(iter(made.values()))
                head = chain.head_of([first[1:]] if first[1] is not None else [])
                links, _ = chain.link(head, [admit_record(t, r[0], r[7]) for r in rows])
                await db.many(chain.INSERT_SQL, links)  # audit_head_follows moves the head
            if cursor is not None:
                await db.run(CURSOR_SQL, (pipeline, scope, cursor, t))
            return result

        return await self._run(tx)

    async def _append(self, db: Db, records: Sequence[chain.Record],
                      tokens: Tokens | None = None) -> None:
        if records and await db.many(chain.SQLITE_APPEND_SQL, list(records)) != len(records):
            raise StoreError(chain.NO_HEAD)
        if tokens is not None:
            await db.run(TOKENS_SQL, tokens)

    async def mark_seen(self, pipeline: str, scope: str, item_ids: list[str],
                        now: float | None = None) -> None:
        t = self._now(now)
        rows = [(pipeline, scope, i, t) for i in dict.fromkeys(item_ids)]
        await self._run(lambda db: db.many(
            "INSERT INTO seen_items (pipeline, scope, item_id, seen_at) VALUES (?, ?, ?, ?) "
            "ON CONFLICT (pipeline, scope, item_id) DO NOTHING", rows))

    async def claim(self, pipeline: str, lease_seconds: float, *, limit: int = 1,
                    now: float | None = None) -> list[Draft]:
        t = self._now(now)
        if limit <= 0:
            return []
        rows = await self._query(*cas(
            CLAIM, "lease_until = ?, fence = fence + 1, updated_at = ?",
            (t + lease_seconds, t), "id IN (SELECT id FROM drafts WHERE pipeline = ? "
            "AND status = ? ORDER BY id LIMIT ?)", (pipeline, *CLAIM.src, limit),
            returning=DRAFT_COLS))
        return sorted((draft_from_row(r) for r in rows), key=lambda d: d.id)

    async def verify_audit(self) -> chain.Report:
        async def read(db: Db) -> chain.Report:
            assert isinstance(db, _Db)
            await db.run("BEGIN")  # one snapshot (WAL): appends meanwhile are not seen
            try:
                loose = (await db.rows(chain.LOOSE_SQL))[0][0]
                odd = await db.rows(chain.ODD_SEQ_SQL)
                found = await db.rows(chain.HEAD_SQL)
                walker = chain.Walker()  # rows streamed, never all in memory
                async with db.conn.execute(chain.WALK_SQL) as cursor:
                    async for row in cursor:
                        if not walker.feed(row):
                            break
                return chain.conclude(walker, tuple(found[0]) if found else None, loose,
                                      tuple(odd[0]) if odd else None)
            finally:
                await db.run("COMMIT")

        return await self._run(read, tx=False)

    async def check(self) -> list[str]:
        try:
            rows = await self._query("PRAGMA quick_check")
        except StoreError as exc:
            return [str(exc)]
        found = [str(r[0]) for r in rows]
        return [] if found == ["ok"] else [f"SQLite store {self.path}: {f}" for f in found[:5]]
