"""Shared fixtures.

Store fixtures: ``store`` (an opened store) and ``store_url`` run a test once per
backend: SQLite on a file in ``tmp_path`` always, PostgreSQL (a throwaway schema) when
``DRAFTGATE_TEST_PG_DSN`` is set. With ``DRAFTGATE_REQUIRE_PG=1`` or ``CI=true`` a
missing DSN, an unreachable server or a missing ``bot/store/postgres.py`` fails instead
of skipping.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import AsyncIterator

import pytest

from bot.store import create_store

STORE_BACKENDS = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]


@contextlib.asynccontextmanager
async def make_store_url(backend: str, tmp_path: Path) -> AsyncIterator[str]:
    """The URL of a fresh, empty store of ``backend`` ("sqlite" or "postgres"), for
    tests that open several stores or processes on the same database. A PostgreSQL
    schema made for it is dropped on exit."""
    if backend == "sqlite":
        yield f"sqlite:///{tmp_path / 'store.db'}"
        return
    if backend != "postgres":
        raise ValueError(f"unknown store backend {backend!r}; expected sqlite or postgres")
    try:
        import bot.store.postgres  # noqa: F401
    except ImportError as exc:
        from ._pg import pg_required

        msg = f"bot/store/postgres.py is not importable ({exc})"
        if pg_required():
            pytest.fail("CI (CI=true or DRAFTGATE_REQUIRE_PG=1) but " + msg)
        pytest.skip(msg)
    from ._pg import drop_schema, new_schema_name, require_pg_dsn, with_schema

    dsn = await require_pg_dsn()  # skips, or fails under DRAFTGATE_REQUIRE_PG=1
    schema = new_schema_name("dg_test")
    try:
        yield with_schema(dsn, schema)
    finally:
        await drop_schema(dsn, schema)


@pytest.fixture(params=STORE_BACKENDS)
def store_backend(request) -> str:
    return request.param


@pytest.fixture
async def store_url(store_backend, tmp_path):
    async with make_store_url(store_backend, tmp_path) as url:
        yield url


@pytest.fixture
async def store(store_url):
    s = create_store(store_url)
    await s.open()
    try:
        yield s
    finally:
        await s.close()
