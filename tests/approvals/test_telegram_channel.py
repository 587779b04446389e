"""The Telegram channel end to end: the real python-telegram-bot over HTTP against the
fake Bot API server, the real Engine and a real SQLite store.

Taps and messages are injected into the fake's getUpdates queue; every test waits on
an event the fake exposes (an answered callback query, a message in a chat), never on
a sleep.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
import warnings

import pytest

from bot.approvals.telegram.channel import create
from bot.config.load import load_settings
from bot.errors import SendUnknown
from tests.fakes.telegram import parse_html
from tests.support.desk import SYSTEM, op
from tests.support.held import Held
from tests.support.service import _free_port
from tests.support.telegram_world import (  # noqa: F401
    ANNA,
    BO,
    EVE,
    NAMES,
    OPS_CHAT,
    SALES_CHAT,
    SUPPORT_CHAT,
    TOKEN_ENV,
    EchoDrafter,
    RecordingSender,
    World,
    _buttons,
    eml,
    write_config,
)


@pytest.fixture
async def world(tmp_path, fake, monkeypatch):
    monkeypatch.setenv(TOKEN_ENV, fake.token)
    w = World(tmp_path, fake, write_config(tmp_path, fake))
    await w.start()
    try:
        yield w
    finally:
        await w.stop()


async def until(check, timeout: float = 10.0):
    """Poll an async condition (store state, no fake event for it) until true."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not (value := await check()):
        if asyncio.get_running_loop().time() > deadline:
            raise TimeoutError("condition not met in time")
        await asyncio.sleep(0.02)
    return value




# -- approve ---------------------------------------------------------------------------------

async def test_approve_sends_exactly_once_and_the_card_shows_who(world, fake):
    """Approve & send sends one reply and the card then says who sent it, no buttons."""
    d = await world.deliver(1)
    assert d.status == "awaiting"
    card = world.card(d)
    assert card.text.startswith(f"📨 support · #{d.id} v1")
    assert "Alice Buyer <alice1@customer.example>" in card.text
    assert _buttons(card.reply_markup) == [f"{a}:{d.id}:1" for a in ("ap", "ed", "rg", "rj", "lt")]
    assert await world.tap(d, "ap") == "✅ Sent."
    assert world.sender.sent == [(d.id, 1, (await world.draft(d)).body)]
    card = world.card(d)
    assert card.text.startswith("✅ Sent by Anna at ")
    assert card.text.split("\n")[0].endswith(f"· #{d.id} v1")
    assert card.reply_markup is None
    assert (await world.draft(d)).decided_by == f"tg:{ANNA} (Anna)"
    assert {c["command"] for c in fake.commands} >= {"status", "pending", "replay", "sweep",
                                                     "pause", "resume", "run", "help"}


def _count_get_draft(store, monkeypatch) -> list[int]:
    """Record the id of every ``store.get_draft`` (the channel and the engine share it)."""
    reads, get = [], store.get_draft

    async def counting(draft_id):
        reads.append(draft_id)
        return await get(draft_id)

    monkeypatch.setattr(store, "get_draft", counting)
    return reads


async def test_an_approve_tap_reads_the_draft_twice_at_most(world, fake, monkeypatch):
    """Approve & send: the tap's check and the card's render. The decision takes the
    draft the tap read (its CAS is the check, and it keeps the row the CAS returned),
    and the card is not rendered a second time for a send outcome shown already."""
    d = await world.deliver(1)
    reads = _count_get_draft(world.store, monkeypatch)
    assert await world.tap(d, "ap") == "✅ Sent."
    assert world.card(d).text.startswith("✅ Sent by Anna at ")
    assert len(reads) <= 2, reads


async def test_a_reply_to_a_card_finds_its_draft_with_one_read(world, fake, monkeypatch):
    """A reply to the card itself (new text) reads the draft named on the card once, not
    again to check it."""
    d = await world.deliver(1)
    reads = _count_get_draft(world.store, monkeypatch)
    before = len(reads)
    fake.say(ANNA, SUPPORT_CHAT, "New text.", reply_to=int(d.approval_message_id))
    await fake.await_for(lambda: reads[before:], 10)
    answer = await fake.await_for(lambda: [m for m in fake.chat_messages(SUPPORT_CHAT)
                                           if m.text.startswith("✏️")], 10)
    assert answer[0].text == f"✏️ #{d.id} v2 is on the card."
    # One to find it; the engine's edit reads it 4 times (check, post, after); the card.
    assert reads.count(d.id) <= 6, reads


async def test_a_slow_send_gets_its_tap_answered_first_and_the_card_shows_the_outcome(
        world, fake):
    """The spinner on the operator's phone ends within seconds even when the send
    takes longer; the card then says Sent."""
    world.answer_within = 0.2
    await world.restart()
    d = await world.deliver(1)
    world.sender.send = held = Held(world.sender.send)
    entered, release = held.entered, held.release
    u = fake.tap(ANNA, SUPPORT_CHAT, int(d.approval_message_id), f"ap:{d.id}:1", "Anna")
    assert (await fake.answered(u))["text"] == "Working on it; the card shows the outcome."
    assert entered.is_set() and world.sender.sent == []
    release.set()
    await fake.await_for(lambda: world.card(d).text.startswith("✅ Sent by Anna"))
    assert len(world.sender.sent) == 1


async def test_a_slow_tap_that_then_fails_is_told_in_the_chat(world, fake, caplog):
    world.answer_within = 0.2
    await world.restart()
    d = await world.deliver(1)
    release = asyncio.Event()

    async def broken_approve(*args, **kw):
        await release.wait()
        raise RuntimeError("store went away")

    world.desk.approve = broken_approve
    u = fake.tap(ANNA, SUPPORT_CHAT, int(d.approval_message_id), f"ap:{d.id}:1", "Anna")
    assert (await fake.answered(u))["text"] == "Working on it; the card shows the outcome."
    before = len(fake.chat_messages(SUPPORT_CHAT))
    release.set()
    [note] = await fake.await_for(lambda: fake.chat_messages(SUPPORT_CHAT)[before:])
    assert note.text.startswith("⚠️ That tap did not go through")
    assert note.reply_to == int(d.approval_message_id)


async def test_two_taps_in_one_getupdates_batch_send_once(world, fake):
    d = await world.deliver(1)
    with fake.cond:  # both queued before the next getUpdates answers
        u1 = fake.tap(ANNA, SUPPORT_CHAT, int(d.approval_message_id), f"ap:{d.id}:1", "Anna")
        u2 = fake.tap(ANNA, SUPPORT_CHAT, int(d.approval_message_id), f"ap:{d.id}:1", "Anna")
    answers = {(await fake.answered(u1))["text"], (await fake.answered(u2))["text"]}
    assert "✅ Sent." in answers and len(answers) == 2
    assert len(world.sender.sent) == 1
    batches = [c.response["result"] for c in fake.calls_of("getUpdates", ok=True)]
    assert any({u["update_id"] for u in b} >= {u1["update_id"], u2["update_id"]} for b in batches)


