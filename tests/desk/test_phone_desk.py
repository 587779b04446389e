"""The phone desk (issue 28): Undo after the deciding approval, through the real
python-telegram-bot against the fake Bot API, the real Engine and a real store.

Time is the engine's clock, moved by the test; the due-time loop of deferred sends is
woken after each move and the test waits for its pass (an event), never for a duration.
"""

from __future__ import annotations

import asyncio

import pytest

from bot.engine.engine import Engine
from tests._pg import drop_schema, new_schema_name, require_pg_dsn, with_schema
from tests.support.clock import Clock
from tests.support.team import team_config
from tests.support.telegram_world import ANNA, BO, TOKEN_ENV, World, start_world

WAIT = 30.0
T0 = 1_796_000_000.0  # a fixed instant: the engine's clock starts here


async def _world(tmp_path, fake, monkeypatch, worlds, approval: str = "undo: 10s",
                 cfg=None) -> tuple[World, Clock]:
    clock = Clock(T0)
    w = await start_world(tmp_path, fake, monkeypatch, worlds,
                          cfg or team_config(tmp_path, fake, approval), now=clock)
    return w, clock


async def tap(w: World, d, action: str, user: int = ANNA, name: str = "Anna") -> str:
    u = w.fake.tap(user, int(d.approval_chat), int(d.approval_message_id),
                   f"{action}:{d.id}:{d.version}", name)
    return (await w.fake.answered(u, WAIT))["text"]


async def due_pass(engine: Engine) -> None:
    """Wake the due-time loop and wait for one whole pass of it after the wake."""
    ticket = engine.sends.wake()
    await _until(lambda: engine.sends.due_served >= ticket, "a pass of the due loop")


async def _until(check, what: str, timeout: float = WAIT) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not check():
        if loop.time() > end:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


def buttons(w: World, d) -> list[str]:
    markup = w.card(d).reply_markup or {}
    return [b["text"] for row in markup.get("inline_keyboard", []) for b in row]


# -- undo -----------------------------------------------------------------------------------

async def test_undo_within_the_window_sends_nothing_and_approving_again_sends_once(
        tmp_path, fake, monkeypatch, worlds):
    w, clock = await _world(tmp_path, fake, monkeypatch, worlds)
    d = await w.deliver(1)
    answer = await tap(w, d, "ap")
    assert answer.startswith("✅ Approved. 📤 Sending in 10 s")
    await fake.await_for(lambda: w.card(d).text.startswith("📤 Sending in 10 s · ↩️ Undo"), WAIT)
    assert buttons(w, d) == ["↩️ Undo"]
    assert (await w.draft(d)).send_after == T0 + 10
    clock.t = T0 + 5
    assert await tap(w, d, "un") == "↩️ Undone: nothing was sent; the card waits for a decision again."
    back = await w.draft(d)
    assert back.status == "awaiting" and back.version == 1 and back.send_after is None
    await fake.await_for(lambda: "✅ Approve & send" in buttons(w, d), WAIT)
    clock.t = T0 + 60  # long after the window: nothing was left to send
    await due_pass(w.engine)
    assert w.sender.sent == []
    assert await tap(w, d, "ap", BO, "Bo") == "✅ Approved. 📤 Sending in 10 s · ↩️ Undo on the card stops it."
    clock.t = T0 + 70
    await due_pass(w.engine)
    await fake.await_for(lambda: w.card(d).text.startswith("✅ Sent by Bo"), WAIT)
    assert [s[:2] for s in w.sender.sent] == [(d.id, 1)]
    actions = [(e.action, e.detail) for e in await w.store.audit_log(d.key)
               if e.action in ("approve", "undo", "sent")]
    assert actions[::-1] == [("approve", "v1"), ("undo", "v1: not sent"), ("approve", "v1"),
                             ("sent", "v1, message id msg-1")]
    assert await tap(w, d, "un") == "Already decided: sent by Bo."


