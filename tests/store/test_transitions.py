"""The draft state machine written once (bot/store/transitions.py): both backends move
drafts exactly along the transition table, and nothing else can be written."""

from __future__ import annotations

import json
import time

import pytest

from bot.models import Item, Status
from bot.store.base import Backend
from bot.store.sql import Change
from bot.store.transitions import (
    APPROVE,
    REPLAY,
    TRANSITIONS,
    IllegalTransition,
    Step,
    Transition,
    cas,
)
from tests._stores import get_draft_by_key
from tests.support.store_data import DAY, T0, P, R, S, _items, _msg

ALLOWED = {(src, t.dst) for t in TRANSITIONS.values() for src in t.src}


class Recorder:
    """Runs store calls and records every status change of the drafts it knows."""

    def __init__(self, store):
        self.store = store
        self.ids: set[int] = set()
        self.seen: set[tuple[str, str]] = set()

    async def _statuses(self) -> dict[int, str]:
        return {i: (await self.store.get_draft(i)).status for i in self.ids}

    async def __call__(self, op):
        before = await self._statuses()
        result = await op
        after = await self._statuses()
        for i, old in before.items():
            if after[i] != old:
                assert (old, after[i]) in ALLOWED, f"draft {i}: {old} -> {after[i]}"
                self.seen.add((old, after[i]))
        return result

    async def admit(self, *ids: str, skip: dict[str, str] | None = None):
        result = await self.store.admit(P, S, R, _items(*ids, skip=skip), now=T0)
        drafts = [await get_draft_by_key(self.store, k) for k in result.new + result.skipped]
        self.ids.update(d.id for d in drafts)
        return drafts


async def _awaiting(rec: Recorder, item: str):
    [d] = await rec.admit(item)
    d = await rec(rec.store.claim_key(d.key, 600, now=T0))
    d = await rec(rec.store.finish_draft(d.id, d.fence, f"Hi {item}", now=T0))
    return await rec(rec.store.mark_posted(d.id, d.version, "-100", "7"))


