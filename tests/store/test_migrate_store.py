"""``draftgate migrate-store``: after moving a SQLite store to PostgreSQL (and back)
nothing is fetched or drafted again and cards already posted still work."""

from __future__ import annotations

import argparse
import asyncio
import io
import time

import pytest

from bot.cli.migrate import _Bar, add_cli, migrate_store, run_cli
from bot.errors import StoreError
from bot.models import Item, Message
from bot.store import create_store
from tests._pg import pg_url_fixture
from tests._stores import get_draft_by_key

SEEN = 10_000


pg_url = pg_url_fixture("mig")  # a fresh PostgreSQL schema per test


def _item(i: int) -> Item:
    return Item(f"<m{i}@example.com>", Message(subject=f"order {i}", from_addr=f"c{i}@example.com",
                                              body=f"where is order {i}?"))


async def _old_sqlite_store(url: str) -> dict:
    """A SQLite store as a long-running install leaves it: 10,000 items seen, cards
    awaiting approval in Telegram, one sent, a cursor, runs, tokens, a paused pipeline."""
    facts: dict = {}
    async with create_store(url) as s:
        ids = [f"<old{i}@example.com>" for i in range(SEEN)]
        for i in range(0, SEEN, 1000):
            await s.mark_seen("support", "inbox", ids[i:i + 1000], now=1000.0)
        facts["old_ids"] = ids
        admitted = await s.admit("support", "inbox", "v1", [_item(i) for i in range(6)],
                                 cursor="history-4711", now=2000.0)
        assert len(admitted.new) == 6
        drafts = await s.claim("support", 600, limit=6, now=2001.0)
        cards = []
        for n, d in enumerate(drafts):
            d = await s.finish_draft(d.id, d.fence, f"Hi, about order {n}", tokens_in=100,
                                     tokens_out=20, now=2002.0)
            d = await s.mark_posted(d.id, d.version, "-100123", str(900 + n))
            cards.append(d)
        # One card was edited (version 2, re-posted on the same message), one was sent.
        edited = await s.edit(cards[1].id, cards[1].version, "Edited reply", "anna", now=2003.0)
        cards[1] = await s.mark_posted(edited.id, edited.version, "-100123", "901")
        sent = await s.approve(cards[5].id, cards[5].version, "anna", now=2004.0)
        await s.begin_send(sent.id)
        await s.mark_sent(sent.id, "gmail-abc", now=2005.0)  # kept as an example too
        await s.index_knowledge("support", "kb/returns.md", ("sha", 1, 2),
                                [("Refunds", "Refunds take five business days.")])
        # The team desk: one of two approvals of card 2, a reminder and a digest sent.
        half = cards[2]
        assert await s.approve(half.id, half.version, "tg:1 (Anna)", now=2004.5, quorum=2,
                               body=half.body, key=half.key) is None
        assert await s.claim_notice(f"remind|{cards[3].id}|1|1", 2004.6, draft_id=cards[3].id,
                                    version=1)
        assert await s.claim_notice("digest|1970-01-01T08:00", 2004.7)
        run = await s.start_run("support", now=2000.0)
        await s.end_run(run, "ok", {"fetched": 6, "new": 6}, now=2006.0)
        await s.set_paused("posts", True, "anna")
        facts["cards"] = cards[:5]
        facts["sent_id"] = sent.id
        facts["max_fence"] = max(d.fence for d in cards)
        facts["max_id"] = max(d.id for d in cards)
        facts["audit"] = len(await s.audit_log(limit=1000))
        facts["head"] = (await s.verify_audit()).head
        facts["tokens"] = await s.tokens_used("support", time.strftime("%Y-%m-%d", time.gmtime(2002.0)))
    return facts