async def test_without_undo_it_is_sent_once_when_the_window_has_passed_not_before(
        tmp_path, fake, monkeypatch, worlds):
    w, clock = await _world(tmp_path, fake, monkeypatch, worlds)
    d = await w.deliver(1)
    await tap(w, d, "ap")
    clock.t = T0 + 9.9
    await due_pass(w.engine)
    await w.engine.tick("support")  # a tick does not send it early either
    assert w.sender.sent == [] and (await w.draft(d)).status == "approved"
    clock.t = T0 + 10
    await due_pass(w.engine)
    await fake.await_for(lambda: w.card(d).text.startswith("✅ Sent by Anna"), WAIT)
    await due_pass(w.engine)
    await w.engine.tick("support")
    assert [s[:2] for s in w.sender.sent] == [(d.id, 1)]
    assert await tap(w, d, "un") == "Already decided: sent by Anna."


async def test_a_restart_inside_the_window_sends_once_when_due(tmp_path, fake, monkeypatch, worlds):
    w, clock = await _world(tmp_path, fake, monkeypatch, worlds)
    d = await w.deliver(1)
    await tap(w, d, "ap")
    await w.restart()
    await due_pass(w.engine)  # the loop's first pass at start: not due yet
    assert w.sender.sent == [] and (await w.draft(d)).status == "approved"
    clock.t = T0 + 11
    await w.restart()  # at start, the approved row is picked up as it is due
    await fake.await_for(lambda: w.card(d).text.startswith("✅ Sent by Anna"), WAIT)
    await due_pass(w.engine)
    assert [s[:2] for s in w.sender.sent] == [(d.id, 1)]


async def test_undo_off_sends_at_once_as_before(tmp_path, fake, monkeypatch, worlds):
    w, _ = await _world(tmp_path, fake, monkeypatch, worlds, approval="quorum: 1")
    d = await w.deliver(1)
    assert await tap(w, d, "ap") == "✅ Sent."
    assert (await w.draft(d)).send_after is None


async def test_two_hosts_on_postgresql_send_a_due_reply_once(tmp_path, fake, monkeypatch, worlds):
    dsn = await require_pg_dsn()
    schema = new_schema_name("undo")
    cfg = team_config(tmp_path, fake, "undo: 10s")
    cfg.write_text(cfg.read_text().replace("store: sqlite:///state.db",
                                           f"store: {with_schema(dsn, schema)}"))
    try:
        w, clock = await _world(tmp_path, fake, monkeypatch, worlds, cfg=cfg)
        d = await w.deliver(1)
        await tap(w, d, "ap")
        # A second host: its own engine and store connection on the same schema.
        from bot.store import create_store

        other_store = create_store(w.settings.store)
        await other_store.open()
        other = Engine(w.settings, other_store, {}, clock=clock, host="other-host",
                       senders={"support": w.sender}, drafters={"support": w.drafter})
        try:
            clock.t = T0 + 10
            sent = await asyncio.gather(w.engine.sends.send_due(), other.sends.send_due())
            assert sorted(sent) == [0, 1]
            assert [s[:2] for s in w.sender.sent] == [(d.id, 1)]
            assert (await w.draft(d)).status == "sent"
        finally:
            await other.stop()
            await other_store.close()
    finally:
        for x in worlds:
            await x.stop()
        worlds.clear()
        await drop_schema(dsn, schema)


# -- send later and sending hours: the times, by table ------------------------------------------

FRI_1500 = 1796396400.0  # Fri 2026-12-04 15:00 UTC


def _utc(t: float) -> str:
    from datetime import datetime, timezone
    return datetime.fromtimestamp(t, timezone.utc).strftime("%a %Y-%m-%d %H:%M")


@pytest.mark.parametrize("choice, tz, expected", [
    ("hour", "UTC", "Fri 2026-12-04 16:00"),
    ("tomorrow", "UTC", "Sat 2026-12-05 09:00"),
    ("monday", "UTC", "Mon 2026-12-07 09:00"),
    ("tomorrow", "Europe/Berlin", "Sat 2026-12-05 08:00"),  # 09:00 CET
])
def test_later_choices_are_told_by_the_pipelines_clock(choice, tz, expected):
    from bot import scheduler
    assert _utc(scheduler.later(choice, FRI_1500, tz)) == expected


