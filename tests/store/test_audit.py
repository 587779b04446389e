"""The audit anyone can verify, and one item's history: `draftgate audit show|verify|export`
on a store written by a full flow, the same store tampered with through the sqlite3
module, rows written before the chain existed, and /audit in Telegram."""

from __future__ import annotations

import asyncio
import json
import re
import sqlite3
from pathlib import Path

import pytest

from bot.__main__ import main
from bot.store import chain, create_store
from bot.store.schema import MIGRATIONS
from tests._pg import pg_url_fixture
from tests.support.demo import demo_deployment, flow_demo

ROOT = Path(__file__).resolve().parents[2]
ORDER = "<CAF1234.order-question@mail.customer.example>"


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.fixture
def flowed(tmp_path: Path) -> Path:
    """The demo deployment after a full flow: 8 mails admitted (3 skipped), 5 drafted by
    the template model, approved and sent through the outbox."""
    cfg = demo_deployment(tmp_path)
    asyncio.run(flow_demo(cfg))
    return cfg


def _db(cfg: Path) -> sqlite3.Connection:
    return sqlite3.connect(cfg.parent / "state.db", isolation_level=None)


def _rows(cfg: Path) -> int:
    with _db(cfg) as db:
        return db.execute("SELECT count(*) FROM audit").fetchone()[0]


def test_show_gives_the_history_of_an_item_after_a_full_flow(flowed, capsys):
    code, out, _ = run(capsys, "audit", "show", "demo", ORDER, "-c", str(flowed))
    assert code == 0, out
    lines = out.splitlines()
    assert lines[0] == f"demo · item {ORDER} (times UTC)"
    assert lines[1].startswith("#") and " sent as demo-" in lines[1] and "Where is my order" in lines[1]
    events = [line[20:] for line in lines[2:]]  # after "YYYY-MM-DD HH:MM:SS "
    assert events[0] == "admitted: queued"
    assert events[1].startswith("drafted: v1 by template:") and " tokens (in " in events[1]
    assert events[2] == "approved by demo-auto-approve: v1"
    assert events[3].startswith("sent by demo-auto-approve: v1, message id demo-")
    assert len(events) == 4
    code, out, _ = run(capsys, "audit", "show", "demo", ORDER, "--json", "-c", str(flowed))
    h = json.loads(out)
    assert [e["action"] for e in h["events"]] == ["admit", "draft", "approve", "sent"]
    assert h["events"][2]["text_sha256"] == h["events"][3]["text_sha256"]  # the text sent
    code, out, _ = run(capsys, "audit", "show", "demo", "<nope@x>", "-c", str(flowed))
    assert code == 1 and out.startswith("nothing known about item <nope@x> in demo")


def test_verify_passes_after_a_full_flow_and_names_a_changed_row(flowed, capsys):
    total = _rows(flowed)
    code, out, _ = run(capsys, "audit", "verify", "-c", str(flowed))
    assert code == 0 and out.startswith(f"audit chain intact: {total} row(s) checked; head: "
                                        f"position {total}, sha256 ")
    with _db(flowed) as db:  # what someone with the file could do
        db.execute("DROP TRIGGER audit_no_update")
        old = db.execute("SELECT detail FROM audit WHERE id = 7").fetchone()[0]
        db.execute("UPDATE audit SET detail = 'v1, message id nothing' WHERE id = 7")
    code, out, _ = run(capsys, "audit", "verify", "-c", str(flowed))
    assert code == 1
    assert out.startswith("audit chain broken (store): audit row #7 was changed: its content "
                          "no longer matches its hash. 6 row(s) before it are intact.")
    with _db(flowed) as db:  # the hash recomputed too: the next row gives it away
        r = db.execute("SELECT prev_hash, seq, at, actor, action, draft_key, text_sha256, "
                       "detail FROM audit WHERE id = 7").fetchone()
        db.execute("UPDATE audit SET hash = ? WHERE id = 7",
                   (chain.row_hash(r[0], r[1], r[2:]),))
    code, out, _ = run(capsys, "audit", "verify", "-c", str(flowed))
    assert code == 1 and "audit row #7 was changed and its hash rewritten (#8 records" in out
    with _db(flowed) as db:
        db.execute("UPDATE audit SET detail = ? WHERE id = 7", (old,))
        db.execute("UPDATE audit SET hash = ? WHERE id = 7",
                   (chain.row_hash(r[0], r[1], (*r[2:7], old)),))
    code, out, _ = run(capsys, "audit", "verify", "-c", str(flowed))
    assert code == 0, out  # back as it was: intact again