async def test_two_operators_tapping_at_once_send_once(world, fake):
    d = await world.deliver(1)
    with fake.cond:
        u1 = fake.tap(ANNA, SUPPORT_CHAT, int(d.approval_message_id), f"ap:{d.id}:1", "Anna")
        u2 = fake.tap(BO, SUPPORT_CHAT, int(d.approval_message_id), f"ap:{d.id}:1", "Bo")
    a1, a2 = (await fake.answered(u1))["text"], (await fake.answered(u2))["text"]
    assert sorted([a1 == "✅ Sent.", a2 == "✅ Sent."]) == [False, True]
    assert len(world.sender.sent) == 1
    winner = "Anna" if a1 == "✅ Sent." else "Bo"
    assert world.card(d).text.startswith(f"✅ Sent by {winner} at ")
    audit = [e for e in await world.store.audit_log(d.key) if e.action.startswith("approve")]
    assert len(audit) == 1


async def test_the_same_update_delivered_again_after_a_restart_sends_nothing(world, fake):
    d = await world.deliver(1)
    u = fake.tap(ANNA, SUPPORT_CHAT, int(d.approval_message_id), f"ap:{d.id}:1", "Anna")
    assert (await fake.answered(u))["text"] == "✅ Sent."
    await world.stop()
    fake.redeliver(u)  # Telegram hands it out again: the confirmation was lost
    await world.start()
    await fake.await_for(lambda: [c for c in fake.calls if c.method == "answerCallbackQuery"
                                  and c.params.get("callback_query_id") == u["callback_query"]["id"]
                                  and c.status == 400])
    assert len(world.sender.sent) == 1
    assert (await world.draft(d)).status == "sent"


# -- authorization ------------------------------------------------------------------------------

async def test_a_stranger_changes_nothing_and_gets_no_data(world, fake, caplog):
    """/status, /replay, a forged Approve and an edit reply from a user not on the
    allow-list: dropped by the gate, logged without their text, no state change."""
    caplog.set_level(logging.INFO)
    d = await world.deliver(1)
    audit_before = await world.store.audit_log()
    n_before = len(fake.calls_of("sendMessage"))
    fake.say(EVE, SUPPORT_CHAT, "/status")
    fake.say(EVE, EVE, "/status support")
    fake.say(EVE, SUPPORT_CHAT, "/replay support <order-1@customer.example>")
    fake.say(EVE, SUPPORT_CHAT, "secret new text", reply_to=int(d.approval_message_id))
    forged = fake.tap(EVE, SUPPORT_CHAT, int(d.approval_message_id), f"ap:{d.id}:1", "Eve")
    assert (await fake.answered(forged))["text"] == "Not allowed."
    # An operator's command after them: once it is answered, theirs were handled too.
    assert "/status" in await world.say("/help")
    await fake.await_for(lambda: len([r for r in caplog.records if "dropped" in r.getMessage()])
                         >= 5)
    sends = fake.calls_of("sendMessage")[n_before:]
    assert all(int(c.params["chat_id"]) == SUPPORT_CHAT for c in sends)
    assert len(sends) == 1  # the /help answer to Anna
    assert (await world.draft(d)).status == "awaiting"
    assert world.sender.sent == []
    assert await world.store.audit_log() == audit_before
    logs = "\n".join(r.getMessage() for r in caplog.records)
    assert f"from user {EVE}" in logs and "secret new text" not in logs


# -- hostile callback data ---------------------------------------------------------------------

async def test_hostile_callback_data_is_answered_and_changes_nothing(world, fake, caplog):
    caplog.set_level(logging.INFO)
    d = await world.deliver(1)
    other = await world.deliver(2, pipeline="sales")
    mid = int(d.approval_message_id)
    cases = {
        "ap:" + "1" * 62: "not one of ours",
        "zz:1:1": "Unknown action",
        f"ap:abc:{d.version}": "not one of ours",
        "": "no data",
        f"ap:{other.id}:1": "does not belong",  # sales draft, tapped in support's chat
        f"ap:{d.id}:7": "Old version",
        f"ap:0{d.id}:01": "not one of ours",  # non-canonical numbers are not ours either
        "ap:999999:1": "does not belong",
        "ap:1:1:1": "not one of ours",
    }
    for data, expect in cases.items():
        u = fake.tap(ANNA, SUPPORT_CHAT, mid, data, "Anna")
        text = (await fake.answered(u))["text"]
        assert expect in text, (data, text)
    # The sales card tapped from the support chat's message id, in the sales chat: fine.
    assert (await world.draft(d)).status == "awaiting"
    assert (await world.draft(other)).status == "awaiting"
    assert world.sender.sent == []
    assert not [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR]


async def test_forged_data_on_another_drafts_card_changes_nothing(world, fake):
    """Draft B's id tapped on draft A's card neither acts on B nor gets A's card deleted
    as a 'duplicate' of B's (nor adopted as B's card while B waits to be posted)."""
    a = await world.deliver(1)
    b = await world.deliver(2)
    fake.lose_reply("sendMessage")
    c = await world.deliver(3)  # its card's answer was lost: c waits in ready
    assert c.status == "ready"
    cards_before = {m.message_id: (m.text, m.reply_markup) for m in fake.chat_messages(SUPPORT_CHAT)}
    card_a = int(a.approval_message_id)
    for target in (b, c):
        for action in ("ap", "ed", "rg", "rj", "ft"):
            u = fake.tap(ANNA, SUPPORT_CHAT, card_a, f"{action}:{target.id}:1", "Anna")
            assert "does not belong to this message" in (await fake.answered(u))["text"]
    assert {m.message_id: (m.text, m.reply_markup)
            for m in fake.chat_messages(SUPPORT_CHAT)} == cards_before
    assert [(await world.draft(x)).status for x in (a, b, c)] == ["awaiting", "awaiting", "ready"]
    assert (await world.draft(c)).approval_message_id is None
    assert world.sender.sent == [] and fake.calls_of("deleteMessage") == []
    # A's own buttons still work on A's card.
    assert await world.tap(a, "ap") == "✅ Sent."
    assert world.sender.sent == [(a.id, 1, (await world.draft(a)).body)]


# -- big cards -----------------------------------------------------------------------------------

