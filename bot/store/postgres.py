"""PostgreSQL backend (asyncpg), for running draftgate on several hosts.

Same tables, same transitions and the same contract tests as the SQLite store. What
differs is how concurrent writers are kept apart:

* claims take rows with ``FOR UPDATE SKIP LOCKED``, so processes claiming at once
  each get different drafts and nobody waits on another's row lock;
* admit inserts with ``ON CONFLICT DO NOTHING``, so two hosts admitting the same
  mail both succeed and exactly one queues it;
* migrations run under ``pg_advisory_xact_lock``, so hosts starting together
  migrate once.

URL: ``postgresql://user[:password]@host[:port]/db[?schema=NAME]``. ``schema`` puts
every table in that schema (created if missing); the rest of the query is passed
to asyncpg unchanged.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import re
import time
from typing import Any, AsyncIterator, Awaitable, Callable, Iterable, Sequence, TypeVar
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import asyncpg

from ..clock import wall
from ..errors import StoreError, StoreUnavailable
from ..models import Draft, Item, Status, draft_key
from ..redact import redact_url
from . import chain
from .base import AdmitResult, StoreMissing
from .pg_schema import MIGRATIONS, TABLES
from .rows import CURSOR_SQL, DRAFT_COLS, Db, Tokens, admit_record, draft_from_row
from .sql import SqlStore
from .transitions import CLAIM, cas

T = TypeVar("T")

# What a lost or refused connection can raise through asyncpg. InternalClientError
# shows up when the server ends a session (restart, pg_terminate_backend) while the
# connection sits idle in the pool: the next statement finds the protocol mid-error.
_DB_ERRORS = (asyncpg.PostgresError, asyncpg.InterfaceError, asyncpg.InternalClientError,
              OSError, TimeoutError)
#: Errors that say the server, not the statement, is the trouble: it is down, shutting
#: down, unreachable, out of disk or of connections. Raised as StoreUnavailable, which
#: holds the schedule until the server answers (bot.engine.outage).
_UNREACHABLE = (OSError, TimeoutError, asyncpg.PostgresConnectionError,
                asyncpg.CannotConnectNowError, asyncpg.AdminShutdownError,
                asyncpg.CrashShutdownError, asyncpg.InsufficientResourcesError)
_SCHEMA_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")

# One primary-key probe per id, whatever the planner's statistics say. The plain
# `item_id = ANY($3)` form was planned, on a table grown since its last ANALYZE, as a
# scan of every seen mark of the pipeline: 10 ms at 3,000 rows, linear beyond.
_SEEN_AMONG = (
    "SELECT s.item_id FROM unnest($3::text[]) AS u(i) CROSS JOIN LATERAL"
    " (SELECT item_id FROM seen_items WHERE pipeline=$1 AND scope=$2 AND item_id=u.i"
    "  LIMIT 1) AS s")


# admit as ONE statement (one round trip, atomic on its own): skip items with a seen
# mark, insert the rest as drafts, mark them all seen (also those whose draft already
# existed: their mark was swept and the source listed them again; marked afresh, a
# later recipe change does not draft them again), store the cursor. The unique draft
# key decides who queues an item: a second host admitting the same mail waits on that
# index entry, then skips it.
_ADMIT = """
WITH u AS (
    SELECT * FROM unnest($5::text[], $6::text[], $7::text[], $8::text[], $9::text[])
        WITH ORDINALITY AS u(k, i, s, p, e, n)
), fresh AS (
    SELECT u.* FROM u LEFT JOIN LATERAL (
        SELECT 1 AS hit FROM seen_items
        WHERE pipeline = $1 AND scope = $2 AND item_id = u.i LIMIT 1) AS seen ON true
    WHERE seen.hit IS NULL
), ins AS (
    INSERT INTO drafts (key, pipeline, scope, item_id, recipe, status, payload, error,
                        created_at, updated_at)
    SELECT k, $1, $2, i, $3, s, p, e, $4, $4 FROM fresh ORDER BY n
    ON CONFLICT (key) DO NOTHING
    RETURNING key, item_id
), marked AS (
    INSERT INTO seen_items (pipeline, scope, item_id, seen_at)
    SELECT $1, $2, i, $4 FROM fresh WHERE $10::boolean
    ON CONFLICT DO NOTHING
), cur AS (
    INSERT INTO cursors (pipeline, scope, value, updated_at)
    SELECT $1, $2, $11::text, $4 WHERE $11::text IS NOT NULL
    ON CONFLICT (pipeline, scope) DO UPDATE SET value = EXCLUDED.value,
        updated_at = EXCLUDED.updated_at
)
SELECT key FROM ins
"""


@functools.lru_cache(maxsize=512)
def _dollars(sql: str) -> str:
    """asyncpg's placeholders for the shared ``?`` ones: the n-th ``?`` becomes ``$n``."""
    parts = sql.split("?")
    return "".join(f"{p}${i}" for i, p in enumerate(parts[:-1], 1)) + parts[-1]


