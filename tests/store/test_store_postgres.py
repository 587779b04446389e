"""PostgreSQL-only behaviour of the store: what several pools or processes on one
database must never do (claim a draft twice, queue an item twice, migrate twice,
share a lock). The shared contract runs in tests/test_store_contract.py."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import textwrap
from pathlib import Path

import asyncpg
import pytest

from bot.errors import StoreError
from bot.models import Item, Message
from bot.store import create_store
from bot.store.pg_schema import MIGRATIONS
from bot.store.postgres import PostgresStore
from tests._pg import drop_schema, new_schema_name, pg_url_fixture, require_pg_dsn, with_schema

pytestmark = pytest.mark.postgres

ROOT = Path(__file__).resolve().parents[2]


pg_url = pg_url_fixture()  # a URL for a fresh, empty schema, dropped after the test


def _items(n: int, start: int = 0) -> list[Item]:
    return [Item(f"m{i}", Message(subject=f"subject {i}", from_addr=f"u{i}@example.com"))
            for i in range(start, start + n)]


async def _stores(url: str, n: int) -> list[PostgresStore]:
    stores = [PostgresStore(url) for _ in range(n)]
    await asyncio.gather(*(s.open() for s in stores))
    return stores


async def test_concurrent_opens_migrate_once(pg_url):
    """Five stores opening a new schema at once all succeed and migrate it once."""
    stores = await _stores(pg_url, 5)
    try:
        dsn = await require_pg_dsn()
        con = await asyncpg.connect(dsn)
        try:
            schema = pg_url.rsplit("schema=", 1)[1]
            rows = await con.fetch(f'SELECT version FROM "{schema}".schema_migrations ORDER BY version')
        finally:
            await con.close()
        assert [r["version"] for r in rows] == [v for v, _, _ in MIGRATIONS]
    finally:
        for s in stores:
            await s.close()


async def test_four_pools_claiming_at_once_get_each_draft_once(pg_url):
    """Four pools racing claim() split 300 queued drafts with no draft claimed twice."""
    stores = await _stores(pg_url, 4)
    try:
        await stores[0].admit("p", "inbox", "v1", _items(300))

        async def worker(store: PostgresStore) -> list[tuple[int, int]]:
            got = []
            while batch := await store.claim("p", 60, limit=7):
                assert len(batch) <= 7
                for d in batch:
                    assert d.status == "drafting"
                    assert await store.finish_draft(d.id, d.fence, f"body {d.id}") is not None
                    got.append((d.id, d.fence))
            return got

        results = await asyncio.gather(*(worker(s) for s in stores))
        ids = [i for r in results for i, _ in r]
        fences = [f for r in results for _, f in r]
        assert len(ids) == 300 and len(set(ids)) == 300
        assert len(set(fences)) == 300  # a fence is never handed out twice
        assert await stores[0].count_by_status("p") == {"ready": 300}
    finally:
        for s in stores:
            await s.close()


async def test_two_hosts_admitting_the_same_mail_queue_it_once(pg_url):
    """Two pools admitting overlapping fetches at once queue every item exactly once."""
    a, b = await _stores(pg_url, 2)
    try:
        ra, rb = await asyncio.gather(
            a.admit("p", "inbox", "v1", _items(200), cursor="h1"),
            b.admit("p", "inbox", "v1", _items(200, start=100), cursor="h2"),
        )
        assert not set(ra.new) & set(rb.new)
        assert len(set(ra.new) | set(rb.new)) == 300
        assert ra.already_seen + rb.already_seen == 100
        assert await a.seen_count("p") == 300
        assert await a.count_by_status("p") == {"queued": 300}
        assert await b.get_cursor("p", "inbox") in ("h1", "h2")
    finally:
        await a.close()
        await b.close()


async def test_stale_worker_after_lease_loss_changes_nothing(pg_url):
    """A worker whose lease expired and was re-claimed elsewhere cannot finish the draft."""
    a, b = await _stores(pg_url, 2)
    try:
        await a.admit("p", "inbox", "v1", _items(1), now=1000.0)
        [old] = await a.claim("p", 60, now=1000.0)
        swept = await b.sweep(seen_ttl_days=90, max_attempts=3, now=1100.0)
        assert swept.leases_requeued == 1
        [new] = await b.claim("p", 60, now=1100.0)
        assert new.id == old.id and new.fence > old.fence
        assert await a.finish_draft(old.id, old.fence, "stale body") is None
        done = await b.finish_draft(new.id, new.fence, "fresh body")
        assert done.body == "fresh body" and done.attempt == 1
    finally:
        await a.close()
        await b.close()


async def test_tick_lock_is_held_by_one_host_until_it_expires(pg_url):
    """try_lock across pools: one holder at a time; another takes over after expiry."""
    a, b = await _stores(pg_url, 2)
    try:
        results = await asyncio.gather(
            *(s.try_lock("tick:p", f"host{i}", 30, now=100.0) for i, s in enumerate([a, b] * 5)))
        assert results.count(True) in (1, 5)  # one host wins, and may renew its own lease
        winners = {f"host{i % 2}" for i, ok in enumerate(results) if ok}
        assert len(winners) == 1
        winner = winners.pop()
        loser = "host1" if winner == "host0" else "host0"
        assert await b.try_lock("tick:p", loser, 30, now=120.0) is False
        assert await a.try_lock("tick:p", winner, 30, now=120.0) is True  # renewal
        assert await b.try_lock("tick:p", loser, 30, now=149.0) is False
        assert await b.try_lock("tick:p", loser, 30, now=151.0) is True  # expired
        await a.unlock("tick:p", winner)  # not the holder any more: no effect
        assert await a.try_lock("tick:p", winner, 30, now=152.0) is False
        await b.unlock("tick:p", loser)
        assert await a.try_lock("tick:p", winner, 30, now=152.0) is True
    finally:
        await a.close()
        await b.close()


async def test_schema_in_url_isolates_tables(pg_url):
    """Two schemas on one database see different data; create_store picks Postgres."""
    dsn = await require_pg_dsn()
    other_schema = new_schema_name()
    a = create_store(pg_url)
    b = create_store(with_schema(dsn, other_schema))
    assert isinstance(a, PostgresStore)
    try:
        await a.open()
        await b.open()
        await a.admit("p", "inbox", "v1", _items(3))
        assert await a.seen_count("p") == 3
        assert await b.seen_count("p") == 0
    finally:
        await a.close()
        await b.close()
        await drop_schema(dsn, other_schema)


async def test_a_schema_name_with_capitals_is_its_own_schema():
    """?schema=TeamA must not fold into teama (another deployment's tables)."""
    dsn = await require_pg_dsn()
    upper = "T" + new_schema_name("Case")
    lower = upper.lower()
    a, b = create_store(with_schema(dsn, upper)), create_store(with_schema(dsn, lower))
    try:
        await a.open()
        await b.open()
        await a.admit("p", "inbox", "v1", _items(2))
        assert await a.seen_count("p") == 2
        assert await b.seen_count("p") == 0
    finally:
        await a.close()
        await b.close()
        await drop_schema(dsn, upper)
        await drop_schema(dsn, lower)


def test_bad_schema_name_is_refused_with_a_fix():
    """A schema that is not a plain identifier is refused before connecting."""
    with pytest.raises(StoreError, match="schema=.*plain identifier"):
        PostgresStore("postgresql://u@127.0.0.1/db?schema=x;drop")


async def test_unreachable_server_error_names_it_without_the_password():
    """Connecting to a closed port says what failed and never shows the password."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    store = PostgresStore(f"postgresql://alice:s3cret@127.0.0.1:{port}/db")
    with pytest.raises(StoreError) as info:
        await store.open()
    msg = str(info.value)
    assert f"127.0.0.1:{port}" in msg and "server is running" in msg
    assert "s3cret" not in msg


async def test_methods_before_open_raise_store_error():
    """Using a store that was never opened is a StoreError, not an AttributeError."""
    store = PostgresStore("postgresql://u@127.0.0.1/db")
    with pytest.raises(StoreError, match="not open"):
        await store.seen_count("p")


_CHILD = textwrap.dedent("""
    import asyncio, json, sys
    from bot.store.postgres import PostgresStore

    async def main():
        store = PostgresStore(sys.argv[1])
        await store.open()
        print("ready", flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        got = []
        while batch := await store.claim("p", 60, limit=5):
            for d in batch:
                if await store.finish_draft(d.id, d.fence, "b") is None:
                    raise SystemExit(f"lost fence on {d.id}")
                got.append(d.id)
        await store.close()
        print(json.dumps(got), flush=True)

    asyncio.run(main())
""")


@pytest.mark.slow
async def test_four_processes_migrate_once_and_claim_disjoint_drafts(pg_url):
    """Four processes start on an empty schema at once (one migration), then race
    claims over 400 drafts: every draft is drafted by exactly one of them."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    procs = [await asyncio.create_subprocess_exec(
        sys.executable, "-c", _CHILD, pg_url, cwd=ROOT, env=env,
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE) for _ in range(4)]
    try:
        for p in procs:
            line = await asyncio.wait_for(p.stdout.readline(), 60)
            assert line.strip() == b"ready", (line, await p.stderr.read())
        store = PostgresStore(pg_url)
        await store.open()
        try:
            await store.admit("p", "inbox", "v1", _items(400))
            for p in procs:
                p.stdin.write(b"go\n")
                await p.stdin.drain()
            claimed = []
            for p in procs:
                out, err = await asyncio.wait_for(p.communicate(), 90)
                assert p.returncode == 0, err.decode()
                claimed += json.loads(out.decode().strip().splitlines()[-1])
            assert sorted(claimed) == sorted(set(claimed)) and len(claimed) == 400
            assert await store.count_by_status("p") == {"ready": 400}
        finally:
            await store.close()
    finally:
        for p in procs:
            if p.returncode is None:
                p.kill()
                await p.wait()