@pytest.mark.postgres
async def test_sqlite_to_postgres_nothing_fetched_or_drafted_again(tmp_path, pg_url):
    """After the switch the 10,000 old items are seen, re-admitting them queues nothing,
    and a card posted before the switch can still be approved (its CAS still matches)."""
    src = f"sqlite:///{tmp_path / 'state.db'}"
    facts = await _old_sqlite_store(src)
    seen_progress: list[tuple[str, int, int]] = []
    started = time.monotonic()
    copied = await migrate_store(src, pg_url, progress=lambda *a: seen_progress.append(a))
    elapsed = time.monotonic() - started
    assert copied["seen_items"] == SEEN + 6
    assert copied["drafts"] == 6
    assert ("seen_items", SEEN + 6, SEEN + 6) in seen_progress
    assert elapsed < 30, f"copying {SEEN} seen marks took {elapsed:.1f}s"

    async with create_store(pg_url) as pg:
        # The audit chain came over intact: every row, hash for hash.
        report = await pg.verify_audit()
        assert report.ok and report.checked == facts["audit"], report
        assert report.head == facts["head"]
        assert await pg.seen_count("support") == SEEN + 6
        assert await pg.unseen("support", "inbox", facts["old_ids"]) == set()
        again = await pg.admit("support", "inbox", "v1",
                               [Item(i, Message()) for i in facts["old_ids"][:500]]
                               + [_item(i) for i in range(6)])
        assert again.new == [] and again.already_seen == 506
        assert await pg.claim("support", 600, limit=100) == []
        assert await pg.get_cursor("support", "inbox") == "history-4711"
        assert await pg.paused() == {"posts"}
        assert await pg.tokens_used("support", time.strftime("%Y-%m-%d", time.gmtime(2002.0))) == facts["tokens"]
        assert len(await pg.audit_log(limit=1000)) == facts["audit"]
        [run] = await pg.recent_runs("support")
        assert run.counts == {"fetched": 6, "new": 6} and run.status == "ok"
        assert (await pg.get_draft(facts["sent_id"])).sent_id == "gmail-abc"
        # Team memory and the knowledge index came along, searchable on PostgreSQL.
        [example] = await pg.examples_for("support", "where is order 5?", 3)
        assert (example.item_id, example.reply) == ("<m5@example.com>", "Hi, about order 5")
        [passage] = await pg.passages_for("support", "how long does a refund take", 3)
        assert passage.name == "returns.md › Refunds"
        assert await pg.knowledge_files("support") == {"kb/returns.md": ("sha", 1, 2)}

        pending = {d.id: d for d in await pg.pending("support")}
        assert set(pending) == {d.id for d in facts["cards"]}
        for old in facts["cards"]:
            new = pending[old.id]
            assert (new.key, new.status, new.version, new.body, new.approval_chat,
                    new.approval_message_id, new.fence) == (
                old.key, "awaiting", old.version, old.body, "-100123",
                old.approval_message_id, old.fence)
        card = facts["cards"][1]
        assert card.version == 2
        assert await pg.approve(card.id, 1, "anna") is None  # the old version's button
        approved = await pg.approve(card.id, 2, "anna")
        assert approved is not None and approved.status == "approved"
        assert await pg.approve(card.id, 2, "anna") is None  # a second tap

        # The team desk's rows came along: the half-approved card needs one more
        # operator, and no reminder or digest already sent goes out again.
        half = facts["cards"][2]
        assert [v.operator for v in await pg.votes(half.id, 1)] == ["tg:1"]
        assert not await pg.claim_notice(f"remind|{facts['cards'][3].id}|1|1", draft_id=facts[
            "cards"][3].id, version=1)
        assert not await pg.claim_notice("digest|1970-01-01T08:00")
        assert await pg.approve(half.id, 1, "tg:1 (Anna)", quorum=2, key=half.key) is None
        assert (await pg.approve(half.id, 1, "tg:2 (Bo)", quorum=2, key=half.key)).status \
            == "approved"

        # New work after the switch gets fresh ids and fences, never reused ones.
        fresh = await pg.admit("support", "inbox", "v1", [_item(100)])
        [d] = await pg.claim("support", 600)
        assert d.key == fresh.new[0]
        assert d.id > facts["max_id"] and d.fence > facts["max_fence"]
        # ... and the chain goes on from the copied head.
        report = await pg.verify_audit()
        # Three rows written on the copy: the approve, the quorum's second vote, the admit.
        assert report.ok and report.checked == facts["audit"] + 3, report


@pytest.mark.postgres
async def test_refuses_a_non_empty_target_unless_forced(tmp_path, pg_url):
    """A second copy into the same target is refused with the way to override it;
    with force it adds nothing twice."""
    src = f"sqlite:///{tmp_path / 'state.db'}"
    async with create_store(src) as s:
        await s.admit("support", "inbox", "v1", [_item(i) for i in range(3)])
    await migrate_store(src, pg_url)
    with pytest.raises(StoreError, match="not empty.*--force"):
        await migrate_store(src, pg_url)
    copied = await migrate_store(src, pg_url, force=True)
    assert copied["drafts"] == 0 and copied["seen_items"] == 0
    async with create_store(pg_url) as pg:
        assert await pg.count_by_status("support") == {"queued": 3}


