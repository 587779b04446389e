"""`grounding: confirm` (issue 24): Approve on a card whose draft says what its sources
do not support asks once more ("Send anyway?", the claims listed) before it counts; a
quorum vote likewise. With `flag` one tap sends.

The real python-telegram-bot against the fake Bot API server, the real engine and a
real SQLite store (tests/support/telegram_world.py); the console review through the
real CLI."""

from __future__ import annotations

import asyncio

import pytest

from bot.models import DraftResult
from tests.fakes.telegram import FakeTelegram
from tests.support.desk import op
from tests.support.fixtures import fake_telegram
from tests.support.telegram_world import (
    ANNA,
    BO,
    SUPPORT_CHAT,
    World,
    _buttons,
    start_world,
    write_config,
)

fake = fake_telegram  # the fixture here: a fake Telegram (context/conftest's is a model)

#: "€25" and "14 days" are in no source: the email asks only where the order is.
CLAIMS = "Hi Alice, your order left today. We take €25 off and refund within 14 days."


class ClaimingDrafter:
    """Writes a draft with two claims nothing the model was given supports."""

    name = "claims"

    def __init__(self, body: str = CLAIMS) -> None:
        self.body = body

    async def draft(self, request):
        return DraftResult(body=self.body, tokens_in=10, tokens_out=20)

    async def close(self):
        pass


@pytest.fixture
async def worlds(tmp_path, fake, monkeypatch):
    made: list[World] = []

    async def make(grounding: str, quorum: int = 1, body: str = CLAIMS) -> World:
        cfg = write_config(tmp_path, fake)
        support = tmp_path / "pipelines" / "support.yaml"
        support.write_text(support.read_text().replace(
            "approval: {channel: telegram, chat: 1001}",
            f"approval: {{channel: telegram, chat: 1001, quorum: {quorum}}}")
            + f"drafter: {{grounding: {grounding}}}\n")
        return await start_world(tmp_path, fake, monkeypatch, made, cfg,
                                 drafter=lambda w: ClaimingDrafter(body))

    yield make
    for w in made:
        await w.stop()


def _question(fake: FakeTelegram, d):
    """The question Approve asked under the card (None: none was asked)."""
    found = [m for m in fake.chat_messages(SUPPORT_CHAT)
             if m.reply_to == int(d.approval_message_id) and "Send anyway?" in m.text]
    return found[-1] if found else None


async def _tap_message(world: World, message, data: str, user: int = ANNA,
                       name: str = "Anna") -> str:
    u = world.fake.tap(user, SUPPORT_CHAT, message.message_id, data, name)
    return (await world.fake.answered(u))["text"]


async def test_confirm_asks_once_more_and_only_send_anyway_sends(worlds, fake):
    """The first tap sends nothing and shows the claims; ⚠️ Send anyway sends, once."""
    w = await worlds("confirm")
    d = await w.deliver(1)
    assert "⚠️ Not in the sources: €25 · 14 days" in w.card(d).text

    notice = await w.tap(d, "ap")
    assert notice.startswith("⚠️ Not approved yet")
    assert w.sender.sent == [] and (await w.draft(d)).status == "awaiting"
    q = _question(fake, d)
    assert q is not None and "€25 · 14 days" in q.text
    assert _buttons(q.reply_markup) == [f"ac:{d.id}:1"]
    assert _buttons(w.card(d).reply_markup)[0] == f"ap:{d.id}:1"  # the card is unchanged

    assert await _tap_message(w, q, f"ac:{d.id}:1") == "✅ Sent."
    assert w.sender.sent == [(d.id, 1, CLAIMS)]
    assert w.card(d).text.startswith("✅ Sent by Anna")
    assert fake.message(SUPPORT_CHAT, q.message_id).reply_markup is None
    assert await _tap_message(w, q, f"ac:{d.id}:1") != "✅ Sent."  # a second tap: nothing
    assert len(w.sender.sent) == 1
    [entry] = [a for a in await w.store.audit_log(d.key) if a.action == "approve"]
    assert "sent anyway: €25 · 14 days" in entry.detail


async def test_send_anyway_of_an_older_version_is_refused(worlds, fake):
    """After an edit the question of v1 sends nothing; v2 without claims needs one tap."""
    w = await worlds("confirm")
    d = await w.deliver(1)
    await w.tap(d, "ap")
    q = _question(fake, d)
    await w.desk.edit(op("anna"), d.id, 1, "Hi Alice, your order left today.")
    await w.engine.post_unposted()
    assert (await _tap_message(w, q, f"ac:{d.id}:1")).startswith("Old version (v1)")
    assert w.sender.sent == []
    d2 = await w.draft(d)
    assert d2.version == 2 and "Not in the sources" not in w.card(d2).text
    assert await w.tap(d2, "ap") == "✅ Sent."
    assert w.sender.sent == [(d.id, 2, "Hi Alice, your order left today.")]


