"""The team desk end to end (issue 14): quorum, per-pipeline operators, /reply and
/emails, reminders and the digest. The real python-telegram-bot against the fake Bot
API, the real Engine and a real SQLite store (tests/test_telegram_channel.py's World).
Every wait is on an event of the fake (an answered tap, a message in a chat); time for
reminders and the digest is the engine's clock, moved by the test.
"""

from __future__ import annotations

import asyncio
import re
import time

import pytest

from tests.fakes.telegram import FakeTelegram
from tests.support.clock import Clock
from tests.support.team import (  # noqa: F401
    CY,
    team_config,
)
from tests.support.telegram_world import (
    ANNA,
    BO,
    OPS_CHAT,
    SUPPORT_CHAT,
    World,
    start_world,
)

WAIT = 30.0


async def _start(tmp_path, fake, monkeypatch, worlds, approval: str, **kw) -> World:
    return await start_world(tmp_path, fake, monkeypatch, worlds,
                             team_config(tmp_path, fake, approval, **kw))


async def tap(w: World, d, action: str, user: int, name: str) -> str:
    u = w.fake.tap(user, int(d.approval_chat), int(d.approval_message_id),
                   f"{action}:{d.id}:{d.version}", name)
    return (await w.fake.answered(u, WAIT))["text"]


async def say(w: World, text: str, user: int = ANNA, name: str = "Anna",
              chat: int = SUPPORT_CHAT, reply_to: int | None = None) -> str:
    """Send a message; the text of the bot's answer to it (a reply quoting it)."""
    mid = w.fake.say(user, chat, text, reply_to=reply_to, first_name=name)["message"]["message_id"]
    msgs = await w.fake.await_for(
        lambda: [m for m in w.fake.chat_messages(chat) if m.reply_to == mid], WAIT)
    return msgs[-1].text


# -- quorum -------------------------------------------------------------------------------------

async def test_quorum_two_one_approval_sends_nothing_a_second_operator_sends_once(
        tmp_path, fake, monkeypatch, worlds):
    """The card shows ✅ 1/2 · Anna after Anna's approval; Anna again changes nothing;
    Bo's approval sends exactly once."""
    w = await _start(tmp_path, fake, monkeypatch, worlds, "quorum: 2")
    d = await w.deliver(1)
    assert "👥 needs 2 approvals" in w.card(d).text
    assert await tap(w, d, "ap", ANNA, "Anna") == "✅ Your approval counts (1/2); it sends at 2."
    assert w.sender.sent == []
    await fake.await_for(lambda: "✅ 1/2 · Anna" in w.card(d).text, WAIT)
    assert w.card(d).text.split("\n")[1] == "✅ 1/2 · Anna"
    assert await tap(w, d, "ap", ANNA, "Anna") == "✅ Your approval counts (1/2); it sends at 2."
    assert w.sender.sent == [] and (await w.draft(d)).status == "awaiting"
    assert await tap(w, d, "ap", BO, "Bo") == "✅ Sent."
    assert [s[:2] for s in w.sender.sent] == [(d.id, 1)]
    await fake.await_for(lambda: w.card(d).text.startswith("✅ Sent by Bo"), WAIT)
    assert await tap(w, d, "ap", CY, "Cy") == "Already decided: sent by Bo."
    assert len(w.sender.sent) == 1
    approvals = [(e.actor, e.detail) for e in await w.store.audit_log(d.key)
                 if e.action == "approve"]
    assert approvals == [(f"tg:{BO} (Bo)", "v1: 2/2 approvals"),
                         (f"tg:{ANNA} (Anna)", "v1: 1/2 approvals")]