@pytest.mark.postgres
async def test_postgres_back_to_sqlite(tmp_path, pg_url):
    """The copy works the other way too: an awaiting card moved to SQLite can be approved."""
    async with create_store(pg_url) as pg:
        await pg.admit("support", "inbox", "v1", [_item(i) for i in range(2)], cursor="c9")
        [d] = await pg.claim("support", 600)
        d = await pg.finish_draft(d.id, d.fence, "reply")
        d = await pg.mark_posted(d.id, d.version, "42", "777")
        await pg.index_knowledge("support", "kb/hours.md", ("sha", 1, 2),
                                 [("Opening hours", "Open Monday to Friday.")])
    dst = f"sqlite:///{tmp_path / 'back.db'}"
    copied = await migrate_store(pg_url, dst)
    assert copied["drafts"] == 2 and copied["seen_items"] == 2
    async with create_store(dst) as s:
        assert await s.get_cursor("support", "inbox") == "c9"
        assert await s.unseen("support", "inbox", ["<m0@example.com>", "<m1@example.com>"]) == set()
        got = await s.approve(d.id, d.version, "anna")
        assert got is not None and got.approval_message_id == "777"
        [q] = await s.claim("support", 600)
        assert q.item_id == "<m1@example.com>"  # the queued one, not drafted twice
        fresh = await s.admit("support", "inbox", "v1", [_item(7)])
        assert (await get_draft_by_key(s, fresh.new[0])).id > q.id  # ids not reused
        [passage] = await s.passages_for("support", "are you open on monday?", 3)
        assert passage.name == "hours.md › Opening hours"  # indexed by SQLite's triggers
        # admit 2 + draft, then on the copy approve + admit: one chain throughout.
        report = await s.verify_audit()
        assert report.ok and report.checked == 5, report


def test_cli_refusal_says_how_to_override(tmp_path, capsys):
    """`migrate-store` into a non-empty store exits 1 and names --force."""
    a = f"sqlite:///{tmp_path / 'a.db'}"
    b = f"sqlite:///{tmp_path / 'b.db'}"

    async def seed():
        for url in (a, b):
            async with create_store(url) as s:
                await s.mark_seen("p", "inbox", ["x"])
    asyncio.run(seed())
    parser = argparse.ArgumentParser(prog="draftgate")
    add_cli(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["migrate-store", "--from", a, "--to", b])
    assert run_cli(args) == 1
    err = capsys.readouterr().err
    assert "not empty" in err and "--force" in err
    args = parser.parse_args(["migrate-store", "--from", a, "--to", b, "--force"])
    assert run_cli(args) == 0
    out = capsys.readouterr()
    assert "seen_items" in out.err  # the progress bar
    assert "copied" in out.out


def test_cli_help_describes_the_command(capsys):
    parser = argparse.ArgumentParser(prog="draftgate")
    add_cli(parser.add_subparsers(dest="command"))
    with pytest.raises(SystemExit):
        parser.parse_args(["migrate-store", "--help"])
    out = capsys.readouterr().out
    assert "--from URL" in out and "--to URL" in out and "--force" in out
    assert "nothing is fetched or drafted again" in out


def test_progress_bar_draws_each_table_to_the_end():
    buf = io.StringIO()
    bar = _Bar(buf, width=10)
    bar("seen_items", 0, 100)
    bar("seen_items", 100, 100)
    bar("drafts", 0, 0)
    text = buf.getvalue()
    assert "seen_items      [##########] 100/100\n" in text
    assert "drafts          [##########] 0/0\n" in text


@pytest.mark.postgres
async def test_cli_copies_sqlite_to_postgres_with_a_progress_bar(tmp_path, pg_url):
    """`python -m bot migrate-store` copies, draws a bar per table and exits 0."""
    import sys

    src = f"sqlite:///{tmp_path / 'state.db'}"
    async with create_store(src) as s:
        await s.mark_seen("support", "inbox", [f"x{i}" for i in range(12_000)])
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bot", "migrate-store", "--from", src, "--to", pg_url,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()
    assert "seen_items      [##############################] 12000/12000" in err.decode()
    assert "copied 12000 seen_items" in out.decode()
    async with create_store(pg_url) as pg:
        assert await pg.seen_count("support") == 12_000


async def test_a_mistyped_or_empty_source_is_refused(tmp_path):
    """A --from that does not exist is not created and "copied"; an empty one is refused."""
    missing = tmp_path / "typo.db"
    with pytest.raises(StoreError, match="does not exist; check --from"):
        await migrate_store(f"sqlite:///{missing}", f"sqlite:///{tmp_path / 'b.db'}")
    assert not missing.exists()
    empty = f"sqlite:///{tmp_path / 'empty.db'}"
    async with create_store(empty):
        pass
    with pytest.raises(StoreError, match="holds nothing to copy"):
        await migrate_store(empty, f"sqlite:///{tmp_path / 'c.db'}")