async def test_a_quorum_vote_is_confirmed_like_an_approval(worlds, fake):
    """Each operator's vote counts only after their Send anyway; at 2 it sends."""
    w = await worlds("confirm", quorum=2)
    d = await w.deliver(1)
    assert (await w.tap(d, "ap")).startswith("⚠️ Not approved yet")
    assert await w.store.votes(d.id, 1) == []
    q = _question(fake, d)
    assert (await _tap_message(w, q, f"ac:{d.id}:1")).startswith("✅ Your approval counts (1/2)")
    assert (await w.tap(d, "ap", user=BO, first_name="Bo")).startswith("⚠️ Not approved yet")
    assert len(await w.store.votes(d.id, 1)) == 1 and w.sender.sent == []
    q2 = _question(fake, d)
    assert q2.message_id != q.message_id
    assert await _tap_message(w, q2, f"ac:{d.id}:1", BO, "Bo") == "✅ Sent."
    assert w.sender.sent == [(d.id, 1, CLAIMS)]


async def test_flag_sends_with_one_tap(worlds, fake):
    """`flag` (the default) shows the claims on the card; Approve sends at once."""
    w = await worlds("flag")
    d = await w.deliver(1)
    assert "⚠️ Not in the sources: €25 · 14 days" in w.card(d).text
    assert await w.tap(d, "ap") == "✅ Sent."
    assert w.sender.sent == [(d.id, 1, CLAIMS)] and _question(fake, d) is None


async def test_confirm_without_unsupported_claims_sends_with_one_tap(worlds, fake):
    w = await worlds("confirm", body="Hi Alice, your order left today.")
    d = await w.deliver(1)
    assert await w.tap(d, "ap") == "✅ Sent."
    assert _question(fake, d) is None


@pytest.mark.parametrize("sure", ["n", "y"])
async def test_the_console_review_asks_send_anyway(worlds, fake, monkeypatch, sure):
    """`draftgate review`: a then Send anyway? n leaves it pending; y sends it."""
    from bot.__main__ import main
    from bot.approvals import console

    w = await worlds("confirm")
    d = await w.deliver(1)
    asked: list[str] = []
    answers = iter(["a", sure])

    def ask(prompt: str) -> str:
        asked.append(prompt)
        return next(answers, "")

    monkeypatch.setattr(console, "_ask", ask)
    assert await asyncio.to_thread(main, ["review", "-c", str(w.cfg)]) == 0
    assert any("Send anyway?" in a for a in asked)
    status = (await w.draft(d)).status
    assert status == ("awaiting" if sure == "n" else "sent")
    approvals = [a for a in await w.store.audit_log(d.key) if a.action == "approve"]
    assert [a.detail for a in approvals] == (["v1; sent anyway: €25 · 14 days"] if sure == "y" else [])


FRI_1500, MON_0900 = 1796396400.0, 1796634000.0  # Fri 2026-12-04 15:00 UTC, the next Monday 09:00


@pytest.mark.parametrize("quorum", [1, 2])
async def test_send_anyway_after_later_approves_for_the_chosen_time(worlds, fake, quorum):
    """🕘 Later → Monday 09:00 on a card that asks Send anyway?: the question's button
    carries the choice, so its tap approves for Monday 09:00 (the deciding vote of a
    quorum likewise), and nothing is sent before then."""
    from tests.support.clock import Clock

    w = await worlds("confirm", quorum=quorum)
    w.now = clock = Clock(FRI_1500)
    d = await w.deliver(1)
    if quorum == 2:  # Anna's vote first (confirmed), so Bo's Later is the deciding one
        await w.tap(d, "ap")
        assert (await _tap_message(w, _question(fake, d), f"ac:{d.id}:1")).startswith(
            "✅ Your approval counts (1/2)")
    assert await w.tap(d, "lt", user=BO, first_name="Bo") == "🕘 When should it be sent?"
    assert (await w.tap(d, "lw", user=BO, first_name="Bo")).startswith("⚠️ Not approved yet")
    q = _question(fake, d)
    [data] = _buttons(q.reply_markup)
    assert "(🕘 Monday 09:00)" in q.text and len(data.encode()) <= 64
    assert await _tap_message(w, q, data, BO, "Bo") == \
        "✅ Approved. 🕘 Sends Mon 09:00 · ↩️ Cancel on the card stops it."
    approved = await w.draft(d)
    assert approved.status == "approved" and approved.send_after == MON_0900
    for t in (FRI_1500 + 3600, MON_0900 - 1):  # the due-time loop passes: nothing goes
        clock.t = t
        ticket = w.engine.sends.wake()
        await fake.await_for(lambda ticket=ticket: w.engine.sends.due_served >= ticket, 30)
    assert w.sender.sent == [] and (await w.draft(d)).status == "approved"
    clock.t = MON_0900
    w.engine.sends.wake()
    await fake.await_for(lambda: w.sender.sent, 30)
    assert w.sender.sent == [(d.id, 1, CLAIMS)]
