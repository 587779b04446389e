"""Several hosts on one PostgreSQL store: three real ``python -m bot run`` processes,
one of them polling Telegram, against the fake Gmail, Telegram and model servers.

What an operator would notice if the multi-host promises broke: a message drafted
twice (two model calls), two cards for one email, a reply sent twice, or an email
stuck for ever because the host drafting it died.
"""

from __future__ import annotations

import asyncio
import email
import email.policy
import signal
import time
from itertools import pairwise
from pathlib import Path

import pytest

from bot.models import Item, Message
from tests._chaos_parts import _pid_of_client
from tests._multihost import (
    ANNA,
    CHAT,
    OPS_CHAT,
    Db,
    Host,
    card_posts,
    logs,
    ticket_email,
    tickets_of,
    until,
    write_deployment,
)
from tests._pg import drop_schema, new_schema_name, require_pg_dsn, with_schema
from tests.fakes.gmail import FakeGmail
from tests.fakes.llm import FakeLLM
from tests.fakes.telegram import FakeTelegram

MESSAGES = 200
BATCHES = 5


class World:
    """The three fakes, a fresh schema and the hosts started on it."""

    def __init__(self, tmp: Path, url: str):
        self.tmp = tmp
        self.url = url
        self.gmail = FakeGmail().start()
        self.tg = FakeTelegram().start()
        self.llm = FakeLLM().start()
        self.db = Db(url)
        self.hosts: list[Host] = []

    def deploy(self, *, lease: str, model_timeout: str, max_in_flight: int | None = None) -> Path:
        return write_deployment(self.tmp, store=self.url, gmail=self.gmail, tg=self.tg,
                                llm=self.llm, lease=lease, model_timeout=model_timeout,
                                max_in_flight=max_in_flight)

    def host(self, name: str, cfg: Path, receive: str, **kw) -> Host:
        h = Host(name, cfg, self.tg, receive=receive, **kw)
        self.hosts.append(h)
        return h

    async def tap_awaiting(self, tapped: dict[int, dict]) -> None:
        """Tap Approve, as the operator, on every card that waits for a decision and was
        not tapped yet (by store state: a card being posted is not tappable yet)."""
        for r in await self.db.fetch("SELECT id, version, approval_message_id FROM drafts"
                                     " WHERE status='awaiting' ORDER BY id"):
            if r["id"] not in tapped:
                tapped[r["id"]] = self.tg.tap(ANNA, CHAT, int(r["approval_message_id"]),
                                              f"ap:{r['id']}:{r['version']}", "Anna")

    def close(self) -> None:
        for h in self.hosts:
            h.ensure_dead()
        self.llm.stop()
        self.tg.stop()
        self.gmail.stop()


@pytest.fixture
async def world(tmp_path):
    dsn = await require_pg_dsn()  # skips without a server; fails under DRAFTGATE_REQUIRE_PG=1
    schema = new_schema_name("dg_multihost")
    w = World(tmp_path, with_schema(dsn, schema))
    try:
        await w.db.open()
        yield w
    finally:
        w.close()
        await w.db.close()
        await drop_schema(dsn, schema)


async def _stop_all(hosts: list[Host]) -> None:
    codes = await asyncio.gather(*(asyncio.to_thread(h.terminate) for h in hosts))
    assert codes == [0] * len(hosts), f"exit codes {codes}\n{logs(hosts)}"