async def test_a_20000_character_email_of_lt_amp_underscore_gives_a_valid_card(world, fake):
    body = ("<&_" * 7000)[:20_000]
    d = await world.deliver(1, body=body, name="<b>&_")
    assert d.status == "awaiting", d.error
    card = world.card(d)
    assert len(card.html.encode("utf-16-le")) // 2 <= 4096
    assert parse_html(card.html) == card.text
    assert "cut; tap 📄 Full text" in card.text
    assert "<b>&_ <alice1@customer.example>" in card.text
    assert _buttons(card.reply_markup)[-1] == f"ft:{d.id}:1"
    assert await world.tap(d, "ft") == "Full text sent as a file."
    doc = [m for m in fake.chat_messages(SUPPORT_CHAT) if m.kind == "document"][0]
    assert doc.reply_to == int(d.approval_message_id)
    assert (await world.draft(d)).body in doc.document.decode("utf-8")
    assert doc.filename == f"draft-{d.id}-v1.txt"


# -- edit, regenerate, reject --------------------------------------------------------------------

async def _prompt(world, fake, d, action):
    before = len(fake.chat_messages(SUPPORT_CHAT))
    await world.tap(d, action)
    prompt = fake.chat_messages(SUPPORT_CHAT)[before]
    assert prompt.reply_markup.get("force_reply") is True
    return prompt


async def test_edit_makes_version_2_and_the_old_button_sends_nothing(world, fake):
    d = await world.deliver(1)
    prompt = await _prompt(world, fake, d, "ed")
    assert f"reply with the new text for #{d.id} v1" in prompt.text
    answer = await world.say("Dear Alice, it ships <today> & arrives Monday.",
                             reply_to=prompt.message_id)
    assert answer == f"✏️ #{d.id} v2 is on the card."
    d2 = await world.draft(d)
    assert (d2.version, d2.status, d2.approval_message_id) == (2, "awaiting", d.approval_message_id)
    card = world.card(d2)
    assert card.text.endswith("Dear Alice, it ships <today> & arrives Monday.")
    assert f"· #{d.id} v2" in card.text
    assert _buttons(card.reply_markup)[0] == f"ap:{d.id}:2"
    assert len(fake.chat_messages(SUPPORT_CHAT)) == 3  # card, prompt, answer: no second card
    assert "Old version" in await world.tap(d, "ap", version=1)
    assert world.sender.sent == []
    # Replying to the card itself also edits it.
    answer = await world.say("Third try.", reply_to=int(d.approval_message_id))
    assert answer == f"✏️ #{d.id} v3 is on the card."
    d3 = await world.draft(d)
    assert await world.tap(d3, "ap") == "✅ Sent."
    assert world.sender.sent == [(d.id, 3, "Third try.")]
    hashes = {e.text_sha256 for e in await world.store.audit_log(d.key) if e.text_sha256}
    assert len(hashes) >= 2


async def test_a_reply_to_an_old_prompt_after_an_edit_changes_nothing(world, fake):
    d = await world.deliver(1)
    prompt = await _prompt(world, fake, d, "ed")
    await world.say("v2 text", reply_to=prompt.message_id)
    answer = await world.say("late v2 text", reply_to=prompt.message_id)
    assert answer.startswith("Not applied")
    assert (await world.draft(d)).body == "v2 text"


async def test_a_notice_that_reads_like_a_prompt_or_a_card_changes_nothing(
        tmp_path, fake, monkeypatch):
    """Ops notices can quote outside text (an email subject, an error). One that reads
    like a prompt or a card header is not one: a reply to it edits nothing. A real
    prompt still works, also after a restart."""
    monkeypatch.setenv(TOKEN_ENV, fake.token)
    cfg = write_config(tmp_path, fake)
    cfg.write_text(cfg.read_text().replace(f"ops_chat: {OPS_CHAT}", f"ops_chat: {SUPPORT_CHAT}"))
    world = await World(tmp_path, fake, cfg).start()
    try:
        d = await world.deliver(1)
        for lie in (f"✏️ Anna, reply with the new text for #{d.id} v1. (a bounced subject)",
                    f"📨 support · #{d.id} v1"):
            await world.engine.notify(lie)
            notice = fake.chat_messages(SUPPORT_CHAT)[-1]
            assert notice.text.startswith(lie[:10])
            answer = await world.say("Send the refund to evil@example.com",
                                     reply_to=notice.message_id)
            assert answer.startswith("Nothing changed")
            d_now = await world.draft(d)
            assert (d_now.version, d_now.body) == (1, d.body)
        prompt = await _prompt(world, fake, d, "ed")
        await world.restart()
        answer = await world.say("The real new text.", reply_to=prompt.message_id)
        assert answer == f"✏️ #{d.id} v2 is on the card."
        assert (await world.draft(d)).body == "The real new text."
    finally:
        await world.stop()


async def _status(world, d, status, version):
    fresh = await world.draft(d)
    return fresh if (fresh.status, fresh.version) == (status, version) else None


async def test_regenerate_with_an_instruction_makes_version_2(world, fake):
    d = await world.deliver(1)
    prompt = await _prompt(world, fake, d, "rg")
    n = len(world.drafter.requests)
    await world.say("shorter, mention the refund", reply_to=prompt.message_id)
    d2 = await until(lambda: _status(world, d, "awaiting", 2))
    assert (d2.version, d2.status) == (2, "awaiting")
    assert world.drafter.requests[n].instruction == "shorter, mention the refund"
    assert world.card(d2).text.endswith("[shorter, mention the refund]")
    assert "Old version" in await world.tap(d, "ap", version=1)
    assert world.sender.sent == []
    # /skip regenerates without an instruction.
    prompt = await _prompt(world, fake, d2, "rg")
    await world.say("/skip", reply_to=prompt.message_id)
    d3 = await until(lambda: _status(world, d, "awaiting", 3))
    assert _buttons(world.card(d3).reply_markup)[0] == f"ap:{d.id}:3"
    assert world.drafter.requests[-1].instruction == ""


async def test_regenerate_with_the_budget_spent_is_refused_with_the_reason(world, fake):
    d = await world.deliver(1)
    ps = world.settings.pipelines  # the card's draft used 30
    ps[:] = [dataclasses.replace(p, daily_token_budget=30) if p.name == "support" else p for p in ps]
    prompt = await _prompt(world, fake, d, "rg")
    answer = await world.say("shorter", reply_to=prompt.message_id)
    assert answer.startswith("Not regenerated: support's daily token budget is spent")
    assert (await world.draft(d)).status == "awaiting"
    assert _buttons(world.card(d).reply_markup)[0] == f"ap:{d.id}:1"


