"""Row-level copying between stores, for ``draftgate migrate-store``.

A copier reads a table in key order in batches and writes rows as they are, ids
included. One copier per backend, on the store's own connection and transaction
helpers, so the store modules keep only what the running bot needs.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from contextlib import closing
from typing import Any, Protocol

from ..errors import StoreError

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
    if all(callable(getattr(store, m, None)) for m in
           ("copy_count", "export_rows", "import_rows", "finish_import")):
        return store
    from .postgres import PostgresStore
    from .sqlite import SQLiteStore

    if isinstance(store, SQLiteStore):
        return _SQLiteCopier(store)
    if isinstance(store, PostgresStore):
        return _PostgresCopier(store)
    raise StoreError(f"migrate-store cannot copy a {type(store).__name__}")


class _SQLiteCopier:
    def __init__(self, store):
        self._store = store

    async def copy_count(self, table: str) -> int:
        key_columns(table)

        def read(db: sqlite3.Connection) -> int:
            with closing(db.execute(f"SELECT count(*) FROM {table}")) as cur:
                return int(cur.fetchone()[0])

        return await self._store._read(read)

    async def export_rows(self, table: str, after: tuple | None, limit: int) -> list[dict]:
        key = key_columns(table)
        cols = ", ".join(key)
        sql = f"SELECT * FROM {table}"
        params: tuple = ()
        if after is not None:
            # Row values compare like a composite index: one range scan per batch.
            sql += f" WHERE ({cols}) > ({', '.join('?' * len(key))})"
            params = tuple(after)
        sql += f" ORDER BY {cols} LIMIT ?"

        def read(db: sqlite3.Connection) -> list[dict]:
            with closing(db.execute(sql, params + (int(limit),))) as cur:
                names = [d[0] for d in cur.description]
                return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]

        return await self._store._read(read)

    async def import_rows(self, table: str, rows: list[dict]) -> int:
        key_columns(table)
        if not rows:
            return 0

        def tx(db: sqlite3.Connection) -> int:
            with closing(db.execute(f"PRAGMA table_info({table})")) as cur:
                have = {r[1] for r in cur.fetchall()}
            cols = [c for c in rows[0] if c in have]
            # OR IGNORE: with --force, a row whose key or id is already there is kept.
            # rowcount, not total_changes: the count triggers' rows are not copied rows.
            with closing(db.executemany(
                    f"INSERT OR IGNORE INTO {table} ({', '.join(cols)}) "
                    f"VALUES ({', '.join('?' * len(cols))})",
                    [tuple(r.get(c) for c in cols) for r in rows])) as cur:
                return cur.rowcount

        return await self._store._write(tx)

    async def finish_import(self) -> None:
        # Ids are INTEGER PRIMARY KEY (next = max + 1) and fences grow per draft
        # (fence + 1), so copied rows already keep new numbers from colliding.
        return None


class _PostgresCopier:
    def __init__(self, store):
        self._store = store

    async def copy_count(self, table: str) -> int:
        """Rows in one of the copied tables (see ``COPY_TABLES``)."""
        key_columns(table)
        async with self._store._conn() as con:
            return await con.fetchval(f"SELECT count(*) FROM {table}")

    async def export_rows(self, table: str, after: tuple | None, limit: int) -> list[dict]:
        """Up to ``limit`` rows of ``table`` whose key columns sort after ``after``,
        in key order, as plain dicts (a keyset scan: each batch is one index range)."""
        pk = key_columns(table)
        cols = ", ".join(pk)
        where = ""
        args: list[Any] = [limit]
        if after is not None:
            marks = ", ".join(f"${i + 2}" for i in range(len(pk)))
            where = f"WHERE ({cols}) > ({marks})"
            args += list(after)
        async with self._store._tx() as con:
            rows = await con.fetch(
                f"SELECT * FROM {table} {where} ORDER BY {cols} LIMIT $1", *args)
        return [dict(r) for r in rows]

    async def import_rows(self, table: str, rows: list[dict]) -> int:
        """Insert copied rows as they are (ids included); a row whose key or id is
        already present is left alone. Returns how many were inserted."""
        from .postgres import _clean, _count  # (the postgres module imports this one)

        key_columns(table)
        if not rows:
            return 0
        # SQLite hands back whatever type a value was stored with; PostgreSQL wants the
        # column's own type.
        convert: dict[str, Callable[[Any], Any]] = {"double precision": float, "bigint": int, "integer": int,
                   "text": lambda v: _clean(str(v))}
        async with self._store._tx() as con:
            types = {r["column_name"]: r["data_type"] for r in await con.fetch(
                "SELECT column_name, data_type FROM information_schema.columns"
                " WHERE table_schema=$1 AND table_name=$2", self._store._schema, table)}
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
        return _count(status)

    async def finish_import(self) -> None:
        """Move id and fence sequences past every copied row, so the next draft,
        run or audit row (and the next claim's fence) never reuses a number."""
        async with self._store._tx() as con:
            for table in ("drafts", "pipeline_runs", "audit"):
                await con.execute(
                    f"SELECT setval(pg_get_serial_sequence('{table}', 'id'),"
                    f" GREATEST((SELECT max(id) FROM {table}), 1),"
                    f" (SELECT max(id) FROM {table}) IS NOT NULL)")
            await con.execute(
                "SELECT setval('draft_fence_seq', GREATEST((SELECT max(fence) FROM drafts), 1),"
                " coalesce((SELECT max(fence) FROM drafts), 0) > 0)")


# PostgreSQL array type of each column type, for unnest() of one array per column.
_ARRAY_TYPE = {"double precision": "float8", "bigint": "int8", "integer": "int4", "text": "text"}