async def test_user_without_create_rights_gets_told_how_to_fix_it(pg_url):
    """A login that may not create tables in `public` is told to grant CREATE or name
    a schema it owns; with ?schema= of its own schema the store opens."""
    dsn = await require_pg_dsn()
    role, schema = new_schema_name("role"), new_schema_name("owned")
    admin = await asyncpg.connect(dsn)
    try:
        await admin.execute(f'CREATE ROLE "{role}" LOGIN')
        await admin.execute(f'CREATE SCHEMA "{schema}" AUTHORIZATION "{role}"')
        parts = dsn.split("://", 1)[1].split("@", 1)
        limited = f"postgresql://{role}@{parts[-1]}"
        with pytest.raises(StoreError, match="Grant this user CREATE.*schema=NAME"):
            await PostgresStore(limited).open()
        store = PostgresStore(with_schema(limited, schema))
        await store.open()
        try:
            await store.admit("p", "inbox", "v1", _items(2))
            assert await store.seen_count("p") == 2
        finally:
            await store.close()
    finally:
        await admin.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        await admin.execute(f'DROP ROLE IF EXISTS "{role}"')
        await admin.close()


async def test_a_newer_schema_is_refused_not_downgraded(pg_url):
    """A database migrated by a newer draftgate is refused with the fix (upgrade)."""
    store = PostgresStore(pg_url)
    await store.open()
    await store.close()
    dsn = await require_pg_dsn()
    schema = pg_url.rsplit("schema=", 1)[1]
    con = await asyncpg.connect(dsn)
    try:
        await con.execute(f'INSERT INTO "{schema}".schema_migrations VALUES (999, $1, 0)', "future")
    finally:
        await con.close()
    with pytest.raises(StoreError, match="schema version 999.*upgrade draftgate"):
        await PostgresStore(pg_url).open()


