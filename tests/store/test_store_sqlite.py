"""SQLite-only behaviour of the store: connection pragmas, migrations, lock handling,
clean shutdown. The shared contract runs in tests/test_store_contract.py."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from bot.errors import StoreError
from bot.models import Item, Message
from bot.store import create_store
from bot.store.schema import LATEST
from bot.store.sqlite import SQLiteStore

ROOT = Path(__file__).resolve().parents[2]


def _items(*ids: str) -> list[Item]:
    return [Item(i, Message(subject=f"s {i}", body="b", to=["x@y"], headers={"h": "v"}))
            for i in ids]


async def _wait_for(predicate, timeout: float = 10.0) -> None:
    async def poll() -> None:
        while not predicate():
            await asyncio.sleep(0.005)
    await asyncio.wait_for(poll(), timeout)


async def test_open_creates_directories_and_a_wal_database(tmp_path):
    path = tmp_path / "a" / "b" / "state.db"
    async with create_store(f"sqlite:///{path}") as store:
        pragmas = [(await store._query(f"PRAGMA {p}"))[0][0]
                   for p in ("journal_mode", "synchronous", "busy_timeout")]
    assert pragmas == ["wal", 1, 5000]  # synchronous 1 = NORMAL
    raw = sqlite3.connect(path)
    assert raw.execute("PRAGMA user_version").fetchone()[0] == LATEST
    raw.close()


async def test_relative_url_is_resolved_against_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    async with SQLiteStore("sqlite:///data/state.db") as store:
        assert store.path == str(tmp_path / "data" / "state.db")
    assert (tmp_path / "data" / "state.db").exists()


@pytest.mark.parametrize("url", ["sqlite://host/x.db", "sqlite:///", "sqlite:///x.db?mode=ro",
                                 "postgres-ish:///x.db"])
def test_bad_urls_say_what_is_expected(url):
    with pytest.raises(StoreError, match="sqlite:////absolute/path"):
        SQLiteStore(url)


async def test_an_uncreatable_directory_is_a_clear_error(tmp_path):
    (tmp_path / "file").write_text("not a directory")
    with pytest.raises(StoreError, match="cannot create the directory"):
        await SQLiteStore(f"sqlite:///{tmp_path}/file/sub/state.db").open()


async def test_a_closed_store_refuses_work_and_close_twice_is_fine(tmp_path):
    store = SQLiteStore(f"sqlite:///{tmp_path}/s.db")
    with pytest.raises(StoreError, match="not open"):
        await store.paused()
    await store.open()
    await store.close()
    await store.close()
    with pytest.raises(StoreError, match="not open"):
        await store.paused()


async def test_data_survives_reopening_and_migrations_do_not_rerun(tmp_path):
    url = f"sqlite:///{tmp_path}/s.db"
    async with SQLiteStore(url) as store:
        await store.admit("p", "s", "v1", _items("m1"))
    async with SQLiteStore(url) as store:
        assert await store.count_by_status("p") == {"queued": 1}
        assert await store.seen_count("p") == 1


async def test_a_database_from_a_newer_draftgate_is_refused(tmp_path):
    path = tmp_path / "s.db"
    raw = sqlite3.connect(path)
    raw.execute(f"PRAGMA user_version = {LATEST + 1}")
    raw.close()
    with pytest.raises(StoreError, match=f"schema version {LATEST + 1}.*upgrade draftgate"):
        await SQLiteStore(f"sqlite:///{path}").open()


async def test_many_stores_opening_a_new_file_at_once_all_migrate_it_safely(tmp_path):
    stores = [SQLiteStore(f"sqlite:///{tmp_path}/s.db") for _ in range(6)]
    try:
        await asyncio.gather(*(s.open() for s in stores))
        results = await asyncio.gather(*(s.admit("p", "s", "v1", _items("m1", f"own{n}"))
                                         for n, s in enumerate(stores)))
    finally:
        await asyncio.gather(*(s.close() for s in stores))
    assert sum(len(r.new) for r in results) == 7  # m1 once, plus each store's own item


async def test_payload_is_the_json_of_message_to_dict(tmp_path):
    path = tmp_path / "s.db"
    item = _items("m1")[0]
    async with SQLiteStore(f"sqlite:///{path}") as store:
        await store.admit("p", "s", "v1", [item])
    raw = sqlite3.connect(path)
    [(payload,)] = raw.execute("SELECT payload FROM drafts").fetchall()
    raw.close()
    assert json.loads(payload) == item.message.to_dict()


async def test_audit_rows_cannot_be_changed_or_deleted(tmp_path):
    path = tmp_path / "s.db"
    async with SQLiteStore(f"sqlite:///{path}") as store:
        await store.audit("anna", "note", "k", text="t")
    raw = sqlite3.connect(path)
    try:
        for sql in ("UPDATE audit SET actor = 'mallory'", "DELETE FROM audit"):
            with pytest.raises(sqlite3.DatabaseError, match="append-only"):
                raw.execute(sql)
    finally:
        raw.close()


async def test_a_writer_holding_the_lock_past_busy_timeout_delays_work_but_loses_nothing(tmp_path):
    """SQLITE_BUSY that outlasts busy_timeout is retried: the admit waits, then lands."""
    path = tmp_path / "s.db"
    async with SQLiteStore(f"sqlite:///{path}", busy_timeout_ms=20) as store:
        other = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        other.execute("BEGIN IMMEDIATE")
        task = asyncio.create_task(store.admit("p", "s", "v1", _items("m1")))
        await _wait_for(lambda: store.busy_retries >= 2)
        assert not task.done()
        other.execute("COMMIT")
        other.close()
        result = await asyncio.wait_for(task, 30)
        assert len(result.new) == 1


async def test_a_lock_held_beyond_the_retry_budget_is_a_store_error_naming_the_cause(tmp_path):
    path = tmp_path / "s.db"
    async with SQLiteStore(f"sqlite:///{path}", busy_timeout_ms=10, retry_for=0.2) as store:
        other = sqlite3.connect(path, isolation_level=None)
        other.execute("BEGIN IMMEDIATE")
        try:
            with pytest.raises(StoreError, match="stayed locked"):
                await store.admit("p", "s", "v1", _items("m1"))
        finally:
            other.execute("ROLLBACK")
            other.close()
        # Nothing half-done: the next call works and finds nothing admitted.
        assert await store.seen_count("p") == 0
        assert len((await store.admit("p", "s", "v1", _items("m1"))).new) == 1


async def test_a_cancelled_caller_leaves_no_open_transaction(tmp_path):
    async with SQLiteStore(f"sqlite:///{tmp_path}/s.db") as store:
        tasks = [asyncio.create_task(store.admit("p", "s", "v1", _items(f"m{n}")))
                 for n in range(10)]
        await asyncio.sleep(0)
        for t in tasks[::2]:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        # Every admit either happened completely or not at all, and the store still works.
        count = await store.seen_count("p")
        assert (await store.count_by_status("p")).get("queued", 0) == count
        assert store._conn.in_transaction is False
        assert len((await store.admit("p", "s", "v1", _items("late"))).new) == 1


def test_a_process_that_closes_its_store_exits_promptly(tmp_path):
    script = textwrap.dedent(f"""
        import asyncio, sys
        sys.path.insert(0, {str(ROOT)!r})
        from bot.store import create_store
        async def main():
            store = create_store({f"sqlite:///{tmp_path}/s.db"!r})
            await store.open()
            await store.set_paused("p", True, "anna")
            await store.close()
        asyncio.run(main())
        print("done")
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "done"