async def test_reject_with_a_reason_is_final(world, fake):
    d = await world.deliver(1)
    prompt = await _prompt(world, fake, d, "rj")
    assert await world.say("spam", reply_to=prompt.message_id) == f"🗑 #{d.id} rejected."
    d2 = await world.draft(d)
    assert d2.status == "rejected"
    card = world.card(d2)
    assert card.text.startswith("🗑 Rejected by Anna at") and card.reply_markup is None
    assert (await world.tap(d2, "ap")).startswith("Already decided: rejected by Anna")
    assert world.sender.sent == []


async def test_a_card_of_a_removed_pipeline_is_not_approved_but_can_be_rejected(world, fake):
    """Its pipeline (and so its sender) left the configuration: Approve would strand the
    reply in `approved`; the tap says what to do instead, and Reject still works."""
    d = await world.deliver(1, pipeline="sales")
    (world.tmp_path / "pipelines" / "sales.yaml").unlink()
    world.settings = load_settings(world.cfg)
    await world.restart()
    answer = await world.tap(d, "ap", chat=SALES_CHAT)
    assert answer.startswith("Pipeline 'sales' is not configured any more: restore its YAML")
    assert (await world.draft(d)).status == "awaiting" and world.sender.sent == []
    pending = await world.say("/pending", chat=SUPPORT_CHAT)
    assert f"sales #{d.id} v1 · awaiting · ⚠ pipeline sales is not configured" in pending
    before = len(fake.chat_messages(SALES_CHAT))
    await world.tap(d, "rj", chat=SALES_CHAT)
    prompt = fake.chat_messages(SALES_CHAT)[before]
    answer = await world.say("pipeline retired", chat=SALES_CHAT, reply_to=prompt.message_id)
    assert answer == f"🗑 #{d.id} rejected."
    assert (await world.draft(d)).status == "rejected"
    assert world.card(d).text.startswith("🗑 Rejected by Anna at")


async def test_review_in_the_terminal_keeps_the_telegram_card(world, fake, monkeypatch):
    """`draftgate review` edits a Telegram pipeline's draft: the draft keeps its card,
    the running bot puts v2 on it, and a tap there sends exactly the edited text."""
    from bot.__main__ import main
    from bot.approvals import console

    d = await world.deliver(1)
    answers = iter(["e"])
    monkeypatch.setattr(console, "_ask", lambda prompt: next(answers, ""))
    monkeypatch.setattr(console, "_read_block", lambda: "Edited in the terminal.")
    assert await asyncio.to_thread(main, ["review", "-c", str(world.cfg)]) == 0
    d2 = await world.draft(d)
    assert (d2.version, d2.status, d2.body) == (2, "ready", "Edited in the terminal.")
    assert (d2.approval_chat, d2.approval_message_id) == (d.approval_chat, d.approval_message_id)
    assert await world.engine.post_unposted() == 1
    card = world.card(d2)
    assert card.text.endswith("Edited in the terminal.") and f"#{d.id} v2" in card.text
    assert await world.tap(await world.draft(d), "ap") == "✅ Sent."
    assert world.sender.sent == [(d.id, 2, "Edited in the terminal.")]
    assert len(fake.chat_messages(SUPPORT_CHAT)) == 1  # still the one card


async def test_a_card_says_so_when_its_regenerate_fails_or_its_approval_expires(world, fake):
    from bot.errors import DrafterError

    d = await world.deliver(1)
    prompt = await _prompt(world, fake, d, "rg")
    world.drafter.fail_next = DrafterError("400: the model refused")
    await world.say("shorter", reply_to=prompt.message_id)
    await until(lambda: _status(world, d, "failed", 2))
    await fake.await_for(lambda: "Drafting failed" in world.card(d).text)
    card = world.card(d)
    assert card.reply_markup is None and "the model refused" in card.text

    d2 = await world.deliver(2)
    assert _buttons(world.card(d2).reply_markup)
    world.settings.approval_ttl_days = 1
    await world.desk.sweep(SYSTEM)  # nothing is a day old yet
    assert (await world.draft(d2)).status == "awaiting"
    world.skew = d2.updated_at + 2 * 86400 - time.time()
    await world.desk.sweep(SYSTEM)
    expired = await world.draft(d2)
    assert expired.status == "expired"
    card = world.card(expired)
    assert card.reply_markup is None and "expired" in card.text.lower()


# -- resilience ---------------------------------------------------------------------------------

async def test_a_429_is_honoured_and_the_card_arrives_once_later(world, fake):
    fake.fail("sendMessage", 429, "Too Many Requests: retry after 1", retry_after=1)
    d = await world.deliver(1)
    calls = fake.calls_of("sendMessage")
    assert [c.status for c in calls] == [429, 200]
    assert calls[1].at - calls[0].at >= 1.0
    assert len(fake.chat_messages(SUPPORT_CHAT)) == 1
    assert d.status == "awaiting"


async def test_a_card_whose_post_answer_was_lost_is_adopted_by_a_tap(world, fake):
    """Telegram showed the card but the answer never came back: the draft waits in
    ready. A tap on that card makes it the draft's card, so no second card follows."""
    fake.lose_reply("sendMessage")
    d = await world.deliver(1)
    assert (d.status, d.approval_message_id) == ("ready", None)
    [card] = fake.chat_messages(SUPPORT_CHAT)
    u = fake.tap(ANNA, SUPPORT_CHAT, card.message_id, f"ap:{d.id}:1", "Anna")
    assert (await fake.answered(u))["text"] == "✅ Sent."
    assert world.sender.sent == [(d.id, 1, (await world.draft(d)).body)]
    assert await world.engine.post_unposted() == 0
    [card] = fake.chat_messages(SUPPORT_CHAT)
    assert card.text.startswith("✅ Sent by Anna at ") and card.reply_markup is None


async def test_a_second_card_after_a_lost_answer_goes_when_either_is_touched(world, fake):
    """The lost answer led to a second card; a tap on the first acts once and removes
    it, and a repost that loses the race to an adopting tap removes its own card."""
    fake.lose_reply("sendMessage")
    d = await world.deliver(1)
    assert await world.engine.post_unposted() == 1
    first, second = fake.chat_messages(SUPPORT_CHAT)
    assert (await world.draft(d)).approval_message_id == str(second.message_id)
    assert first.reply_markup == second.reply_markup
    u = fake.tap(ANNA, SUPPORT_CHAT, first.message_id, f"ap:{d.id}:1", "Anna")
    assert (await fake.answered(u))["text"] == "✅ Sent."
    assert len(world.sender.sent) == 1
    [left] = fake.chat_messages(SUPPORT_CHAT)
    assert left.message_id == second.message_id and left.text.startswith("✅ Sent by Anna")

    # The race: a repost is under way (it read the draft as ready) when a tap adopts
    # the first card; the repost's card is then the duplicate and is removed.
    fake.lose_reply("sendMessage")
    d2 = await world.deliver(2)
    [orphan] = [m for m in fake.chat_messages(SUPPORT_CHAT) if m.message_id != left.message_id]
    assert await world.store.mark_posted(d2.id, 1, str(SUPPORT_CHAT), str(orphan.message_id))
    after = await world.engine.channels.post_card(world.settings.pipeline("support"), d2)
    assert after.approval_message_id == str(orphan.message_id)
    assert {m.message_id for m in fake.chat_messages(SUPPORT_CHAT)} == {left.message_id,
                                                                        orphan.message_id}
    assert fake.calls_of("deleteMessage", ok=True)