@pytest.mark.parametrize("approved, tz, expected", [
    # a weekday evening waits for the next morning; inside the hours: at once
    (1796773200.0, "UTC", "Wed 2026-12-09 08:00"),  # Tue 23:40
    (1796396400.0, "UTC", "Fri 2026-12-04 15:00"),  # Fri 15:00: open
    # Friday 23:40 CEST waits over the weekend and the autumn change: Mon 08:00 CET
    (1792791600.0, "Europe/Berlin", "Mon 2026-10-26 07:00"),
    # Friday 17:59:xx plus nothing: open; spring change: Mon 08:00 CEST is 06:00 UTC
    (1774630740.0 + 3600, "Europe/Berlin", "Mon 2026-03-30 06:00"),
])
def test_send_hours_hold_an_approval_until_the_next_opening(approved, tz, expected):
    from bot import scheduler
    hours = scheduler.parse_send_hours("Mon-Fri 08:00-18:00")
    assert _utc(scheduler.within_hours(hours, approved, tz)) == expected


@pytest.mark.parametrize("text, problem", [
    ("Mon-Fry 08:00-18:00", "'Fry' is not a day"),
    ("Mon-Fri 8-18", "expected days and hours like"),
    ("Mon-Fri 18:00-08:00", "the end after the start"),
    ("Mon-Fri 08:00-18:75", "expected days and hours like"),
])
def test_a_bad_send_hours_is_refused_at_load_saying_what_is_wrong(tmp_path, fake, text, problem):
    from bot.config.load import load_settings
    from bot.errors import ConfigError
    cfg = team_config(tmp_path, fake, f'send_hours: "{text}"')
    with pytest.raises(ConfigError) as err:
        load_settings(cfg)
    assert "approval.send_hours" in str(err.value) and problem in str(err.value)


def test_send_hours_parse_once_into_days_and_minutes():
    from bot import scheduler
    h = scheduler.parse_send_hours("Sat-Mon 09:30-24:00")
    assert h.days == frozenset({5, 6, 0}) and (h.start, h.end) == (570, 1440)
    assert str(h) == "Mon,Sat,Sun 09:30-24:00"


# -- send later, through Telegram -----------------------------------------------------------

async def test_later_sends_at_the_chosen_time_survives_a_restart_and_lists_in_pending(
        tmp_path, fake, monkeypatch, worlds, capsys):
    w, clock = await _world(tmp_path, fake, monkeypatch, worlds, approval="quorum: 1")
    clock.t = FRI_1500
    d = await w.deliver(1)
    assert "🕘 Later" in buttons(w, d)
    assert await tap(w, d, "lt") == "🕘 When should it be sent?"
    await fake.await_for(lambda: buttons(w, d) == ["In 1 hour", "Tomorrow 09:00",
                                                   "Monday 09:00", "⬅️ Back"], WAIT)
    assert await tap(w, d, "lb") == "Back to the card."
    await fake.await_for(lambda: "✅ Approve & send" in buttons(w, d), WAIT)
    await tap(w, d, "lt")
    assert await tap(w, d, "lw") == "✅ Approved. 🕘 Sends Mon 09:00 · ↩️ Cancel on the card stops it."
    await fake.await_for(lambda: w.card(d).text.startswith("🕘 Sends Mon 09:00 · ↩️ Cancel"), WAIT)
    assert buttons(w, d) == ["↩️ Cancel"]
    assert "🕘 sends Mon 09:00" in await w.say("/pending")
    from bot.cli.main import main
    capsys.readouterr()
    assert await asyncio.to_thread(main, ["pending", "-c", str(w.cfg)]) == 0
    assert f"support #{d.id} v1 · 🕘 sends Mon 09:00" in capsys.readouterr().out

    await w.restart()
    clock.t = 1796634000.0 - 1  # Mon 08:59:59
    await due_pass(w.engine)
    await w.engine.tick("support")
    assert w.sender.sent == []
    clock.t = 1796634000.0  # Mon 09:00
    await due_pass(w.engine)
    await fake.await_for(lambda: w.card(d).text.startswith("✅ Sent by Anna"), WAIT)
    assert [s[:2] for s in w.sender.sent] == [(d.id, 1)]
    assert await tap(w, d, "un") == "Already decided: sent by Anna."


