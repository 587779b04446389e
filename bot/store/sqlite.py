"""SQLite backend of the store (aiosqlite, one connection per store object).

Why it is built the way it is:

* Every read-modify-write runs in ``BEGIN IMMEDIATE``. A deferred transaction that
  upgrades to a write gets SQLITE_BUSY at once in WAL mode, without consulting
  ``busy_timeout``; IMMEDIATE takes the write lock up front, where the timeout applies.
* A whole transaction runs as ONE call on aiosqlite's worker thread. Awaiting each
  statement separately costs a thread hop per statement (about 150 us measured), and
  no other task's statement can ever land inside our transaction.
* An ``asyncio.Lock`` serialises transactions of concurrent tasks on the connection.
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
from contextlib import closing
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence, TypeVar

import aiosqlite

from ..errors import StoreError
from ..models import QUEUED, SKIPPED, Draft, Item, draft_key
from . import chain
from .base import (
    ABANDONED_SEND,
    HEARTBEAT_PREFIX,
    AdmitResult,
    ReplayResult,
    StoreMissing,
    SweepResult,
    replay_refusal,
    replay_without_draft,
)
from .chain import Record
from .schema import LATEST, MIGRATIONS
from .sql import (
    BEFORE_SQL,
    CURSOR_SQL,
    DRAFT_COLS,
    Change,
    SqlStore,
    admit_record,
    audit_row,
    draft_from_row,
)
from .transitions import CLAIM, EXPIRE, LEASE_FAIL, LEASE_RETRY, RECOVER_SEND, REPLAY, cas

T = TypeVar("T")

_DAY = 86400.0
_CHUNK = 500  # ids per IN (...) list, far below SQLite's variable limit


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


def _now(now: float | None) -> float:
    return time.time() if now is None else float(now)


def _is_busy(exc: BaseException) -> bool:
    if not isinstance(exc, sqlite3.OperationalError):
        return False
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None:
        return code & 0xFF in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)
    text = str(exc)
    return "locked" in text or "busy" in text



def _chunks(seq: list, size: int = _CHUNK) -> Iterable[list]:
    for i in range(0, len(seq), size):
        yield seq[i:i + size]


# -- statement helpers (run on the connection thread; cursors closed at once) ----------

def _rows(db: sqlite3.Connection, sql: str, params: Iterable[Any] = ()) -> list[sqlite3.Row]:
    with closing(db.execute(sql, tuple(params))) as cur:
        return cur.fetchall()


def _exec(db: sqlite3.Connection, sql: str, params: Iterable[Any] = ()) -> int:
    with closing(db.execute(sql, tuple(params))) as cur:
        return cur.rowcount


def _many(db: sqlite3.Connection, sql: str, rows: list[tuple]) -> None:
    if rows:
        with closing(db.executemany(sql, rows)):
            pass


def _drafts(db: sqlite3.Connection, where: str, params: Iterable[Any] = (),
            tail: str = "ORDER BY id") -> list[Draft]:
    return [draft_from_row(r)
            for r in _rows(db, f"SELECT {DRAFT_COLS} FROM drafts WHERE {where} {tail}", params)]


def _apply(db: sqlite3.Connection, change: Change) -> Draft | None:
    """Run ``change`` (see SqlStore) inside the caller's transaction."""
    old = _rows(db, BEFORE_SQL, (change.before,)) if change.before is not None else None
    for step in change.steps:
        rows = _rows(db, *step.sql(DRAFT_COLS))
        if rows:
            break
    else:
        return None
    draft = draft_from_row(rows[0])
    _script(db, *change.followups(draft, old[0] if old else None, lambda t: t))
    return draft


def _append(db: sqlite3.Connection, records: Sequence[Record]) -> None:
    """Append ``records`` to the audit chain, inside the caller's (IMMEDIATE, so
    write-locked) transaction: nothing else can append meanwhile."""
    if records:
        rows, head = chain.link(chain.head_of(_rows(db, chain.HEAD_SQL)), records)
        _many(db, chain.INSERT_SQL, rows)
        _exec(db, chain.SET_HEAD_SQL, head)


def _audit(db: sqlite3.Connection, now: float, actor: str, action: str,
           key: str | None, text: str | None, detail: str | None) -> None:
    _append(db, [audit_row(now, actor, action, key, text, detail)])


def _script(db: sqlite3.Connection, statements: list[tuple[str, tuple]],
            records: Sequence[Record] = ()) -> None:
    for sql, args in statements:
        _exec(db, sql, args)
    _append(db, records)


