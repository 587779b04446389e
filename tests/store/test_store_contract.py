"""The store contract (bot/store/base.py), run unchanged against every backend through
the ``store`` fixture: SQLite always, PostgreSQL when DRAFTGATE_TEST_PG_DSN is set."""

from __future__ import annotations

import asyncio
import multiprocessing
import random
import time

import pytest

from bot.models import Item, Message, draft_key, sha256_text
from bot.store import create_store
from bot.store.base import HEARTBEAT_PREFIX
from tests._stores import get_draft_by_key, set_cursor
from tests.support.store_data import (  # noqa: F401
    DAY,
    T0,
    P,
    R,
    S,
    _items,
    _msg,
)


def _key(item_id: str, pipeline: str = P, recipe: str = R) -> str:
    return draft_key(pipeline, S, item_id, recipe)


async def _queued(store, *ids: str, pipeline: str = P, now: float = T0) -> list[str]:
    result = await store.admit(pipeline, S, R, _items(*ids), now=now)
    assert len(result.new) == len(ids)
    return result.new


async def _ready(store, item_id: str = "m1", body: str = "Hi, it ships today.", now: float = T0):
    [key] = await _queued(store, item_id, now=now)
    claimed = await store.claim_key(key, 600, now=now)
    return await store.finish_draft(claimed.id, claimed.fence, body, now=now)


async def _awaiting(store, item_id: str = "m1", body: str = "Hi, it ships today."):
    d = await _ready(store, item_id, body)
    return await store.mark_posted(d.id, d.version, "-100123", "77")


async def _sending(store, item_id: str = "m1"):
    d = await _awaiting(store, item_id)
    await store.approve(d.id, d.version, "anna")
    return await store.begin_send(d.id)


def _claim_worker(url: str, keys: list[str], seed: int, barrier, out) -> None:
    """A separate process: open its own store, claim every key in a shuffled order."""
    async def run() -> dict:
        store = create_store(url)
        await store.open()
        won, errors = [], []
        try:
            barrier.wait(timeout=60)
            order = list(keys)
            random.Random(seed).shuffle(order)
            for key in order:
                try:
                    draft = await store.claim_key(key, 600)
                except Exception as exc:  # counted: the test asserts there are none
                    errors.append(f"{type(exc).__name__}: {exc}")
                    continue
                if draft is not None:
                    won.append(key)
        finally:
            await store.close()
        return {"won": won, "errors": errors}

    try:
        out.put(asyncio.run(run()))
    except BaseException as exc:  # the parent must hear about a crash, not time out
        out.put({"won": [], "errors": [f"worker crashed: {type(exc).__name__}: {exc}"]})