@pytest.mark.slow
@pytest.mark.postgres
async def test_three_hosts_draft_post_and_send_each_of_200_messages_exactly_once(world):
    """200 emails arrive in batches while three hosts run: each is drafted once, gets
    one card, and each approval sends exactly one reply. Ticks never overlap."""
    w = world
    cfg = w.deploy(lease="30s", model_timeout="10s")
    hosts = [w.host("a", cfg, "polling"), w.host("b", cfg, "off"), w.host("c", cfg, "off")]
    # The first tick records Gmail's cursor; mail older than that is not drafted.
    await until(w.db.cursor_recorded, 40, "the first tick to record Gmail's cursor", hosts)

    originals: dict[str, int] = {}  # Gmail id of each customer email -> its number
    tapped: dict[int, dict] = {}  # draft id -> the tap update
    per_batch = MESSAGES // BATCHES
    for b in range(BATCHES):
        for n in range(b * per_batch, (b + 1) * per_batch):
            originals[w.gmail.add_message(ticket_email(n))] = n
        want = (b + 1) * per_batch

        async def admitted(want=want):
            return sum((await w.db.statuses()).values()) >= want
        await until(admitted, 30, f"batch {b + 1} to be admitted", hosts)
        await w.tap_awaiting(tapped)  # approvals overlap with the next batches' drafting

    async def all_tapped():
        await w.tap_awaiting(tapped)
        return len(tapped) == MESSAGES
    await until(all_tapped, 60, "every card to be posted and tapped", hosts)

    async def all_sent():
        return await w.db.statuses() == {"sent": MESSAGES}
    await until(all_sent, 60, "every approved draft to be sent", hosts)

    def answered_and_shown():
        # Every tap answered and every card edited to its final state (the edit may
        # come from another host if its tick sent the approved draft first).
        ids = [u["callback_query"]["id"] for u in tapped.values()]
        cards = w.tg.chat_messages(CHAT)
        if all(i in w.tg.answers for i in ids) and all(
                m.text.startswith("✅ Sent by Anna") for m in cards):
            return [w.tg.answers[i] for i in ids]
        return None
    # Generous: 200 card edits at the Bot API's 30/s from three busy hosts; it only
    # runs out when an edit is lost.
    try:
        answers = await w.tg.await_for(answered_and_shown, timeout=90)
    except TimeoutError:
        unanswered = [k for k, u in tapped.items()
                      if u["callback_query"]["id"] not in w.tg.answers]
        shown = [m.text[:90] for m in w.tg.chat_messages(CHAT)
                 if not m.text.startswith("✅ Sent by Anna")]
        raise AssertionError(f"taps not answered: {unanswered[:5]} ({len(unanswered)}); "
                             f"cards not shown as sent: {shown[:5]} ({len(shown)})") from None
    await _stop_all(hosts)

    # Drafted once: one model request per email, none repeated, none missing.
    tickets = tickets_of(w.llm)
    assert sorted(tickets) == list(range(MESSAGES)), (
        f"{len(tickets)} model requests for {MESSAGES} emails; repeated: "
        f"{sorted(t for t in set(tickets) if tickets.count(t) > 1)}")
    rows = await w.db.fetch("SELECT id, item_id, version, attempt, sent_id, approval_message_id"
                            " FROM drafts ORDER BY id")
    assert len(rows) == MESSAGES
    assert sorted(originals[r["item_id"]] for r in rows) == list(range(MESSAGES))
    assert {(r["version"], r["attempt"]) for r in rows} == {(1, 0)}

    # One card each, in the approvals chat, and nothing else there.
    posts = card_posts(w.tg)
    assert posts == {r["id"]: 1 for r in rows}, {i: n for i, n in posts.items() if n != 1}
    assert len(w.tg.chat_messages(CHAT)) == MESSAGES
    assert len({r["approval_message_id"] for r in rows}) == MESSAGES

    # One send per approval: 200 messages.send, 200 distinct Message-IDs, each a reply
    # to a different customer email, and every tap answered.
    sends = w.gmail.calls_to("messages.send")
    assert len(sends) == MESSAGES and all(c.status == 200 for c in sends)
    replies = [email.message_from_bytes(raw, policy=email.policy.default)
               for raw in w.gmail.received_raw]
    assert len(replies) == MESSAGES
    assert len({m["Message-ID"] for m in replies}) == MESSAGES
    assert sorted(m["In-Reply-To"] for m in replies) == sorted(
        f"<ticket-{n}@customer.example>" for n in range(MESSAGES))
    assert len({r["sent_id"] for r in rows}) == MESSAGES
    approvals = await w.db.fetch("SELECT draft_key FROM audit WHERE action='approve'")
    assert len(approvals) == MESSAGES and len({a["draft_key"] for a in approvals}) == MESSAGES
    assert len(answers) == MESSAGES and all(a.get("text") for a in answers)

    # Ticks of the pipeline never overlapped, whichever host ran them.
    runs = await w.db.fetch("SELECT started_at, ended_at FROM pipeline_runs"
                            " WHERE ended_at IS NOT NULL ORDER BY started_at")
    overlaps = [(a["started_at"], a["ended_at"], b["started_at"])
                for a, b in pairwise(runs) if b["started_at"] < a["ended_at"]]
    assert runs and not overlaps, overlaps
    for h in hosts:
        assert "Traceback" not in h.text(), logs([h])