async def test_a_duplicate_card_telegram_will_not_delete_loses_its_buttons_and_points_on(
        world, fake):
    """Telegram deletes a message only within 48 hours: when it refuses to delete the
    duplicate card (the lost answer's first card), the card is edited instead, its
    buttons gone and its text pointing to the other card, so nobody taps it again."""
    fake.lose_reply("sendMessage")
    d = await world.deliver(1)
    assert await world.engine.post_unposted() == 1
    first, second = fake.chat_messages(SUPPORT_CHAT)
    fake.fail("deleteMessage", 400, "Bad Request: message can't be deleted for everyone")
    u = fake.tap(ANNA, SUPPORT_CHAT, first.message_id, f"ap:{d.id}:1", "Anna")
    assert (await fake.answered(u))["text"] == "✅ Sent."
    assert len(world.sender.sent) == 1
    assert [c.status for c in fake.calls_of("deleteMessage")] == [400]
    old, kept = fake.chat_messages(SUPPORT_CHAT)
    assert old.message_id == first.message_id and old.reply_markup is None
    assert old.text == (f"Duplicate of the card of #{d.id} (Telegram lost the answer to the "
                        "first post); use the other card.")
    assert kept.message_id == second.message_id and kept.text.startswith("✅ Sent by Anna")
    # A second tap on the stripped card changes nothing and sends nothing.
    u = fake.tap(ANNA, SUPPORT_CHAT, first.message_id, f"ap:{d.id}:1", "Anna")
    await fake.answered(u)
    assert len(world.sender.sent) == 1


async def test_a_new_versions_card_whose_answer_was_lost_is_adopted_not_deleted(world, fake):
    """v1's card was deleted; the edit posted v2 as a new card and its answer was lost.
    A tap on that v2 card makes it the draft's card (it used to be deleted as a
    duplicate of the dead v1 card)."""
    d = await world.deliver(1)
    with fake.cond:
        fake.messages.pop((SUPPORT_CHAT, int(d.approval_message_id)))
    fake.lose_reply("sendMessage")
    await world.desk.edit(op("anna"), d.id, 1, "Second text.")
    d2 = await world.draft(d)
    assert (d2.status, d2.version) == ("ready", 2)
    [card] = fake.chat_messages(SUPPORT_CHAT)
    u = fake.tap(ANNA, SUPPORT_CHAT, card.message_id, f"ap:{d.id}:2", "Anna")
    assert (await fake.answered(u))["text"] == "✅ Sent."
    assert world.sender.sent == [(d.id, 2, "Second text.")]
    assert [m.message_id for m in fake.chat_messages(SUPPORT_CHAT)] == [card.message_id]


@pytest.mark.parametrize("outage", ["unreachable", "502"])
async def test_cards_wait_in_ready_while_telegram_is_down_and_are_posted_later(world, fake, outage):
    if outage == "unreachable":
        fake.down = True
    else:
        fake.fail("sendMessage", 502, "Bad Gateway", times=2)
    d = await world.deliver(1)
    assert d.status == "ready" and d.approval_message_id is None
    assert fake.chat_messages(SUPPORT_CHAT) == []
    fake.down = False
    if outage == "502":
        assert await world.engine.post_unposted() == 0  # second 502
    assert await world.engine.post_unposted() == 1
    d = await world.draft(d)
    assert d.status == "awaiting"
    assert len(fake.chat_messages(SUPPORT_CHAT)) == 1


async def test_the_channel_starts_while_telegram_is_down_and_connects_later(tmp_path, fake,
                                                                            monkeypatch):
    monkeypatch.setenv(TOKEN_ENV, fake.token)
    w = World(tmp_path, fake, write_config(tmp_path, fake), reconnect_delay=0.05)
    fake.down = True
    await w.start()
    try:
        d = await w.deliver(1)
        assert d.status == "ready"
        fake.down = False
        await fake.await_for(lambda: fake.calls_of("setMyCommands", ok=True), 15)
        assert await until(w.engine.post_unposted) == 1
        assert await w.tap(await w.draft(d), "ap") == "✅ Sent."
    finally:
        await w.stop()


async def test_an_unknown_send_is_told_to_ops_with_a_retry_button_that_sends(world, fake):
    d = await world.deliver(1)
    world.sender.unknown_once = True
    assert await world.tap(d, "ap") == "❓ Send outcome unknown; see the card."
    card = world.card(d)
    assert card.text.startswith("❓ Send outcome unknown (approved by Anna")
    assert _buttons(card.reply_markup) == [f"ck:{d.id}:1", f"ms:{d.id}:1", f"rt:{d.id}:1"]
    note = await fake.await_for(lambda: fake.chat_messages(OPS_CHAT))
    assert f"#{d.id}" in note[0].text and _buttons(note[0].reply_markup) == [f"rt:{d.id}:1"]
    u = fake.tap(BO, OPS_CHAT, note[0].message_id, f"rt:{d.id}:1", "Bo")
    assert (await fake.answered(u))["text"] == "✅ Sent."
    assert len(world.sender.sent) == 2  # the unknown one and the operator's retry
    assert world.card(d).text.startswith("✅ Sent by ")
    assert world.card(d).reply_markup is None


async def test_an_unknown_sends_card_checks_again_and_marks_sent_without_sending(world, fake):
    """Check again asks the mailbox and says what it found (nothing is sent); Mark as
    sent records the operator's word: sent, audited, no second send."""
    d = await world.deliver(1)
    world.sender.unknown_once = True
    await world.tap(d, "ap")
    world.sender.check_answer = SendUnknown("the provider does not file SMTP mail")
    assert (await world.tap(await world.draft(d), "ck")).startswith(
        "❓ Still unknown: the provider does not file SMTP mail")
    assert (await world.draft(d)).status == "send_unknown"
    assert await world.tap(await world.draft(d), "ms") == "✅ Marked as sent."
    after = await world.draft(d)
    assert after.status == "sent" and len(world.sender.sent) == 1
    assert world.card(d).text.startswith("✅ Sent by ") and world.card(d).reply_markup is None
    rows = await world.store.audit_log(after.key)
    assert any(r.action == "sent" and r.actor and "Anna" in r.actor for r in rows)