class TestStoreContract:
    # -- admit -----------------------------------------------------------------------------

    async def test_admit_marks_seen_queues_and_stores_cursor_together(self, store):
        """New items are marked seen, queued with their message, and the cursor kept."""
        result = await store.admit(P, S, R, _items("m1", "m2"), cursor="h-42", now=T0)
        assert result.new == [_key("m1"), _key("m2")]
        assert result.skipped == [] and result.already_seen == 0
        assert await store.seen_count(P) == 2
        assert await store.unseen(P, S, ["m1", "m2", "m3"]) == {"m3"}
        assert await store.get_cursor(P, S) == "h-42"
        d = await get_draft_by_key(store, _key("m1"))
        assert (d.status, d.pipeline, d.scope, d.item_id, d.recipe) == ("queued", P, S, "m1", R)
        assert d.message == _msg("m1")
        assert (d.attempt, d.version, d.created_at) == (0, 1, T0)

    async def test_the_stored_message_comes_back_unchanged_whatever_its_text(self, store):
        """Non-ASCII, control characters, a lone surrogate from a header no decoder
        could read, and a nested value all survive the payload round trip."""
        odd = Message(message_id="<odd@mail.example>", from_name="Zoë \udc9f Ünal",
                      subject="Счёт 🧾\tNo.\x01 7", body="line\r\nnul:\x00 end " + "é" * 3000,
                      headers={"X-Tag": "über"}, size=2**40, labels=["INBOX"])
        nested = Message(message_id="<nested@mail.example>",
                         headers={"X-Parts": [{"part": 1}]})  # type: ignore[dict-item]
        await store.admit(P, S, R, [Item("odd", odd), Item("nested", nested)], now=T0)
        assert (await get_draft_by_key(store, _key("odd"))).message == odd
        assert (await get_draft_by_key(store, _key("nested"))).message == nested

    async def test_items_seen_before_are_not_queued_again(self, store):
        """A second fetch of the same ids queues only the new one."""
        await store.admit(P, S, R, _items("m1", "m2"), now=T0)
        result = await store.admit(P, S, R, _items("m2", "m1", "m3"), cursor="h2", now=T0 + 5)
        assert result.new == [_key("m3")]
        assert result.already_seen == 2
        assert await store.count_by_status(P) == {"queued": 3}
        assert (await get_draft_by_key(store, _key("m1"))).created_at == T0
        assert await store.get_cursor(P, S) == "h2"

    async def test_a_large_fetch_is_admitted_and_filtered_whole(self, store):
        """Thousands of ids in one fetch (a first sync) are all admitted exactly once."""
        ids = [f"m{i}" for i in range(1200)]
        assert len((await store.admit(P, S, R, _items(*ids), now=T0)).new) == 1200
        more = ids + [f"n{i}" for i in range(100)]
        assert await store.unseen(P, S, more) == {f"n{i}" for i in range(100)}
        again = await store.admit(P, S, R, _items(*more), mark_seen=False, now=T0)
        assert (len(again.new), again.already_seen) == (100, 1200)

    async def test_duplicate_ids_in_one_batch_make_one_draft(self, store):
        result = await store.admit(P, S, R, _items("m1", "m1"), now=T0)
        assert result.new == [_key("m1")]
        assert result.already_seen == 1
        assert await store.count_by_status(P) == {"queued": 1}

    async def test_skip_reason_records_a_skipped_draft_with_the_reason(self, store):
        result = await store.admit(P, S, R, _items("m1", "m2", skip={"m2": "mailing list"}), now=T0)
        assert result.new == [_key("m1")] and result.skipped == [_key("m2")]
        d = await get_draft_by_key(store, _key("m2"))
        assert (d.status, d.error) == ("skipped", "mailing list")
        assert await store.unseen(P, S, ["m2"]) == set()
        assert [x.key for x in await store.claim(P, 60, limit=5, now=T0)] == [_key("m1")]

    async def test_admit_without_mark_seen_writes_only_the_draft(self, store):
        """mark_seen=False queues the item but leaves no seen mark; the draft row still
        stops a second queueing."""
        result = await store.admit(P, S, R, _items("m1"), mark_seen=False, now=T0)
        assert result.new == [_key("m1")]
        assert await store.seen_count(P) == 0
        assert await store.unseen(P, S, ["m1"]) == {"m1"}
        again = await store.admit(P, S, R, _items("m1"), now=T0 + 1)
        assert again.new == [] and again.already_seen == 1

    async def test_a_new_recipe_drafts_again_only_where_nothing_marks_the_item_seen(self, store):
        """Changing the recipe re-drafts an unmarked item (a schedule slot), never mail
        that carries a seen mark."""
        await store.admit(P, S, "v1", _items("slot", "mail"), now=T0)
        await store.mark_seen(P, S, ["mail"], now=T0)
        await store.admit(P, "slots", "v1", _items("slot"), mark_seen=False, now=T0)
        again = await store.admit(P, "slots", "v2", _items("slot"), mark_seen=False, now=T0)
        assert again.new == [draft_key(P, "slots", "slot", "v2")]
        assert (await store.admit(P, S, "v2", _items("mail"), now=T0)).new == []

    async def test_a_seen_mark_alone_stops_queueing(self, store):
        await store.mark_seen(P, S, ["m1", "m1"], now=T0)
        await store.mark_seen(P, S, ["m1"], now=T0)
        result = await store.admit(P, S, R, _items("m1", "m2"), now=T0)
        assert result.new == [_key("m2")] and result.already_seen == 1
        assert await store.item_drafts(P, "m1") == []

    async def test_failed_admit_leaves_no_seen_mark_and_no_cursor(self, store):
        """Marking seen and queueing are one transaction: if queueing fails, the item is
        not marked seen either, so the next fetch takes it again."""
        bad = _msg("m2")
        bad.headers = {"x": object()}  # cannot be stored as JSON
        with pytest.raises(TypeError):  # not JSON serializable
            await store.admit(P, S, R, [Item("m1", _msg("m1")), Item("m2", bad)],
                              cursor="h-9", now=T0)
        assert await store.seen_count(P) == 0
        assert await store.count_by_status(P) == {}
        assert await store.get_cursor(P, S) is None

    async def test_cursor_per_pipeline_and_scope(self, store):
        assert await store.get_cursor(P, S) is None
        await set_cursor(store, P, S, "1")
        await set_cursor(store, P, "other", "9")
        await set_cursor(store, P, S, "2")
        assert (await store.get_cursor(P, S), await store.get_cursor(P, "other")) == ("2", "9")
        await set_cursor(store, P, S, None)
        assert await store.get_cursor(P, S) is None

    async def test_seen_marks_are_per_pipeline_and_scope(self, store):
        await store.admit(P, S, R, _items("m1"), now=T0)
        assert await store.unseen(P, "other", ["m1"]) == {"m1"}
        assert await store.unseen("sales", S, ["m1"]) == {"m1"}
        assert (await store.admit("sales", S, R, _items("m1"), now=T0)).new == [_key("m1", "sales")]

    # -- claiming and drafting ---------------------------------------------------------------

    async def test_claim_takes_oldest_queued_of_the_pipeline_with_a_lease_and_new_fence(self, store):
        await _queued(store, "m1", "m2", "m3")
        await _queued(store, "x1", pipeline="sales")
        first = await store.claim(P, 60, limit=2, now=T0 + 1)
        assert [d.item_id for d in first] == ["m1", "m2"]
        assert all(d.status == "drafting" and d.lease_until == T0 + 61 for d in first)
        rest = await store.claim(P, 60, limit=5, now=T0 + 1)
        assert [d.item_id for d in rest] == ["m3"]
        assert await store.claim(P, 60, limit=5, now=T0 + 1) == []
        assert (await store.count_by_status("sales")) == {"queued": 1}

    async def test_claim_key_claims_only_a_queued_draft(self, store):
        [key] = await _queued(store, "m1")
        d = await store.claim_key(key, 60, now=T0)
        assert (d.status, d.key) == ("drafting", key)
        assert await store.claim_key(key, 60, now=T0) is None
        assert await store.claim_key(_key("nope"), 60, now=T0) is None

    async def test_concurrent_claims_in_one_process_hand_out_each_draft_once(self, store):
        keys = await _queued(store, *[f"m{i}" for i in range(30)])
        got = await asyncio.gather(*(store.claim(P, 60, limit=2) for _ in range(20)),
                                   *(store.claim_key(k, 60) for k in keys))
        won = [d.key for r in got for d in (r if isinstance(r, list) else [r] if r else [])]
        assert sorted(won) == sorted(keys)

    async def test_finish_draft_needs_the_current_fence(self, store):
        [key] = await _queued(store, "m1")
        d = await store.claim_key(key, 60, now=T0)
        assert await store.finish_draft(d.id, d.fence + 1, "stale", now=T0) is None
        ready = await store.finish_draft(d.id, d.fence, "Hello", tokens_in=10, tokens_out=5, now=T0)
        assert (ready.status, ready.body, ready.tokens_in, ready.tokens_out) == ("ready", "Hello", 10, 5)
        assert await store.finish_draft(d.id, d.fence, "again", now=T0) is None
        assert (await store.get_draft(d.id)).body == "Hello"

    async def test_fail_draft_requeues_retryable_until_max_attempts(self, store):
        [key] = await _queued(store, "m1")
        d = await store.claim_key(key, 60, now=T0)
        again = await store.fail_draft(d.id, d.fence, "429", retryable=True, max_attempts=2, now=T0)
        assert (again.status, again.attempt, again.error) == ("queued", 1, "429")
        d = await store.claim_key(key, 60, now=T0)
        assert d.fence != again.fence
        dead = await store.fail_draft(d.id, d.fence, "429 again", retryable=True, max_attempts=2, now=T0)
        assert (dead.status, dead.error) == ("failed", "429 again")
        assert await store.fail_draft(d.id, d.fence, "x", retryable=True, max_attempts=9) is None

    async def test_fail_draft_not_retryable_fails_at_once(self, store):
        [key] = await _queued(store, "m1")
        d = await store.claim_key(key, 60, now=T0)
        assert await store.fail_draft(d.id, d.fence + 7, "x", retryable=False, max_attempts=3) is None
        dead = await store.fail_draft(d.id, d.fence, "bad prompt", retryable=False, max_attempts=3)
        assert (dead.status, dead.error) == ("failed", "bad prompt")

    async def test_release_returns_to_queued_without_an_attempt(self, store):
        [key] = await _queued(store, "m1")
        d = await store.claim_key(key, 60, now=T0)
        assert await store.release(d.id, d.fence + 1) is False
        assert await store.release(d.id, d.fence) is True
        back = await store.get_draft(d.id)
        assert (back.status, back.attempt, back.lease_until) == ("queued", 0, None)
        assert await store.release(d.id, d.fence) is False

    async def test_expired_lease_is_drafted_exactly_once_more_and_the_stale_worker_loses(self, store):
        [key] = await _queued(store, "m1")
        stale = await store.claim_key(key, 60, now=T0)
        early = await store.sweep(seen_ttl_days=90, now=T0 + 59)
        assert early.leases_requeued == 0
        swept = await store.sweep(seen_ttl_days=90, max_attempts=3, now=T0 + 61)
        assert swept.leases_requeued == 1 and swept.leases_failed == 0
        back = await store.get_draft(stale.id)
        assert (back.status, back.attempt, back.lease_until) == ("queued", 1, None)
        fresh = await store.claim(P, 60, limit=5, now=T0 + 62)
        assert [d.id for d in fresh] == [stale.id] and fresh[0].fence != stale.fence
        assert await store.claim(P, 60, limit=5, now=T0 + 62) == []
        # The first worker wakes up late: nothing it does sticks.
        assert await store.finish_draft(stale.id, stale.fence, "late body", now=T0 + 63) is None
        assert await store.fail_draft(stale.id, stale.fence, "x", retryable=True, max_attempts=3) is None
        assert await store.release(stale.id, stale.fence) is False
        done = await store.finish_draft(fresh[0].id, fresh[0].fence, "good body", now=T0 + 64)
        assert (done.status, done.body) == ("ready", "good body")

    async def test_lease_expiring_past_max_attempts_fails_with_a_reason(self, store):
        [key] = await _queued(store, "m1")
        d = await store.claim_key(key, 10, now=T0)
        assert (await store.sweep(seen_ttl_days=90, max_attempts=2, now=T0 + 11)).leases_requeued == 1
        d2 = await store.claim_key(key, 10, now=T0 + 12)
        result = await store.sweep(seen_ttl_days=90, max_attempts=2, now=T0 + 30)
        assert (result.leases_requeued, result.leases_failed) == (0, 1)
        dead = await store.get_draft(d.id)
        assert dead.status == "failed" and "lease expired" in dead.error
        assert await store.finish_draft(d2.id, d2.fence, "late", now=T0 + 31) is None

    async def test_requeue_expired_handles_one_pipeline_only(self, store):
        """The per-tick lease check: expired leases of that pipeline go back to the
        queue (or fail past max_attempts); other pipelines and live leases stay."""
        [a, b] = await _queued(store, "m1", "m2")
        [c] = await _queued(store, "x1", pipeline="sales")
        da = await store.claim_key(a, 10, now=T0)
        await store.claim_key(b, 100, now=T0)
        await store.claim_key(c, 10, now=T0)
        assert await store.requeue_expired(P, max_attempts=3, now=T0 + 11) == (1, 0)
        assert await store.count_by_status(P) == {"queued": 1, "drafting": 1}
        assert await store.count_by_status("sales") == {"drafting": 1}
        assert await store.finish_draft(da.id, da.fence, "late", now=T0 + 12) is None
        again = await store.claim_key(a, 10, now=T0 + 12)
        assert again.attempt == 1
        assert await store.requeue_expired(P, max_attempts=2, now=T0 + 30) == (0, 1)
        assert (await store.get_draft(da.id)).status == "failed"

    async def test_tokens_are_counted_per_pipeline_and_utc_day(self, store):
        [key] = await _queued(store, "m1")
        d = await store.claim_key(key, 60, now=T0)
        await store.finish_draft(d.id, d.fence, "b", tokens_in=100, tokens_out=20, now=T0)
        await store.add_tokens(P, 7, now=T0)
        await store.add_tokens(P, 1000, now=T0 + DAY)
        await store.add_tokens("sales", 5, now=T0)
        day = time.strftime("%Y-%m-%d", time.gmtime(T0))
        next_day = time.strftime("%Y-%m-%d", time.gmtime(T0 + DAY))
        assert await store.tokens_used(P, day) == 127
        assert await store.tokens_used(P, next_day) == 1000
        assert await store.tokens_used("sales", day) == 5
        assert await store.tokens_used(P, "1999-01-01") == 0

    # -- approval ----------------------------------------------------------------------------

    async def test_ready_drafts_are_unposted_until_posted_for_their_version(self, store):
        a = await _ready(store, "m1")
        b = await _ready(store, "m2")
        assert [d.id for d in await store.unposted()] == [a.id, b.id]
        assert [d.id for d in await store.unposted(P, limit=1)] == [a.id]
        assert await store.unposted("sales") == []
        assert await store.mark_posted(a.id, a.version + 1, "-100", "5") is None
        posted = await store.mark_posted(a.id, a.version, "-100", "5")
        assert (posted.status, posted.approval_chat, posted.approval_message_id) == ("awaiting", "-100", "5")
        assert await store.mark_posted(a.id, a.version, "-100", "6") is None
        assert [d.id for d in await store.unposted()] == [b.id]

    async def test_a_draft_its_drafter_posts_is_left_out_of_the_outbox_for_its_post_lease(
            self, store):
        """A host drafting beside another's tick posts its own cards: the tick's outbox
        leaves such a draft (or FYI card) alone for its post lease, so no card is posted
        twice, and takes it once the lease ran out (the helper's post failed or it died)."""
        await store.admit(P, "s", "v1", [Item(m, Message(subject=m)) for m in ("m1", "m2")],
                          now=T0)
        a, b = await store.claim(P, 60, limit=2, now=T0)
        a = await store.finish_draft(a.id, a.fence, "Hi", now=T0, post_lease=60, lease_now=T0)
        b = await store.record_triage(b.id, b.fence, "notify", "FYI", lease_seconds=60, now=T0,
                                      post_lease=60, lease_now=T0)
        assert (a.status, b.status) == ("ready", "notified")
        assert await store.unposted(P, now=T0 + 59) == []
        assert [d.id for d in await store.unposted(P, now=T0 + 61)] == [a.id, b.id]
        posted = await store.mark_posted(a.id, a.version, "-100", "5", now=T0 + 1)
        assert posted.lease_until is None  # the post lease ends with the post
        assert [d.id for d in await store.unposted(P, now=T0 + 61)] == [b.id]

    async def test_approve_once_for_exactly_the_version_shown(self, store):
        d = await _awaiting(store, body="Exact text")
        assert await store.approve(d.id, d.version + 1, "anna", now=T0) is None
        ok = await store.approve(d.id, d.version, "anna", now=T0 + 5)
        assert (ok.status, ok.decided_by, ok.decided_at) == ("approved", "anna", T0 + 5)
        assert await store.approve(d.id, d.version, "bob", now=T0 + 6) is None
        assert (await store.get_draft(d.id)).decided_by == "anna"
        [entry] = [e for e in await store.audit_log(d.key) if e.action == "approve"]
        assert (entry.actor, entry.text_sha256) == ("anna", sha256_text("Exact text"))

    async def test_approve_refuses_a_draft_not_awaiting(self, store):
        d = await _ready(store)
        assert await store.approve(d.id, d.version, "anna") is None
        assert await store.approve(987654, 1, "anna") is None

    async def test_edit_bumps_the_version_and_the_old_card_cannot_approve(self, store):
        d = await _awaiting(store, body="old")
        assert await store.edit(d.id, d.version + 1, "nope", "anna") is None
        edited = await store.edit(d.id, d.version, "new text", "anna")
        assert (edited.status, edited.body, edited.version) == ("ready", "new text", d.version + 1)
        assert (edited.approval_chat, edited.approval_message_id) == ("-100123", "77")
        assert await store.edit(d.id, d.version, "again", "anna") is None
        reposted = await store.mark_posted(d.id, edited.version, "-100123", "77")
        assert await store.approve(d.id, d.version, "anna") is None
        assert (await store.approve(d.id, reposted.version, "anna")).status == "approved"
        [entry] = [e for e in await store.audit_log(d.key) if e.action == "edit"]
        assert (entry.actor, entry.text_sha256) == ("anna", sha256_text("new text"))

    async def test_regenerate_requeues_with_the_instruction_and_a_new_version(self, store):
        d = await _awaiting(store)
        regen = await store.regenerate(d.id, d.version, "anna", "shorter please")
        assert (regen.status, regen.version, regen.instruction, regen.attempt) == (
            "queued", d.version + 1, "shorter please", 0)
        assert await store.regenerate(d.id, d.version, "anna") is None
        assert await store.approve(d.id, d.version, "anna") is None
        again = await store.claim_key(d.key, 60)
        assert again.instruction == "shorter please"
        # Newest first: the item's whole history is in the audit.
        assert [e.action for e in await store.audit_log(d.key)] == ["regenerate", "draft",
                                                                    "admit"]

    async def test_reject_is_final_for_that_card(self, store):
        d = await _awaiting(store)
        assert await store.reject(d.id, d.version + 1, "anna") is None
        rejected = await store.reject(d.id, d.version, "anna", "not a customer")
        assert (rejected.status, rejected.decided_by) == ("rejected", "anna")
        assert await store.approve(d.id, d.version, "anna") is None
        assert await store.reject(d.id, d.version, "anna") is None
        entry, *older = await store.audit_log(d.key)
        assert entry.action == "reject" and "not a customer" in entry.detail
        assert [e.action for e in older] == ["draft", "admit"]

    # -- the team desk: quorum, on demand, notices once --------------------------------------

    async def test_a_quorum_of_two_needs_two_distinct_operators(self, store):
        """One vote moves nothing (and is audited with its count); the same operator
        again counts once; a second operator's vote is the CAS that approves."""
        d = await _awaiting(store, body="Team text")
        vote = dict(quorum=2, body=d.body, key=d.key)
        assert await store.approve(d.id, d.version, "tg:1 (Anna)", now=T0, **vote) is None
        assert await store.approve(d.id, d.version, "tg:1 (Anny)", now=T0 + 1, **vote) is None
        assert [(v.operator, v.actor) for v in await store.votes(d.id, d.version)] == [
            ("tg:1", "tg:1 (Anna)")]
        assert (await store.get_draft(d.id)).status == "awaiting"
        done = await store.approve(d.id, d.version, "tg:2 (Bo)", now=T0 + 2, **vote)
        assert (done.status, done.decided_by) == ("approved", "tg:2 (Bo)")
        entries = [(e.actor, e.detail, e.text_sha256) for e in await store.audit_log(d.key)
                   if e.action == "approve"]
        assert entries == [("tg:2 (Bo)", "v1: 2/2 approvals", sha256_text("Team text")),
                           ("tg:1 (Anna)", "v1: 1/2 approvals", sha256_text("Team text"))]

    async def test_concurrent_votes_move_a_draft_once_at_quorum_two_and_never_at_three(
            self, store):
        """Two operators approving at the same moment: exactly one CAS approves with a
        quorum of 2, none with 3 (each round on a fresh draft)."""
        for quorum, rounds in ((2, 8), (3, 3)):
            for i in range(rounds):
                d = await _awaiting(store, item_id=f"q{quorum}-{i}")
                moved = await asyncio.gather(*(
                    store.approve(d.id, d.version, f"tg:{u} (Op)", now=T0, quorum=quorum,
                                  body=d.body, key=d.key) for u in (1, 2)))
                assert sum(m is not None for m in moved) == (1 if quorum == 2 else 0)
                assert len(await store.votes(d.id, d.version)) == 2
                assert (await store.get_draft(d.id)).status == (
                    "approved" if quorum == 2 else "awaiting")

    async def test_a_new_version_starts_without_votes_and_a_reject_ends_it(self, store):
        d = await _awaiting(store)
        assert await store.approve(d.id, 1, "tg:1 (Anna)", quorum=2, key=d.key) is None
        edited = await store.edit(d.id, 1, "v2 text", "tg:1 (Anna)")
        await store.mark_posted(d.id, edited.version, "-100123", "77")
        assert await store.votes(d.id, 2) == []
        assert await store.approve(d.id, 2, "tg:1 (Anna)", quorum=2, key=d.key) is None
        assert (await store.reject(d.id, 2, "tg:3 (Cy)")).status == "rejected"
        assert await store.approve(d.id, 2, "tg:2 (Bo)", quorum=2, key=d.key) is None
        assert [v.operator for v in await store.votes(d.id, 2)] == ["tg:1"]

    async def test_redraft_takes_back_a_skipped_item_with_the_instruction(self, store):
        await store.admit(P, S, R, _items("s1", skip={"s1": "mailing list"}), now=T0)
        [d] = await store.item_drafts(P, "s1")
        again = await store.redraft(d.id, "tg:1 (Anna)", "shorter please", now=T0 + 1)
        assert (again.status, again.version, again.instruction, again.error) == (
            "queued", 2, "shorter please", None)
        assert await store.redraft(d.id, "tg:1 (Anna)") is None  # queued: in flight
        [entry] = [e for e in await store.audit_log(d.key) if e.action != "admit"]
        assert (entry.action, entry.actor) == ("reply", "tg:1 (Anna)")
        assert entry.detail == "v1 -> v2 (was skipped): shorter please"
        sent = await _sending(store, "m9")
        await store.mark_sent(sent.id, "x")
        assert await store.redraft(sent.id, "tg:1 (Anna)") is None

    async def test_a_notice_is_claimed_once_and_a_reminder_only_while_awaiting(self, store):
        assert await store.claim_notice("digest|2026-12-01T08:00", T0)
        assert not await store.claim_notice("digest|2026-12-01T08:00", T0 + 1)
        d = await _awaiting(store)
        claims = await asyncio.gather(*(store.claim_notice(
            f"remind|{d.id}|1|1", T0, draft_id=d.id, version=1) for _ in range(3)))
        assert sorted(claims) == [False, False, True]
        assert not await store.claim_notice(f"remind|{d.id}|2|1", T0, draft_id=d.id, version=2)
        await store.approve(d.id, 1, "anna")
        assert not await store.claim_notice(f"remind|{d.id}|1|2", T0, draft_id=d.id, version=1)

    # -- sending -----------------------------------------------------------------------------

    async def test_send_path_is_one_way_and_audited_with_the_sent_text(self, store):
        d = await _awaiting(store, body="Sent words")
        await store.approve(d.id, d.version, "anna")
        assert [x.id for x in await store.approved()] == [d.id]
        assert await store.approved("sales") == []
        sending = await store.begin_send(d.id)
        assert sending.status == "sending"
        assert await store.begin_send(d.id) is None
        assert await store.approved() == []
        sent = await store.mark_sent(d.id, "gmail-123")
        assert (sent.status, sent.sent_id) == ("sent", "gmail-123")
        assert await store.mark_sent(d.id, "gmail-456") is None
        [entry] = [e for e in await store.audit_log(d.key) if e.action == "sent"]
        assert entry.text_sha256 == sha256_text("Sent words")

    async def test_begin_send_needs_approved(self, store):
        d = await _awaiting(store)
        assert await store.begin_send(d.id) is None
        assert await store.mark_sent(d.id, "x") is None
        assert await store.mark_send_failed(d.id, "x") is None
        assert await store.mark_send_unknown(d.id, "x") is None

    async def test_send_failed_can_be_retried_by_an_operator(self, store):
        d = await _sending(store)
        failed = await store.mark_send_failed(d.id, "550 no such user")
        assert (failed.status, failed.error) == ("send_failed", "550 no such user")
        assert await store.mark_send_failed(d.id, "again") is None
        retried = await store.retry_send(d.id, "bob")
        assert retried.status == "approved"
        assert await store.retry_send(d.id, "bob") is None
        assert "retry_send" in [e.action for e in await store.audit_log(d.key)]

    async def test_send_unknown_is_listed_and_can_be_confirmed_sent(self, store):
        d = await _sending(store)
        unknown = await store.mark_send_unknown(d.id, "timeout")
        assert unknown.status == "send_unknown"
        assert [x.id for x in await store.send_unknown()] == [d.id]
        assert await store.send_unknown("sales") == []
        assert (await store.mark_sent(d.id, "found-in-sent")).status == "sent"
        assert await store.send_unknown() == []

    async def test_recovery_marks_a_dead_process_send_unknown_once_and_nothing_else(self, store):
        """What a start does for a row its crashed process left in ``sending``: that
        row (and only a ``sending`` one) becomes send_unknown, once."""
        d = await _awaiting(store, "m1")
        await store.approve(d.id, d.version, "anna")
        assert (await store.begin_send(d.id, "h-dead")).status == "sending"
        other = await _awaiting(store, "m2")
        approved = await _awaiting(store, "m3")
        await store.approve(approved.id, approved.version, "anna")
        assert await store.recover_abandoned_sends(dead=["h-dead"], alive="h-me", grace=300) == 1
        after = await store.get_draft(d.id)
        assert after.status == "send_unknown" and after.error.startswith("interrupted")
        assert [x.id for x in await store.send_unknown()] == [d.id]
        assert (await store.get_draft(other.id)).status == "awaiting"
        assert (await store.get_draft(approved.id)).status == "approved"
        assert await store.recover_abandoned_sends(dead=["h-dead"], alive="h-me", grace=300) == 0

    async def test_recover_abandoned_sends_takes_only_sends_whose_process_is_gone(self, store):
        """A send in flight in a live process (heartbeat fresh, or the caller's own) is
        never taken; one whose process was seen dead or whose heartbeat lapsed is
        recovered at once; one with no recorded process only after the grace."""
        holders = ["h-live", "h-lapsed", "h-dead", "h-me", None]
        drafts = {}
        for i, holder in enumerate(holders):
            d = await _awaiting(store, f"m{i}")
            await store.approve(d.id, d.version, "anna")
            assert (await store.begin_send(d.id, holder)).send_holder == holder
            drafts[holder] = d.id
        assert sorted(await store.sending_holders()) == ["h-dead", "h-lapsed", "h-live", "h-me"]
        now = time.time()
        assert await store.try_lock(HEARTBEAT_PREFIX + "h-live", "h-live", 15, now=now)
        assert await store.try_lock(HEARTBEAT_PREFIX + "h-lapsed", "h-lapsed", 15, now=now - 20)
        assert await store.recover_abandoned_sends(
            dead=["h-dead"], alive="h-me", grace=300, now=now) == 2

        async def status(holder):
            return (await store.get_draft(drafts[holder])).status
        assert [await status(h) for h in holders] == [
            "sending", "send_unknown", "send_unknown", "sending", "sending"]
        assert (await store.get_draft(drafts["h-dead"])).error.startswith("interrupted")
        assert await store.recover_abandoned_sends(alive="h-me", grace=0, now=now + 1) == 1
        assert await status(None) == "send_unknown"
        assert await status("h-live") == "sending" and await status("h-me") == "sending"

    # -- reading -----------------------------------------------------------------------------

    async def test_pending_counts_and_lookups(self, store):
        a = await _ready(store, "m1")
        b = await _awaiting(store, "m2")
        c = await _sending(store, "m3")
        await store.mark_send_failed(c.id, "x")
        await _queued(store, "m4")
        await store.admit("sales", S, R, _items("m1"), now=T0)
        assert [d.id for d in await store.pending()] == [a.id, b.id, c.id]
        assert [d.id for d in await store.pending(P)] == [a.id, b.id, c.id]
        assert await store.pending("sales") == []
        assert await store.count_by_status(P) == {"ready": 1, "awaiting": 1, "send_failed": 1, "queued": 1}
        assert await store.count_by_status() == {"ready": 1, "awaiting": 1, "send_failed": 1, "queued": 2}
        await store.admit(P, S, "v1", _items("m9"), mark_seen=False, now=T0)
        await store.admit(P, "other", "v2", _items("m9"), mark_seen=False, now=T0)
        assert {(d.scope, d.recipe) for d in await store.item_drafts(P, "m9")} == {
            (S, "v1"), ("other", "v2")}
        assert (await get_draft_by_key(store, _key("m2"))).id == b.id
        assert await get_draft_by_key(store, "nope") is None
        assert await store.get_draft(10**9) is None
        assert await store.seen_count("sales") == 1

    # -- runs --------------------------------------------------------------------------------

    async def test_runs_newest_first_and_last_by_status(self, store):
        r1 = await store.start_run(P, scheduled_for=T0, now=T0)
        await store.end_run(r1, "ok", {"fetched": 3, "new": 1}, now=T0 + 1)
        r2 = await store.start_run(P, now=T0 + 60)
        await store.end_run(r2, "error", {"fetched": 0}, "Gmail 503", now=T0 + 61)
        r3 = await store.start_run(P, now=T0 + 120)
        await store.start_run("sales", now=T0 + 200)
        runs = await store.recent_runs(P)
        assert [r.id for r in runs] == [r3, r2, r1]
        assert [r.id for r in await store.recent_runs(P, limit=2)] == [r3, r2]
        assert (runs[0].status, runs[0].ended_at) == ("running", None)
        assert (runs[1].error_text, runs[1].counts) == ("Gmail 503", {"fetched": 0})
        assert (runs[2].counts, runs[2].scheduled_for, runs[2].ended_at) == ({"fetched": 3, "new": 1}, T0, T0 + 1)
        assert (await store.last_run(P)).id == r3
        assert (await store.last_run(P, "ok")).id == r1
        assert (await store.last_run(P, "error")).id == r2
        assert await store.last_run("nobody") is None

    async def test_recent_lists_the_newest_drafts_in_the_asked_statuses(self, store):
        await store.admit(P, S, R, _items("s1", "m1", "s2", skip={"s1": "newsletter",
                                                                  "s2": "no-reply sender"}))
        await _queued(store, "x1", pipeline="other")
        skipped = await store.recent(P, ["skipped"])
        assert [(d.item_id, d.error) for d in skipped] == [("s2", "no-reply sender"),
                                                           ("s1", "newsletter")]
        assert [d.item_id for d in await store.recent(P, ["skipped", "queued"], limit=2)] == [
            "s2", "m1"]
        assert await store.recent(P, []) == []

    async def test_count_by_pipeline_counts_only_the_asked_statuses(self, store):
        await _queued(store, "m1", "m2")
        await _queued(store, "x1", pipeline="other")
        await _awaiting(store, "m3")
        assert await store.count_by_pipeline(["queued"]) == {P: 2, "other": 1}
        assert await store.count_by_pipeline(["awaiting", "sent"]) == {P: 1}
        assert await store.count_by_pipeline([]) == {}

    async def test_counts_follow_every_change_of_the_rows(self, store):
        """status counts are kept beside the rows (not counted at every status): they
        stay equal to the rows through admit, skip, claim, finish, post, reject, replay,
        a seen mark removed by replay and the sweep, and several items in one admit."""
        await store.admit(P, S, R, _items("a", "b", "c", skip={"c": "filtered"}), now=T0)
        await store.mark_seen(P, S, ["only-seen"], now=T0)
        await store.mark_seen(P, S, ["only-seen", "a"], now=T0)  # already seen: no change
        [d] = await store.claim(P, 600, now=T0)
        d = await store.finish_draft(d.id, d.fence, "Hi", now=T0)
        d = await store.mark_posted(d.id, d.version, "1", "2")
        assert await store.count_by_status(P) == {"queued": 1, "awaiting": 1, "skipped": 1}
        await store.reject(d.id, d.version, "anna")
        assert (await store.replay(P, "a", "anna")).outcome == "requeued"
        assert (await store.replay(P, "only-seen", "anna")).outcome != "requeued"
        assert await store.count_by_status(P) == {"queued": 2, "skipped": 1}
        assert await store.count_by_pipeline(["queued", "skipped"]) == {P: 3}
        assert await store.seen_count(P) == 3
        await store.sweep(seen_ttl_days=1, now=T0 + 2 * DAY)
        assert await store.seen_count(P) == 0 and await store.unseen(P, S, ["a"]) == {"a"}
        assert await store.count_by_status(P) == {"queued": 2, "skipped": 1}

    # -- sweep -------------------------------------------------------------------------------

    async def test_sweep_deletes_seen_marks_older_than_the_ttl_only(self, store):
        await store.mark_seen(P, S, ["old1", "old2"], now=T0)
        await store.mark_seen(P, S, ["new"], now=T0 + 80 * DAY)
        result = await store.sweep(seen_ttl_days=90, now=T0 + 91 * DAY)
        assert result.seen_deleted == 2
        assert await store.unseen(P, S, ["old1", "old2", "new"]) == {"old1", "old2"}

    async def test_a_sent_item_fetched_after_its_seen_mark_expired_is_not_drafted_again(self, store):
        d = await _sending(store, "m1")
        await store.mark_sent(d.id, "g1")
        assert (await store.sweep(seen_ttl_days=1, now=T0 + 2 * DAY)).seen_deleted == 1
        assert (await store.admit(P, S, R, _items("m1"), now=T0 + 3 * DAY)).new == []
        assert await store.count_by_status(P) == {"sent": 1}

    async def test_an_item_listed_again_after_its_mark_expired_is_not_drafted_by_a_new_recipe(
            self, store):
        """A maildir lists old mail on every tick: once the sweep removed the mark of an
        answered item, the next fetch marks it again, so bumping the recipe later does
        not bring a second card (and a second reply) for it."""
        d = await _sending(store, "m1")
        await store.mark_sent(d.id, "g1")
        await _queued(store, "m2")
        await store.sweep(seen_ttl_days=1, now=T0 + 2 * DAY)
        again = await store.admit(P, S, R, _items("m1", "m2"), now=T0 + 2 * DAY + 300)
        assert again.new == [] and again.already_seen == 2
        assert await store.unseen(P, S, ["m1", "m2"]) == set()
        bumped = await store.admit(P, S, "v2", _items("m1", "m2", "m3"), now=T0 + 3 * DAY)
        assert bumped.new == [_key("m3", recipe="v2")]

    async def test_sweep_expires_approvals_only_when_asked(self, store):
        d = await _awaiting(store)
        later = time.time() + 3 * DAY
        assert (await store.sweep(seen_ttl_days=90, now=later)).approvals_expired == 0
        assert (await store.sweep(seen_ttl_days=90, approval_ttl_days=7, now=later)).approvals_expired == 0
        result = await store.sweep(seen_ttl_days=90, approval_ttl_days=2, now=later)
        assert result.approvals_expired == 1
        assert (await store.get_draft(d.id)).status == "expired"
        assert await store.approve(d.id, d.version, "anna") is None

    async def test_sweep_prunes_old_runs(self, store):
        old = await store.start_run(P, now=T0)
        await store.end_run(old, "ok", {}, now=T0)
        new = await store.start_run(P, now=T0 + 20 * DAY)
        result = await store.sweep(seen_ttl_days=90, runs_keep_days=30, now=T0 + 31 * DAY)
        assert result.runs_pruned == 1
        assert [r.id for r in await store.recent_runs(P)] == [new]
        assert result.to_dict()["runs_pruned"] == 1

    # -- replay ------------------------------------------------------------------------------

    async def test_replay_requeues_a_rejected_draft_and_keeps_its_card(self, store):
        d = await _awaiting(store)
        await store.reject(d.id, d.version, "anna", "wrong tone")
        result = await store.replay(P, "m1", "bob")
        assert result.outcome == "requeued"
        again = await store.get_draft(d.id)
        assert (again.status, again.attempt, again.version) == ("queued", 0, d.version + 1)
        assert (again.approval_chat, again.approval_message_id) == ("-100123", "77")
        assert result.draft.id == d.id
        assert await store.approve(d.id, d.version, "anna") is None
        assert [e.action for e in await store.audit_log(d.key)][:2] == ["replay", "reject"]

    @pytest.mark.parametrize("end", ["failed", "skipped", "expired"])
    async def test_replay_requeues_every_replayable_end_state(self, store, end):
        if end == "skipped":
            await store.admit(P, S, R, _items("m1", skip={"m1": "too big"}), now=T0)
        elif end == "failed":
            [key] = await _queued(store, "m1")
            d = await store.claim_key(key, 60)
            await store.fail_draft(d.id, d.fence, "boom", retryable=False, max_attempts=1)
        else:
            await _awaiting(store)
            await store.sweep(seen_ttl_days=90, approval_ttl_days=1, now=time.time() + 2 * DAY)
        assert (await get_draft_by_key(store, _key("m1"))).status == end
        assert (await store.replay(P, "m1", "bob")).outcome == "requeued"
        assert [d.key for d in await store.claim(P, 60, limit=5)] == [_key("m1")]

    async def test_replay_of_an_item_only_seen_removes_the_seen_mark(self, store):
        await store.mark_seen(P, S, ["m1"], now=T0)
        result = await store.replay(P, "m1", "bob")
        assert result.outcome == "unseen"
        assert await store.unseen(P, S, ["m1"]) == {"m1"}
        assert (await store.admit(P, S, R, _items("m1"), now=T0)).new == [_key("m1")]
        assert [e.action for e in await store.audit_log()] == ["admit", "replay"]

    async def test_replay_refuses_sent_and_in_flight_items(self, store):
        sent = await _sending(store, "m1")
        await store.mark_sent(sent.id, "g1")
        waiting = await _awaiting(store, "m2")
        r1 = await store.replay(P, "m1", "bob")
        r2 = await store.replay(P, "m2", "bob")
        assert (r1.outcome, r2.outcome) == ("refused", "refused")
        assert (await store.get_draft(sent.id)).status == "sent"
        assert (await store.get_draft(waiting.id)).version == waiting.version
        assert "replay" in [e.action for e in await store.audit_log(sent.key)]

    async def test_replay_of_an_unknown_item_is_not_found(self, store):
        result = await store.replay(P, "never-seen", "bob")
        assert result.outcome == "not_found" and result.draft is None
        assert [e.action for e in await store.audit_log()] == ["replay"]

    # -- audit, pause, locks -----------------------------------------------------------------

    async def test_every_audited_change_appends_one_chained_row_with_it(self, store):
        """admit (queued and skipped), draft (model, tokens), edit, approve, sent, pause:
        one row each, chained in order; a CAS that loses writes no row."""
        await store.admit(P, S, R, _items("m1", "m2", skip={"m2": "mailing list"}), now=T0)
        d = await store.claim_key(_key("m1"), 600, now=T0)
        d = await store.finish_draft(d.id, d.fence, "Hi", tokens_in=7, tokens_out=5,
                                     model="gpt-x", now=T0)
        d = await store.mark_posted(d.id, d.version, "1", "2")
        d = await store.edit(d.id, d.version, "Hello", "anna", now=T0)
        d = await store.mark_posted(d.id, d.version, "1", "2")
        assert await store.approve(d.id, d.version - 1, "bo", now=T0) is None  # old version
        d = await store.approve(d.id, d.version, "bo", now=T0)
        await store.begin_send(d.id)
        await store.mark_sent(d.id, "gm-1", now=T0)
        await store.set_paused(P, True, "anna")
        rows = await store.audit_export()
        assert [(r["seq"], r["action"], r["actor"], r["detail"]) for r in rows] == [
            (1, "admit", "draftgate", "queued"),
            (2, "admit", "draftgate", "skipped: mailing list"),
            (3, "draft", "draftgate", "v1 by gpt-x, 12 tokens (in 7, out 5)"),
            (4, "edit", "anna", "v1 -> v2"),
            (5, "approve", "bo", "v2"),
            (6, "sent", "bo", "v2, message id gm-1"),
            (7, "pause", "anna", P)]
        assert all(a["hash"] == b["prev_hash"] for a, b in zip(rows, rows[1:], strict=False))
        report = await store.verify_audit()
        assert report.ok and report.checked == 7 and report.head == (7, rows[-1]["hash"])

    async def test_rows_of_any_text_and_time_verify(self, store):
        """What a backend hashes itself (PostgreSQL hashes a single row in SQL) is
        exactly what verify recomputes: quotes, backslashes, control characters,
        non-ASCII text, no key, odd times."""
        texts = ['a "quoted" \\ line\nnext\t\x01\x1f', "Zoë 🦊 日本語 \u2028", None, "\ud7ff\ue000"]
        for i, text in enumerate(texts):
            await store.audit("Zoë" if i % 2 else "anna", "note", None if i == 2 else f'k|<"{i}">',
                              text=text, detail=text, now=T0 + i * 0.1 + 1e-7 * (i == 3))
        report = await store.verify_audit()
        assert report.ok and report.checked == len(texts), report

    async def test_audit_log_is_newest_first_with_text_hashes(self, store):
        await store.audit("anna", "note", "k1", text="hello", detail="d1", now=T0)
        await store.audit("bob", "note", "k2", now=T0 + 1)
        await store.audit("cy", "note", "k1", text="", now=T0 + 2)
        log = await store.audit_log()
        assert [e.actor for e in log] == ["cy", "bob", "anna"]
        assert (log[2].text_sha256, log[2].detail, log[2].at) == (sha256_text("hello"), "d1", T0)
        assert log[1].text_sha256 is None and log[0].text_sha256 == sha256_text("")
        assert [e.actor for e in await store.audit_log("k1")] == ["cy", "anna"]
        assert len(await store.audit_log(limit=1)) == 1

    async def test_pause_and_resume_are_stored_and_audited(self, store):
        assert await store.paused() == set()
        await store.set_paused(P, True, "anna")
        await store.set_paused("sales", True, "anna")
        await store.set_paused("sales", False, "bob")
        assert await store.paused() == {P}
        assert [(e.actor, e.action) for e in await store.audit_log()] == [
            ("bob", "resume"), ("anna", "pause"), ("anna", "pause")]

    async def test_named_lock_has_one_holder_until_it_expires(self, store):
        assert await store.try_lock("tick:support", "host-a", 30, now=T0)
        assert not await store.try_lock("tick:support", "host-b", 30, now=T0 + 1)
        assert await store.try_lock("tick:support", "host-a", 30, now=T0 + 20)  # renew
        assert not await store.try_lock("tick:support", "host-b", 30, now=T0 + 40)
        assert await store.try_lock("tick:sales", "host-b", 30, now=T0 + 40)
        assert await store.try_lock("tick:support", "host-b", 30, now=T0 + 51)  # expired
        await store.unlock("tick:support", "host-a")  # not the holder: no effect
        assert not await store.try_lock("tick:support", "host-a", 30, now=T0 + 52)
        await store.unlock("tick:support", "host-b")
        assert await store.try_lock("tick:support", "host-a", 30, now=T0 + 53)

    async def test_lock_holder_names_who_holds_a_lock(self, store):
        assert await store.lock_holder("tick:support") is None
        assert await store.try_lock("tick:support", "host-a:17:x", 30, now=T0)
        assert await store.lock_holder("tick:support") == "host-a:17:x"
        await store.unlock("tick:support", "host-a:17:x")
        assert await store.lock_holder("tick:support") is None

    # -- stale cards -------------------------------------------------------------------------

    async def test_a_stale_card_mark_is_kept_until_cleared_and_leaves_the_draft_alone(self, store):
        """mark_card_stale sets and clears the flag; stale_cards lists only marked drafts,
        oldest first; the draft's state and updated_at do not change."""
        a = await _awaiting(store, "m1")
        b = await _awaiting(store, "m2")
        assert await store.stale_cards() == []
        await store.mark_card_stale(b.id, True)
        await store.mark_card_stale(a.id, True)
        stale = await store.stale_cards()
        assert [d.id for d in stale] == [a.id, b.id] and all(d.card_stale for d in stale)
        assert [d.id for d in await store.stale_cards(limit=1)] == [a.id]
        after = await store.get_draft(a.id)
        assert (after.status, after.version, after.updated_at) == (a.status, a.version,
                                                                   a.updated_at)
        await store.mark_card_stale(a.id, False)
        assert [d.id for d in await store.stale_cards()] == [b.id]
        assert not (await store.get_draft(a.id)).card_stale

    # -- many processes ----------------------------------------------------------------------

    @pytest.mark.slow
    async def test_four_processes_claiming_the_same_keys_get_one_winner_each(self, store):
        """4 processes x 250 claims on the same keys: one winner per key, no lock errors."""
        keys = await _queued(store, *[f"m{i}" for i in range(250)])
        ctx = multiprocessing.get_context("spawn")
        barrier, out = ctx.Barrier(4), ctx.Queue()
        procs = [ctx.Process(target=_claim_worker, args=(store.url, keys, n, barrier, out))
                 for n in range(4)]
        for p in procs:
            p.start()
        try:
            results = await asyncio.to_thread(lambda: [out.get(timeout=90) for _ in procs])
        finally:
            for p in procs:
                p.join(timeout=30)
                if p.is_alive():
                    p.kill()
        errors = [e for r in results for e in r["errors"]]
        locked = [e for e in errors if "locked" in e.lower()]
        assert locked == [] and errors == []
        won = [k for r in results for k in r["won"]]
        assert sorted(won) == sorted(keys)  # every key exactly once
        assert await store.count_by_status(P) == {"drafting": 250}