@pytest.mark.slow
@pytest.mark.postgres
async def test_two_hosts_draft_one_pipelines_queue_side_by_side_each_email_once(world):
    """With one draft in flight per process, two hosts have two emails of one pipeline
    at the model at the same time: the host that does not run the tick drafts beside
    the one that does (a second host used to wait, doubling nothing). Each email is
    still drafted once and gets one card, and the ticks never overlap."""
    w = world
    cfg = w.deploy(lease="60s", model_timeout="50s", max_in_flight=1)
    hosts = [w.host("a", cfg, "polling"), w.host("b", cfg, "off")]
    await until(w.db.cursor_recorded, 40, "the first tick to record Gmail's cursor", hosts)
    first, second = w.llm.hold(), w.llm.hold()
    w.llm.script(first, second)
    for n in (1, 2):
        w.gmail.add_message(ticket_email(n))
    try:
        for held in (first, second):
            assert await asyncio.to_thread(held.arrived.wait, 30), (
                f"{len(w.llm.requests)} model call(s) in flight, not 2\n{logs(hosts)}")
        askers = {_pid_of_client(r.client_port, [h.pid for h in hosts]) for r in w.llm.requests}
        assert askers == {h.pid for h in hosts}
    finally:
        first.release()
        second.release()

    async def both_waiting():
        rows = await w.db.draft_rows()
        return rows if [r["status"] for r in rows] == ["awaiting", "awaiting"] else None
    rows = await until(both_waiting, 30, "both cards", hosts)
    await _stop_all(hosts)
    assert sorted(tickets_of(w.llm)) == [1, 2]
    assert card_posts(w.tg) == {r["id"]: 1 for r in rows}
    assert len(w.tg.chat_messages(CHAT)) == 2
    runs = await w.db.fetch("SELECT started_at, ended_at FROM pipeline_runs"
                            " WHERE ended_at IS NOT NULL ORDER BY started_at")
    assert not [(a, b) for a, b in pairwise(runs) if b["started_at"] < a["ended_at"]]


@pytest.mark.slow
@pytest.mark.postgres
async def test_sigkill_of_the_host_holding_a_draft_another_host_finishes_it_once(world):
    """The host drafting an email is SIGKILLed mid model call: after the lease another
    host drafts it again, and the operator sees one card and sends one reply."""
    w = world
    # A healthy call ends inside its lease. Takeover is gated by the dead host's
    # pipeline lock (Leases.ttl, 15 s) more than by this lease, so a lease with
    # room to spare costs nothing and keeps a loaded machine from timing the call out
    # before the kill.
    cfg = w.deploy(lease="6s", model_timeout="4s")
    # Only non-polling hosts at first, so the one killed is never the Telegram receiver.
    workers = [w.host("b", cfg, "off"), w.host("c", cfg, "off")]
    await until(w.db.cursor_recorded, 40, "the first tick to record Gmail's cursor", workers)
    held = w.llm.hold(then=w.llm.reply("LATE answer from the killed host"))
    w.llm.script(held)
    gid = w.gmail.add_message(ticket_email(7))
    assert await asyncio.to_thread(held.arrived.wait, 30), logs(workers)

    # The draft is claimed; the host drafting it is the one whose call the model holds
    # (the tick's host or one drafting beside it).
    [row] = await w.db.fetch("SELECT id, status FROM drafts")
    assert row["status"] == "drafting"
    pid = _pid_of_client(w.llm.requests[-1].client_port, [h.pid for h in workers])
    [victim] = [h for h in workers if h.pid == pid]
    [survivor] = [h for h in workers if h is not victim]
    assert victim.kill() == -signal.SIGKILL
    poller = w.host("a", cfg, "polling")
    live = [survivor, poller]

    async def card_waits():
        r = await w.db.fetch("SELECT status, attempt, approval_message_id FROM drafts")
        return r if r and r[0]["status"] == "awaiting" else None
    [after] = await until(card_waits, 45, "another host to draft it after the lease", live)
    assert after["attempt"] == 1  # one expired lease, one redraft
    held.release()  # the dead host's call answers now; nobody is left to store it
    assert await asyncio.to_thread(held.finished.wait, 10)

    tap = w.tg.tap(ANNA, CHAT, int(after["approval_message_id"]), f"ap:{row['id']}:1", "Anna")
    answer = await w.tg.await_for(lambda: w.tg.answers.get(tap["callback_query"]["id"]), 30)
    assert answer["text"] == "✅ Sent.", logs(live)

    # Two more finished ticks change nothing: no third model call, card or send.
    runs = await w.db.finished_runs()

    async def two_more_ticks():
        return await w.db.finished_runs() >= runs + 2
    await until(two_more_ticks, 20, "two more ticks", live)
    await _stop_all(live)

    assert tickets_of(w.llm) == [7, 7]  # the killed call and exactly one redraft
    rows = await w.db.fetch("SELECT status, version, body, item_id FROM drafts")
    assert [(r["status"], r["version"], r["item_id"]) for r in rows] == [("sent", 1, gid)]
    assert "LATE" not in rows[0]["body"]  # the stale answer was never stored
    assert card_posts(w.tg) == {row["id"]: 1}
    assert len(w.tg.chat_messages(CHAT)) == 1
    assert len(w.gmail.calls_to("messages.send")) == 1
    for h in live:
        assert "Traceback" not in h.text(), logs([h])