async def test_cancel_a_later_send_before_it_goes(tmp_path, fake, monkeypatch, worlds):
    w, clock = await _world(tmp_path, fake, monkeypatch, worlds, approval="quorum: 1")
    clock.t = FRI_1500
    d = await w.deliver(1)
    await tap(w, d, "lt")
    assert (await tap(w, d, "lm")).startswith("✅ Approved. 🕘 Sends Sat 09:00")
    clock.t = FRI_1500 + 3600
    assert await tap(w, d, "un") == "↩️ Cancelled: nothing was sent; the card waits for a decision again."
    await fake.await_for(lambda: "🕘 Later" in buttons(w, d), WAIT)
    clock.t = FRI_1500 + 86400
    await due_pass(w.engine)
    assert w.sender.sent == [] and (await w.draft(d)).status == "awaiting"
    assert [e.action for e in await w.store.audit_log(d.key)][:2] == ["undo", "approve"]


async def test_send_hours_hold_an_approval_at_23_40_until_08_00_across_a_dst_change(
        tmp_path, fake, monkeypatch, worlds):
    cfg = team_config(tmp_path, fake, 'send_hours: "Mon-Fri 08:00-18:00"',
                      extra="timezone: Europe/Berlin\n")
    w, clock = await _world(tmp_path, fake, monkeypatch, worlds, cfg=cfg)
    clock.t = 1792791600.0  # Fri 2026-10-23 23:40 CEST; clocks go back on Sunday
    d = await w.deliver(1)
    assert (await tap(w, d, "ap")).startswith("✅ Approved. 🕘 Sends Mon 08:00")
    opens = 1792998000.0  # Mon 2026-10-26 08:00 CET
    assert (await w.draft(d)).send_after == opens
    await fake.await_for(lambda: w.card(d).text.startswith("🕘 Sends Mon 08:00 · ↩️ Cancel"), WAIT)
    clock.t = opens - 1
    await due_pass(w.engine)
    assert w.sender.sent == []
    clock.t = opens
    await due_pass(w.engine)
    await fake.await_for(lambda: w.card(d).text.startswith("✅ Sent by Anna"), WAIT)
    assert len(w.sender.sent) == 1


# -- follow-ups -------------------------------------------------------------------------------

WED_1500 = FRI_1500 + 5 * 86400  # 3 working days after Fri 15:00 (a plain 3d is Mon)
FOLLOWUP = "followup: {after: 3d, working_days: true, max: 2}\n"


async def _followups(w: World) -> list:
    return [d for d in await w.store.item_drafts("support", "<order-1@customer.example>")
            if d.scope == "followup"]


async def _sent_reply(tmp_path, fake, monkeypatch, worlds) -> tuple[World, Clock, object]:
    cfg = team_config(tmp_path, fake, "quorum: 1", extra=FOLLOWUP)
    w, clock = await _world(tmp_path, fake, monkeypatch, worlds, cfg=cfg)
    clock.t = FRI_1500
    d = await w.deliver(1)
    assert await tap(w, d, "ap") == "✅ Sent."
    return w, clock, d