# -- truthful status: holds, the queue, integrity, opening without creating ------------------

async def test_a_hold_is_kept_until_cleared_and_other_pipelines_are_untouched(store):
    await store.set_paused("other", True, "anna")
    await store.set_hold(P, "setup error: 401", None)
    await store.set_hold("other", "budget spent", T0 + DAY)
    assert await store.holds() == {P: ("setup error: 401", None),
                                   "other": ("budget spent", T0 + DAY)}
    assert await store.paused() == {"other"}  # a hold is not a pause, nor the reverse
    await store.set_hold("other", None, T0)
    assert await store.holds() == {P: ("setup error: 401", None)}
    assert await store.paused() == {"other"}


async def test_waiting_lists_queued_and_drafting_oldest_first(store):
    keys = await _queued(store, "m1", "m2", "m3")
    await _queued(store, "x1", pipeline="other")
    claimed = await store.claim_key(keys[1], 600, now=T0)
    assert [(d.item_id, d.status) for d in await store.waiting(P)] == [
        ("m1", "queued"), ("m2", "drafting"), ("m3", "queued")]
    assert [d.id for d in await store.waiting(P, limit=1)] == [claimed.id - 1]
    assert len(await store.waiting()) == 4


async def test_a_healthy_store_passes_its_check(store):
    await _queued(store, "m1")
    assert await store.check() == []


async def test_opening_a_store_that_does_not_exist_without_create_creates_nothing(store_url,
                                                                                  tmp_path):
    from bot.store import StoreMissing

    if store_url.startswith("sqlite"):
        url = f"sqlite:///{tmp_path}/sub/missing.db"
    else:
        import re

        url = re.sub(r"schema=[^&]+", "schema=dg_never_made", store_url)
    s = create_store(url)
    with pytest.raises(StoreMissing, match="nothing was created"):
        await s.open(create=False)
    await s.close()
    assert not (tmp_path / "sub").exists()
