"""The engine with the real LLM drafters: the real maildir/schedule sources, the real
SQLite store, the real outbox sender and the real openai/anthropic SDKs against the
fake model server. What is counted is what a user would notice: model calls (money),
cards (a reviewer's attention) and drafts.
"""

from __future__ import annotations

import asyncio

import pytest

from bot.desk import reports as ops
from tests.fakes.llm import FakeLLM
from tests.support.desk import SYSTEM, op
from tests.support.engine_world import (  # noqa: F401
    T0,
    Cards,
    Clock,
    World,
    deploy,
    email,
)
from tests.support.fixtures import fake_llm

fake = fake_llm  # the fixture: a fake model server (support/fixtures.py)


@pytest.fixture
async def world_factory(tmp_path):
    worlds: list[World] = []

    def make(fake: FakeLLM, **kw) -> World:
        w = World(deploy(tmp_path, fake, **kw), Clock())
        worlds.append(w)
        return w

    yield make
    for w in worlds:
        await w.close()


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
async def test_a_tick_makes_one_model_call_one_draft_and_one_card_per_email(
        world_factory, fake, provider):
    w = world_factory(fake, provider=provider, emails=3)
    engine, cards = await w.engine()
    counts = await engine.tick("support")
    assert (counts.new, counts.drafted, counts.posted) == (3, 3, 3)
    assert len(fake.requests) == 3
    again = await engine.tick("support")
    assert (again.new, again.drafted, again.posted) == (0, 0, 0)
    assert len(fake.requests) == 3 and len(cards.cards) == 3
    pending = await w.store.pending("support")
    assert sorted(d.status for d in pending) == ["awaiting"] * 3
    assert all(d.body.startswith("Thank you for your message.") for d in pending)
    # Token use, from the usage fields: per draft, per run and per day.
    assert all((d.tokens_in, d.tokens_out) == (11, 7) for d in pending)
    assert counts.tokens == 3 * 18
    detail = await ops.status_one(w.store, w.settings, "support", now=w.clock())
    assert detail.tokens_today == 3 * 18
    assert "tokens today 54" in ops.format_status_one(detail)


async def test_a_catch_up_run_drafts_each_missed_slot_once_and_never_a_drafted_slot_again(
        world_factory, fake):
    w = world_factory(fake)
    engine, cards = await w.engine()
    await engine.tick("posts", scheduled_for=T0)
    assert len(fake.requests) == 1
    # Down for three hours; the restarted bot catches up the missed slots.
    w.clock.t = T0 + 3 * 3600 + 120
    engine2, cards2 = await w.engine()
    await engine2.tick("posts")
    assert len(fake.requests) == 4
    # The same slots again (a second catch-up, a late tick for an old slot): no call.
    await engine2.tick("posts")
    await engine2.tick("posts", scheduled_for=T0)
    await engine2.tick("posts", scheduled_for=T0 + 3600)
    assert len(fake.requests) == 4
    drafts = await w.store.pending("posts")
    assert sorted(d.item_id for d in drafts) == ["2025-11-29T10:00", "2025-11-29T11:00",
                                                 "2025-11-29T12:00", "2025-11-29T13:00"]
    assert len(cards.cards) + len(cards2.cards) == 4
    system, user = fake.requests[0].texts()
    assert "scheduled slot 2025-11-29T10:00" in system and "Weekly product tip" in user


async def test_429_then_success_is_one_draft_after_the_wait(world_factory, fake):
    w = world_factory(fake, emails=1)
    fake.script(fake.error(429, "rate limited", retry_after=0.3))
    engine, cards = await w.engine()
    counts = await engine.tick("support")
    assert counts.drafted == 1 and len(cards.cards) == 1
    assert len(fake.requests) == 2 and fake.requests[1].at - fake.requests[0].at >= 0.3
    [d] = await w.store.pending("support")
    assert d.status == "awaiting" and d.attempt == 0