async def test_an_edit_after_one_approval_needs_two_new_approvals(
        tmp_path, fake, monkeypatch, worlds):
    w = await _start(tmp_path, fake, monkeypatch, worlds, "quorum: 2")
    d = await w.deliver(1)
    await tap(w, d, "ap", ANNA, "Anna")
    answer = await say(w, "Edited by Bo.", user=BO, name="Bo",
                       reply_to=int(d.approval_message_id))
    assert answer == f"✏️ #{d.id} v2 is on the card."
    d2 = await w.draft(d)
    assert d2.version == 2 and "✅ 1/2" not in w.card(d2).text
    assert "👥 needs 2 approvals" in w.card(d2).text
    assert await tap(w, d2, "ap", ANNA, "Anna") == "✅ Your approval counts (1/2); it sends at 2."
    assert w.sender.sent == []
    assert await tap(w, d2, "ap", BO, "Bo") == "✅ Sent."
    assert w.sender.sent == [(d.id, 2, "Edited by Bo.")]


@pytest.mark.parametrize("quorum,sends", [(2, 1), (3, 0)])
async def test_two_operators_approving_in_one_getupdates_batch(
        tmp_path, fake, monkeypatch, worlds, quorum, sends):
    """Both taps arrive in one batch and are handled concurrently: quorum 2 sends
    exactly one email, quorum 3 none (and the card shows 2/3)."""
    w = await _start(tmp_path, fake, monkeypatch, worlds, f"quorum: {quorum}")
    d = await w.deliver(1)
    with fake.cond:  # both queued before the next getUpdates answers
        u1 = fake.tap(ANNA, SUPPORT_CHAT, int(d.approval_message_id), f"ap:{d.id}:1", "Anna")
        u2 = fake.tap(BO, SUPPORT_CHAT, int(d.approval_message_id), f"ap:{d.id}:1", "Bo")
    answers = [(await fake.answered(u, WAIT))["text"] for u in (u1, u2)]
    await w.engine.wait_idle()
    assert len(w.sender.sent) == sends, answers
    assert answers.count("✅ Sent.") == sends
    if quorum == 3:
        await fake.await_for(lambda: "✅ 2/3 · " in w.card(d).text, WAIT)
        assert (await w.draft(d)).status == "awaiting"


# -- per-pipeline operators -------------------------------------------------------------------

async def test_an_operator_not_listed_for_the_pipeline_cannot_decide_and_sees_none_of_it(
        tmp_path, fake, monkeypatch, worlds):
    w = await _start(tmp_path, fake, monkeypatch, worlds, f"operators: [{ANNA}]")
    d = await w.deliver(1)
    before = w.card(d).text
    for action in ("ap", "rj", "ed"):
        answer = await tap(w, d, action, BO, "Bo")
        assert answer.startswith("Not yours to decide"), answer
    answer = await say(w, "Bo's own text.", user=BO, name="Bo",
                       reply_to=int(d.approval_message_id))
    assert answer.startswith("Not yours to decide"), answer
    assert (await w.draft(d)).status == "awaiting" and w.sender.sent == []
    assert w.card(d).text == before and (await w.draft(d)).version == 1
    refused = [(e.actor, e.detail) for e in await w.store.audit_log(d.key)
               if e.action == "refused"]
    assert refused and all(a == f"tg:{BO} (Bo)" for a, _ in refused)
    assert "not in approval.operators of support" in refused[0][1]
    assert await say(w, "/pending", user=BO, name="Bo") == "nothing pending"
    assert f"support #{d.id} v1" in await say(w, "/pending")
    for command in ("/emails support", f"/replay support {d.item_id}",
                    f"/reply support {d.item_id} shorter"):
        assert (await say(w, command, user=BO, name="Bo")).startswith("Not yours to decide")
    assert (await w.draft(d)).version == 1
    assert await tap(w, d, "ap", ANNA, "Anna") == "✅ Sent."


# -- on demand ---------------------------------------------------------------------------------

