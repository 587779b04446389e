"""The Gmail source against the fake Gmail API, through the real googleapiclient,
the real SQLite store and the real Engine."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time

import pytest

from bot.models import Status
from tests._stores import set_cursor
from tests.fakes.gmail import GmailWorld, simple_message
from tests.support.desk import op
from tests.support.fixtures import gmail_world

world = gmail_world  # the fixture: an opened GmailWorld (support/fixtures.py)


async def _started(w: GmailWorld):
    """First run done: cursor recorded."""
    await w.tick()
    assert await w.store.get_cursor("support", "gmail:support")
    return w


async def test_first_run_records_cursor_and_drafts_no_old_mail(world):
    """Mail already in the box on the first run is not drafted."""
    for n in range(3):
        world.fake.add_message(simple_message(n))
    counts = await world.tick()
    assert counts.new == 0 and counts.fetched == 0
    cursor = json.loads(await world.store.get_cursor("support", "gmail:support"))
    assert cursor["historyId"] == str(world.fake.history_id)
    assert cursor["first"] == cursor["synced"]
    assert [c.route for c in world.fake.api_calls()] == ["getProfile"]
    assert await world.drafts() == []


async def test_idle_tick_is_one_call_and_two_quota_units(world):
    """A tick with nothing new costs one history.list: 1 call, 2 quota units."""
    await _started(world)
    mark = world.fake.mark()
    counts = await world.tick()
    calls = world.fake.api_calls(mark)
    assert [c.route for c in calls] == ["history.list"]
    assert world.fake.units(mark) == 2
    assert counts.new == 0
    run = (await world.store.recent_runs("support", 1))[0]
    assert run.status == "ok"


async def test_fifty_new_messages_are_each_fetched_exactly_once(world):
    """50 new messages: each body is downloaded once and drafted once; the next tick
    fetches nothing again."""
    await _started(world)
    ids = [world.fake.add_message(simple_message(n)) for n in range(50)]
    mark = world.fake.mark()
    counts = await world.tick()
    gets = [c.path.rsplit("/", 1)[-1] for c in world.fake.calls_to("messages.get")]
    assert sorted(gets) == sorted(ids)
    assert all(c.query["format"] == ["raw"] for c in world.fake.calls_to("messages.get"))
    assert counts.new == 50 and counts.drafted == 50
    mark = world.fake.mark()
    await world.tick()
    assert [c.route for c in world.fake.api_calls(mark)] == ["history.list"]
    drafts = await world.drafts()
    assert len(drafts) == 50 and {d.item_id for d in drafts} == set(ids)
    assert all(d.status == Status.AWAITING for d in drafts)
    d = drafts[0]
    assert d.message.thread_id and d.message.source_id == d.item_id
    assert "INBOX" in d.message.labels


async def test_history_pagination_is_followed(world):
    """More history than one page: every page is read and nothing is dropped."""
    await _started(world)
    world.engine.source(world.settings.pipeline("support")).page_size = 7
    ids = [world.fake.add_message(simple_message(n)) for n in range(20)]
    counts = await world.tick()
    assert counts.new == 20
    history = world.fake.calls_to("history.list")
    assert [c.query.get("pageToken") for c in history[-3:]] == [None, ["7"], ["14"]]
    assert {d.item_id for d in await world.drafts()} == set(ids)


async def test_history_404_falls_back_to_query_and_admits_each_new_message_once(world):
    """history.list 404 (historyId too old): the query listing admits every new message
    once, the ones admitted before are not admitted again, and a message that arrives
    during the listing is admitted exactly once too."""
    await _started(world)
    before = [world.fake.add_message(simple_message(n)) for n in range(3)]
    await world.tick()
    assert len(await world.drafts()) == 3
    new = [world.fake.add_message(simple_message(n)) for n in range(10, 14)]
    world.fake.expire_history()
    counts, during = await _tick_with_mail_arriving(world, "messages.list",
                                                    world.fake.hold("messages.list"))
    routes = [c.route for c in world.fake.api_calls()]
    assert routes.count("history.list") >= 2 and "getProfile" in routes
    run = (await world.store.recent_runs("support", 1))[0]
    assert run.status == "ok", run.error_text
    await world.tick()  # the next history.list from the new cursor
    drafts = await world.drafts()
    by_item: dict[str, int] = {}
    for d in drafts:
        by_item[d.item_id] = by_item.get(d.item_id, 0) + 1
    assert set(by_item) == set(before + new + during)
    assert all(n == 1 for n in by_item.values())
    assert counts.new >= 4
    # Bodies already admitted before the fallback were not even downloaded again.
    fetched = [c.path.rsplit("/", 1)[-1] for c in world.fake.calls_to("messages.get")]
    assert all(fetched.count(i) == 1 for i in before + new + during)


async def test_sent_drafts_spam_own_and_non_matching_mail_are_not_admitted(world):
    """Our own sent mail and drafts, spam and a promotion (excluded by the query) are
    not work; a normal message is; mail from our own address is skipped with the reason."""
    await _started(world)
    good = world.fake.add_message(simple_message(1))
    world.fake.add_message(simple_message(2), labels=["SENT"])
    world.fake.add_message(simple_message(3), labels=["DRAFT"])
    world.fake.add_message(simple_message(4), labels=["SPAM"])
    world.fake.add_message(simple_message(5), labels=["INBOX", "CATEGORY_PROMOTIONS"])
    own = world.fake.add_message(simple_message(6, sender=f"Us <{world.fake.address}>"))
    counts = await world.tick()
    assert sorted((d.item_id, d.status) for d in await world.drafts()) == \
        sorted([(good, Status.AWAITING), (own, Status.SKIPPED)])
    assert counts.new == 1 and counts.skipped == 1
    assert len(world.fake.calls_to("messages.get")) == 3  # SENT/DRAFT/SPAM not downloaded


async def test_backfill_admits_newest_n_with_progress(tmp_path):
    """backfill: N drafts the newest N matching messages on the first run, reporting
    progress."""
    fake_src = '{type: gmail, account: support, query: "in:inbox", backfill: 3}'
    w = GmailWorld(tmp_path, source=fake_src)
    ids = [w.fake.add_message(simple_message(n)) for n in range(5)]
    await w.open()
    try:
        from bot.stages import FetchContext

        source = w.engine.source(w.settings.pipeline("support"))
        seen: list[tuple[int, int]] = []

        async def unseen(xs):
            return set(xs)

        ctx = FetchContext("support", source.scope, 0.0, None, unseen,
                           progress=lambda d, t: seen.append((d, t)))
        result = await source.fetch(ctx)
        assert {i.item_id for i in result.items} == set(ids[-3:])
        assert seen[0] == (0, 3) and seen[-1] == (3, 3)
        assert json.loads(result.cursor)["historyId"] == str(w.fake.history_id)
        assert "3 backfilled" in result.note
    finally:
        await w.close()


async def test_label_restricts_to_labelled_mail(tmp_path):
    """source.label: only mail carrying that label is admitted (history.list labelId)."""
    w = GmailWorld(tmp_path, source='{type: gmail, account: support, query: "in:inbox", '
                                    'label: Support}')
    lid = w.fake.add_label("Support")
    await w.open()
    try:
        await _started(w)
        yes = w.fake.add_message(simple_message(1), labels=["INBOX", lid])
        w.fake.add_message(simple_message(2))
        await w.tick()
        assert [d.item_id for d in await w.drafts()] == [yes]
        assert w.fake.calls_to("history.list")[-1].query["labelId"] == [lid]
    finally:
        await w.close()


async def test_read_5xx_is_retried_and_nothing_is_lost(world):
    """A 503 on history.list is retried; a Gmail outage longer than the retries fails
    the run with the reason, admits nothing, and the next tick gets every message."""
    await _started(world)
    world.fake.fail("history.list", 503)
    world.fake.add_message(simple_message(1))
    counts = await world.tick()
    assert counts.new == 1
    world.fake.fail("messages.get", 500, times=6)  # 3 attempts for each of 2 messages
    ids = [world.fake.add_message(simple_message(n)) for n in (2, 3)]
    counts = await world.tick()
    run = (await world.store.recent_runs("support", 1))[0]
    assert run.status == "error" and "Gmail 500 on messages.get" in run.error_text
    assert counts.new == 0
    counts = await world.tick()
    assert counts.new == 2
    assert {d.item_id for d in await world.drafts()} >= set(ids)


async def test_429_with_short_retry_after_waits_and_succeeds(world):
    await _started(world)
    world.fake.fail("history.list", 429, headers={"Retry-After": "0"})
    world.fake.add_message(simple_message(1))
    counts = await world.tick()
    assert counts.new == 1
    assert len(world.fake.calls_to("history.list")) == 2


@pytest.mark.parametrize("status,reason", [(429, None), (403, "userRateLimitExceeded")])
async def test_rate_limit_with_long_retry_after_fails_run_and_backs_off(world, status, reason):
    """429 / quota 403 asking for a long wait: the run records why, the next tick does
    not call Gmail before the wait is over, and nothing is lost."""
    await _started(world)
    world.fake.fail("history.list", status, reason=reason, headers={"Retry-After": "120"})
    world.fake.add_message(simple_message(1))
    await world.tick()
    run = (await world.store.recent_runs("support", 1))[0]
    assert run.status == "error"
    assert f"Gmail {status}" in run.error_text and "retry after 120s" in run.error_text
    mark = world.fake.mark()
    await world.tick()
    assert world.fake.api_calls(mark) == []
    run = (await world.store.recent_runs("support", 1))[0]
    assert "backing off" in run.error_text
    source = world.engine.source(world.settings.pipeline("support"))
    source._not_before = 0  # the wait is over
    counts = await world.tick()
    assert counts.new == 1


async def test_unauthorised_fails_the_run_with_the_command_to_run(world):
    """A 401 (revoked token): the run fails with one clear message naming the command,
    and the operators are told."""
    await _started(world)
    world.fake.revoke()
    await world.tick()
    run = (await world.store.recent_runs("support", 1))[0]
    assert run.status == "error"
    assert "Gmail account 'support': token expired or revoked; run `draftgate auth gmail " \
           "--account support" in run.error_text
    assert "fake-access-token" not in run.error_text
    assert "draftgate auth gmail --account support" in world.out.getvalue()


async def test_tick_never_blocks_other_pipelines_event_loop(world):
    """While Gmail holds a call, the event loop keeps running (calls are in threads)."""
    await _started(world)
    release = world.fake.hold("history.list")
    task = asyncio.create_task(world.tick())
    reached = world.fake.reached("history.list")
    for _ in range(200):
        if reached.is_set():
            break
        await asyncio.sleep(0.01)
    assert reached.is_set()
    beats = 0
    for _ in range(5):
        await asyncio.sleep(0.01)
        beats += 1
    assert beats == 5 and not task.done()
    release.set()
    await asyncio.wait_for(task, 10)


async def test_query_beyond_labels_is_rechecked_with_one_bounded_list(tmp_path):
    """A query Gmail must evaluate (from:) is re-checked with one messages.list bounded
    by after:, so history's other new mail is not admitted."""
    w = GmailWorld(tmp_path, source='{type: gmail, account: support, '
                                    'query: "in:inbox from:alice@customer.example"}')
    await w.open()
    try:
        await _started(w)
        yes = w.fake.add_message(simple_message(1))
        w.fake.add_message(simple_message(2, sender="bob@other.example"))
        mark = w.fake.mark()
        await w.tick()
        assert [d.item_id for d in await w.drafts()] == [yes]
        routes = [c.route for c in w.fake.api_calls(mark)]
        assert routes == ["history.list", "messages.get", "messages.get", "messages.list"]
        (q,) = w.fake.calls_to("messages.list")[-1].query["q"]
        assert q.startswith("(in:inbox from:alice@customer.example) after:")
    finally:
        await w.close()