def _in_transaction(db: sqlite3.Connection, fn: Callable[..., T], args: tuple) -> T:
    _exec(db, "BEGIN IMMEDIATE")
    try:
        result = fn(db, *args)
        _exec(db, "COMMIT")
        return result
    except BaseException:
        if db.in_transaction:
            _exec(db, "ROLLBACK")
        raise


def _outside_transaction(db: sqlite3.Connection, fn: Callable[..., T], args: tuple) -> T:
    return fn(db, *args)


def _run_migrations(db: sqlite3.Connection, path: str) -> int:
    current = _rows(db, "PRAGMA user_version")[0][0]
    if current > LATEST:
        raise StoreError(
            f"SQLite store {path} has schema version {current}, but this draftgate only "
            f"knows versions up to {LATEST}: upgrade draftgate, or point `store:` at "
            "another file")
    for version in range(current, LATEST):
        for statement in MIGRATIONS[version]:
            if callable(statement):
                statement(db)
            else:
                _exec(db, statement)
    if current != LATEST:
        _exec(db, f"PRAGMA user_version = {LATEST}")
    return current


class SQLiteStore(SqlStore):
    """The embedded store: ``SQLiteStore("sqlite:////var/lib/draftgate/state.db")``."""

    def __init__(self, url: str, *, busy_timeout_ms: int = 5000, retry_for: float = 60.0):
        self.url = url
        self.path = _path_from_url(url)
        self._busy_timeout_ms = int(busy_timeout_ms)
        self._retry_for = float(retry_for)  # total backoff budget after busy_timeout
        self._conn: aiosqlite.Connection | None = None
        self._lock = asyncio.Lock()
        #: How often SQLITE_BUSY outlasted busy_timeout and was retried (observability).
        self.busy_retries = 0

    # -- plumbing ------------------------------------------------------------------------

    async def _call(self, runner: Callable, fn: Callable[..., T], *args: Any) -> T:
        async with self._lock:
            conn = self._conn  # read under the lock: close() may have run meanwhile
            if conn is None:
                raise StoreError(f"SQLite store {self.path} is not open; call open() first")
            deadline = time.monotonic() + self._retry_for
            delay = 0.005
            while True:
                # aiosqlite has no public "run this on the connection thread"; _execute
                # is that primitive (aiosqlite is pinned in requirements.lock).
                raw = conn._conn
                try:
                    return await conn._execute(runner, raw, fn, args)
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
                    raise StoreError(f"SQLite store {self.path}: {exc}") from exc

    async def _write(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(db, *args)`` inside BEGIN IMMEDIATE ... COMMIT, in one thread hop."""
        return await self._call(_in_transaction, fn, *args)

    async def _read(self, fn: Callable[..., T], *args: Any) -> T:
        return await self._call(_outside_transaction, fn, *args)

    async def _change(self, change: Change) -> Draft | None:
        return await self._write(_apply, change)

    async def _query(self, sql: str, args: tuple = (), *, write: bool = False) -> list[Any]:
        return await (self._write if write else self._read)(_rows, sql, args)

    async def _execute(self, sql: str, args: tuple = ()) -> int:
        return await self._write(_exec, sql, args)

    async def _script(self, statements: list[tuple[str, tuple]],
                      records: Sequence[Record] = ()) -> None:
        await self._write(_script, statements, records)

    async def _select_drafts(self, where: str, args: tuple, tail: str = "ORDER BY id"
                             ) -> list[Draft]:
        return await self._read(_drafts, where, args, tail)

    # -- lifecycle -----------------------------------------------------------------------

    async def open(self, *, create: bool = True) -> None:
        """Connect, set the connection pragmas, run pending numbered migrations."""
        if self._conn is not None:
            return
        if self.path != ":memory:" and not create and not Path(self.path).exists():
            raise StoreMissing(
                f"no store at {self.path}: nothing has run with this configuration yet, or "
                "`store:` names the wrong file; nothing was created")
        if self.path != ":memory:":
            try:
                Path(self.path).parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise StoreError(
                    f"cannot create the directory of SQLite store {self.path}: {exc}; "
                    "check `store:` in draftgate.yaml and the directory permissions") from exc
        conn = aiosqlite.connect(self.path, isolation_level=None)
        try:
            await conn
        except sqlite3.Error as exc:
            # aiosqlite queues its worker thread's stop without waiting for it; left
            # alone, the thread reports to a closed event loop later (a traceback at
            # exit). Wait for it here, while the loop runs.
            await asyncio.to_thread(conn._thread.join, 5)
            raise StoreError(f"cannot open SQLite store {self.path}: {exc}") from exc
        if not callable(getattr(conn, "_execute", None)):
            await conn.close()
            raise StoreError("this aiosqlite version lacks Connection._execute; install the "
                             "version pinned in requirements.lock")
        conn.row_factory = sqlite3.Row
        self._conn = conn
        try:
            await self._read(self._configure)
            if await self._read(lambda db: _rows(db, "PRAGMA user_version")[0][0]) != LATEST:
                await self._write(_run_migrations, self.path)
        except BaseException:
            await self.close()
            raise

    def _configure(self, db: sqlite3.Connection) -> None:
        # busy_timeout first: switching a fresh file to WAL needs a lock that another
        # process opening it at the same moment may hold.
        _exec(db, f"PRAGMA busy_timeout = {self._busy_timeout_ms}")
        mode = _rows(db, "PRAGMA journal_mode = WAL")[0][0]
        if self.path != ":memory:" and str(mode).lower() != "wal":
            raise StoreError(
                f"SQLite store {self.path} could not switch to WAL mode (got {mode!r}); "
                "put the database on a local disk")
        _exec(db, "PRAGMA synchronous = NORMAL")

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
        if not ids:
            return set()

        def read(db: sqlite3.Connection) -> set[str]:
            return set(ids) - _seen_among(db, pipeline, scope, ids)

        return await self._read(read)

    async def admit(self, pipeline: str, scope: str, recipe: str, items: list[Item], *,
                    cursor: str | None = None, mark_seen: bool = True,
                    now: float | None = None) -> AdmitResult:
        now = _now(now)
        unique: dict[str, Item] = {}
        for item in items:
            unique.setdefault(item.item_id, item)
        duplicates = len(items) - len(unique)
        keys = {item_id: draft_key(pipeline, scope, item_id, recipe) for item_id in unique}
        if not unique and cursor is None:
            return AdmitResult()

        def tx(db: sqlite3.Connection) -> AdmitResult:
            ids = list(unique)
            old = _seen_among(db, pipeline, scope, ids)
            unseen = [i for i in ids if i not in old]
            by_key = {keys[i]: i for i in unseen}
            for chunk in _chunks(list(by_key)):
                marks = ",".join("?" * len(chunk))
                for row in _rows(db, f"SELECT key FROM drafts WHERE key IN ({marks})", chunk):
                    old.add(by_key[row[0]])
            fresh = [i for i in ids if i not in old]
            result = AdmitResult(already_seen=len(old) + duplicates)
            if mark_seen:
                # Also the items whose draft exists but whose mark the sweep removed
                # (a source that lists old mail again): marked afresh, so that a later
                # recipe change does not draft them again.
                _many(db, "INSERT INTO seen_items (pipeline, scope, item_id, seen_at) "
                          "VALUES (?, ?, ?, ?)", [(pipeline, scope, i, now) for i in unseen])
            rows = []
            for i in fresh:
                item = unique[i]
                status = SKIPPED if item.skip_reason else QUEUED
                (result.skipped if item.skip_reason else result.new).append(keys[i])
                rows.append((keys[i], pipeline, scope, i, recipe, status,
                             item.message.to_json(), item.skip_reason, now, now))
            _many(db, "INSERT INTO drafts (key, pipeline, scope, item_id, recipe, status, "
                      "payload, error, created_at, updated_at) "
                      "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", rows)
            _append(db, [admit_record(now, r[0], r[7]) for r in rows])
            if cursor is not None:
                _exec(db, CURSOR_SQL, (pipeline, scope, cursor, now))
            return result

        return await self._write(tx)

    async def mark_seen(self, pipeline: str, scope: str, item_ids: list[str],
                        now: float | None = None) -> None:
        now = _now(now)
        rows = [(pipeline, scope, i, now) for i in dict.fromkeys(item_ids)]
        await self._write(lambda db: _many(
            db, "INSERT INTO seen_items (pipeline, scope, item_id, seen_at) VALUES (?, ?, ?, ?) "
                "ON CONFLICT (pipeline, scope, item_id) DO NOTHING", rows))

    # -- drafting ------------------------------------------------------------------------

    async def claim(self, pipeline: str, lease_seconds: float, *, limit: int = 1,
                    now: float | None = None) -> list[Draft]:
        now = _now(now)
        if limit <= 0:
            return []

        def tx(db: sqlite3.Connection) -> list[Draft]:
            rows = _rows(db, *cas(
                CLAIM, "lease_until = ?, fence = fence + 1, updated_at = ?",
                (now + lease_seconds, now), "id IN (SELECT id FROM drafts WHERE pipeline = ? "
                "AND status = ? ORDER BY id LIMIT ?)", (pipeline, *CLAIM.src, limit),
                returning=DRAFT_COLS))
            return sorted((draft_from_row(r) for r in rows), key=lambda d: d.id)

        return await self._write(tx)

    # -- operations ----------------------------------------------------------------------

    async def replay(self, pipeline: str, item_id: str, actor: str,
                     now: float | None = None) -> ReplayResult:
        now = _now(now)
        return await self._write(_replay, pipeline, item_id, actor, now)

    async def sweep(self, *, seen_ttl_days: float, max_attempts: int = 3,
                    approval_ttl_days: float | None = None, runs_keep_days: float = 30,
                    now: float | None = None) -> SweepResult:
        now = _now(now)

        def tx(db: sqlite3.Connection) -> SweepResult:
            result = SweepResult()
            result.seen_deleted = _exec(db, "DELETE FROM seen_items WHERE seen_at < ?",
                                        (now - seen_ttl_days * _DAY,))
            result.leases_requeued, result.leases_failed = _requeue_expired(
                db, None, max_attempts, now)
            if approval_ttl_days is not None:
                result.approvals_expired = _exec(db, *cas(
                    EXPIRE, "error = ?, updated_at = ?",
                    (f"no decision within {approval_ttl_days:g} days", now),
                    "updated_at < ?", (now - approval_ttl_days * _DAY,)))
            result.runs_pruned = _exec(db, "DELETE FROM pipeline_runs WHERE started_at < ?",
                                       (now - runs_keep_days * _DAY,))
            return result

        return await self._write(tx)

    async def requeue_expired(self, pipeline: str, *, max_attempts: int,
                              now: float | None = None) -> tuple[int, int]:
        now = _now(now)
        return await self._write(_requeue_expired, pipeline, max_attempts, now)

    async def recover_sending(self, older_than: float | None = None,
                              now: float | None = None) -> int:
        """Not in the Store contract (the engine uses recover_abandoned_sends): for tests.
        Every ``sending`` row -> ``send_unknown``; with ``older_than``, only rows that
        began sending more than that many seconds before ``now``."""
        now = _now(now)
        before = None if older_than is None else now - older_than
        return await self._write(lambda db: _exec(db, *cas(
            RECOVER_SEND, "error = ?, updated_at = ?",
            ("interrupted mid-send by a restart; it may have been delivered", now),
            "(? IS NULL OR updated_at < ?)", (before, before))))

    # -- locks ---------------------------------------------------------------------------

    async def try_lock(self, name: str, holder: str, ttl_seconds: float,
                       now: float | None = None) -> bool:
        now = _now(now)

        def tx(db: sqlite3.Connection) -> bool:
            _exec(db, "INSERT INTO locks (name, holder, expires_at) VALUES (?, ?, ?) "
                      "ON CONFLICT (name) DO UPDATE SET holder = excluded.holder, "
                      "expires_at = excluded.expires_at "
                      "WHERE locks.holder = excluded.holder OR locks.expires_at <= ?",
                  (name, holder, now + ttl_seconds, now))
            rows = _rows(db, "SELECT holder FROM locks WHERE name = ?", (name,))
            return bool(rows) and rows[0][0] == holder

        return await self._write(tx)

    # -- the audit chain -------------------------------------------------------------------

    async def verify_audit(self) -> chain.Report:
        def read(db: sqlite3.Connection) -> chain.Report:
            _exec(db, "BEGIN")  # one snapshot (WAL): appends meanwhile are not seen
            try:
                loose = _rows(db, chain.LOOSE_SQL)[0][0]
                found = _rows(db, chain.HEAD_SQL)
                head = tuple(found[0]) if found else None
                with closing(db.execute(chain.WALK_SQL)) as cur:
                    return chain.walk(cur, head, loose)
            finally:
                _exec(db, "COMMIT")

        return await self._read(read)

    # -- truthful status -------------------------------------------------------------------

    async def check(self) -> list[str]:
        try:
            rows = await self._read(lambda db: _rows(db, "PRAGMA quick_check"))
        except StoreError as exc:
            return [str(exc)]
        found = [str(r[0]) for r in rows]
        return [] if found == ["ok"] else [f"SQLite store {self.path}: {f}" for f in found[:5]]

    # -- crashed sends -------------------------------------------------------------------

    async def recover_abandoned_sends(self, *, dead: Iterable[str] = (), alive: str | None = None,
                                      grace: float, now: float | None = None) -> int:
        now = _now(now)
        dead = list(dead)

        def tx(db: sqlite3.Connection) -> int:
            marks = ",".join("?" * len(dead)) or "NULL"
            n = _exec(db, *cas(
                RECOVER_SEND, "error = ?, updated_at = ?", (ABANDONED_SEND, now),
                f"(send_holder IN ({marks})"
                " OR (send_holder IS NOT NULL AND send_holder IS NOT ?"
                "     AND NOT EXISTS (SELECT 1 FROM locks WHERE name = ? || drafts.send_holder"
                "                     AND expires_at > ?))"
                " OR (send_holder IS NULL AND updated_at < ?))",
                (*dead, alive, HEARTBEAT_PREFIX, now, now - grace)))
            # Heartbeats of processes gone for a day: nothing can refer to them any more.
            _exec(db, "DELETE FROM locks WHERE name LIKE ? AND expires_at < ?",
                  (HEARTBEAT_PREFIX + "%", now - _DAY))
            return n

        return await self._write(tx)



def _seen_among(db: sqlite3.Connection, pipeline: str, scope: str, ids: list[str]) -> set[str]:
    found: set[str] = set()
    for chunk in _chunks(ids):
        marks = ",".join("?" * len(chunk))
        for row in _rows(db, "SELECT item_id FROM seen_items WHERE pipeline = ? AND scope = ? "
                             f"AND item_id IN ({marks})", (pipeline, scope, *chunk)):
            found.add(row[0])
    return found


def _requeue_expired(db: sqlite3.Connection, pipeline: str | None, max_attempts: int,
                     now: float) -> tuple[int, int]:
    params: tuple[str | float, ...]
    where, params = "lease_until < ?", (now,)
    if pipeline is not None:
        where, params = "pipeline = ? AND " + where, (pipeline,) + params
    # A new fence on every expired lease, so the stale worker's update loses.
    requeued = _exec(db, *cas(
        LEASE_RETRY, "attempt = attempt + 1, lease_until = NULL, fence = fence + 1, "
                     "error = 'lease expired; retrying', updated_at = ?", (now,),
        where + " AND attempt + 1 < ?", params + (max_attempts,)))
    failed = _exec(db, *cas(
        LEASE_FAIL, "attempt = attempt + 1, lease_until = NULL, fence = fence + 1, "
                    "error = 'lease expired after ' || (attempt + 1) || ' attempts', "
                    "updated_at = ?", (now,), where, params))
    return requeued, failed


def _replay(db: sqlite3.Connection, pipeline: str, item_id: str, actor: str,
            now: float) -> ReplayResult:
    drafts = _drafts(db, "pipeline = ? AND item_id = ?", (pipeline, item_id))
    where = f"{pipeline} {item_id}"
    if not drafts:
        removed = _exec(db, "DELETE FROM seen_items WHERE pipeline = ? AND item_id = ?",
                        (pipeline, item_id))
        result = replay_without_draft(pipeline, item_id, removed)
        _audit(db, now, actor, "replay", None, None, f"{result.outcome}: {where}")
        return result
    refusal = replay_refusal(drafts)
    if refusal is not None:
        d, why = refusal
        result = ReplayResult("refused", f"{where}: {why}", d)
        _audit(db, now, actor, "replay", d.key, None, f"refused: {why}")
        return result
    old = drafts[-1]  # the newest recipe's draft
    # version + 1 makes the old card's buttons stale; the card's chat and message id
    # stay so the channel can edit that same card.
    rows = _rows(db, *cas(
        REPLAY, "attempt = 0, version = version + 1, lease_until = NULL, error = NULL, "
                "decided_by = NULL, decided_at = NULL, instruction = '', updated_at = ?",
        (now,), "id = ?", (old.id,), src=(old.status,), returning=DRAFT_COLS))
    draft = draft_from_row(rows[0])  # inside our IMMEDIATE transaction nothing else moved it
    detail = f"requeued from {old.status}" + (f" ({old.error})" if old.error else "")
    _audit(db, now, actor, "replay", draft.key, None, detail)
    return ReplayResult("requeued", f"{where}: {detail}", draft)