async def test_500_to_the_last_attempt_fails_with_the_reason_tells_the_operator_and_replay_recovers(
        world_factory, fake):
    w = world_factory(fake, emails=1)
    fake.default = fake.error(500, "model overloaded", retry_after=0.01)
    engine, cards = await w.engine()
    first = await engine.tick("support")
    # Attempt 1 (two calls: retries 1) fails; the item waits in the queue for the
    # next tick, and no card is shown.
    assert first.failed == 0 and len(fake.requests) == 2 and cards.notes == []
    [d] = await w.store.item_drafts("support", "<q1@customer.example>")
    assert d.status == "queued" and "HTTP 500" in d.error
    w.clock.t += 300
    counts = await engine.tick("support")
    # max_attempts 2: the second attempt was the last one.
    assert counts.failed == 1 and len(fake.requests) == 4
    [d] = await w.store.item_drafts("support", "<q1@customer.example>")
    assert d.status == "failed" and "HTTP 500" in d.error and "model overloaded" in d.error
    [note] = [n for n in cards.notes if "drafting failed" in n]
    assert "model overloaded" in note and f"#{d.id}" in note
    assert cards.cards == []
    # The provider recovers; the operator replays the item.
    fake.default = fake.reply("Your order ships today.")
    result = await ops.replay(w.store, "support", "<q1@customer.example>", "anna")
    assert result.outcome == "requeued"
    w.clock.t += 300  # the next tick
    await engine.tick("support")
    [d] = await w.store.item_drafts("support", "<q1@customer.example>")
    assert d.status == "awaiting" and d.body == "Your order ships today."
    assert len(fake.requests) == 5 and cards.cards == [d.id]


async def test_the_daily_token_budget_stops_drafting_tells_once_and_resumes_next_day(
        world_factory, fake):
    # 18 tokens per draft; a budget of 30 allows two drafts (the check is before each).
    w = world_factory(fake, emails=3, budget=30, in_flight=1)
    engine, cards = await w.engine()
    await engine.tick("support")
    assert len(fake.requests) == 2
    by_status = await w.store.count_by_status("support")
    assert by_status.get("awaiting") == 2 and by_status.get("queued") == 1
    w.clock.t += 600
    await engine.tick("support")
    assert len(fake.requests) == 2
    told = [n for n in cards.notes if "budget" in n]
    assert len(told) == 1 and "30" in told[0]
    detail = await ops.status_one(w.store, w.settings, "support", now=w.clock())
    assert "tokens today 36 / 30" in ops.format_status_one(detail)
    # A new UTC day: the queued item is drafted.
    w.clock.t = T0 + 86400
    await engine.tick("support")
    assert len(fake.requests) == 3
    assert (await w.store.count_by_status("support")).get("awaiting") == 3
    assert len(cards.cards) == 3


async def test_an_answer_that_arrives_after_the_lease_was_lost_changes_nothing(world_factory, fake):
    """A call outlives its claim (here: the clock jumps past the lease while the model
    holds the answer); another engine re-drafts the item; the late answer is fenced."""
    w = world_factory(fake, emails=1)
    late = fake.hold(then=fake.reply("LATE answer from the abandoned call"))
    fake.script(late, fake.reply("Fresh draft"))
    slow_engine, slow_cards = await w.engine()
    first = asyncio.create_task(slow_engine.tick("support"))
    assert await asyncio.to_thread(late.arrived.wait, 10)
    w.clock.t += 400  # the 60 s lease (and the 300 s tick lock) have expired
    other, other_cards = await w.engine()
    assert (await w.desk.sweep(SYSTEM)).leases_requeued == 1  # the newest engine's desk
    counts = await other.tick("support")
    assert counts.drafted == 1
    late.release()
    stale = await first
    assert stale.drafted == 0
    [d] = await w.store.item_drafts("support", "<q1@customer.example>")
    assert d.status == "awaiting" and d.body == "Fresh draft" and d.version == 1
    assert len(slow_cards.cards) + len(other_cards.cards) == 1
    await slow_engine.drain("support")
    await other.drain("support")
    assert len(slow_cards.cards) + len(other_cards.cards) == 1
    assert len(fake.requests) == 2


async def test_regenerate_sends_the_operators_instruction_as_an_instruction(world_factory, fake):
    w = world_factory(fake, emails=1)
    engine, cards = await w.engine()
    await engine.tick("support")
    [d] = await w.store.pending("support")
    fake.script(fake.reply("Shorter reply."))
    assert await w.desk.regenerate(op("anna"), d.id, d.version, "Make it shorter") is not None
    await engine.wait_idle()  # the new version is drafted and posted on its own, at once
    after = await w.store.get_draft(d.id)
    assert after.body == "Shorter reply." and after.version == d.version + 1
    system, user = fake.requests[-1].texts()
    assert "Make it shorter" in system and "Make it shorter" not in user
    assert d.body in user  # the previous draft, as data
    assert len(cards.cards) == 1 and cards.edits == [(d.id, d.version + 1)]
