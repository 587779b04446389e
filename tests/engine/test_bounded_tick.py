"""A tick has a bound: a flood or a backfill is taken ``max_per_tick`` items at a time,
oldest first and nothing lost; cards go out as drafts finish; an operator's
Regenerate does not wait behind bulk drafting; one item the store refuses does not
keep the others out.

The real maildir and Gmail sources (against the fake Gmail), the real SQLite store,
the real template and openai drafters (against the fake model server) and the real
engine; the approval channel is a recording double that also notes, when a card goes
out, how far the work had got.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import tracemalloc
from pathlib import Path

import pytest

from bot.approvals.base import DeskChannel
from bot.config.load import load_settings
from bot.engine.engine import Engine
from bot.errors import ConfigError
from bot.stages import PostedRef
from bot.store import create_store
from tests.fakes.gmail import GmailWorld, simple_message
from tests.fakes.llm import FakeLLM
from tests.support.desk import op, started

T0 = 1_764_410_400.0  # 2025-11-29T10:00:00Z


class Cards(DeskChannel):
    """Records each card: (draft id, version, drafts admitted so far, drafts still
    queued or drafting) at the moment it was posted or re-rendered; the two counts
    only for the first card and for new versions (-1 otherwise: counting is not free)."""

    name = "console"

    def __init__(self, store, pipeline: str = "support"):
        self.store, self.pipeline = store, pipeline
        self.posts: list[tuple[int, int, int, int]] = []
        self.posted = asyncio.Event()

    async def start(self, decisions):
        pass

    async def post(self, draft):
        admitted = waiting = -1
        if not self.posts or draft.version > 1:
            counts = await self.store.count_by_status(self.pipeline)
            admitted = sum(counts.values())
            waiting = counts.get("queued", 0) + counts.get("drafting", 0)
        self.posts.append((draft.id, draft.version, admitted, waiting))
        self.posted.set()
        return PostedRef("chat", draft.approval_message_id or f"card-{draft.id}")

    async def update(self, draft):
        pass

    async def notify(self, text, *, retry_draft=None):
        pass

    async def stop(self):
        pass


def mail(n: int, body_kb: int = 0) -> bytes:
    """A customer email; with ``body_kb``, a body of about that many kB of prose."""
    para = (f"Hello, this is customer {n} writing about order #{10000 + n}. The parcel "
            f"was due on Friday and the tracking page has not moved since Tuesday. ")
    body = (para * (body_kb * 1024 // len(para) + 1))[:body_kb * 1024] if body_kb else para
    return (f"From: Customer {n} <c{n}@customer.example>\nTo: support@shop.example\n"
            f"Subject: Order {n}\nMessage-ID: <order-{n}@customer.example>\n"
            f"Date: Sat, 29 Nov 2025 09:00:00 +0000\n\n{body}\n").encode()


def deploy(tmp: Path, *, emails: int = 0, body_kb: int = 0, extra: str = "",
           model: str = "template", in_flight: int = 4, llm_url: str = "") -> Path:
    """A maildir pipeline ``support``; file n is older than file n + 1."""
    (tmp / "pipelines").mkdir()
    add_mail(tmp, range(1, emails + 1), body_kb)
    (tmp / "reply.txt").write_text("Hi {first_name},\n\nthanks for writing about {subject}.\n")
    models = (f"models:\n  llm:\n    provider: openai\n    base_url: {llm_url}\n    model: m\n"
              f"    timeout: 30s\n    retries: 0\n" if llm_url else "")
    (tmp / "draftgate.yaml").write_text(
        f"store: sqlite:///{tmp}/state.db\npipelines: pipelines/*.yaml\n"
        f"max_in_flight: {in_flight}\n{models}")
    (tmp / "pipelines" / "support.yaml").write_text(
        f"name: support\nschedule: 5m\nsource: {{type: maildir, path: inbox}}\n"
        f"drafter: {{model: {model}, prompt: reply.txt}}\n"
        f"sender: {{type: outbox, path: out, from: s@shop.example}}\nlease: 120s\n{extra}")
    return tmp / "draftgate.yaml"


def add_mail(tmp: Path, numbers, body_kb: int = 0) -> None:
    inbox = tmp / "inbox"
    inbox.mkdir(exist_ok=True)
    for n in numbers:
        path = inbox / f"{n:05d}.eml"
        path.write_bytes(mail(n, body_kb))
        os.utime(path, ns=(int(T0 * 1e9) + n * 1000, int(T0 * 1e9) + n * 1000))


class World:
    def __init__(self, cfg: Path):
        self.settings = load_settings(cfg)
        self.store = create_store(self.settings.store)
        self.engine: Engine | None = None
        self.cards: Cards | None = None

    async def open(self) -> "World":
        await self.store.open()
        self.cards = Cards(self.store)
        app = await started(self.settings, self.store, {"console": self.cards})
        self.app, self.engine, self.desk = app, app.engine, app.desk
        return self

    async def close(self) -> None:
        if self.engine is not None:
            await self.engine.stop()
        await self.store.close()

    async def drafts(self):
        return [d for d in await self.store.recent("support", _ALL, limit=100_000)]


_ALL = ("queued", "drafting", "ready", "awaiting", "approved", "sending", "sent",
        "send_failed", "send_unknown", "skipped", "failed", "rejected", "expired")


@pytest.fixture
async def make_world():
    worlds: list[World] = []

    async def make(cfg: Path) -> World:
        w = await World(cfg).open()
        worlds.append(w)
        return w

    yield make
    for w in worlds:
        await w.close()


@pytest.mark.slow
@pytest.mark.timeout(600)  # 2,000 mails parsed, stored, drafted and posted under tracemalloc
async def test_a_flood_of_2000_mails_is_taken_in_bounded_ticks_and_cards_come_early(
        tmp_path, make_world):
    """2,000 mails of 60 kB at once (a flood, an old mailbox): every tick takes at most
    max_per_tick (200), so memory stays bounded (it was about 2,000 × the mail at
    once), and the first card goes out during the first tick, not after all 2,000
    are fetched, stored and drafted, for one of the oldest mails. Nothing is lost or
    drafted twice."""
    w = await make_world(deploy(tmp_path, emails=2000, body_kb=60))
    tracemalloc.start()
    try:
        ticks = []
        for _ in range(15):
            counts = await w.engine.tick("support")
            ticks.append(counts.new)
            if counts.fetched == 0:
                break
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    # Bounded: about 18 MB here; without max_per_tick the 2,000 mails take about 130 MB.
    assert peak < 60 * 2**20, f"peak {peak / 2**20:.0f} MB"
    first_id, _, admitted, _ = w.cards.posts[0]
    # The first card went out before the third tick had admitted anything.
    assert admitted <= 2 * 200, f"first card after {admitted} mails were admitted"
    assert ticks[:10] == [200] * 10 and sum(ticks) == 2000, ticks
    drafts = await w.drafts()
    assert len(drafts) == 2000 and {d.status for d in drafts} == {"awaiting"}
    assert sorted(d for d, *_ in w.cards.posts) == sorted(d.id for d in drafts)  # one card each
    # It is one of the oldest: drafts run 4 at a time (max_in_flight), so any of the
    # first 4 may finish first; the order of cards within those is not promised.
    assert first_id in sorted(d.id for d in drafts)[:4], first_id


async def test_max_per_tick_50_takes_120_mails_as_50_50_20_oldest_first(tmp_path, make_world):
    """max_per_tick: 50 with 120 mails in a maildir: three ticks admit 50, 50 and 20,
    oldest first, and every mail is drafted exactly once."""
    w = await make_world(deploy(tmp_path, emails=120, extra="max_per_tick: 50\n"))
    news = [(await w.engine.tick("support")).new for _ in range(4)]
    assert news == [50, 50, 20, 0]
    drafts = sorted(await w.drafts(), key=lambda d: d.id)
    assert [d.item_id for d in drafts] == [f"<order-{n}@customer.example>" for n in range(1, 121)]
    assert {d.status for d in drafts} == {"awaiting"} and len(w.cards.posts) == 120


async def test_gmail_max_per_tick_keeps_the_rest_for_the_next_ticks_in_order(tmp_path):
    """Gmail: 120 new messages in history with max_per_tick: 50 are admitted 50, 50,
    20, oldest first; the history cursor moves on, yet none of the 70 left over is
    skipped, and a mail that arrives meanwhile comes after them."""
    gw = GmailWorld(tmp_path)
    with open(tmp_path / "pipelines" / "support.yaml", "a") as f:
        f.write("max_per_tick: 50\n")
    await gw.open()
    try:
        assert (await gw.tick()).new == 0  # first run: cursor recorded
        ids = [gw.fake.add_message(simple_message(n)) for n in range(120)]
        first = await gw.tick()
        late = gw.fake.add_message(simple_message(500))
        news = [first.new] + [(await gw.tick()).new for _ in range(3)]
        assert news == [50, 50, 21, 0]  # the late one after the 120
        drafts = sorted(await gw.drafts(), key=lambda d: d.id)
        assert [d.item_id for d in drafts] == ids + [late]
        assert {d.status for d in drafts} == {"awaiting"}
        assert (await gw.tick()).new == 0
    finally:
        await gw.close()


async def test_gmail_backfill_over_max_per_tick_comes_over_the_next_ticks(tmp_path):
    """backfill: 120 with max_per_tick: 50: the first run takes the oldest 50 of the
    newest 120, the next ticks the rest, in order; mail older than those is not taken."""
    gw = GmailWorld(tmp_path, source='{type: gmail, account: support, query: "in:inbox", '
                                     'backfill: 120}')
    old = [gw.fake.add_message(simple_message(n)) for n in range(130)]
    with open(tmp_path / "pipelines" / "support.yaml", "a") as f:
        f.write("max_per_tick: 50\n")
    await gw.open()
    try:
        news = [(await gw.tick()).new for _ in range(4)]
        assert news == [50, 50, 20, 0]
        drafts = sorted(await gw.drafts(), key=lambda d: d.id)
        assert [d.item_id for d in drafts] == old[10:]
    finally:
        await gw.close()


def _refuse(db: Path, item_id: str) -> None:
    """Make the store refuse one row, as a full disk refuses a big one."""
    with sqlite3.connect(db) as con:
        con.execute(f"CREATE TRIGGER refuse BEFORE INSERT ON drafts WHEN NEW.item_id = "
                    f"'{item_id}' BEGIN SELECT RAISE(ABORT, 'database or disk is full'); END")


def _allow(db: Path) -> None:
    with sqlite3.connect(db) as con:
        con.execute("DROP TRIGGER refuse")


async def test_one_mail_the_store_refuses_does_not_keep_the_others_out(tmp_path, make_world):
    """The store refuses one mail (disk full for its row): the other 79 are admitted,
    drafted and posted; the run is red and names the mail; once the store takes it,
    the next tick admits it. Nothing is lost."""
    w = await make_world(deploy(tmp_path, emails=80))
    bad = "<order-7@customer.example>"
    _refuse(tmp_path / "state.db", bad)
    counts = await w.engine.tick("support")
    assert counts.new == 79 and len(w.cards.posts) == 79
    [run] = await w.store.recent_runs("support", limit=1)
    assert run.status == "error" and bad in run.error_text
    assert "database or disk is full" in run.error_text and "fetched again" in run.error_text
    _allow(tmp_path / "state.db")
    again = await w.engine.tick("support")
    assert again.new == 1 and len(await w.drafts()) == 80
    assert (await w.store.recent_runs("support", limit=1))[0].status == "ok"


async def test_gmail_a_refused_mail_is_fetched_again_although_the_others_moved_on(tmp_path):
    """Gmail: one new message the store refuses while the others are admitted; the
    cursor does not move past it, so once the store takes it the next tick does."""
    gw = GmailWorld(tmp_path)
    await gw.open()
    try:
        await gw.tick()  # first run: cursor recorded
        ids = [gw.fake.add_message(simple_message(n)) for n in range(60)]
        _refuse(tmp_path / "state.db", ids[30])
        first = await gw.tick()
        assert first.new == 59
        [run] = await gw.store.recent_runs("support", limit=1)
        assert run.status == "error" and ids[30] in run.error_text
        _allow(tmp_path / "state.db")
        assert (await gw.tick()).new == 1
        assert sorted(d.item_id for d in await gw.drafts()) == sorted(ids)
    finally:
        await gw.close()


async def test_regenerate_is_answered_while_a_backlog_drafts_with_a_slow_model(
        tmp_path, make_world):
    """A Regenerate tapped while 12 mails are drafted by a model that takes 1 s each
    (2 at a time) gets its new version on the card before that backlog is done: it
    is drafted at once on its own, not behind the tick's queue or its lock."""
    with FakeLLM(latency=1.0) as llm:
        w = await make_world(deploy(tmp_path, emails=1, model="llm", in_flight=2,
                                    llm_url=llm.openai_url))
        await w.engine.tick("support")
        [(card, version, _, _)] = w.cards.posts
        add_mail(tmp_path, range(2, 14))
        tick = asyncio.create_task(w.engine.tick("support"))
        assert await asyncio.to_thread(llm.wait_requests, 2, 30)  # the backlog is drafting
        assert await w.desk.regenerate(op("anna"), card, version, "shorter") is not None
        async with asyncio.timeout(60):
            while not any(p[:2] == (card, version + 1) for p in w.cards.posts):
                w.cards.posted.clear()
                await w.cards.posted.wait()
        [(_, _, _, waiting)] = [p for p in w.cards.posts if p[:2] == (card, version + 1)]
        assert waiting > 0, "the new version came only after the whole backlog was drafted"
        counts = await tick
        assert counts.new == 12
        [d] = [d for d in await w.drafts() if d.id == card]
        assert d.version == version + 1 and d.status == "awaiting"
        assert sum(1 for r in llm.requests if "shorter" in str(r.body)) == 1