async def test_reply_drafts_a_skipped_item_with_the_instruction_and_emails_lists_five(
        tmp_path, fake, monkeypatch, worlds):
    w = await _start(tmp_path, fake, monkeypatch, worlds, "quorum: 1",
                     extra='filters: {skip_subjects: ["^Order 3$"]}\n')
    for n in range(1, 7):
        await w.deliver(n)
    listing = await say(w, "/emails support 5")
    lines = [ln for ln in listing.splitlines() if ln.startswith("#")]
    assert len(lines) == 5
    ids = re.findall(r"<order-(\d)@customer\.example>", listing)
    assert ids == ["6", "5", "4", "3", "2"]
    [skipped] = [ln for ln in lines if "skipped" in ln]
    assert "· Order 3" in skipped
    item = "<order-3@customer.example>"
    [d] = await w.store.item_drafts("support", item)
    assert d.status == "skipped" and d.approval_message_id is None
    cards_before = len([m for m in fake.chat_messages(SUPPORT_CHAT) if m.text.startswith("📨")])
    answer = await say(w, f"/reply support {item} shorter please")
    assert answer == f"✍️ support #{d.id}: drafting v2; its card follows."
    card = await fake.await_for(lambda: [
        m for m in fake.chat_messages(SUPPORT_CHAT) if m.text.startswith(f"📨 support · #{d.id} v2")],
        WAIT)
    assert len([m for m in fake.chat_messages(SUPPORT_CHAT)
                if m.text.startswith("📨")]) == cards_before + 1
    assert [r.instruction for r in w.drafter.requests if r.draft_key == d.key] == [
        "shorter please"]
    assert "[shorter please]" in card[0].text
    await w.engine.wait_idle()  # the redraft task records the card it posted
    d2 = await w.draft(d)
    assert (d2.status, d2.version) == ("awaiting", 2)
    audit = {(e.action, e.actor) for e in await w.store.audit_log()}
    assert ("emails", f"tg:{ANNA} (Anna)") in audit and ("reply", f"tg:{ANNA} (Anna)") in audit
    # Drafts again an item whose card waits (on that same card); a sent one never.
    [first] = await w.store.item_drafts("support", "<order-1@customer.example>")
    assert (await say(w, f"/reply support {first.item_id} friendlier")).endswith(
        "drafting v2; its card follows.")
    await fake.await_for(lambda: w.card(first).text.startswith(f"📨 support · #{first.id} v2"),
                         WAIT)
    assert "[friendlier]" in w.card(first).text
    [second] = await w.store.item_drafts("support", "<order-2@customer.example>")
    assert await tap(w, second, "ap", ANNA, "Anna") == "✅ Sent."
    assert await say(w, f"/reply support {second.item_id}") == (
        f"support {second.item_id}: not drafted: it was sent already; a sent item is never "
        "drafted again.")
    assert (await say(w, "/reply support <nope@x>")).startswith("support <nope@x>: no such")
    assert (await say(w, "/emails support 0")).startswith("Usage: /emails")


# -- reminders ----------------------------------------------------------------------------------

def _reminders(fake: FakeTelegram, d) -> list:
    return [m for m in fake.chat_messages(SUPPORT_CHAT) if m.text.startswith("⏰")
            and m.reply_to == int(d.approval_message_id)]


async def test_reminders_one_per_interval_at_most_three_none_doubled_after_a_restart(
        tmp_path, fake, monkeypatch, worlds):
    w = await _start(tmp_path, fake, monkeypatch, worlds, "remind_after: 2s")
    clock = Clock(time.time())
    w.now = clock
    d, decided = await w.deliver(1), await w.deliver(2)
    assert await w.engine.reminders.remind() == 0  # not old enough
    clock.t += 2.1
    assert await w.engine.reminders.remind() == 2
    assert await w.engine.reminders.remind() == 0  # the same interval: once
    assert [m.text for m in _reminders(fake, d)] == [
        f"⏰ #{d.id} v1 has waited 2s for a decision: reminder 1 of 3."]
    assert await tap(w, decided, "ap", ANNA, "Anna") == "✅ Sent."
    clock.t += 2
    assert await w.engine.reminders.remind() == 1  # not the approved one
    await w.restart()
    w.now = clock
    assert await w.engine.reminders.remind() == 0  # claimed before the restart
    for _ in range(3):
        clock.t += 2
        await w.engine.reminders.remind()
    assert [re.search(r"reminder (\d) of 3", m.text)[1] for m in _reminders(fake, d)] == [
        "1", "2", "3"]
    assert _reminders(fake, d)[-1].text.endswith("reminder 3 of 3 (last reminder).")
    assert len(_reminders(fake, decided)) == 1  # the one before its approval