def test_bad_options_name_the_file_and_path(tmp_path):
    """Config errors for the Gmail source and senders say where and what is expected."""
    from bot.config.load import collect_settings
    from bot.engine.build import check_all
    from tests.fakes.gmail import FakeGmail, write_deployment

    fake = FakeGmail()  # never started: building does no I/O
    fake._server = type("S", (), {"server_address": ("127.0.0.1", 1)})()
    config = write_deployment(
        tmp_path, fake, source="{type: gmail, account: support, querry: x, backfill: -1}",
        sender="{type: gmail_reply, acount: support}")
    settings, errors = collect_settings(config)  # as `draftgate validate` does
    errors += check_all(settings)
    assert "pipelines/support.yaml: source.querry: unknown key; did you mean 'query'?" in errors
    assert "pipelines/support.yaml: source.backfill: expected 0 or a positive number of " \
           "messages" in errors
    assert any(e.startswith("pipelines/support.yaml: sender.acount: unknown key") for e in errors)


async def test_a_huge_history_does_not_stall_the_event_loop(world):
    """25,000 messages in history (a long outage on a busy box): collecting the
    candidates from a page stays quick on the event loop, so Telegram taps and other
    pipelines are not held up (a list membership test per entry was quadratic: about
    4 s of blocked loop for this page)."""
    from bot.stages import FetchContext

    await _started(world)
    cursor = await world.store.get_cursor("support", "gmail:support")
    raw = simple_message(1)
    ids = [world.fake.add_message(raw) for _ in range(25_000)]
    source = world.engine.source(world.settings.pipeline("support"))
    source.page_size = len(ids)  # one page: what the loop does with it is one step
    asked: list[list[str]] = []

    async def unseen(xs):
        asked.append(list(xs))
        return set()  # all admitted before: nothing to download

    longest = 0.0
    stop = asyncio.Event()

    async def heartbeat():
        # CPU time of the loop's own thread between two beats: what one step kept the
        # loop busy with, whatever else a busy machine runs meanwhile (wall time is not).
        nonlocal longest
        while not stop.is_set():
            before = time.thread_time()
            await asyncio.sleep(0.005)
            longest = max(longest, time.thread_time() - before)

    beat = asyncio.create_task(heartbeat())
    try:
        result = await source.fetch(FetchContext("support", source.scope, 0.0, cursor, unseen))
    finally:
        stop.set()
        await beat
    assert asked == [ids] and result.items == []
    assert longest < 1.0, f"event loop busy for {longest:.2f}s of CPU in one step"