@pytest.mark.parametrize("value, problem", [
    ("0", "expected a whole number of messages of at least 1, like 200, got 0"),
    ("-5", "expected a whole number of messages of at least 1, like 200, got -5"),
    ("lots", "expected a whole number, got a string 'lots'"),
])
def test_max_per_tick_must_be_a_positive_whole_number(tmp_path, value, problem):
    cfg = deploy(tmp_path, extra=f"max_per_tick: {value}\n")
    with pytest.raises(ConfigError) as err:
        load_settings(cfg)
    assert f"pipelines/support.yaml: max_per_tick: {problem}" in str(err.value)


async def test_the_loop_runs_the_next_tick_at_once_while_mail_waits_at_the_source(
        tmp_path, make_world):
    """Running for real (schedule 5m): 120 mails with max_per_tick: 50 are all drafted
    and posted in three ticks back to back, not one tick per 5 minutes."""
    w = await make_world(deploy(tmp_path, emails=120, extra="max_per_tick: 50\n"))
    stop = asyncio.Event()
    loop = asyncio.create_task(w.app.run_forever(stop))
    try:
        async with asyncio.timeout(100):
            while len(w.cards.posts) < 120:
                w.cards.posted.clear()
                await w.cards.posted.wait()
    finally:
        stop.set()
        await loop
    runs = await w.store.recent_runs("support", limit=10)
    assert [r.counts["new"] for r in reversed(runs)][:3] == [50, 50, 20]