async def test_every_move_of_both_stores_is_in_the_table_and_every_row_is_used(store):
    """A whole life of drafts on each backend: every status change made is one the table
    allows, and every allowed change is made by some store method."""
    rec, st = Recorder(store), store
    d = await _awaiting(rec, "sent")
    d = await rec(st.approve(d.id, d.version, "anna", now=T0))
    d = await rec(st.begin_send(d.id, "host-a"))
    await rec(st.mark_sent(d.id, "s-1", now=T0))

    # A deferred send (the undo window): not claimed before send_after; undone, it
    # awaits a decision again (same version); approved again, claimed when due.
    d = await _awaiting(rec, "undone")
    d = await rec(st.approve(d.id, d.version, "anna", now=T0, send_after=T0 + 10))
    assert await rec(st.begin_send(d.id, "host-a", now=T0 + 9)) is None
    d = await rec(st.undo(d.id, d.version, "anna", now=T0 + 9))
    assert d.status == Status.AWAITING and d.version == 1 and d.send_after is None
    d = await rec(st.approve(d.id, d.version, "bo", now=T0 + 20, send_after=T0 + 30))
    assert (await rec(st.begin_send(d.id, "host-a", now=T0 + 30))).status == Status.SENDING
    assert await rec(st.undo(d.id, d.version, "anna", now=T0 + 30)) is None  # lost to the claim
    await rec(st.mark_sent(d.id, "s-3", now=T0 + 31))

    # A follow-up (issue 28): queued once by its key; an answer cancels it while it
    # waits in any state before the send.
    f = await rec(st.queue_followup(P, "undone", 1, d.message, "nudge", "↪️ 1 of 1", now=T0))
    rec.ids.add(f.id)
    assert await rec(st.queue_followup(P, "undone", 1, d.message, "nudge", "", now=T0)) is None
    f = await rec(st.claim_key(f.key, 600, now=T0))
    assert (await rec(st.cancel(f.id, "answered", now=T0))).status == Status.CANCELLED
    for src in (Status.QUEUED, Status.READY, Status.AWAITING, Status.APPROVED):
        f = await rec(st.queue_followup(P, f"fu-{src}", 1, d.message, "nudge", "", now=T0))
        rec.ids.add(f.id)
        if src != Status.QUEUED:
            f = await rec(st.claim_key(f.key, 600, now=T0))
            f = await rec(st.finish_draft(f.id, f.fence, "Any news?", now=T0))
        if src in (Status.AWAITING, Status.APPROVED):
            f = await rec(st.mark_posted(f.id, f.version, "-100", "9"))
        if src == Status.APPROVED:
            f = await rec(st.approve(f.id, f.version, "anna", now=T0, send_after=T0 + 99))
        assert (await rec(st.cancel(f.id, "answered", now=T0))).status == Status.CANCELLED

    d = await _awaiting(rec, "unknown")
    d = await rec(st.approve(d.id, d.version, "anna", now=T0))
    await rec(st.begin_send(d.id))
    await rec(st.mark_send_unknown(d.id, "timeout"))
    await rec(st.retry_send(d.id, "anna", now=T0))
    await rec(st.begin_send(d.id))
    await rec(st.mark_send_failed(d.id, "550 rejected"))
    await rec(st.retry_send(d.id, "anna", now=T0))
    await rec(st.begin_send(d.id, "host-dead"))
    assert await rec(st.recover_abandoned_sends(dead=["host-dead"], grace=300)) == 1
    assert (await rec(st.mark_sent(d.id, "s-2", now=T0))).status == Status.SENT

    [d] = await rec.admit("fails")
    d = await rec(st.claim_key(d.key, 600, now=T0))
    d = await rec(st.fail_draft(d.id, d.fence, "503", retryable=True, max_attempts=3, now=T0))
    assert d.status == Status.QUEUED
    [d] = await rec(st.claim(P, 600, now=T0))
    d = await rec(st.fail_draft(d.id, d.fence, "400", retryable=False, max_attempts=3, now=T0))
    assert d.status == Status.FAILED
    assert (await rec(st.replay(P, "fails", "anna", now=T0))).outcome == "requeued"

    d = await _awaiting(rec, "edited")
    d = await rec(st.edit(d.id, d.version, "Better", "anna", now=T0))
    d = await rec(st.mark_posted(d.id, d.version, "-100", "7"))
    d = await rec(st.regenerate(d.id, d.version, "anna", "shorter", now=T0))
    d = await rec(st.claim_key(d.key, 600, now=T0))
    assert await rec(st.release(d.id, d.fence))

    d = await _awaiting(rec, "rejected")
    await rec(st.reject(d.id, d.version, "anna", "no", now=T0))
    await rec(st.replay(P, "rejected", "anna", now=T0))
    await rec.admit("skipped", skip={"skipped": "newsletter"})
    await rec(st.replay(P, "skipped", "anna", now=T0))

    # Triage: reply keeps the claim (a move onto itself), notify and skip end drafting;
    # an FYI card is recorded (onto itself too), then drafted after all or dismissed.
    for item, action in (("t-reply", "reply"), ("t-skip", "skip"), ("t-fyi", "notify"),
                         ("t-dismiss", "notify")):
        [d] = await rec.admit(item)
        d = await rec(st.claim_key(d.key, 600, now=T0))
        d = await rec(st.record_triage(d.id, d.fence, action, "why", lease_seconds=60, now=T0))
        if d.status in (Status.DRAFTING, Status.NOTIFIED):
            d = await rec(st.mark_posted(d.id, d.version, "-100", "8")) \
                if d.status == Status.NOTIFIED else d
            rec.seen.add((d.status, d.status))
        if d.status == Status.DRAFTING:  # reply: drafting goes on under the same claim
            assert await rec(st.release(d.id, d.fence))
    fyi = await get_draft_by_key(st, f"{P}|{S}|t-fyi|{R}")
    assert (await rec(st.draft_reply(fyi.id, fyi.version, "anna", now=T0))).status == Status.QUEUED
    gone = await get_draft_by_key(st, f"{P}|{S}|t-dismiss|{R}")
    assert (await rec(st.dismiss(gone.id, gone.version, "anna", now=T0))).status == Status.DISMISSED
    await rec(st.replay(P, "t-dismiss", "anna", now=T0))
    [d] = await rec.admit("t-expires")
    d = await rec(st.claim_key(d.key, 600, now=T0))
    await rec(st.record_triage(d.id, d.fence, "notify", "an invoice", lease_seconds=60, now=T0))

    # Leases and approvals that run out (the other drafts are queued again by now).
    n = len(await rec(st.claim(P, 60, limit=10, now=T0)))
    assert n == 7 and await rec(st.requeue_expired(P, max_attempts=5, now=T0 + 61)) == (n, 0)
    await rec(st.claim(P, 60, limit=10, now=T0 + 61))
    assert await rec(st.requeue_expired(P, max_attempts=1, now=T0 + 200)) == (0, n)
    d = await _awaiting(rec, "expires")
    later = time.time() + 2 * DAY  # mark_posted stamps the real time
    res = await rec(st.sweep(seen_ttl_days=3650, approval_ttl_days=1, now=later))
    assert res.approvals_expired == 2  # the card and the FYI card nobody decided on
    await rec(st.replay(P, "expires", "anna", now=later))

    assert rec.seen == ALLOWED, f"never made: {sorted(ALLOWED - rec.seen)}"