@pytest.mark.parametrize("failure", ["flood wait", "500"])
async def test_a_card_whose_edits_failed_shows_the_decision_after_the_next_tick(
        world, fake, failure):
    """Every edit after the approval fails (an hour's flood wait, or a 500): the card
    keeps its buttons for now, and the next tick puts it right."""
    d = await world.deliver(1)
    if failure == "500":
        fake.fail("editMessageText", 500, "Internal Server Error", times=100)
    else:
        fake.fail("editMessageText", 429, "Too Many Requests: retry after 3600",
                  retry_after=3600, times=100)
    assert await world.tap(d, "ap") == "✅ Sent."
    assert _buttons(world.card(d).reply_markup)[0] == f"ap:{d.id}:1"  # not updated yet
    assert (await world.draft(d)).card_stale
    await world.engine.tick("support")  # Telegram still refuses: nothing lost
    assert (await world.draft(d)).card_stale
    fake.recover("editMessageText")
    await world.engine.tick("support")
    card = world.card(d)
    assert card.text.startswith("✅ Sent by Anna at ") and card.reply_markup is None
    assert not (await world.draft(d)).card_stale
    assert len(world.sender.sent) == 1


async def test_a_stale_card_is_put_right_at_the_next_start(world, fake):
    """The edits failed and draftgate restarted: the card is re-rendered at start; a
    card already right ("message is not modified") counts as put right."""
    d = await world.deliver(1)
    fake.fail("editMessageText", 500, "Internal Server Error", times=100)
    assert await world.tap(d, "rj") == "Reply with a reason, or /skip."
    prompt = fake.chat_messages(SUPPORT_CHAT)[-1]
    assert (await world.say("/skip", reply_to=prompt.message_id)).startswith("🗑")
    assert (await world.draft(d)).status == "rejected"
    assert _buttons(world.card(d).reply_markup)[0] == f"ap:{d.id}:1"
    await world.stop()
    fake.recover("editMessageText")
    await world.start()
    card = world.card(d)
    assert card.text.startswith("🗑 Rejected by Anna") and card.reply_markup is None
    assert not (await world.draft(d)).card_stale
    await world.store.mark_card_stale(d.id, True)
    await world.restart()
    assert fake.calls_of("editMessageText")[-1].status == 400  # not modified
    assert not (await world.draft(d)).card_stale


async def test_a_failed_draft_is_told_with_a_replay_button_that_requeues_it(world, fake):
    """The notice about a failed draft has a Replay button (no command to type, no
    backticks); it does what /replay does, audited, once."""
    from bot.errors import DrafterError

    world.drafter.fail_next = DrafterError("the model refused")
    d = await world.deliver(1)
    assert d.status == "failed"
    [note] = await fake.await_for(lambda: fake.chat_messages(OPS_CHAT))
    assert f"#{d.id}" in note.text and "the model refused" in note.text
    assert "`" not in note.text and "/replay" not in note.text
    assert _buttons(note.reply_markup) == [f"rp:{d.id}:1"]
    u = fake.tap(BO, OPS_CHAT, note.message_id, f"rp:{d.id}:1", "Bo")
    assert (await fake.answered(u))["text"] == f"♻️ #{d.id} is back in the queue; the next tick drafts it."
    d2 = await world.draft(d)
    assert (d2.status, d2.version) == ("queued", 2)
    assert [e.actor for e in await world.store.audit_log(d.key) if e.action == "replay"] == \
        [f"tg:{BO} (Bo)"]
    assert fake.message(OPS_CHAT, note.message_id).reply_markup is None
    again = fake.tap(ANNA, OPS_CHAT, note.message_id, f"rp:{d.id}:1", "Anna")
    assert (await fake.answered(again))["text"].startswith("Already replayed")
    stranger = fake.tap(EVE, OPS_CHAT, note.message_id, f"rp:{d.id}:2", "Eve")
    assert (await fake.answered(stranger))["text"] == "Not allowed."
    await world.engine.tick("support")
    assert (await world.draft(d)).status == "awaiting"
    # A notice naming a config key shows it as code, not between backticks.
    await world.engine.notify("⚠️ support: check `schedule` in <pipelines/support.yaml>.")
    last = fake.chat_messages(OPS_CHAT)[-1]
    assert last.text == "⚠️ support: check schedule in <pipelines/support.yaml>."
    assert "<code>schedule</code>" in last.html


# -- commands --------------------------------------------------------------------------------------

async def test_commands_answer_and_bad_arguments_get_a_usage_line(world, fake):
    d = await world.deliver(1)
    assert "support" in await world.say("/status") and "sales" in await world.say("/status")
    assert "support · " in await world.say("/status support")
    assert "unknown pipeline 'nope'" in await world.say("/status nope")
    assert (await world.say("/status a b")).startswith("Usage: /status [pipeline]")
    assert f"support #{d.id} v1" in await world.say("/pending")
    assert (await world.say("/replay support")).startswith("Usage: /replay <pipeline> <item_id>")
    assert "not found" in await world.say("/replay support <nothing@x>")
    assert (await world.say("/sweep abc")).startswith("Usage: /sweep [days]")
    assert (await world.say("/sweep 30")).startswith("swept:")
    assert (await world.say("/pause")).startswith("Usage: /pause <pipeline>")
    assert "paused" in await world.say("/pause support")
    assert "support" in await world.store.paused()
    assert "resumed" in await world.say("/resume support")
    assert "support" not in await world.store.paused()
    assert "support: fetched" in await world.say("/run support", answers=2)
    help_text = await world.say("/help")
    for c in ("status", "pending", "replay", "sweep", "pause", "resume", "run", "help"):
        assert f"/{c}" in help_text
    # A rejected item can be replayed from the chat.
    prompt = await _prompt(world, fake, d, "rj")
    await world.say("/skip", reply_to=prompt.message_id)
    assert "back in the queue" in await world.say("/replay support <order-1@customer.example>")
    # An item id with spaces (a schedule slot such as "2026-01-05 00:00") stays whole.
    assert "support 2026-01-05 00:00: not found" in await world.say(
        "/replay support 2026-01-05 00:00")
    # Arguments Telegram counts longer than they look (emoji are 2 UTF-16 units) get
    # the real answer, cut to fit, not a failed send.
    assert "unknown pipeline" in await world.say("/status " + "😀" * 2100)
    assert "not found" in await world.say("/replay support " + "😀" * 2100)


# -- configuration and webhook ----------------------------------------------------------------------