def test_verify_names_a_removed_row_and_an_inserted_one(flowed, capsys):
    total = _rows(flowed)
    with _db(flowed) as db:
        db.execute("DROP TRIGGER audit_no_delete")
        saved = db.execute("SELECT * FROM audit WHERE id = 5").fetchone()
        db.execute("DELETE FROM audit WHERE id = 5")
    code, out, _ = run(capsys, "audit", "verify", "-c", str(flowed))
    assert code == 1 and "audit row #5 was removed: chain positions 5..5 are missing " \
                         "between #4 and #6" in out
    with _db(flowed) as db:
        db.execute(f"INSERT INTO audit VALUES ({', '.join('?' * len(saved))})", saved)
        last = db.execute("SELECT id FROM audit ORDER BY id DESC LIMIT 1").fetchone()[0]
        db.execute("DELETE FROM audit WHERE id = ?", (last,))  # the newest one
    code, out, _ = run(capsys, "audit", "verify", "-c", str(flowed))
    assert code == 1 and f"the last audit row(s) were removed: the chain ends at position " \
                         f"{total - 1} (#{last - 1})" in out

    def forge(db, seq: int, prev: str) -> int:
        record = (1.7e9, "mallory", "approve", None, None, "v1")
        cur = db.execute(chain.INSERT_SQL, (*record, seq, prev, chain.row_hash(prev, seq, record)))
        return cur.lastrowid

    with _db(flowed) as db:  # a row in the middle, hashed as draftgate would
        prev = db.execute("SELECT hash FROM audit WHERE seq = 3").fetchone()[0]
        db.execute("DROP INDEX audit_seq")
        forged = forge(db, 4, prev)
    code, out, _ = run(capsys, "audit", "verify", "-c", str(flowed))
    assert code == 1 and f"audit row #{forged} was inserted: chain position 4 already " \
                         f"belongs to #4" in out
    with _db(flowed) as db:
        db.execute("DELETE FROM audit WHERE id = ?", (forged,))
        db.execute("INSERT INTO audit (at, actor, action) VALUES (1.7e9, 'mallory', 'note')")
        loose = db.execute("SELECT max(id) FROM audit").fetchone()[0]
    code, out, _ = run(capsys, "audit", "verify", "-c", str(flowed))
    assert code == 1 and f"audit row #{loose} is not part of the chain" in out
    with _db(flowed) as db:
        db.execute("DELETE FROM audit WHERE id = ?", (loose,))
        db.execute("DELETE FROM audit_head")
    code, out, _ = run(capsys, "audit", "verify", "-c", str(flowed))
    assert code == 1 and "the chain head (the one row of table audit_head) was removed" in out
    # Nothing audited can be written then, and the operator is told why.
    code, _, err = run(capsys, "replay", "demo", ORDER, "-c", str(flowed))
    assert code == 1 and "audit chain's head (the one row of table audit_head) is missing" in err


def _swap_ids(db, a: int, b: int) -> None:
    """Swap two audit rows' ids (which the chain does not cover)."""
    db.execute("UPDATE audit SET id = -1 WHERE id = ?", (a,))
    db.execute("UPDATE audit SET id = ? WHERE id = ?", (a, b))
    db.execute("UPDATE audit SET id = ? WHERE id = -1", (b,))