async def test_statuses_are_stored_and_serialised_as_the_same_plain_strings(store):
    """The StrEnum changes no stored row and no JSON: the values are the old strings."""
    assert [s.value for s in Status] == [
        "queued", "drafting", "ready", "awaiting", "approved", "sending", "sent",
        "send_failed", "send_unknown", "failed", "skipped", "rejected", "expired",
        "notified", "dismissed", "cancelled"]
    assert json.dumps({"s": Status.SEND_UNKNOWN}) == '{"s": "send_unknown"}'
    assert f"{Status.QUEUED}" == "queued" and Status.QUEUED == "queued"
    await store.admit(P, S, R, [Item("m1", _msg("m1"))], now=T0)
    assert await store.count_by_status() == {"queued": 1}
    [d] = await store.item_drafts(P, "m1")
    assert type(d.status) is str and d.status == "queued"


def test_a_transition_the_table_does_not_allow_is_refused_loudly():
    with pytest.raises(IllegalTransition, match="sent -> queued"):
        cas(REPLAY, "attempt = 0", (), "id = ?", (1,), src=(Status.SENT,))
    with pytest.raises(IllegalTransition, match="not in the transition table"):
        cas(Transition("resurrect", (Status.SENT,), Status.QUEUED), "attempt = 0", (), "id = ?", (1,))
    # An audited move without its audit row (and the other way round) is refused too.
    approve = Step(APPROVE, "decided_by = ?", ("anna",), "id = ?", (1,))
    with pytest.raises(IllegalTransition, match="audited"):
        Change((approve,))
    sql, args = cas(REPLAY, "attempt = 0", (), "id = ?", (1,), src=(Status.FAILED,))
    assert sql == "UPDATE drafts SET status = ?, attempt = 0 WHERE id = ? AND status IN (?)"
    assert args == (Status.QUEUED, 1, Status.FAILED)


def test_every_status_has_a_way_in_and_every_unfinished_one_a_way_out():
    into = {t.dst for t in TRANSITIONS.values()} | {Status.QUEUED, Status.SKIPPED}  # admit inserts those
    out = {s for t in TRANSITIONS.values() for s in t.src}
    assert into == set(Status)
    # sent is final (/replay refuses it); so is a cancelled follow-up: the recipient's
    # answer ended its chain
    assert out == set(Status) - {Status.SENT, Status.CANCELLED}
    assert {Status.DRAFTING, Status.READY, Status.AWAITING, Status.APPROVED, Status.SENDING, Status.SEND_FAILED, Status.SEND_UNKNOWN,
            Status.FAILED, Status.REJECTED, Status.EXPIRED, Status.NOTIFIED, Status.DISMISSED} <= out


def test_a_backend_writes_itself_only_what_its_sql_does_differently():
    # Everything else of the contract is written once, in sql.py and sql_ops.py. The
    # audit append is each backend's own, in the fewest round trips each can.
    assert Backend.__abstractmethods__ == {"open", "close", "_run", "unseen", "admit",
                                           "mark_seen", "claim", "verify_audit", "check",
                                           "_append"}
    assert {Status.EXPIRED, Status.REJECTED} <= set(REPLAY.src)