def _without_configured_address(w: GmailWorld) -> None:
    """The account's own address is then known only from Gmail's profile."""
    config = w.tmp_path / "draftgate.yaml"
    config.write_text("".join(line for line in config.read_text().splitlines(True)
                              if "address:" not in line))


async def _contact_form_mail(w: GmailWorld):
    """After the first run, a contact form's message From: our own address (Reply-To:
    the visitor) and a tick: its draft and the tick's counts."""
    await _started(w)
    gid = w.fake.add_message(simple_message(
        1, sender=f"Website <{w.fake.address}>",
        extra_headers="Reply-To: visitor@customer.example\r\n"))
    counts = await w.tick()
    (d,) = await w.store.item_drafts("support", gid)
    return d, counts


@pytest.mark.parametrize("configured", [True, False])
async def test_mail_from_our_own_address_is_skipped_with_the_reason(tmp_path, configured):
    """A contact form sending From: our own address (Reply-To: the visitor) is not lost
    without a trace: it is recorded as skipped with the reason, whether the address is
    configured or learnt from Gmail's profile."""
    w = GmailWorld(tmp_path)
    if not configured:
        _without_configured_address(w)
    await w.open()
    try:
        d, counts = await _contact_form_mail(w)
        assert d.status == Status.SKIPPED
        assert d.error == f"sent from our own address {w.fake.address}"
        assert counts.skipped == 1 and counts.new == 0
    finally:
        await w.close()