def test_pending_links_to_cards_in_supergroups():
    """/pending links each card where Telegram has links (supergroups), nowhere else."""
    from bot.approvals.telegram.commands import card_link as _card_link
    from bot.models import Draft, Message

    d = Draft(id=1, key="k", pipeline="p", scope="s", item_id="i", recipe="v1",
              status="awaiting", message=Message(), approval_chat="-1001234567890",
              approval_message_id="77")
    assert _card_link(d) == "https://t.me/c/1234567890/77"
    d.approval_chat = "1001"
    assert _card_link(d) is None
    d.approval_chat, d.approval_message_id = "-1001234567890", None
    assert _card_link(d) is None


def test_create_says_what_to_fix(tmp_path, fake, monkeypatch):
    """A missing token variable or webhook secret is a ConfigError naming the setting."""
    from bot.errors import ConfigError

    monkeypatch.delenv(TOKEN_ENV, raising=False)
    settings = load_settings(write_config(tmp_path, fake))
    with pytest.raises(ConfigError, match=TOKEN_ENV):
        create(settings)
    monkeypatch.setenv(TOKEN_ENV, fake.token)
    assert create(settings).approvals_chat("sales") == SALES_CHAT
    settings = load_settings(write_config(tmp_path, fake, receive="webhook"))
    with pytest.raises(ConfigError, match=r"telegram\.webhook\.url.*\n.*telegram\.webhook\.secret_env"):
        create(settings)


def _webhook_config(tmp_path, fake, monkeypatch, port: int, extra: str = ""):
    """receive: webhook on 127.0.0.1:``port``/tg, its secret (s3cret-Token_1) and the
    token in the environment, ``extra`` appended to draftgate.yaml; the config's path."""
    monkeypatch.setenv(TOKEN_ENV, fake.token)
    monkeypatch.setenv("DG_TEST_WEBHOOK_SECRET", "s3cret-Token_1")
    return write_config(tmp_path, fake, receive="webhook", webhook=(
        f"  webhook: {{listen: 127.0.0.1, port: {port}, path: tg, "
        f"url: 'https://bot.example/tg', secret_env: DG_TEST_WEBHOOK_SECRET}}\n" + extra))


async def test_webhook_checks_the_secret_token_on_every_request(tmp_path, fake, monkeypatch):
    """receive: webhook -- a request with a missing or wrong secret gets 403 and changes
    nothing; the right secret delivers the tap."""
    import httpx

    port = _free_port()
    w = await World(tmp_path, fake, _webhook_config(tmp_path, fake, monkeypatch, port)).start()
    try:
        assert fake.webhook["url"] == "https://bot.example/tg"
        assert fake.webhook["secret_token"] == "s3cret-Token_1"
        d = await w.deliver(1)
        update = dict(fake.callback_update(ANNA, SUPPORT_CHAT, int(d.approval_message_id),
                                           f"ap:{d.id}:1", "Anna"), update_id=1)
        url = f"http://127.0.0.1:{port}/tg"
        async with httpx.AsyncClient() as client:
            for headers in ({}, {"X-Telegram-Bot-Api-Secret-Token": "wrong"}):
                r = await client.post(url, json=update, headers=headers)
                assert r.status_code == 403
            assert (await w.draft(d)).status == "awaiting"
            r = await client.post(url, json=update,
                                  headers={"X-Telegram-Bot-Api-Secret-Token": "s3cret-Token_1"})
            assert r.status_code == 200
        assert (await fake.answered(update))["text"] == "✅ Sent."
        assert len(w.sender.sent) == 1
    finally:
        await w.stop()


async def test_the_webhook_refuses_a_strangers_large_post_before_reading_its_body(
        tmp_path, fake, monkeypatch):
    """A POST announcing 100 MB with a wrong or no secret is answered 403 on its head
    alone, before a byte of its body is sent, and the connection is closed: nothing of
    it is read or buffered (PTB's server read 100 MB first). The right secret with
    100 MB gets 413, a body without a length 411; a real update still works (above)."""
    port = _free_port()
    w = await World(tmp_path, fake, _webhook_config(tmp_path, fake, monkeypatch, port)).start()

    async def head_only(headers: str) -> bytes:
        """The answer to a request's head sent alone, read until the server closes."""
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            writer.write(f"POST /tg HTTP/1.1\r\nHost: bot.example\r\nContent-Type: "
                         f"application/json\r\n{headers}\r\n".encode())
            await writer.drain()
            return await asyncio.wait_for(reader.read(), 20)
        finally:
            writer.close()

    big = "Content-Length: 100000000\r\n"
    try:
        for secret in ("", "X-Telegram-Bot-Api-Secret-Token: wrong\r\n"):
            assert (await head_only(secret + big)).startswith(b"HTTP/1.1 403 ")
        right = "X-Telegram-Bot-Api-Secret-Token: s3cret-Token_1\r\n"
        assert (await head_only(right + big)).startswith(b"HTTP/1.1 413 ")
        assert (await head_only(right + "Transfer-Encoding: chunked\r\n")).startswith(
            b"HTTP/1.1 411 ")
        assert (await head_only(right + "Content-Length: 2\r\nContent-Length: 9\r\n")
                ).startswith(b"HTTP/1.1 400 ")
    finally:
        await w.stop()


async def test_healthz_fails_while_the_webhook_server_is_dead(tmp_path, fake, monkeypatch):
    """receive: webhook, with /healthz served: 200 while the webhook server answers;
    once it is dead (the process lives on) 503 naming the receiver, as for a stuck
    poller; 200 again when it is back."""
    import httpx

    from bot.service import health
    from bot.service.observe import Service

    monkeypatch.setattr(health, "WEBHOOK_PROBE_EVERY", 0.05, raising=False)
    monkeypatch.setattr(health, "_TELEGRAM_SLACK", 1.0)  # the bound: 1.05 s
    ports = [_free_port(), _free_port()]
    cfg = _webhook_config(tmp_path, fake, monkeypatch, ports[0],
                          f"observability: {{listen: '127.0.0.1:{ports[1]}'}}\n")
    service = await Service(load_settings(cfg), None).start()
    w = await World(tmp_path, fake, cfg).start()

    async def healthz(want: int) -> dict:
        async with httpx.AsyncClient() as client:
            for _ in range(600):  # 30 s at most
                r = await client.get(f"http://127.0.0.1:{ports[1]}/healthz")
                if r.status_code == want:
                    return r.json()
                await asyncio.sleep(0.05)
        raise AssertionError(f"/healthz never answered {want}: {r.status_code} {r.text}")

    try:
        assert (await healthz(200))["stuck"] == {}
        await w.channel._receiver.stop()  # the webhook server is gone
        body = await healthz(503)
        assert list(body["stuck"]) == ["telegram webhook"], body
        assert "late waking up" in body["stuck"]["telegram webhook"]
        await w.channel._connect()  # back: the next probe is answered
        assert (await healthz(200))["stuck"] == {}
    finally:
        await w.stop()
        await service.close()