async def test_another_apps_schema_migrations_table_is_not_mistaken_for_ours(pg_url):
    """A schema holding some other tool's schema_migrations is refused, naming ?schema=."""
    dsn = await require_pg_dsn()
    schema = pg_url.rsplit("schema=", 1)[1]
    con = await asyncpg.connect(dsn)
    try:
        await con.execute(f'CREATE SCHEMA "{schema}"')
        await con.execute(f'CREATE TABLE "{schema}".schema_migrations (version varchar PRIMARY KEY)')
    finally:
        await con.close()
    with pytest.raises(StoreError, match=r"not draftgate's.*\?schema=draftgate"):
        await PostgresStore(pg_url).open()


async def test_a_dropped_connection_fails_one_call_and_the_store_recovers(pg_url):
    """A server-side disconnect (restart, failover) is a StoreError for the call that
    hit it, never a hang or a raw asyncpg error; the pool reconnects for the next."""
    store = PostgresStore(pg_url, max_size=1)
    await store.open()
    try:
        await store.admit("p", "inbox", "v1", _items(1))
        async with store._conn() as con:  # the pool's only connection
            pid = await con.fetchval("SELECT pg_backend_pid()")
        admin = await asyncpg.connect(await require_pg_dsn())
        try:
            assert await admin.fetchval("SELECT pg_terminate_backend($1)", pid)
        finally:
            await admin.close()
        outcomes = []
        for _ in range(3):
            try:
                outcomes.append(await store.seen_count("p"))
            except StoreError as e:
                outcomes.append(str(e))
        assert outcomes[1:] == [1, 1]  # at most the first call fails
        assert all(o == 1 or "PostgreSQL store" in o for o in outcomes)
    finally:
        await store.close()