@pytest.mark.parametrize("configured", [True, False])
async def test_skip_own_false_drafts_mail_from_our_own_address(tmp_path, configured):
    """filters.skip_own: false, as README documents: the contact form's message is
    drafted, and the reply is addressed to its Reply-To."""
    w = GmailWorld(tmp_path)
    if not configured:
        _without_configured_address(w)
    pipeline = tmp_path / "pipelines" / "support.yaml"
    pipeline.write_text(pipeline.read_text() + "filters: {skip_own: false}\n")
    await w.open()
    try:
        d, counts = await _contact_form_mail(w)
        assert d.status == Status.AWAITING and counts.new == 1
        after = await w.desk.approve(op("op"), d.id, d.version)
        assert after.status == "sent"
        (reply,) = w.fake.sent()
        assert b"To: visitor@customer.example" in reply.raw
    finally:
        await w.close()


@pytest.mark.parametrize("status,reason", [(429, None), (429, "rateLimitExceeded"),
                                           (403, "userRateLimitExceeded"),
                                           (403, "rateLimitExceeded")])
async def test_rate_limit_without_retry_after_backs_off_and_the_tick_succeeds(
        world, status, reason):
    """One "too many concurrent requests" among 20 downloads, with no Retry-After: that
    download backs off and is retried, the tick is green, each message is admitted, and
    no body is downloaded again on the next tick."""
    await _started(world)
    ids = [world.fake.add_message(simple_message(n)) for n in range(20)]
    world.fake.fail("messages.get", status, reason=reason,
                    message="Too many concurrent requests for user")
    counts = await world.tick()
    run = (await world.store.recent_runs("support", 1))[0]
    assert run.status == "ok", run.error_text
    assert counts.new == 20
    assert len(world.fake.calls_to("messages.get")) == 21
    mark = world.fake.mark()
    await world.tick()
    assert [c.route for c in world.fake.api_calls(mark)] == ["history.list"]
    assert {d.item_id for d in await world.drafts()} == set(ids)