#: SQL for "now" in statements that decide leases (pipeline locks, process heartbeats,
#: drafting leases, send recovery): its parameter if a test passed a time, else the
#: database's own clock. Hosts' clocks may disagree; the one clock they share is the
#: server's, so a skewed host can neither take a live lease nor call another host's send
#: in flight abandoned.
_DB_NOW = "coalesce(?::float8, extract(epoch from clock_timestamp()))"


def parse_pg_url(url: str) -> tuple[str, str]:
    """Split ``?schema=NAME`` off a PostgreSQL URL: ``(dsn_for_asyncpg, schema)``."""
    parts = urlsplit(url)
    if parts.scheme not in ("postgresql", "postgres"):
        raise StoreError(f"not a PostgreSQL URL: {redact_url(url)!r}; expected postgresql://user@host/db")
    query = parse_qsl(parts.query, keep_blank_values=True)
    schema = ([v for k, v in query if k == "schema"] or ["public"])[-1]
    rest = [(k, v) for k, v in query if k != "schema"]
    if not _SCHEMA_NAME.match(schema):
        raise StoreError(
            f"store URL {redact_url(url)!r}: schema={schema!r} is not a plain identifier; "
            "use letters, digits and underscores, starting with a letter or underscore")
    dsn = urlunsplit(parts._replace(query=urlencode(rest)))
    return dsn, schema


def _lock_key(label: str) -> int:
    """A stable signed 64-bit advisory lock key for ``label``."""
    return int.from_bytes(hashlib.sha256(label.encode()).digest()[:8], "big", signed=True)