async def test_after_downtime_a_card_gets_only_its_newest_due_reminder_once(
        tmp_path, fake, monkeypatch, worlds):
    """draftgate was down for three and a half intervals: the card gets reminder 3 of
    3, not 1, 2 and 3 in a burst, and the next pass sends nothing."""
    w = await _start(tmp_path, fake, monkeypatch, worlds, "remind_after: 2s")
    clock = Clock(time.time())
    w.now = clock
    d = await w.deliver(1)
    await w.stop()
    clock.t += 7
    await w.start()
    assert await w.engine.reminders.remind() == 1
    assert await w.engine.reminders.remind() == 0
    assert [m.text for m in _reminders(fake, d)] == [
        f"⏰ #{d.id} v1 has waited 7s for a decision: reminder 3 of 3 (last reminder)."]


async def test_a_reminder_telegram_refuses_is_not_repeated_and_the_others_go_out(
        tmp_path, fake, monkeypatch, worlds, caplog):
    """Telegram refuses one card's reminder: the pass goes on to the next card, the
    refusal is logged, and the refused reminder is not sent again (once beats twice);
    the card's next reminder comes at the next interval."""
    w = await _start(tmp_path, fake, monkeypatch, worlds, "remind_after: 2s")
    clock = Clock(time.time())
    w.now = clock
    first, second = await w.deliver(1), await w.deliver(2)
    fake.fail("sendMessage", 400, "Bad Request: message thread not found")
    clock.t += 2.1
    assert await w.engine.reminders.remind() == 2  # both claimed; the first one's send failed
    assert _reminders(fake, first) == []
    assert [m.text for m in _reminders(fake, second)] == [
        f"⏰ #{second.id} v1 has waited 2s for a decision: reminder 1 of 3."]
    assert f"#{first.id}: could not send a reminder" in caplog.text
    assert await w.engine.reminders.remind() == 0
    assert _reminders(fake, first) == []
    clock.t += 2
    assert await w.engine.reminders.remind() == 2
    assert [m.text for m in _reminders(fake, first)] == [
        f"⏰ #{first.id} v1 has waited 4s for a decision: reminder 2 of 3."]


# -- the digest ---------------------------------------------------------------------------------