def _show_actions(capsys, cfg: Path) -> list[str]:
    code, out, _ = run(capsys, "audit", "show", "demo", ORDER, "--json", "-c", str(cfg))
    assert code == 0, out
    return [e["action"] for e in json.loads(out)["events"]]


def test_verify_names_a_row_it_cannot_read_instead_of_crashing(flowed, capsys):
    """A chain position that is text, or a time of 9e999 (infinity): verify names the
    row and exits 1; it does not crash with a traceback."""
    with _db(flowed) as db:
        db.execute("DROP TRIGGER audit_no_update")
        db.execute("UPDATE audit SET seq = 'five' WHERE id = 5")
    code, out, err = run(capsys, "audit", "verify", "-c", str(flowed))
    assert code == 1, (out, err)
    assert out.startswith("audit chain broken (store): audit row #5 was changed: its chain "
                          "position is 'five', not a whole number"), out
    assert "Traceback" not in err
    with _db(flowed) as db:
        db.execute("UPDATE audit SET seq = 5 WHERE id = 5")
        db.execute("UPDATE audit SET at = 9e999 WHERE id = 6")
    code, out, err = run(capsys, "audit", "verify", "-c", str(flowed))
    assert code == 1 and "Traceback" not in err
    assert out.startswith("audit chain broken (store): audit row #6 was changed: its time is "
                          "inf, not a finite number. 5 row(s) before it are intact."), out
    with _db(flowed) as db:
        db.execute("UPDATE audit SET at = 'noon' WHERE id = 6")
    code, out, _ = run(capsys, "audit", "verify", "-c", str(flowed))
    assert code == 1 and "audit row #6 was changed: its time is 'noon'" in out


def test_an_export_with_an_unreadable_row_is_named_not_a_crash(flowed, capsys, tmp_path):
    target = tmp_path / "audit.jsonl"
    assert run(capsys, "audit", "export", "--since", "2000-01-01", "-o", str(target),
               "-c", str(flowed))[0] == 0
    rows = [json.loads(line) for line in target.read_text().splitlines()]
    rows[2]["at"] = "9e999"
    target.write_text("".join(json.dumps(r) + "\n" for r in rows))
    code, out, _ = run(capsys, "audit", "verify", "--file", str(target))
    assert code == 1 and f"audit row #{rows[2]['id']} was changed: its time is '9e999'" in out
    target.write_text("".join(json.dumps(r) + "\n" for r in rows).replace('"9e999"', "9e999"))
    code, out, _ = run(capsys, "audit", "verify", "--file", str(target))
    assert code == 1 and f"audit row #{rows[2]['id']} was changed: its time is inf" in out


def test_swapping_row_ids_does_not_change_the_order_shown(flowed, capsys):
    """`audit show` orders by chain position: the ids, which the hashes do not cover,
    can be swapped and the history still reads approved before sent."""
    assert _show_actions(capsys, flowed) == ["admit", "draft", "approve", "sent"]
    with _db(flowed) as db:
        key = db.execute("SELECT key FROM drafts WHERE item_id = ?", (ORDER,)).fetchone()[0]
        ids = dict(db.execute("SELECT action, id FROM audit WHERE draft_key = ?", (key,)))
        db.execute("DROP TRIGGER audit_no_update")
        _swap_ids(db, ids["approve"], ids["sent"])
        _swap_ids(db, ids["admit"], ids["draft"])
    assert _show_actions(capsys, flowed) == ["admit", "draft", "approve", "sent"]
    code, out, _ = run(capsys, "audit", "show", "demo", ORDER, "-c", str(flowed))
    assert [line[20:].split(":")[0] for line in out.splitlines()[2:]] == [
        "admitted", "drafted", "approved by demo-auto-approve", "sent by demo-auto-approve"]