async def test_rate_limit_backoff_is_bounded_by_read_attempts(world):
    """A rate limit that does not clear: read_attempts calls (3), then the run fails
    with the reason; a daily quota is not retried at all."""
    await _started(world)
    world.fake.add_message(simple_message(1))
    world.fake.fail("history.list", 429, times=3)
    mark = world.fake.mark()
    await world.tick()
    run = (await world.store.recent_runs("support", 1))[0]
    assert run.status == "error" and "Gmail 429 (rate limit) on history.list" in run.error_text
    assert [c.route for c in world.fake.api_calls(mark)] == ["history.list"] * 3
    world.fake.fail("history.list", 403, reason="dailyLimitExceeded")
    mark = world.fake.mark()
    await world.tick()
    run = (await world.store.recent_runs("support", 1))[0]
    assert "Gmail 403 (quota exceeded) on history.list" in run.error_text
    assert [c.route for c in world.fake.api_calls(mark)] == ["history.list"]
    assert (await world.tick()).new == 1


async def test_a_failed_download_stops_the_others_before_the_tick_ends(tmp_path):
    """One download fails for good: the tick fails with its reason, the batches not
    yet started are not started, and nothing calls Gmail after the tick has ended
    (orphaned downloads used to go on in the background). The next tick gets all."""
    w = GmailWorld(tmp_path, source='{type: gmail, account: support, '
                                    'query: "in:inbox", concurrency: 1}')
    await w.open()
    try:
        await _started(w)
        ids = [w.fake.add_message(simple_message(n)) for n in range(120)]  # 3 batches
        w.fake.fail("messages.get", 400, message="Invalid id value")
        await w.tick()
        run = (await w.store.recent_runs("support", 1))[0]
        assert run.status == "error" and "Gmail 400 on messages.get" in run.error_text
        assert len(w.fake.batches()) == 1 and len(w.fake.calls_to("messages.get")) == 50
        release = w.fake.hold("batch")
        try:
            late = await asyncio.to_thread(w.fake.reached("batch").wait, 1.0)
        finally:
            release.set()
        assert not late, "a download reached Gmail after the tick had ended"
        assert len(w.fake.calls_to("messages.get")) == 50
        counts = await w.tick()
        assert counts.new == 120 and {d.item_id for d in await w.drafts()} == set(ids)
    finally:
        await w.close()


async def test_reauthorising_takes_effect_without_a_restart(world):
    """The run said "token expired or revoked; run `draftgate auth gmail ...`": once
    that command has written a new token file, the next tick uses it, without
    restarting draftgate."""
    from tests.fakes.gmail import write_token_file

    await _started(world)
    world.fake.revoke()
    gid = world.fake.add_message(simple_message(1))
    await world.tick()
    run = (await world.store.recent_runs("support", 1))[0]
    assert run.status == "error" and "draftgate auth gmail" in run.error_text
    access, refresh = world.fake.reauthorise()  # what `draftgate auth gmail` obtains
    write_token_file(world.tmp_path / "support-token.json", world.fake, token=access,
                     refresh_token=refresh)
    counts = await world.tick()
    run = (await world.store.recent_runs("support", 1))[0]
    assert run.status == "ok", run.error_text
    assert counts.new == 1 and [d.item_id for d in await world.drafts()] == [gid]


def _after(call) -> int:
    """The after: bound (epoch seconds) of a messages.list call."""
    (q,) = call.query["q"]
    return int(q.split("after:")[1].split()[0])


async def test_history_expiry_never_drafts_mail_that_was_there_at_install(world):
    """Mail in the box on the first run is deliberately not drafted; when history then
    expires (draftgate was down for a week), the fallback does not draft it either.
    Mail that arrived after the first run is admitted, each once."""
    old = [world.fake.add_message(simple_message(n)) for n in range(5)]
    installed = time.time()
    await _started(world)
    new = [world.fake.add_message(simple_message(n)) for n in range(10, 13)]
    world.fake.expire_history()
    counts = await world.tick()
    run = (await world.store.recent_runs("support", 1))[0]
    assert run.status == "ok", run.error_text
    assert counts.new == 3
    assert sorted(d.item_id for d in await world.drafts()) == sorted(new)
    assert await world.store.unseen("support", "gmail:support", old) == set(old)
    (listing,) = world.fake.calls_to("messages.list")
    assert _after(listing) >= int(installed) - 1
    await world.tick()
    assert sorted(d.item_id for d in await world.drafts()) == sorted(new)