async def test_the_digest_goes_to_the_ops_chat_once_per_slot(
        tmp_path, fake, monkeypatch, worlds):
    w = await _start(tmp_path, fake, monkeypatch, worlds, "quorum: 1",
                     digest="0 8 * * *")
    eight = (time.time() // 86400) * 86400 + 8 * 3600
    clock = Clock(eight - 3600)
    w.now = clock
    sent, waiting = await w.deliver(1), await w.deliver(2)
    assert await tap(w, sent, "ap", ANNA, "Anna") == "✅ Sent."
    assert not await w.engine.reminders.digest()  # 07:00: the last slot is a day old
    clock.t = eight + 30
    assert await w.engine.reminders.digest()
    assert not await w.engine.reminders.digest()
    await w.restart()
    w.now = clock
    assert not await w.engine.reminders.digest()
    [digest] = [m.text for m in fake.chat_messages(OPS_CHAT) if m.text.startswith("📊")]
    line = next(ln for ln in digest.splitlines() if ln.startswith("support:"))
    assert line == ("support: drafted 2 · sent 1 · rejected 0 · failed 0 · waiting 1 "
                    "(oldest 1h) · tokens 60")
    assert "sales: drafted 0" in digest and waiting.status == "awaiting"
    # The scoreboard's line (issue 25): the 30 days before the slot, every pipeline.
    assert digest.splitlines()[-1].startswith(
        "📈 last 30 days: decided 1 · sent as drafted 100% (1/1) · edited 0 · ")


async def test_the_digest_follows_telegram_timezone_for_its_slot_window_and_header(
        tmp_path, fake, monkeypatch, worlds):
    """telegram.timezone: Asia/Tokyo (UTC+9) and digest "0 8 * * *": the digest goes
    at 08:00 in Tokyo (23:00 UTC), counts what happened since 08:00 Tokyo the day
    before, and its header names Tokyo times and the zone."""
    cfg = team_config(tmp_path, fake, "quorum: 1", digest="0 8 * * *")
    cfg.write_text(cfg.read_text() + "  timezone: Asia/Tokyo\n")
    w = await start_world(tmp_path, fake, monkeypatch, worlds, cfg)
    # 08:00 in Tokyo is 23:00 UTC of the day before.
    eight = (time.time() // 86400) * 86400 - 3600
    clock = Clock(eight - 86400 - 1800)  # 07:30 Tokyo yesterday: before the window
    w.now = clock
    await w.deliver(1)
    clock.t = eight - 1800  # 07:30 Tokyo today: inside it
    await w.deliver(2)
    assert not await w.engine.reminders.digest()  # the 08:00 Tokyo slot is not due yet
    clock.t = eight + 10  # 08:00:10 Tokyo: after the window's end
    await w.deliver(3)
    clock.t = eight + 30
    assert await w.engine.reminders.digest()
    assert not await w.engine.reminders.digest()
    [digest] = [m.text for m in fake.chat_messages(OPS_CHAT) if m.text.startswith("📊")]
    day = time.strftime("%d %b", time.gmtime(eight + 9 * 3600))
    before = time.strftime("%d %b", time.gmtime(eight + 9 * 3600 - 86400))
    assert digest.splitlines()[0] == f"📊 Digest {before} 08:00 – {day} 08:00 Asia/Tokyo"
    line = next(ln for ln in digest.splitlines() if ln.startswith("support:"))
    assert line.startswith("support: drafted 1 · ")


async def test_draftgate_run_sends_reminders_on_its_own(tmp_path, fake, monkeypatch, worlds):
    """The engine's loop (what `draftgate run` drives) looks for due reminders without
    being asked: a card older than remind_after gets its reminder."""
    w = await _start(tmp_path, fake, monkeypatch, worlds, "remind_after: 1m")
    clock = Clock(time.time())
    w.now = clock
    d = await w.deliver(1)
    assert w.engine.reminders.every == 30.0
    clock.t += 61
    stop = asyncio.Event()
    running = asyncio.create_task(w.app.run_forever(stop))
    try:
        [note] = await fake.await_for(lambda: _reminders(fake, d), WAIT)
    finally:
        stop.set()
        await running
    assert note.text.endswith("reminder 1 of 3.")


async def test_the_emails_command_lists_the_newest_items_and_is_audited(
        tmp_path, fake, monkeypatch, worlds, capsys):
    """`draftgate emails support -n 2`: the same listing as /emails, from the terminal."""
    from bot.__main__ import main

    w = await _start(tmp_path, fake, monkeypatch, worlds, "quorum: 1",
                     extra='filters: {skip_subjects: ["^Order 2$"]}\n')
    for n in (1, 2, 3):
        await w.deliver(n)
    code = await asyncio.to_thread(main, ["emails", "-c", str(w.cfg), "support", "-n", "2"])
    out = capsys.readouterr().out
    assert code == 0
    assert re.findall(r"<order-(\d)@customer\.example>", out) == ["3", "2"]
    assert "skipped (subject matches" in out and "· Order 2" in out
    assert any(e.action == "emails" and e.actor == "console"
               for e in await w.store.audit_log())
    assert await asyncio.to_thread(main, ["emails", "-c", str(w.cfg), "support", "-n", "0"]) == 2
    assert "-n: expected a number of items from 1 to 50" in capsys.readouterr().err