def test_export_writes_json_lines_that_verify_anywhere(flowed, capsys, tmp_path):
    total = _rows(flowed)
    target = tmp_path / "audit.jsonl"
    code, out, _ = run(capsys, "audit", "export", "--since", "2000-01-01", "-o", str(target),
                       "-c", str(flowed))
    assert code == 0 and out.strip() == f"{total} audit row(s) written to {target}"
    rows = [json.loads(line) for line in target.read_text().splitlines()]
    assert [r["seq"] for r in rows] == list(range(1, total + 1))
    assert set(rows[0]) == set(chain.CHAIN_COLS) and rows[0]["action"] == "admit"
    code, out, _ = run(capsys, "audit", "verify", "--file", str(target))
    assert code == 0 and out.startswith(f"audit chain intact: {total} row(s) checked")
    # From a moment on: the first row written since then and every later one, which
    # verify checks from the first row's recorded prev_hash.
    since = rows[10]["at"]
    code, out, _ = run(capsys, "audit", "export", "--since",
                       __import__("datetime").datetime.fromtimestamp(
                           since, __import__("datetime").timezone.utc).isoformat(),
                       "-c", str(flowed))
    tail = [json.loads(line) for line in out.splitlines()]
    assert tail and tail[-1] == rows[-1] and all(r["at"] >= since for r in tail[:1])
    rows[3]["detail"] = "tampered"
    target.write_text("".join(json.dumps(r) + "\n" for r in rows))
    code, out, _ = run(capsys, "audit", "verify", "--file", str(target))
    assert code == 1 and f"audit row #{rows[3]['id']} was changed" in out
    code, out, _ = run(capsys, "audit", "export", "--since", "2100-01-01", "-c", str(flowed))
    assert code == 0 and out == ""
    code, _, err = run(capsys, "audit", "export", "--since", "yesterday", "-c", str(flowed))
    assert code == 2 and "--since: expected a date like 2026-12-01" in err
    target.write_text("not json\n")
    code, _, err = run(capsys, "audit", "verify", "--file", str(target))
    assert code == 2 and "line 1 is not an audit row" in err


def test_rows_written_before_the_chain_are_chained_in_id_order(tmp_path):
    """A store from before the chain (schema 2) with audit rows: the migration chains
    them in id order, verify passes, and new rows go on from there."""
    path = tmp_path / "old.db"
    db = sqlite3.connect(path, isolation_level=None)
    for statement in MIGRATIONS[0] + MIGRATIONS[1]:
        db.execute(statement)
    db.execute("PRAGMA user_version = 2")
    for i in range(5):
        db.execute("INSERT INTO audit (at, actor, action, draft_key, detail) VALUES "
                   "(?, 'anna', 'approve', ?, 'v1')", (1000.0 + i, f"k{i}"))
    db.close()

    async def check():
        async with create_store(f"sqlite:///{path}") as store:
            assert (await store.verify_audit()).checked == 5
            await store.audit("bo", "note", "k9", now=2000.0)
            report = await store.verify_audit()
            assert report.ok and report.checked == 6
            rows = await store.audit_export()
            assert [(r["id"], r["seq"]) for r in rows] == [(i, i) for i in range(1, 7)]
            assert rows[0]["prev_hash"] == chain.GENESIS
            assert all(a["hash"] == b["prev_hash"] for a, b in zip(rows, rows[1:], strict=False))

    asyncio.run(check())


def test_migrate_store_keeps_verify_passing(flowed, capsys, tmp_path):
    copy = tmp_path / "copy.db"
    code, out, _ = run(capsys, "migrate-store", "--from", f"sqlite:///{flowed.parent / 'state.db'}",
                       "--to", f"sqlite:///{copy}")
    assert code == 0, out
    cfg = tmp_path / "copy.yaml"
    cfg.write_text(f"store: sqlite:///{copy}\npipelines: {flowed.parent}/pipelines/*.yaml\n")
    total = _rows(flowed)
    code, out, _ = run(capsys, "audit", "verify", "-c", str(cfg))
    assert code == 0 and out.startswith(f"audit chain intact: {total} row(s) checked"), out