async def test_history_expiry_lists_back_to_the_last_sync_only(world):
    """After weeks of ticks, the fallback reaches back to the last successful sync (less
    a small margin), not the whole resync_window: an old message put back in the inbox
    (no history record) is not drafted, mail since the last sync is."""
    await _started(world)
    world.fake.add_message(simple_message(1))
    before = time.time()
    await world.tick()  # the last successful sync
    after = time.time()
    archived = world.fake.add_message(simple_message(2), received=time.time() - 3 * 86400)
    fresh = world.fake.add_message(simple_message(3))
    world.fake.expire_history()
    mark = world.fake.mark()
    counts = await world.tick()
    assert await world.store.item_drafts("support", archived) == []
    assert [d.item_id for d in await world.store.item_drafts("support", fresh)] == [fresh]
    assert counts.new == 1
    from bot.sources.gmail import RESYNC_MARGIN

    (listing,) = [c for c in world.fake.api_calls(mark) if c.route == "messages.list"]
    assert int(before - RESYNC_MARGIN) - 1 <= _after(listing) <= int(after)


async def test_a_cursor_stored_as_a_bare_history_id_still_works(world):
    """Cursors stored before this format (a bare historyId) go on working: the next
    tick reads history from it and stores the new format."""
    await _started(world)
    await set_cursor(world.store, "support", "gmail:support", str(world.fake.history_id))
    gid = world.fake.add_message(simple_message(1))
    counts = await world.tick()
    assert counts.new == 1 and [d.item_id for d in await world.drafts()] == [gid]
    cursor = json.loads(await world.store.get_cursor("support", "gmail:support"))
    assert cursor["historyId"] == str(world.fake.history_id) and "synced" in cursor
    world.fake.expire_history()
    later = world.fake.add_message(simple_message(2))
    counts = await world.tick()
    assert counts.new == 1 and {d.item_id for d in await world.drafts()} == {gid, later}


async def test_mail_arriving_while_history_is_paged_is_not_skipped(world):
    """history.list's historyId is the mailbox's current record when each page is
    served, and Gmail does not promise that records added while paging appear on later
    pages. A message arriving between pages is admitted by the next tick: the cursor is
    the first page's historyId, not the last's."""
    await _started(world)
    world.fake.history_snapshot_pages = True
    world.engine.source(world.settings.pipeline("support")).page_size = 7
    ids = [world.fake.add_message(simple_message(n)) for n in range(20)]
    snapshot = world.fake.history_id
    mark = world.fake.mark()
    second = world.fake.hold("history.list", skip=1)  # page 2 waits for the new mail
    counts, during = await _tick_with_mail_arriving(world, "history.list", second)
    assert counts.new == 20
    assert [c.query.get("pageToken") for c in world.fake.api_calls(mark)
            if c.route == "history.list"][:2] == [None, [f"7@{snapshot}"]]
    counts = await world.tick()
    assert counts.new == 1
    assert {d.item_id for d in await world.drafts()} == set(ids + during)


# -- Gmail's search index lagging behind history --------------------------------------

_FROM_ALICE = '{type: gmail, account: support, query: "in:inbox from:alice@customer.example"}'


def _recheck(cursor: str | None) -> list[str]:
    """The ids the stored cursor keeps to search for again."""
    return [gid for gid, _ in json.loads(cursor or "{}").get("recheck", [])]


def _gmail_log(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "draftgate.sources.gmail"
            and r.levelno >= logging.INFO]


@pytest.fixture
async def from_alice(tmp_path):
    w = await GmailWorld(tmp_path, source=_FROM_ALICE).open()
    try:
        await _started(w)
        yield w
    finally:
        await w.close()


