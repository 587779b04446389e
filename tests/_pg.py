"""PostgreSQL test plumbing: a throwaway schema per test on DRAFTGATE_TEST_PG_DSN.

Without the variable the Postgres tests skip, saying how to run them. With
``DRAFTGATE_REQUIRE_PG=1`` (set by ``.ci/run``) or ``CI=true`` (set by GitHub Actions,
GitLab CI and most other CI services) a missing variable or an unreachable server fails
instead, so no CI path can pass by skipping them.
"""

from __future__ import annotations

import os
import uuid
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import asyncpg
import pytest


def pg_required() -> bool:
    """True in CI: PostgreSQL tests fail rather than skip without a server."""
    return os.environ.get("DRAFTGATE_REQUIRE_PG") == "1" or os.environ.get("CI") == "true"


def _why() -> str:
    return "DRAFTGATE_REQUIRE_PG=1" if os.environ.get("DRAFTGATE_REQUIRE_PG") == "1" else "CI=true"


async def require_pg_dsn() -> str:
    """The server DSN, after checking it answers; skips or fails as described above."""
    dsn = os.environ.get("DRAFTGATE_TEST_PG_DSN", "")
    if not dsn:
        msg = ("PostgreSQL tests need DRAFTGATE_TEST_PG_DSN, e.g. "
               "DRAFTGATE_TEST_PG_DSN=postgresql://postgres@127.0.0.1:5432/test")
        if pg_required():
            pytest.fail(f"{_why()} but " + msg)
        pytest.skip(msg)
    try:
        con = await asyncpg.connect(dsn, timeout=5)
    except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError, TimeoutError) as e:
        msg = f"PostgreSQL at DRAFTGATE_TEST_PG_DSN is unreachable: {type(e).__name__}: {e}"
        if pg_required():
            pytest.fail(f"{_why()} and " + msg)
        pytest.skip(msg)
    await con.close()
    return dsn


def with_schema(dsn: str, schema: str) -> str:
    """``dsn`` with ``?schema=NAME`` added (other query parameters kept)."""
    parts = urlsplit(dsn)
    query = [(k, v) for k, v in parse_qsl(parts.query) if k != "schema"] + [("schema", schema)]
    return urlunsplit(parts._replace(query=urlencode(query)))


def new_schema_name(prefix: str = "t") -> str:
    return f"{prefix}_{uuid.uuid4().hex[:16]}"


async def drop_schema(dsn: str, schema: str) -> None:
    con = await asyncpg.connect(dsn, timeout=5)
    try:
        await con.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    finally:
        await con.close()


def pg_url_fixture(prefix: str = "t"):
    """A ``pg_url`` fixture for a module: the URL of a fresh, empty schema named
    ``prefix_<random>`` on DRAFTGATE_TEST_PG_DSN (skips or fails as described above),
    dropped after the test. Use: ``pg_url = pg_url_fixture("audit")``."""

    @pytest.fixture
    async def pg_url():
        dsn = await require_pg_dsn()
        schema = new_schema_name(prefix)
        yield with_schema(dsn, schema)
        await drop_schema(dsn, schema)

    return pg_url