async def test_close_waits_for_a_running_transaction(tmp_path):
    url = f"sqlite:///{tmp_path}/s.db"
    store = SQLiteStore(url)
    await store.open()
    admitting = asyncio.create_task(store.admit("p", "s", "v1", _items("m1", "m2")))
    await asyncio.sleep(0)  # the admit is under way
    await store.close()
    assert len((await admitting).new) == 2
    async with SQLiteStore(url) as again:
        assert await again.seen_count("p") == 2


async def test_an_admit_or_a_decision_without_the_chain_head_writes_nothing(tmp_path):
    """Both SQLite append paths (admit's, which chains after the head its inserts
    return, and the one-statement append of a decision) refuse when the head row was
    removed, and roll back: no seen mark, no draft, no state change without its row."""
    path = tmp_path / "state.db"
    async with create_store(f"sqlite:///{path}") as store:
        await store.admit("p", "inbox", "v1", _items("a"))
        [d] = await store.claim("p", 600)
        raw = sqlite3.connect(path)
        raw.execute("DELETE FROM audit_head")
        raw.commit()
        raw.close()
        with pytest.raises(StoreError, match="audit chain's head .* is missing"):
            await store.admit("p", "inbox", "v1", _items("b", "c"))
        assert await store.unseen("p", "inbox", ["b", "c"]) == {"b", "c"}
        with pytest.raises(StoreError, match="audit chain's head .* is missing"):
            await store.finish_draft(d.id, d.fence, "Hello")
        assert (await store.get_draft(d.id)).status == "drafting"
        assert [r["action"] for r in await store.audit_export()] == ["admit"]


async def test_a_row_appended_past_the_head_from_outside_is_named_by_verify(tmp_path):
    """The head follows the store's own appends (a trigger on its connection only): a
    correctly hashed row inserted at the end by another connection leaves the head
    behind, and verify names that row as inserted."""
    from bot.store import chain

    path = tmp_path / "state.db"
    async with create_store(f"sqlite:///{path}") as store:
        await store.admit("p", "inbox", "v1", _items("a", "b"))
        await store.audit("anna", "note", None, "by the store")
        assert (await store.verify_audit()).ok
        raw = sqlite3.connect(path)
        seq, prev = raw.execute(chain.HEAD_SQL).fetchone()
        record = (1.7e9, "mallory", "approve", None, None, "v1")
        forged = raw.execute(chain.INSERT_SQL, (*record, seq + 1, prev,
                                                chain.row_hash(prev, seq + 1, record))).lastrowid
        raw.commit()
        assert raw.execute(chain.HEAD_SQL).fetchone() == (seq, prev)
        raw.close()
        report = await store.verify_audit()
        assert not report.ok and report.problem == (
            f"audit row #{forged} was inserted: it is past the store's chain head "
            f"(position {seq})")