class PostgresStore(SqlStore):
    """Store on PostgreSQL through an asyncpg pool (1..``max_size`` connections)."""

    FTS = "postgres"
    NEXT_FENCE = "nextval('draft_fence_seq')"
    FOR_UPDATE = " FOR UPDATE"

    def __init__(self, url: str, *, max_size: int = 10):
        self.url = url
        self._dsn, self._schema = parse_pg_url(url)
        self._max_size = max_size
        self._pool: asyncpg.Pool | None = None

    # -- lifecycle ---------------------------------------------------------------
    async def open(self, *, create: bool = True) -> None:
        if self._pool is not None:
            return
        try:
            # One plain connection first: the schema must exist before the pool's
            # search_path can point at it, and the migration lock serialises hosts.
            con = await asyncpg.connect(self._dsn, timeout=10)
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError, TimeoutError) as e:
            raise StoreError(
                f"cannot connect to PostgreSQL at {redact_url(self._dsn)}: {e}. Check the "
                "store URL (postgresql://user@host:port/db) and that the server is running "
                "and accepts this user") from e
        try:
            if not create and await con.fetchval(
                    "SELECT to_regclass(quote_ident($1) || '.schema_migrations')",
                    self._schema) is None:
                raise StoreMissing(
                    f"no draftgate store in schema {self._schema!r} of "
                    f"{redact_url(self._dsn)}: nothing has run with this configuration yet, "
                    "or `store:` names the wrong database or schema; nothing was created")
            await self._migrate(con)
        except asyncpg.InsufficientPrivilegeError as e:
            raise StoreError(
                f"PostgreSQL store {redact_url(self.url)}: cannot create the tables in schema "
                f"{self._schema!r}: {e}. Grant this user CREATE on that schema (or on the "
                "database), or add ?schema=NAME to the URL naming a schema it owns") from e
        except asyncpg.PostgresError as e:
            raise StoreError(f"PostgreSQL store {redact_url(self.url)}: migration failed: {e}") from e
        finally:
            await con.close()
        try:
            # No floor (min_size 0, one connection to start with): asyncpg restores a
            # floor in the background and warns on each failed try while the server is
            # down; an outage is reported once, by bot.engine.outage.
            self._pool = await asyncpg.create_pool(
                self._dsn, min_size=0, init_size=1, max_size=self._max_size, timeout=10,
                # Quoted, as the migration created it: unquoted, PostgreSQL would fold
                # a schema such as "TeamA" to teama (another deployment's, perhaps).
                server_settings={"search_path": '"' + self._schema + '"'},
            )
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError, TimeoutError) as e:
            raise StoreError(f"cannot open a connection pool to {redact_url(self._dsn)}: {e}") from e

    async def _migrate(self, con: asyncpg.Connection) -> None:
        ident = '"' + self._schema + '"'
        async with con.transaction():
            # Transaction-scoped, so a crashed process can never leave it held.
            await con.execute("SELECT pg_advisory_xact_lock($1)",
                              _lock_key(f"draftgate-migrate:{self._schema}"))
            # Look first: CREATE SCHEMA IF NOT EXISTS still needs CREATE on the database,
            # which a deployment user of an existing schema often lacks.
            if not await con.fetchval("SELECT 1 FROM pg_namespace WHERE nspname=$1", self._schema):
                await con.execute(f"CREATE SCHEMA {ident}")
            await con.execute(f"SET LOCAL search_path TO {ident}")
            await con.execute(
                "CREATE TABLE IF NOT EXISTS schema_migrations ("
                " version INTEGER PRIMARY KEY, name TEXT NOT NULL,"
                " applied_at DOUBLE PRECISION NOT NULL)")
            cols = {r["column_name"] for r in await con.fetch(
                "SELECT column_name FROM information_schema.columns"
                " WHERE table_schema=$1 AND table_name='schema_migrations'", self._schema)}
            if cols != {"version", "name", "applied_at"}:
                raise StoreError(
                    f"PostgreSQL store {redact_url(self.url)}: schema {self._schema!r} already "
                    "has a schema_migrations table that is not draftgate's; give draftgate a "
                    "schema of its own, e.g. add ?schema=draftgate to the store URL")
            done = {r["version"] for r in await con.fetch("SELECT version FROM schema_migrations")}
            latest = max(v for v, _, _ in MIGRATIONS)
            if done and max(done) > latest:
                raise StoreError(
                    f"PostgreSQL store {redact_url(self.url)} has schema version {max(done)}, "
                    f"but this draftgate only knows versions up to {latest}: upgrade draftgate "
                    "on this host (every host on one database runs the same version)")
            for version, name, sql in MIGRATIONS:
                if version in done:
                    continue
                for step in sql if isinstance(sql, list) else [sql]:
                    await (step(_PgDb(con)) if callable(step) else con.execute(step))
                await con.execute(
                    "INSERT INTO schema_migrations (version, name, applied_at) VALUES ($1, $2, $3)",
                    version, name, time.time())

    async def close(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            try:
                # close() waits for connections still checked out; a task stuck on one
                # must not hang shutdown.
                await asyncio.wait_for(pool.close(), 10)
            except (asyncio.TimeoutError, asyncpg.InterfaceError, OSError):
                pool.terminate()

    @contextlib.asynccontextmanager
    async def _tx(self) -> AsyncIterator[asyncpg.Connection]:
        """A pooled connection inside one transaction; database errors -> StoreError."""
        async with self._conn() as con:
            async with con.transaction():
                yield con

    @contextlib.asynccontextmanager
    async def _conn(self) -> AsyncIterator[asyncpg.Connection]:
        """A pooled connection in autocommit, for ONE statement (itself atomic): it
        saves the BEGIN and COMMIT round trips that a claim would otherwise pay."""
        if self._pool is None:
            raise StoreError("the PostgreSQL store is not open; call open() first")
        try:
            con = await self._pool.acquire()
            try:
                yield con
            except asyncpg.InterfaceError as e:
                if not _closed(con):
                    raise
                # The server went away mid-transaction ("cannot call
                # Transaction.__aexit__(): the underlying connection is closed").
                raise StoreUnavailable(f"PostgreSQL store {redact_url(self.url)}: {e}") from e
            finally:
                await _release(self._pool, con)
        except _UNREACHABLE as e:
            raise StoreUnavailable(f"PostgreSQL store {redact_url(self.url)}: {e}") from e
        except _DB_ERRORS as e:
            raise StoreError(f"PostgreSQL store {redact_url(self.url)}: {e}") from e

    # -- the shared transitions' primitives (see SqlStore) ---------------------------
    def _now(self, now: float | None) -> float:
        return wall() if now is None else float(now)

    def _clean(self, text: str | None) -> str | None:
        """PostgreSQL text cannot hold NUL (SQLite can): a model answer or an error text
        carrying one would fail every retry, so NUL becomes U+FFFD, visibly."""
        return text.replace("\x00", "\ufffd") if text and "\x00" in text else text

    def _db_clock(self, now: float | None) -> tuple[str, Any]:
        return _DB_NOW, now  # None: the database's clock (see _DB_NOW)

    async def _run(self, fn: Callable[[Db], Awaitable[T]], *, tx: bool = True) -> T:
        async with (self._tx() if tx else self._conn()) as con:
            return await fn(_PgDb(con))

    async def _append(self, db: Db, records: Sequence[chain.Record],
                      tokens: Tokens | None = None) -> None:
        # The rows, the new head and the tokens in one statement, under the head's row
        # lock: the usage row is then held for no round trip of its own.
        assert isinstance(db, _PgDb)
        await chain.append_postgres(db.con, records, tokens)

    async def verify_audit(self) -> chain.Report:
        async with self._conn() as con:
            # One snapshot: rows appended while the walk runs are not seen.
            async with con.transaction(isolation="repeatable_read", readonly=True):
                loose = await con.fetchval(chain.LOOSE_SQL)
                head = await con.fetchrow(chain.HEAD_SQL)
                walker = chain.Walker()  # rows streamed, never all in memory
                async for row in con.cursor(chain.WALK_SQL, prefetch=2000):
                    if not walker.feed(row):
                        break
                return chain.conclude(walker, tuple(head) if head else None, loose)

    # -- fetch side ----------------------------------------------------------------
    async def unseen(self, pipeline: str, scope: str, item_ids: list[str]) -> set[str]:
        if not item_ids:
            return set()
        async with self._conn() as con:
            rows = await con.fetch(_SEEN_AMONG, pipeline, scope, list(dict.fromkeys(item_ids)))
        return set(item_ids) - {r["item_id"] for r in rows}

    async def admit(self, pipeline: str, scope: str, recipe: str, items: list[Item], *,
                    cursor: str | None = None, mark_seen: bool = True,
                    now: float | None = None) -> AdmitResult:
        t = self._now(now)
        result = AdmitResult()
        unique: dict[str, Item] = {}
        for item in items:
            if item.item_id in unique:
                result.already_seen += 1  # a duplicate within one fetch
            else:
                unique[item.item_id] = item
        if not unique:
            if cursor is not None:
                await self._execute(CURSOR_SQL, (pipeline, scope, cursor, t))
            return result
        keys, statuses, item_ids, payloads, errors = [], [], [], [], []
        for item in unique.values():
            keys.append(draft_key(pipeline, scope, item.item_id, recipe))
            statuses.append(Status.SKIPPED if item.skip_reason else Status.QUEUED)
            item_ids.append(item.item_id)
            payloads.append(item.message.to_json())
            errors.append(self._clean(item.skip_reason))
        async with self._tx() as con:
            rows = await con.fetch(
                _ADMIT, pipeline, scope, recipe, t, keys, item_ids, statuses, payloads, errors,
                mark_seen, cursor)
            inserted = {r["key"] for r in rows}
            # In the admit's transaction, in the order the items came.
            await chain.append_postgres(con, [admit_record(t, k, e, self._clean) for k, e in
                                              zip(keys, errors, strict=True) if k in inserted])
        for key, status in zip(keys, statuses, strict=True):
            if key in inserted:
                (result.skipped if status == Status.SKIPPED else result.new).append(key)
        result.already_seen += len(unique) - len(inserted)
        return result

    async def mark_seen(self, pipeline: str, scope: str, item_ids: list[str],
                        now: float | None = None) -> None:
        if not item_ids:
            return
        async with self._conn() as con:
            await con.execute(
                "INSERT INTO seen_items (pipeline, scope, item_id, seen_at)"
                " SELECT $1, $2, i, $4 FROM unnest($3::text[]) AS i ON CONFLICT DO NOTHING",
                pipeline, scope, list(dict.fromkeys(item_ids)), self._now(now))

    # -- drafting ------------------------------------------------------------------
    async def claim(self, pipeline: str, lease_seconds: float, *, limit: int = 1,
                    now: float | None = None) -> list[Draft]:
        if limit <= 0:
            return []
        t = self._now(now)
        async with self._conn() as con:
            # SKIP LOCKED: a row another process is claiming right now is passed over
            # instead of waited for, so N hosts claim N disjoint batches. MATERIALIZED
            # because a plain `id IN (subquery)` may be planned as a nested loop that
            # re-runs the LIMIT subquery per row and claims more than `limit`.
            sql, args = cas(
                CLAIM, f"lease_until = {_DB_NOW} + ?, fence = {self.NEXT_FENCE}, updated_at = ?",
                (now, float(lease_seconds), t), "id IN (SELECT id FROM picked)", (),
                returning=DRAFT_COLS)
            rows = await con.fetch(_dollars(
                "WITH picked AS MATERIALIZED (SELECT id FROM drafts WHERE pipeline = ? AND"
                " status IN (?) ORDER BY id LIMIT ? FOR UPDATE SKIP LOCKED) " + sql),
                pipeline, *CLAIM.src, limit, *args)
        return sorted((draft_from_row(r) for r in rows), key=lambda d: d.id)

    # -- truthful status -------------------------------------------------------------------
    async def check(self) -> list[str]:
        problems = []
        for table in TABLES:
            try:
                async with self._conn() as con:
                    await con.fetchval(f"SELECT count(*) FROM {table}")
            except StoreError as exc:
                problems.append(f"table {table}: {exc}")
        return problems


class _PgDb:
    """A pooled connection inside ``_run`` (see :class:`~bot.store.sql.Db`)."""

    def __init__(self, con: asyncpg.Connection):
        self.con = con

    async def rows(self, sql: str, args: Iterable[Any] = ()) -> list[Any]:
        return await self.con.fetch(_dollars(sql), *args)

    async def run(self, sql: str, args: Iterable[Any] = ()) -> int:
        return rows_affected(await self.con.execute(_dollars(sql), *args))

    async def many(self, sql: str, rows: list[tuple]) -> int:
        await self.con.executemany(_dollars(sql), rows)
        return -1  # asyncpg's executemany does not say


async def _release(pool: asyncpg.Pool, con: asyncpg.Connection) -> None:
    """Give ``con`` back to ``pool``, also when the caller is cancelled meanwhile (a tick
    cut off by an outage): asyncpg shields the release, and one that then fails, the
    server gone, was logged by asyncio as "Task exception was never retrieved"."""
    task = asyncio.ensure_future(pool.release(con))
    task.add_done_callback(_retrieve)
    try:
        await asyncio.shield(task)
    except asyncpg.InternalClientError:
        # "called on a free connection holder": a connection that lost its server is
        # taken back by the pool as it closes, so there was nothing left to release.
        if not _closed(con):
            raise


def _retrieve(task: asyncio.Future) -> None:
    if not task.cancelled():
        task.exception()


def _closed(con: asyncpg.Connection) -> bool:
    """Whether ``con`` lost its server (a proxy the pool already took back after the
    loss cannot even be asked)."""
    try:
        return con.is_closed()
    except asyncpg.InterfaceError:
        return True


def rows_affected(status: str) -> int:
    """Row count from an asyncpg command tag such as ``UPDATE 3``."""
    try:
        return int(status.rsplit(" ", 1)[-1])
    except (ValueError, AttributeError):
        return 0