async def test_nul_in_model_output_is_stored_visibly_not_failed_forever(pg_url):
    """PostgreSQL text cannot hold NUL: a body with one is stored with U+FFFD instead of
    failing the draft on every retry; the audit hash is of the stored text."""
    store = PostgresStore(pg_url)
    await store.open()
    try:
        await store.admit("p", "inbox", "v1", [Item("m1", Message(subject="a\x00b"))])
        [d] = await store.claim("p", 60)
        done = await store.finish_draft(d.id, d.fence, "Hi\x00there")
        assert done.body == "Hi\ufffdthere" and done.message.subject == "a\x00b"
        posted = await store.mark_posted(done.id, done.version, "1", "2")
        edited = await store.edit(posted.id, posted.version, "new\x00body", "anna")
        assert edited.body == "new\ufffdbody"
        from bot.models import sha256_text
        [entry] = [e for e in await store.audit_log(edited.key) if e.action == "edit"]
        assert entry.text_sha256 == sha256_text("new\ufffdbody")
    finally:
        await store.close()


async def test_audit_rows_cannot_be_changed_deleted_or_truncated(pg_url):
    """The database itself refuses to rewrite history, whoever connects (as the SQLite
    store's triggers do): UPDATE, DELETE and TRUNCATE of the audit table all fail,
    and the row is still there, unchanged, for ``audit verify``."""
    from bot.store.postgres import parse_pg_url

    async with create_store(pg_url) as store:
        await store.audit("anna", "note", "k", text="t")
    dsn, schema = parse_pg_url(pg_url)
    con = await asyncpg.connect(dsn, server_settings={"search_path": schema})
    try:
        for sql in ("UPDATE audit SET actor = 'mallory'", "DELETE FROM audit",
                    "TRUNCATE audit"):
            with pytest.raises(asyncpg.PostgresError, match="append-only"):
                await con.execute(sql)
        assert [tuple(r) for r in await con.fetch("SELECT actor, action FROM audit")] == [
            ("anna", "note")]
    finally:
        await con.close()
    async with create_store(pg_url) as store:
        assert (await store.verify_audit()).ok