async def test_a_match_the_search_misses_at_first_is_admitted_later_exactly_once(
        from_alice, caplog):
    """A message matching from: that Gmail's search does not return yet (its index lags
    behind history) is not lost when the cursor moves past it: a later tick searches
    again, admits it once, and then goes back to one call per idle tick."""
    caplog.set_level(logging.INFO, logger="draftgate.sources.gmail")
    w = from_alice
    gid = w.fake.add_message(simple_message(1), search_lag=2)
    counts = await w.tick()
    assert counts.new == 0 and await w.drafts() == []
    cursor = await w.store.get_cursor("support", "gmail:support")
    assert _recheck(cursor) == [gid]
    assert json.loads(cursor)["historyId"] == str(w.fake.history_id)  # moved past it
    assert any("1 of 1 new message(s) not returned by the query" in m and gid in m
               for m in _gmail_log(caplog))
    mark = w.fake.mark()
    assert (await w.tick()).new == 0  # still lagging: searched again, kept
    assert [c.route for c in w.fake.api_calls(mark)] == ["history.list", "messages.list"]
    assert _recheck(await w.store.get_cursor("support", "gmail:support")) == [gid]
    mark = w.fake.mark()
    assert (await w.tick()).new == 1  # the index has caught up
    assert [c.route for c in w.fake.api_calls(mark)] == \
        ["history.list", "messages.list", "messages.get"]
    assert [(d.item_id, d.status) for d in await w.drafts()] == [(gid, Status.AWAITING)]
    assert _recheck(await w.store.get_cursor("support", "gmail:support")) == []
    for _ in range(2):
        mark = w.fake.mark()
        assert (await w.tick()).new == 0
        assert [c.route for c in w.fake.api_calls(mark)] == ["history.list"]
    assert len(await w.drafts()) == 1


async def test_a_non_match_is_searched_for_until_the_window_ends_then_dropped_with_a_log(
        from_alice, caplog):
    """A message that does not match is never admitted; while young it is searched for
    again, and once older than the window it is dropped with an INFO line naming it.
    A match arriving meanwhile is admitted as usual."""
    caplog.set_level(logging.INFO, logger="draftgate.sources.gmail")
    w = from_alice
    bob = w.fake.add_message(simple_message(1, sender="bob@other.example"),
                             received=time.time() - 120)  # young: within the 15 minutes
    counts = await w.tick()
    assert counts.new == 0
    assert _recheck(await w.store.get_cursor("support", "gmail:support")) == [bob]
    assert any("1 of 1 new message(s) not returned by the query" in m and "1 kept" in m
               for m in _gmail_log(caplog))
    yes = w.fake.add_message(simple_message(2))
    assert (await w.tick()).new == 1
    assert _recheck(await w.store.get_cursor("support", "gmail:support")) == [bob]
    source = w.engine.source(w.settings.pipeline("support"))
    source.recheck_window = 60.0  # bob is now older than the window
    caplog.clear()
    mark = w.fake.mark()
    assert (await w.tick()).new == 0
    assert [c.route for c in w.fake.api_calls(mark)] == ["history.list", "messages.list"]
    assert _recheck(await w.store.get_cursor("support", "gmail:support")) == []
    (dropped,) = [r for r in caplog.records if r.name == "draftgate.sources.gmail"
                  and bob in r.getMessage()]
    assert dropped.levelno == logging.INFO and "dropped" in dropped.getMessage()
    assert [d.item_id for d in await w.drafts()] == [yes]
    assert await w.store.item_drafts("support", bob) == []
    mark = w.fake.mark()
    await w.tick()
    assert [c.route for c in w.fake.api_calls(mark)] == ["history.list"]


async def test_a_non_match_older_than_the_window_is_dropped_at_once_with_a_log(
        from_alice, caplog):
    """A candidate already older than the window when the search misses it is not kept
    (the index has had the time); the INFO line counts and names it."""
    caplog.set_level(logging.INFO, logger="draftgate.sources.gmail")
    w = from_alice
    old = w.fake.add_message(simple_message(1, sender="bob@other.example"),
                             received=time.time() - 3600)
    await w.tick()
    assert _recheck(await w.store.get_cursor("support", "gmail:support")) == []
    assert any("1 older dropped as not matching" in m and old in m
               for m in _gmail_log(caplog))
    mark = w.fake.mark()
    await w.tick()
    assert [c.route for c in w.fake.api_calls(mark)] == ["history.list"]


async def test_a_kept_message_deleted_meanwhile_is_dropped(from_alice, caplog):
    """A kept id the search then returns but Gmail answers 404 for (deleted meanwhile)
    is dropped with a log line, and the tick is green."""
    caplog.set_level(logging.INFO, logger="draftgate.sources.gmail")
    w = from_alice
    gid = w.fake.add_message(simple_message(1), search_lag=1)
    await w.tick()
    assert _recheck(await w.store.get_cursor("support", "gmail:support")) == [gid]
    w.fake.fail("messages.get", 404, message="Requested entity was not found.")
    counts = await w.tick()
    run = (await w.store.recent_runs("support", 1))[0]
    assert run.status == "ok", run.error_text
    assert counts.new == 0 and await w.drafts() == []
    assert _recheck(await w.store.get_cursor("support", "gmail:support")) == []
    assert any("vanished" in m and gid in m for m in _gmail_log(caplog))