@pytest.mark.slow
@pytest.mark.postgres
async def test_a_host_starting_while_another_sends_leaves_that_send_alone(world):
    """A rolling restart: host D starts while host A's Gmail send is in flight. D must
    not call that send interrupted: doing so told the operator "not in Sent, tap
    Retry", and the Retry sent the reply a second time once A's send landed."""
    w = world
    cfg = w.deploy(lease="30s", model_timeout="10s")
    a = w.host("a", cfg, "polling")
    await until(w.db.cursor_recorded, 40, "the first tick to record Gmail's cursor", [a])
    w.gmail.add_message(ticket_email(3))

    async def awaiting():
        return await w.db.fetch("SELECT id, version, approval_message_id FROM drafts"
                                " WHERE status='awaiting'")
    [r] = await until(awaiting, 30, "the card", [a])
    release = w.gmail.hold("messages.send")
    try:
        tap = w.tg.tap(ANNA, CHAT, int(r["approval_message_id"]), f"ap:{r['id']}:1", "Anna")
        assert await asyncio.to_thread(w.gmail.reached("messages.send").wait, 20), logs([a])
        d = w.host("d", cfg, "off")
        runs = await w.db.finished_runs()

        async def d_started_and_two_ticks():
            return ("draftgate running" in d.text()
                    and await w.db.finished_runs() >= runs + 2)
        await until(d_started_and_two_ticks, 30, "host D to start and two ticks", [a, d])
        assert [tuple(x) for x in await w.db.fetch("SELECT status FROM drafts")] == [
            ("sending",)]
        assert w.tg.chat_messages(OPS_CHAT) == []
    finally:
        release.set()
    # The tap is answered "Sent." or, if the send outlasted the answer window while
    # held, "Working on it"; either way the card then shows the outcome.
    assert await w.tg.await_for(lambda: w.tg.answers.get(tap["callback_query"]["id"]), 20)
    assert await w.tg.await_for(lambda: [m for m in w.tg.chat_messages(CHAT)
                                         if m.text.startswith("✅ Sent by Anna")], 20)
    await _stop_all([a, d])
    assert len(w.gmail.calls_to("messages.send")) == 1
    assert w.tg.chat_messages(OPS_CHAT) == []


@pytest.mark.slow
@pytest.mark.postgres
async def test_sigkill_of_the_sending_host_another_host_finishes_the_send_within_30s(world):
    """The host sending a reply is SIGKILLed while Gmail holds the request (Gmail then
    delivers it). The other host, on another machine, sees the dead host's heartbeat
    lapse, asks Gmail and marks the reply sent within 30 s (not after a five-minute
    grace): one messages.send, and the operator is never told to Retry."""
    w = world
    cfg = w.deploy(lease="30s", model_timeout="10s")
    hosts = [w.host("a", cfg, "polling", home="host-a"),
             w.host("b", cfg, "off", home="host-b")]
    await until(w.db.cursor_recorded, 40, "the first tick to record Gmail's cursor", hosts)
    w.gmail.add_message(ticket_email(5))

    async def awaiting():
        return [r for r in await w.db.draft_rows() if r["status"] == "awaiting"]
    [r] = await until(awaiting, 30, "the card", hosts)
    release = w.gmail.hold("messages.send")
    try:
        w.tg.tap(ANNA, CHAT, int(r["approval_message_id"]), f"ap:{r['id']}:1", "Anna")
        assert await asyncio.to_thread(w.gmail.reached("messages.send").wait, 20), logs(hosts)
        [row] = await w.db.draft_rows()
        assert row["status"] == "sending"
        [victim] = [h for h in hosts if row["send_holder"].startswith(f"host-{h.name}:")]
        [survivor] = [h for h in hosts if h is not victim]
        assert victim.kill() == -signal.SIGKILL
    finally:
        release.set()  # Gmail goes on and delivers the reply; its answer is lost
    assert await asyncio.to_thread(w.gmail.accepted.wait, 10)
    killed = time.monotonic()

    async def sent():
        return [x["status"] for x in await w.db.draft_rows()] == ["sent"]
    await until(sent, 30, "the other host to check the send and mark it sent", [survivor])
    assert time.monotonic() - killed < 30
    await _stop_all([survivor])
    assert len(w.gmail.calls_to("messages.send")) == 1 and len(w.gmail.sent()) == 1
    assert w.tg.chat_messages(OPS_CHAT) == []
    assert "Traceback" not in survivor.text(), logs([survivor])


