"""Row-level copying between stores, for ``draftgate migrate-store``.

A copier reads a table in key order in batches and writes rows as they are, ids
included. The PostgreSQL store implements the four methods itself; the SQLite store's
are here, run on its connection thread through its own transaction helpers, so the
SQLite module stays as it is.
"""

from __future__ import annotations

import sqlite3
from contextlib import closing
from typing import Any, Protocol

from ..errors import StoreError

#: Tables migrate-store copies, with the key columns a batch is ordered and resumed by.
#: ``locks`` is left out on purpose: its leases belong to the old store's processes.
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
    from .sqlite import SQLiteStore

    if isinstance(store, SQLiteStore):
        return _SQLiteCopier(store)
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
                return [dict(zip(names, row)) for row in cur.fetchall()]

        return await self._store._read(read)

    async def import_rows(self, table: str, rows: list[dict]) -> int:
        key_columns(table)
        if not rows:
            return 0

        def tx(db: sqlite3.Connection) -> int:
            with closing(db.execute(f"PRAGMA table_info({table})")) as cur:
                have = {r[1] for r in cur.fetchall()}
            cols = [c for c in rows[0] if c in have]
            before = db.total_changes
            # OR IGNORE: with --force, a row whose key or id is already there is kept.
            with closing(db.executemany(
                    f"INSERT OR IGNORE INTO {table} ({', '.join(cols)}) "
                    f"VALUES ({', '.join('?' * len(cols))})",
                    [tuple(r.get(c) for c in cols) for r in rows])):
                pass
            return db.total_changes - before

        return await self._store._write(tx)

    async def finish_import(self) -> None:
        # Ids are INTEGER PRIMARY KEY (next = max + 1) and fences grow per draft
        # (fence + 1), so copied rows already keep new numbers from colliding.
        return None