async def test_idle_tick_with_a_search_query_is_one_call_once_nothing_is_kept(from_alice):
    """With a query that needs Gmail's search, an idle tick is one history.list (2 quota
    units) when nothing is kept to search for again; a kept id costs one messages.list
    per tick until it is decided, then the idle tick is one call again."""
    w = from_alice
    mark = w.fake.mark()
    await w.tick()
    assert [c.route for c in w.fake.api_calls(mark)] == ["history.list"]
    assert w.fake.units(mark) == 2
    gid = w.fake.add_message(simple_message(1), search_lag=1)
    await w.tick()
    mark = w.fake.mark()
    await w.tick()
    assert [c.route for c in w.fake.api_calls(mark)] == \
        ["history.list", "messages.list", "messages.get"]
    assert [d.item_id for d in await w.drafts()] == [gid]
    mark = w.fake.mark()
    await w.tick()
    assert [c.route for c in w.fake.api_calls(mark)] == ["history.list"]
    assert w.fake.units(mark) == 2


@pytest.mark.parametrize("stored", ["bare", "json", "json+recheck"])
async def test_older_cursor_formats_keep_working_with_the_recheck(from_alice, stored):
    """A bare historyId, the JSON cursor without "recheck" and one with unreadable
    recheck entries all work: a message the search misses is kept in the new cursor
    and admitted once by a later tick."""
    w = from_alice
    hid = str(w.fake.history_id)
    value = {"bare": hid,
             "json": json.dumps({"historyId": hid, "synced": time.time(), "first": 1.0}),
             "json+recheck": json.dumps({"historyId": hid, "synced": time.time(),
                                         "recheck": [["x", "y"], 5, ["", 1]]})}[stored]
    await set_cursor(w.store, "support", "gmail:support", value)
    gid = w.fake.add_message(simple_message(1), search_lag=1)
    assert (await w.tick()).new == 0
    cursor = json.loads(await w.store.get_cursor("support", "gmail:support"))
    assert cursor["historyId"] == str(w.fake.history_id) and "synced" in cursor
    assert _recheck(json.dumps(cursor)) == [gid]
    assert (await w.tick()).new == 1
    assert [d.item_id for d in await w.drafts()] == [gid]
    assert _recheck(await w.store.get_cursor("support", "gmail:support")) == []
    assert (await w.tick()).new == 0 and len(await w.drafts()) == 1


async def test_ids_kept_to_search_again_survive_a_history_expiry(from_alice):
    """History expires while an id is kept: the resync's own listing (which may lag
    too) does not return it, so the next incremental tick still searches for it."""
    w = from_alice
    gid = w.fake.add_message(simple_message(1), search_lag=2)
    await w.tick()
    w.fake.expire_history()
    counts = await w.tick()  # resync by query: the search still misses it
    run = (await w.store.recent_runs("support", 1))[0]
    assert run.status == "ok", run.error_text
    assert counts.new == 0
    assert _recheck(await w.store.get_cursor("support", "gmail:support")) == [gid]
    assert (await w.tick()).new == 1
    assert [d.item_id for d in await w.drafts()] == [gid]


async def test_a_kept_message_dated_in_the_future_still_leaves_the_recheck_list(from_alice):
    """Imported mail dated five years ahead used to be kept (one extra search per
    tick) until that date; its arrival now counts as the moment it was seen."""
    w = from_alice
    before = time.time() * 1000
    gid = w.fake.add_message(simple_message(1, sender="bob@other.example"),
                             received=time.time() + 5 * 365 * 86400)
    await w.tick()
    [(kept, arrival)] = json.loads(await w.store.get_cursor("support", "gmail:support"))["recheck"]
    assert kept == gid and before <= arrival <= time.time() * 1000


async def _tick_with_mail_arriving(world, route: str, held) -> tuple:
    """Run a tick during which one new message arrives: once a ``route`` call has
    reached the fake (and waits on ``held``), the message is added, then ``held`` is
    released. Returns the tick's counts and [the new message's id]."""
    during: list[str] = []

    def arrive():
        world.fake.reached(route).wait(10)
        during.append(world.fake.add_message(simple_message(99)))
        held.set()

    helper = threading.Thread(target=arrive)
    helper.start()
    counts = await world.tick()
    helper.join(10)
    return counts, during