async def test_no_answer_one_follow_up_per_after_in_working_days_none_past_max(
        tmp_path, fake, monkeypatch, worlds):
    w, clock, d = await _sent_reply(tmp_path, fake, monkeypatch, worlds)
    clock.t = WED_1500 - 60  # a plain 3 days passed on Monday; 3 working days have not
    await w.engine.tick("support")
    assert await _followups(w) == []
    clock.t = WED_1500
    await w.engine.tick("support")
    [f1] = await _followups(w)
    assert (f1.key, f1.status) == ("support|followup|<order-1@customer.example>|1", "awaiting")
    card = w.card(f1)
    assert card.text.split("\n")[1] == "↪️ Follow-up 1 of 2 to Alice Buyer · no answer since Fri"
    assert "follow-up 1 of 2" in w.drafter.requests[-1].instruction
    assert "Hi Alice Buyer, re:" in w.drafter.requests[-1].instruction  # our reply, as context
    # A second tick, a restart, a second host: never a second follow-up 1.
    await w.engine.tick("support")
    await w.restart()
    await w.engine.tick("support")
    other = Engine(w.settings, w.store, {}, clock=clock, host="other-host")
    assert await other.followups.check(w.settings.pipeline("support")) == 0
    assert len(await _followups(w)) == 1
    # Sent on Wednesday: the second is due 3 working days later, on Monday.
    assert await tap(w, f1, "ap") == "✅ Sent."
    clock.t = WED_1500 + 5 * 86400 - 60
    await w.engine.tick("support")
    assert len(await _followups(w)) == 1
    clock.t = WED_1500 + 5 * 86400
    await w.engine.tick("support")
    f2 = (await _followups(w))[-1]
    assert "↪️ Follow-up 2 of 2 to Alice Buyer · no answer since Wed" in w.card(f2).text
    assert await tap(w, f2, "ap") == "✅ Sent."
    clock.t += 30 * 86400  # max 2: none after the second
    await w.engine.tick("support")
    assert len(await _followups(w)) == 2 and len(w.sender.sent) == 3


async def test_an_answer_from_the_recipient_cancels_the_pending_follow_up(
        tmp_path, fake, monkeypatch, worlds):
    w, clock, d = await _sent_reply(tmp_path, fake, monkeypatch, worlds)
    clock.t = WED_1500
    await w.engine.tick("support")
    [f1] = await _followups(w)
    clock.t = WED_1500 + 3600  # Alice answers in the thread before anyone decided
    (tmp_path / "mail-support" / "answer.eml").write_bytes(
        b'From: "Alice Buyer" <alice1@customer.example>\r\nTo: support@acme.example\r\n'
        b"Subject: Re: Order 1\r\nMessage-ID: <answer-1@customer.example>\r\n"
        b"In-Reply-To: <order-1@customer.example>\r\nReferences: <order-1@customer.example>\r\n"
        b"Date: Wed, 09 Dec 2026 16:00:00 +0000\r\n\r\nGot it, thanks!\r\n")
    await w.engine.tick("support")
    f1 = await w.draft(f1)
    assert f1.status == "cancelled"
    assert f1.error.startswith("Alice Buyer answered (Wed 16:00): no follow-up needed")
    await fake.await_for(lambda: w.card(f1).text.startswith("🚫 Cancelled"), WAIT)
    assert "cancelled <order-1@customer.example>  Alice Buyer answered" in await w.say("/status support")
    clock.t += 30 * 86400
    await w.engine.tick("support")
    assert [f.status for f in await _followups(w)] == ["cancelled"]
    assert len(w.sender.sent) == 1


# -- attachments ----------------------------------------------------------------------------

def _with_files(n: int, files: list[tuple[str, str, bytes]]) -> bytes:
    from email.message import EmailMessage
    m = EmailMessage()
    m["From"], m["To"] = '"Alice Buyer" <alice1@customer.example>', "support@acme.example"
    m["Subject"], m["Message-ID"] = "Order 1", f"<order-{n}@customer.example>"
    m["Date"] = "Sun, 29 Nov 2026 10:02:00 +0000"
    m.set_content("Here is the invoice and a photo of the damage.\n")
    for name, ctype, data in files:
        main, sub = ctype.split("/")
        m.add_attachment(data, maintype=main, subtype=sub, filename=name)
    return m.as_bytes()