# -- errors, shutdown, doctor ------------------------------------------------------------------------

class _BrokenStore:
    """Delegates to the real store but cannot read drafts or runs (a failing disk)."""

    def __init__(self, store):
        self._store = store

    def __getattr__(self, name):
        if name in ("get_draft", "recent_runs"):
            async def broken(*args, **kwargs):
                from bot.errors import StoreError

                raise StoreError("database disk image is malformed")
            return broken
        return getattr(self._store, name)


async def test_a_failing_handler_is_logged_first_then_the_operator_is_told(world, fake, caplog):
    """The one error handler logs with the traceback, then answers briefly; a tap whose
    handling fails is still answered."""
    d = await world.deliver(1)
    world.desk.store = _BrokenStore(world.store)  # what the commands and the taps read
    text = await world.say("/status support")
    assert text == "⚠️ That failed (database disk image is malformed); the details are in " \
                   "the bot's log."
    logged = [r for r in caplog.records if r.getMessage() == "handling command /status failed"]
    assert logged and logged[0].exc_info is not None
    assert "went wrong" in await world.tap(d, "ap")
    assert world.sender.sent == []


async def test_stop_lets_an_approval_in_flight_finish(world, fake):
    """SIGTERM while a reply is being sent: the send completes, its card and answer go
    out, then the channel stops."""
    d = await world.deliver(1)
    world.sender.send = held = Held(world.sender.send)
    entered, release = held.entered, held.release
    u = fake.tap(ANNA, SUPPORT_CHAT, int(d.approval_message_id), f"ap:{d.id}:1", "Anna")
    await asyncio.wait_for(entered.wait(), 10)
    stopping = asyncio.create_task(world.channel.stop())
    await asyncio.sleep(0)  # let stop() begin before the send may finish
    assert not stopping.done()
    release.set()
    await asyncio.wait_for(stopping, 20)
    assert fake.answer_for(u)["text"] == "✅ Sent."
    assert (await world.draft(d)).status == "sent"
    assert world.card(d).text.startswith("✅ Sent by Anna")


async def test_a_rejected_token_stops_start_with_the_variable_to_fix(tmp_path, fake, monkeypatch,
                                                                      caplog):
    """A 401 from getMe is a ConfigError naming the variable, never showing the token."""
    from bot.errors import ConfigError

    caplog.set_level(logging.DEBUG, logger="draftgate")
    monkeypatch.setenv(TOKEN_ENV, fake.token)
    fake.fail("getMe", 401, "Unauthorized")
    w = World(tmp_path, fake, write_config(tmp_path, fake))
    with pytest.raises(ConfigError, match=f"rejected the bot token in \\${TOKEN_ENV}") as info:
        await w.start()
    await w.store.close()
    assert fake.token not in str(info.value)
    assert fake.token not in caplog.text


async def test_doctor_reports_the_bot_or_what_is_wrong(tmp_path, fake, monkeypatch):
    from bot.approvals.telegram.doctor import doctor

    settings = load_settings(write_config(tmp_path, fake))
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    [(name, ok, detail)] = await doctor(settings)
    assert (name, ok) == ("telegram", False) and TOKEN_ENV in detail
    monkeypatch.setenv(TOKEN_ENV, fake.token)
    assert await doctor(settings) == [("telegram", True, "@draftgate_test_bot, operators 2")]
    fake.fail("getMe", 401, "Unauthorized")
    [(name, ok, detail)] = await doctor(settings)
    assert not ok and TOKEN_ENV in detail and fake.token not in detail


async def test_a_long_flood_wait_is_not_slept_through(world, fake):
    """retry_after of an hour: the card is not posted now and not lost; it waits in ready
    and goes out on a later try, once."""
    fake.fail("sendMessage", 429, "Too Many Requests: retry after 3600", retry_after=3600)
    d = await asyncio.wait_for(world.deliver(1), 10)
    assert d.status == "ready"
    assert await world.engine.post_unposted() == 1
    assert len(fake.chat_messages(SUPPORT_CHAT)) == 1


@pytest.mark.parametrize("ptb_timedelta", ["false", "true"])
async def test_flood_waits_are_read_in_either_ptb_mode_without_a_warning(monkeypatch,
                                                                        ptb_timedelta):
    """PTB 22 gives RetryAfter.retry_after as seconds (warning that it will become a
    timedelta) or, under PTB_TIMEDELTA=true, as a timedelta. Both are understood: an
    hour's wait fails at once (FloodWait), a second's goes on to PTB's own handling; and
    reading it adds no deprecation warning to the log."""
    from telegram.error import RetryAfter

    from bot.approvals.telegram.limits import FloodWait, _Limiter

    monkeypatch.setenv("PTB_TIMEDELTA", ptb_timedelta)
    def raising(exc: RetryAfter):
        async def call(*args, **kwargs):
            raise exc
        return call

    limiter = _Limiter(max_retries=0)
    for wait, raised in ((3600, FloodWait), (1, RetryAfter)):
        call = raising(RetryAfter(wait))  # PTB's constructor reads it, and warns: not ours

        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            with pytest.raises(raised):
                await limiter.process_request(call, (), {}, "sendMessage",
                                              {"chat_id": SUPPORT_CHAT}, None)
        assert [str(w.message) for w in seen] == []


async def _awaiting(store, pipeline: str, n: int) -> list[int]:
    """``n`` drafts awaiting a decision (cards recorded, not posted: fast)."""
    from bot.models import Item, Message

    await store.admit(pipeline, "bulk", "v1", [Item(f"<bulk-{i}@x>", Message(
        from_addr=f"c{i}@customer.example", subject=f"Question {i}", body="hi"))
        for i in range(n)])
    ids = []
    while claimed := await store.claim(pipeline, 600, limit=100):
        for d in claimed:
            d = await store.finish_draft(d.id, d.fence, "Hello")
            await store.mark_posted(d.id, d.version, str(SUPPORT_CHAT), str(10_000 + d.id))
            ids.append(d.id)
    return ids


async def test_pending_with_hundreds_waiting_says_how_many_more_and_where(world):
    """/pending with 300 drafts awaiting lists what fits, oldest first, and ends with
    how many it left out and the command that lists them all: nothing cut silently."""
    ids = await _awaiting(world.store, "support", 300)
    text = await world.say("/pending")
    lines = text.splitlines()
    shown = [line for line in lines if line.startswith("support #")]
    assert shown and shown[0].startswith(f"support #{ids[0]} v1 · awaiting")
    last = lines[-1]
    assert last.startswith("… and ") and last.endswith(
        "more: draftgate pending --all lists every one"), last
    assert len(shown) + int(last.split()[2].replace(",", "")) == 300
    assert len(text) <= 4096