@pytest.mark.slow
@pytest.mark.postgres
async def test_hosts_with_clocks_a_minute_apart_never_overlap_a_tick_nor_flip_a_send(world):
    """Host B's clock runs 60 s ahead of host A's. While A's tick drafts (it holds the
    pipeline lease and the draft's lease), B never starts a tick of its own nor drafts
    the email again; while A's send is in flight, B never calls it abandoned. Leases
    and send recovery are timed by the database's clock, not by either host's."""
    w = world
    cfg = w.deploy(lease="60s", model_timeout="50s")
    a = w.host("a", cfg, "polling", home="host-a")
    await until(w.db.cursor_recorded, 40, "the first tick to record Gmail's cursor", [a])
    held = w.llm.hold()
    w.llm.script(held)
    w.gmail.add_message(ticket_email(9))
    try:
        assert await asyncio.to_thread(held.arrived.wait, 30), logs([a])
        [open_run] = await w.db.fetch("SELECT id FROM pipeline_runs WHERE ended_at IS NULL")
        b = w.host("b", cfg, "off", home="host-b",
                   clock_offset=60)

        async def b_refused_three_ticks():
            return b.text().count("another process is running this pipeline") >= 3
        await until(b_refused_three_ticks, 60, "host B to find the pipeline busy 3 times",
                    [a, b])
        later = await w.db.fetch("SELECT id FROM pipeline_runs WHERE id > $1", open_run["id"])
        assert later == [], "host B ran a tick while host A's was running"
        assert tickets_of(w.llm) == [9]  # B did not take over the draft's lease either
    finally:
        held.release()

    async def awaiting():
        return [r for r in await w.db.draft_rows() if r["status"] == "awaiting"]
    [r] = await until(awaiting, 60, "the card", [a, b])
    release = w.gmail.hold("messages.send")
    try:
        tap = w.tg.tap(ANNA, CHAT, int(r["approval_message_id"]), f"ap:{r['id']}:1", "Anna")
        assert await asyncio.to_thread(w.gmail.reached("messages.send").wait, 20), logs([a, b])
        runs = await w.db.finished_runs()

        async def ten_more_ticks():
            return await w.db.finished_runs() >= runs + 10
        await until(ten_more_ticks, 80, "ten more ticks while the send is in flight", [a, b])
        assert [x["status"] for x in await w.db.draft_rows()] == ["sending"]
        assert w.tg.chat_messages(OPS_CHAT) == []
    finally:
        release.set()

    async def sent():
        return [x["status"] for x in await w.db.draft_rows()] == ["sent"]
    await until(sent, 60, "the reply to be sent", [a, b])
    assert w.tg.answers.get(tap["callback_query"]["id"])  # the tap was answered
    await _stop_all([a, b])
    assert len(w.gmail.calls_to("messages.send")) == 1
    assert tickets_of(w.llm) == [9]
    assert w.tg.chat_messages(OPS_CHAT) == []


async def test_recovery_takes_a_send_with_no_recorded_process_only_after_the_grace(store):
    """Both backends, the product's recovery (``Sends.recover`` at start and on every
    tick): a ``sending`` row that names no process (begun by an older version) may be
    another host's send in flight, so it is left alone until the grace has passed,
    then becomes send_unknown."""
    await store.admit("p", "s", "v1", [Item("m1", Message(subject="hi"))])
    [d] = await store.claim("p", 60)
    await store.finish_draft(d.id, d.fence, "Hello")
    await store.mark_posted(d.id, d.version, "1", "1")
    await store.approve(d.id, d.version, "anna")
    assert (await store.begin_send(d.id)).status == "sending"
    assert await store.recover_abandoned_sends(alive="host-b", grace=60) == 0
    assert (await store.get_draft(d.id)).status == "sending"
    assert await store.recover_abandoned_sends(alive="host-b", grace=60,
                                               now=time.time() + 61) == 1
    assert (await store.get_draft(d.id)).status == "send_unknown"