async def test_the_card_lists_attachments_and_files_sends_them_naming_an_oversized_one(
        tmp_path, fake, monkeypatch, worlds):
    w, clock = await _world(tmp_path, fake, monkeypatch, worlds, approval="quorum: 1")
    invoice, photo = b"%PDF-1.4 " + bytes(119_991), b"\xff\xd8" + bytes(2_099_998)
    (tmp_path / "mail-support" / "1.eml").write_bytes(_with_files(1, [
        ("invoice.pdf", "application/pdf", invoice), ("photo.jpg", "image/jpeg", photo)]))
    await w.engine.tick("support")
    [d] = await w.store.item_drafts("support", "<order-1@customer.example>")
    assert "📎 invoice.pdf 120 kB · photo.jpg 2.1 MB" in w.card(d).text
    assert "📎 Files" in buttons(w, d)
    monkeypatch.setattr("bot.approvals.telegram.taps.TELEGRAM_MAX", 1_000_000)
    answer = await tap(w, d, "fl")
    assert answer == "📎 1 file sent. Over Telegram's 50 MB, not sent: photo.jpg 2.1 MB"
    docs = [m for m in fake.chat_messages(int(d.approval_chat)) if m.kind == "document"]
    assert [(m.filename, m.document) for m in docs] == [("invoice.pdf", invoice)]
    assert docs[0].reply_to == int(d.approval_message_id)
    [audit] = [e for e in await w.store.audit_log(d.key) if e.action == "files"]
    assert audit.detail == "invoice.pdf 120000 bytes, photo.jpg 2100000 bytes"
    assert await tap(w, d, "fl", user=666, name="Eve") == "Not allowed."  # not an operator
    assert len([m for m in fake.chat_messages(int(d.approval_chat)) if m.kind == "document"]) == 1


async def test_attach_pages_the_folder_makes_a_new_version_and_its_sent_mime_carries_the_file(
        tmp_path, fake, monkeypatch, worlds):
    import email
    import email.policy

    from bot.engine.build import build_sender
    cfg = team_config(tmp_path, fake, "quorum: 1")
    pipeline = tmp_path / "pipelines" / "support.yaml"
    pipeline.write_text(pipeline.read_text().replace(
        'from: "Acme <support@acme.example>"}',
        'from: "Acme <support@acme.example>", attachments: attachments/}'))
    (tmp_path / "attachments").mkdir()
    for i in range(8):
        (tmp_path / "attachments" / f"terms-{i}.pdf").write_bytes(b"%PDF terms " + bytes([i]) * 10)
    monkeypatch.setenv(TOKEN_ENV, fake.token)
    w = World(tmp_path, fake, cfg)
    w.sender = build_sender(w.settings.pipeline("support"), w.settings)  # the real outbox
    clock = Clock(T0)
    w.now = clock
    await w.start()
    worlds.append(w)
    d = await w.deliver(1)
    assert "📎 Attach" in buttons(w, d)
    assert await tap(w, d, "at") == "📎 Which file goes with the reply?"
    await fake.await_for(lambda: buttons(w, d)[:1] == ["📎 terms-0.pdf"], WAIT)
    assert buttons(w, d)[-2:] == ["▶ More", "⬅️ Back"] and len(buttons(w, d)) == 8
    await tap(w, d, "fn")
    await fake.await_for(lambda: buttons(w, d) == ["📎 terms-6.pdf", "📎 terms-7.pdf", "⬅️ Back"], WAIT)
    assert await tap(w, d, "qb") == "📎 terms-7.pdf attached: v2 needs its own approval."
    d2 = await w.draft(d)
    assert d2.version == 2 and d2.status == "awaiting"
    await fake.await_for(lambda: f"#{d.id} v2" in w.card(d2).text, WAIT)
    assert "Attached to the reply: 📎 terms-7.pdf" in w.card(d2).text
    assert await tap(w, d, "ap") == "Old version (v1); the card now shows v2."  # v1's tap
    assert (await w.draft(d)).status == "awaiting"
    assert await tap(w, d2, "ap") == "✅ Sent."
    [out] = list((tmp_path / "outbox").glob("*.eml"))
    sent = email.message_from_bytes(out.read_bytes(), policy=email.policy.default)
    [part] = list(sent.iter_attachments())
    assert part.get_filename() == "terms-7.pdf"
    assert part.get_content() == b"%PDF terms " + bytes([7]) * 10
    assert [e.detail for e in await w.store.audit_log(d.key) if e.action == "attach"] == [
        "v1 -> v2: terms-7.pdf"]