# -- /audit in Telegram, after a flow with an edit and a second operator's approval ------

@pytest.fixture
async def world(tmp_path, monkeypatch):
    from bot.models import DraftResult
    from tests.fakes.telegram import FakeTelegram
    from tests.support.telegram_world import TOKEN_ENV, EchoDrafter, World, write_config

    class NamedModel(EchoDrafter):
        async def draft(self, request):
            r = await super().draft(request)
            return DraftResult(r.body, r.tokens_in, r.tokens_out, model="echo-1")

    with FakeTelegram() as fake:
        monkeypatch.setenv(TOKEN_ENV, fake.token)
        w = World(tmp_path, fake, write_config(tmp_path, fake))
        w.drafter = NamedModel()
        await w.start()
        try:
            yield w
        finally:
            await w.stop()


async def test_audit_command_gives_the_history_of_an_item(world):
    """/audit support <id>: admitted, drafted v1 by the model with its tokens, edited by
    Anna, approved by Bo, sent as the sender's id, each with its time; verify passes."""
    from tests.support.telegram_world import ANNA, BO, SUPPORT_CHAT

    d = await world.deliver(1)
    fake = world.fake
    fake.say(ANNA, SUPPORT_CHAT, "Shorter: it ships Monday.", reply_to=int(d.approval_message_id),
             first_name="Anna")
    await fake.await_for(lambda: [m for m in fake.chat_messages(SUPPORT_CHAT)
                                  if m.text.startswith("✏️")], 30)
    d = await world.draft(d)
    assert d.version == 2
    assert await world.tap(d, "ap", user=BO, first_name="Bo") == "✅ Sent."

    answer = await world.say("/audit support <order-1@customer.example>", user=BO)
    lines = answer.splitlines()
    assert lines[0] == "support · item <order-1@customer.example> (times UTC)"
    assert lines[1] == (f"#{d.id} v2 sent as msg-{d.id} · Order 1 · from "
                        "alice1@customer.example")
    assert [line[20:] for line in lines[2:]] == [
        "admitted: queued",
        "drafted: v1 by echo-1, 30 tokens (in 10, out 20)",
        # Anna's edit promises a day no source gave (the grounding check, issue 24).
        f"edited by tg:{ANNA} (Anna): v1 -> v2; not in the sources: Monday",
        f"approved by tg:{BO} (Bo): v2",
        f"sent by tg:{BO} (Bo): v2, message id msg-{d.id}"]
    assert all(re.match(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d ", line) for line in lines[2:])
    report = await world.store.verify_audit()
    assert report.ok and report.checked == len(await world.store.audit_log(limit=1000))

    assert (await world.say("/audit support")).startswith("Usage: /audit <pipeline> <item_id>")
    assert "unknown pipeline 'nope'" in await world.say("/audit nope <x>")
    assert (await world.say("/audit support <x@y>")).startswith("nothing known about item <x@y>")


# -- PostgreSQL: several writers, one chain ------------------------------------------------

pg_url = pg_url_fixture("audit")  # a fresh PostgreSQL schema per test


async def _pg_exec(url: str, *statements: str | tuple) -> list:
    """Run statements as someone with the database's password could, outside draftgate."""
    import asyncpg

    from bot.store.postgres import parse_pg_url

    dsn, schema = parse_pg_url(url)
    con = await asyncpg.connect(dsn, server_settings={"search_path": schema})
    try:
        out = []
        for sql in statements:
            out.append(await con.fetch(*sql) if isinstance(sql, tuple) else await con.fetch(sql))
        return out
    finally:
        await con.close()


@pytest.mark.postgres
async def test_three_processes_writing_at_once_keep_one_valid_chain(pg_url):
    """Three real processes append concurrently (admit, draft, approve, note); the chain
    verifies, and changing, removing or inserting a row is then named."""
    import subprocess
    import sys

    per, n = 12, 3
    async with create_store(pg_url):
        pass  # migrated once, before the writers
    procs = [subprocess.Popen([sys.executable, "-m", "tests._audit_writer", pg_url, f"p{i}",
                               str(per)], cwd=ROOT, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True) for i in range(n)]
    try:
        for p in procs:
            assert await asyncio.wait_for(asyncio.to_thread(p.stdout.readline), 60) == "ready\n"
        for p in procs:  # all open: go
            p.stdin.write("go\n")
            p.stdin.flush()
        for p in procs:
            assert await asyncio.wait_for(asyncio.to_thread(p.wait), 120) == 0
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(10)
            p.stdin.close()
            p.stdout.close()
    total = per * n * 4
    async with create_store(pg_url) as store:
        report = await store.verify_audit()
        assert report.ok and report.checked == total, report
        rows = await store.audit_export()
        assert [r["seq"] for r in rows] == list(range(1, total + 1))
        [[head]] = await _pg_exec(pg_url, "SELECT seq, hash FROM audit_head")
        assert tuple(head) == report.head

        victim = rows[40]
        await _pg_exec(pg_url, "ALTER TABLE audit DISABLE TRIGGER audit_no_update",
                       f"UPDATE audit SET actor = 'mallory' WHERE id = {victim['id']}")
        report = await store.verify_audit()
        assert not report.ok and report.row_id == victim["id"]
        assert f"audit row #{victim['id']} was changed" in report.problem
        await _pg_exec(pg_url, f"UPDATE audit SET actor = '{victim['actor']}' "
                               f"WHERE id = {victim['id']}",
                       f"DELETE FROM audit WHERE id = {rows[41]['id']}")
        report = await store.verify_audit()
        assert not report.ok and "audit chain" not in report.problem
        assert "removed" in report.problem and f"#{rows[42]['id']}" in report.problem
        assert report.checked == 41
        await _pg_exec(pg_url, "INSERT INTO audit (at, actor, action) VALUES (1, 'x', 'y')")
        await _pg_exec(pg_url, (f"INSERT INTO audit ({', '.join(chain.CHAIN_COLS)}) VALUES "
                                f"($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
                                *[rows[41][c] for c in chain.CHAIN_COLS]))
        report = await store.verify_audit()  # the removed row is back; the loose one stays
        [[loose]] = await _pg_exec(pg_url, "SELECT max(id) FROM audit")
        assert not report.ok and report.row_id == loose["max"], report
        assert "is not part of the chain" in report.problem


@pytest.mark.postgres
async def test_postgres_rows_written_before_the_chain_are_chained_in_id_order(pg_url):
    """A PostgreSQL store at schema 2 with audit rows: the upgrade chains them."""
    import asyncpg

    from bot.store.pg_schema import MIGRATIONS as PG
    from bot.store.postgres import parse_pg_url

    dsn, schema = parse_pg_url(pg_url)
    con = await asyncpg.connect(dsn)
    try:
        await con.execute(f'CREATE SCHEMA "{schema}"')
        await con.execute(f'SET search_path TO "{schema}"')
        await con.execute("CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY, "
                          "name TEXT NOT NULL, applied_at DOUBLE PRECISION NOT NULL)")
        for version, name, sql in PG[:2]:
            await con.execute(sql)
            await con.execute("INSERT INTO schema_migrations VALUES ($1, $2, 0)", version, name)
        for i in range(4):
            await con.execute("INSERT INTO audit (at, actor, action, draft_key, detail) "
                              "VALUES ($1, 'anna', 'approve', $2, 'v1')", 1000.0 + i, f"k{i}")
    finally:
        await con.close()
    async with create_store(pg_url) as store:
        assert (await store.verify_audit()).checked == 4
        await store.audit("bo", "note", "k9")
        report = await store.verify_audit()
        assert report.ok and report.checked == 5
        rows = await store.audit_export()
        assert [r["seq"] for r in sorted(rows, key=lambda r: r["id"])] == [1, 2, 3, 4, 5]


def test_the_canonical_row_is_the_json_array_the_readme_describes():
    """Anyone can recompute a hash with a JSON library: the canonical row is exactly
    json.dumps([seq, at, actor, action, draft_key, text_sha256, detail],
    ensure_ascii=False, separators=(",", ":")), whatever the text holds."""
    import hashlib

    texts = ['plain', 'quote " and \\ backslash', 'ctrl \x00\x1f\t\n', 'Grüße ✓ 😀 \u2028',
             '\u202eRTL', '']
    for i, text in enumerate(texts):
        r = chain.Record(1_764_410_400.123456 + i, f"tg:42 ({text})", "edit", text or None,
                         None, text)
        want = json.dumps([i + 1, r.at, r.actor, r.action, r.draft_key, None, r.detail],
                          ensure_ascii=False, separators=(",", ":"))
        assert chain.canonical(i + 1, r) == want
        assert chain.row_hash(chain.GENESIS, i + 1, r) == hashlib.sha256(
            (chain.GENESIS + want).encode()).hexdigest()


@pytest.fixture
async def pg_flowed(pg_url, tmp_path):
    """The demo flow of ``flowed`` on a PostgreSQL store."""
    cfg = demo_deployment(tmp_path, pg_url)
    await flow_demo(cfg)
    return cfg


async def _run_async(capsys, *argv: str) -> tuple[int, str, str]:
    """The CLI in a thread (it runs its own event loop)."""
    code = await asyncio.to_thread(main, list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.postgres
async def test_postgres_verify_names_an_unreadable_row_and_show_keeps_chain_order(
        pg_flowed, pg_url, capsys):
    """PostgreSQL: a time of infinity is named by `audit verify` (exit 1, no crash);
    swapped row ids leave `audit show`'s order as the chain's."""
    code, out, err = await _run_async(capsys, "audit", "show", "demo", ORDER, "--json",
                                      "-c", str(pg_flowed))
    assert [e["action"] for e in json.loads(out)["events"]] == ["admit", "draft", "approve",
                                                                 "sent"]
    [ids] = await _pg_exec(pg_url, (
        "SELECT action, id FROM audit WHERE draft_key = (SELECT key FROM drafts "
        "WHERE item_id = $1)", ORDER))
    ids = {r["action"]: r["id"] for r in ids}
    a, b = ids["approve"], ids["sent"]
    await _pg_exec(pg_url, "ALTER TABLE audit DISABLE TRIGGER audit_no_update",
                   f"UPDATE audit SET id = -1 WHERE id = {a}",
                   f"UPDATE audit SET id = {a} WHERE id = {b}",
                   f"UPDATE audit SET id = {b} WHERE id = -1")
    code, out, err = await _run_async(capsys, "audit", "show", "demo", ORDER, "--json",
                                      "-c", str(pg_flowed))
    assert code == 0 and [e["action"] for e in json.loads(out)["events"]] == [
        "admit", "draft", "approve", "sent"]
    await _pg_exec(pg_url, "UPDATE audit SET at = 'Infinity' WHERE id = 6")
    code, out, err = await _run_async(capsys, "audit", "verify", "-c", str(pg_flowed))
    assert code == 1 and "Traceback" not in err
    assert out.startswith("audit chain broken (store): audit row #6 was changed: its time "
                          "is inf, not a finite number. 5 row(s) before it are intact."), out
    await _pg_exec(pg_url, "UPDATE audit SET at = 'NaN' WHERE id = 6")
    code, out, _ = await _run_async(capsys, "audit", "verify", "-c", str(pg_flowed))
    assert code == 1 and "audit row #6 was changed: its time is nan" in out
