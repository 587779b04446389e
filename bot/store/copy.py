"""Row-level copying between stores, for ``draftgate migrate-store``.

A copier reads a table in key order in batches and writes rows as they are, ids
included. One copier per backend, on the store's own connection and transaction
helpers, so the store modules keep only what the running bot needs.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit, urlunsplit

from ..errors import StoreError
from .chain import ADOPT_HEAD_SQL
from .rows import Db

#: Tables migrate-store copies, with the key columns a batch is ordered and resumed by.
#: ``locks`` is left out on purpose: its leases belong to the old store's processes;
#: ``seen_counts`` and ``draft_counts`` too: the target's triggers count the copied rows.
COPY_TABLES: dict[str, tuple[str, ...]] = {
    "seen_items": ("pipeline", "scope", "item_id"),
    "cursors": ("pipeline", "scope"),
    "drafts": ("id",),
    "pipeline_runs": ("id",),
    "audit": ("id",),
    "token_usage": ("pipeline", "day"),
    "pipeline_flags": ("pipeline",),
    "approvals": ("draft_id", "version", "operator"),
    "sent_notices": ("key",),
    # Context (issue 13): team memory and the knowledge index. The search indexes
    # follow: SQLite's FTS tables by trigger, PostgreSQL's tsvector columns are generated.
    "examples": ("id",),
    "knowledge_files": ("pipeline", "path"),
    "knowledge_passages": ("id",),
    "prompts": ("chat", "message_id"),
    "style_notes": ("id",),  # issue 25
    # `embeddings` and `embedding_progress` (issue 24) are left out: vectors are made
    # again in the background
    # from the copied texts, and a draft never waits for them.
}


class Copier(Protocol):
    async def copy_count(self, table: str) -> int: ...
    async def export_rows(self, table: str, after: tuple | None, limit: int) -> list[dict]: ...
    async def import_rows(self, table: str, rows: list[dict]) -> int: ...
    async def finish_import(self) -> None: ...


def key_columns(table: str) -> tuple[str, ...]:
    try:
        return COPY_TABLES[table]
    except KeyError:
        raise StoreError(
            f"cannot copy table {table!r}; copied tables: {', '.join(COPY_TABLES)}") from None


def copier(store: Any) -> Copier:
    """The copier of an opened store."""
    from .postgres import PostgresStore
    from .sqlite import SQLiteStore

    if isinstance(store, SQLiteStore):
        return _SQLiteCopier(store)
    if isinstance(store, PostgresStore):
        return _PostgresCopier(store)
    raise StoreError(f"migrate-store cannot copy a {type(store).__name__}")


class _SqlCopier:
    """Counting and reading, alike on both backends (through the store's own SQL helpers)."""

    def __init__(self, store: Any):
        self._store = store

    async def copy_count(self, table: str) -> int:
        key_columns(table)
        return int((await self._store._query(f"SELECT count(*) FROM {table}"))[0][0])

    async def export_rows(self, table: str, after: tuple | None, limit: int) -> list[dict]:
        """Up to ``limit`` rows of ``table`` whose key columns sort after ``after``,
        in key order, as plain dicts."""
        key = key_columns(table)
        cols = ", ".join(key)
        sql = f"SELECT * FROM {table}"
        params: tuple = ()
        if after is not None:
            # Row values compare like a composite index: one range scan per batch.
            sql += f" WHERE ({cols}) > ({', '.join('?' * len(key))})"
            params = tuple(after)
        rows = await self._store._query(f"{sql} ORDER BY {cols} LIMIT ?", (*params, int(limit)))
        return [dict(zip(r.keys(), r, strict=True)) for r in rows]


class _SQLiteCopier(_SqlCopier):
    async def import_rows(self, table: str, rows: list[dict]) -> int:
        key_columns(table)
        if not rows:
            return 0

        async def tx(db: Db) -> int:
            have = {r[1] for r in await db.rows(f"PRAGMA table_info({table})")}
            cols = [c for c in rows[0] if c in have]
            # OR IGNORE: with --force, a row whose key or id is already there is kept.
            # rowcount, not total_changes: the count triggers' rows are not copied rows.
            return await db.many(f"INSERT OR IGNORE INTO {table} ({', '.join(cols)}) "
                                 f"VALUES ({', '.join('?' * len(cols))})",
                                 [tuple(r.get(c) for c in cols) for r in rows])

        return await self._store._run(tx)

    async def finish_import(self) -> None:
        # Ids are INTEGER PRIMARY KEY (next = max + 1) and fences grow per draft
        # (fence + 1), so copied rows already keep new numbers from colliding. The
        # audit chain's head moves to the last copied row.
        await self._store._execute(ADOPT_HEAD_SQL)


class _PostgresCopier(_SqlCopier):
    async def import_rows(self, table: str, rows: list[dict]) -> int:
        """Insert copied rows as they are (ids included); a row whose key or id is
        already present is left alone. Returns how many were inserted."""
        from .postgres import rows_affected  # (the postgres module imports this one)

        key_columns(table)
        if not rows:
            return 0
        # SQLite hands back whatever type a value was stored with; PostgreSQL wants the
        # column's own type.
        convert: dict[str, Callable[[Any], Any]] = {"double precision": float, "bigint": int, "integer": int,
                   "text": lambda v: self._store._clean(str(v))}
        async with self._store._tx() as con:
            types = {r["column_name"]: r["data_type"] for r in await con.fetch(
                "SELECT column_name, data_type FROM information_schema.columns"
                " WHERE table_schema=$1 AND table_name=$2 AND is_generated = 'NEVER'",
                self._store._schema, table)}
            cols = [c for c in rows[0] if c in types]
            conv = [convert.get(types[c], lambda v: v) for c in cols]
            values = [[None if row.get(c) is None else f(row[c])
                       for c, f in zip(cols, conv, strict=True)] for row in rows]
            # One statement per batch: unnest() of one array per column.
            arrays = ", ".join(f"${i + 1}::{_ARRAY_TYPE[types[c]]}[]" for i, c in enumerate(cols))
            names = ", ".join(cols)
            status = await con.execute(
                f"INSERT INTO {table} ({names}) SELECT * FROM unnest({arrays})"
                " ON CONFLICT DO NOTHING",
                *[[v[i] for v in values] for i in range(len(cols))])
        return rows_affected(status)

    async def finish_import(self) -> None:
        """Move id and fence sequences past every copied row, so the next draft,
        run or audit row (and the next claim's fence) never reuses a number."""
        async with self._store._tx() as con:
            for table in ("drafts", "pipeline_runs", "audit", "examples", "knowledge_passages",
                          "style_notes"):
                await con.execute(
                    f"SELECT setval(pg_get_serial_sequence('{table}', 'id'),"
                    f" GREATEST((SELECT max(id) FROM {table}), 1),"
                    f" (SELECT max(id) FROM {table}) IS NOT NULL)")
            await con.execute(ADOPT_HEAD_SQL)  # the audit chain goes on after the last copied row
            await con.execute(
                "SELECT setval('draft_fence_seq', GREATEST((SELECT max(fence) FROM drafts), 1),"
                " coalesce((SELECT max(fence) FROM drafts), 0) > 0)")


# PostgreSQL array type of each column type, for unnest() of one array per column.
_ARRAY_TYPE = {"double precision": "float8", "bigint": "int8", "integer": "int4", "text": "text"}


#: Copy order. Drafts before audit so a reader of the target never sees an audit
#: row for a draft that is not there yet.
TABLES = tuple(COPY_TABLES)
BATCH = 5000

Progress = Callable[[str, int, int], None]


def safe_url(url: str) -> str:
    """``url`` with any password masked, for messages."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.netloc.rsplit("@", 1)[-1]
    return urlunsplit(parts._replace(netloc=f"{parts.username or ''}:***@{host}"))


async def migrate_store(src_url: str, dst_url: str, *, force: bool = False,
                        progress: Progress | None = None, batch: int = BATCH) -> dict[str, int]:
    """Copy every table of the store at ``src_url`` into ``dst_url``; returns rows
    copied per table. Refuses a target that already holds data unless ``force``
    (then rows already in the target, by key or id, are kept and the rest added)."""
    if src_url == dst_url:
        raise StoreError("--from and --to are the same store; give the new store as --to")
    src = _create(src_url)
    # Opening a SQLite URL creates the file: a mistyped --from would "copy" an empty
    # store without a word.
    path = getattr(src, "path", None)
    if path and path != ":memory:" and not Path(path).exists():
        raise StoreError(f"the source store {path} does not exist; check --from "
                         "(sqlite:////absolute/path/to/state.db with four slashes; "
                         "sqlite:///path is relative to the current directory)")
    dst = _create(dst_url)
    async with src, dst:
        return await _copy_all(src, dst, src_url, dst_url, force, progress, batch)


async def _copy_all(src, dst, src_url, dst_url, force, progress, batch) -> dict[str, int]:
    s, d = copier(src), copier(dst)
    existing = {t: await d.copy_count(t) for t in TABLES}
    if any(existing.values()) and not force:
        held = ", ".join(f"{n} {t}" for t, n in existing.items() if n)
        raise StoreError(
            f"the target store {safe_url(dst_url)} is not empty ({held}). migrate-store "
            "copies into an empty store so nothing is mixed up by accident; point --to at "
            "a new database (or schema), or re-run with --force to add the source's rows "
            "to it (rows already there, by key or id, are kept as they are)")
    totals = {t: await s.copy_count(t) for t in TABLES}
    if not any(totals.values()):
        raise StoreError(f"the source store {safe_url(src_url)} holds nothing to copy; check --from")
    copied: dict[str, int] = {}
    for table in TABLES:
        total = totals[table]
        done = 0
        copied[table] = 0
        if progress:
            progress(table, 0, total)
        after = None
        key = COPY_TABLES[table]
        while True:
            rows = await s.export_rows(table, after, batch)
            if not rows:
                break
            copied[table] += await d.import_rows(table, rows)
            done += len(rows)
            after = tuple(rows[-1][c] for c in key)
            if progress:
                progress(table, done, max(total, done))
            if len(rows) < batch:
                break
    await d.finish_import()
    return copied




def _create(url: str) -> Any:
    from . import create_store  # the package imports this module's neighbours first

    return create_store(url)
