"""Gmail reads through the batch endpoint (multipart/mixed), driven by the real
googleapiclient against the fake Gmail: part failures are handled part by part, and
sends never go through a batch."""

from __future__ import annotations

import pytest

from bot.gmail.batch import MAX_PARTS
from tests.fakes.gmail import GmailWorld, simple_message


async def _ready(w: GmailWorld, n: int) -> list[str]:
    await w.tick()  # first run: cursor recorded
    return [w.fake.add_message(simple_message(i)) for i in range(n)]


def _part_ids(envelope) -> list[str]:
    return [path.rsplit("/", 1)[1] for path in envelope.body]


async def test_a_404_part_and_a_503_part_admit_the_others_and_retry_the_503_alone(tmp_path):
    """One part of a batch answers 404 (deleted meanwhile), one 503: the other messages
    are admitted from the first answer, the 503 goes again alone and is admitted too,
    only the 404 one is dropped; quota is counted per part (5 units a messages.get)."""
    w = await GmailWorld(tmp_path).open()
    try:
        ids = await _ready(w, 6)
        w.fake.fail_part(ids[1], 404)
        w.fake.fail_part(ids[4], 503)
        client = w.engine.source(w.settings.pipeline("support")).client
        mark, before = w.fake.mark(), client.calls
        counts = await w.tick()
        first, again = w.fake.batches()
        assert _part_ids(first) == ids and _part_ids(again) == [ids[4]]
        assert counts.new == 5
        drafted = {d.item_id for d in await w.drafts()}
        assert drafted == set(ids) - {ids[1]}
        gets = [c for c in w.fake.api_calls(mark) if c.route == "messages.get"]
        assert all(c.batch for c in gets) and len(gets) == 7
        assert sum(c.units for c in gets) == 7 * 5
        assert client.calls - before == len(w.fake.api_calls(mark))  # parts count as calls
    finally:
        await w.close()


async def test_a_batch_answer_cut_off_mid_body_retries_only_the_missing_parts(tmp_path):
    """The answer to a batch ends in the middle of its fourth part: the three whole
    parts are used, and only the fourth to last go again."""
    w = await GmailWorld(tmp_path).open()
    try:
        ids = await _ready(w, 7)
        w.fake.truncate_batch(part=3)
        counts = await w.tick()
        first, again = w.fake.batches()
        assert _part_ids(first) == ids and _part_ids(again) == ids[3:]
        assert counts.new == 7 and {d.item_id for d in await w.drafts()} == set(ids)
    finally:
        await w.close()


async def test_a_part_that_keeps_failing_fails_the_tick_and_the_next_tick_gets_it(tmp_path):
    """A 503 on every attempt fails the tick with the reason; nothing is admitted
    half-way, and the next tick gets every message."""
    w = await GmailWorld(tmp_path).open()
    try:
        ids = await _ready(w, 3)
        w.fake.fail_part(ids[2], 503, times=3)  # read_attempts: 3
        await w.tick()
        run = (await w.store.recent_runs("support", 1))[0]
        assert run.status == "error" and "Gmail 503 on messages.get" in run.error_text
        assert [len(b.body) for b in w.fake.batches()] == [3, 1, 1]
        counts = await w.tick()
        assert counts.new == 3 and {d.item_id for d in await w.drafts()} == set(ids)
    finally:
        await w.close()


async def test_batches_carry_at_most_50_calls(tmp_path):
    """120 new messages: three batch requests of at most 50 parts, every id once."""
    w = await GmailWorld(tmp_path).open()
    try:
        ids = await _ready(w, 120)
        counts = await w.tick()
        sizes = sorted(len(b.body) for b in w.fake.batches())
        assert sizes == [20, MAX_PARTS, MAX_PARTS]
        assert sorted(i for b in w.fake.batches() for i in _part_ids(b)) == sorted(ids)
        assert counts.new == 120
    finally:
        await w.close()


@pytest.mark.parametrize("sender", ["{type: gmail_reply, account: support}",
                                    "{type: gmail_draft, account: support}"])
async def test_no_send_ever_goes_through_the_batch_endpoint(tmp_path, sender):
    """Replies and Gmail drafts are single requests, even when a read beside them is
    batched and retried; a send that fails with 503 is not sent again."""
    w = await GmailWorld(tmp_path, auto_approve=True, sender=sender).open()
    try:
        ids = await _ready(w, 3)
        route = "messages.send" if "reply" in sender else "drafts.create"
        w.fake.fail_part(ids[0], 503)
        w.fake.error_after_accept(route, 503)
        await w.tick()
        await w.engine.wait_idle()
        writes = w.fake.calls_to(route)
        assert writes and not any(c.batch for c in writes)
        assert len(writes) == 3  # one each: the 503 one is not retried by the transport
        assert all(path.startswith("/gmail/v1/users/me/messages/")
                   for b in w.fake.batches() for path in b.body)
        assert not [c for c in w.fake.calls if c.batch and c.method != "GET"]
    finally:
        await w.close()


@pytest.mark.parametrize("wrong", ["no-id", "other-id"])
async def test_a_part_answering_200_with_another_resource_is_retried_never_lost(tmp_path, wrong):
    """A part answers 200 with a message that is not the one asked for (no ``id``, or
    another message's): it is a failed part, asked for again, and the right answer is
    admitted under the id that was asked for; nothing is drafted twice or as "None"."""
    w = await GmailWorld(tmp_path).open()
    try:
        ids = await _ready(w, 4)
        bad = w.fake.resource_of(ids[3])
        if wrong == "no-id":
            bad.pop("id")
        else:
            bad = w.fake.resource_of(ids[0])
        w.fake.answer_part(ids[3], bad)
        counts = await w.tick()
        first, again = w.fake.batches()
        assert _part_ids(first) == ids and _part_ids(again) == [ids[3]]
        assert counts.new == 4
        drafts = await w.drafts()
        assert sorted(d.item_id for d in drafts) == sorted(ids)
        assert "None" not in {d.item_id for d in drafts}
    finally:
        await w.close()


async def test_a_part_that_keeps_answering_another_resource_fails_the_tick_unseen(tmp_path):
    """Every attempt answers 200 without an ``id``: the tick is red and names why,
    nothing is admitted half-way (the message is not marked seen), and the next tick,
    with Gmail answering properly, drafts all four."""
    w = await GmailWorld(tmp_path).open()
    try:
        ids = await _ready(w, 4)
        bad = w.fake.resource_of(ids[3])
        bad.pop("id")
        w.fake.answer_part(ids[3], bad, times=3)  # read_attempts: 3
        await w.tick()
        run = (await w.store.recent_runs("support", 1))[0]
        assert run.status == "error" and "not the message asked for" in run.error_text
        assert await w.drafts() == []
        unseen = await w.store.unseen("support", "gmail:support", ids)
        assert set(unseen) == set(ids)
        counts = await w.tick()
        assert counts.new == 4 and {d.item_id for d in await w.drafts()} == set(ids)
    finally:
        await w.close()
