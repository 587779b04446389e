"""The microsoft source and the microsoft_reply / microsoft_draft senders against the
fake Graph and identity platform (tests/fakes/microsoft.py), driven by the real MSAL
and the real Graph client."""

from __future__ import annotations

import email
import email.policy

from bot.mail.reply import reply_message_id
from bot.models import Status
from tests.support.desk import CONSOLE
from tests.support.microsoft_world import MicrosoftWorld, customer_mail


async def world(tmp_path, fake, **kw) -> MicrosoftWorld:
    return await MicrosoftWorld(tmp_path, fake, **kw).open()


def parsed(raw: bytes):
    return email.message_from_bytes(raw, policy=email.policy.default)


async def test_new_mail_is_answered_once_threaded_in_sent_items(tmp_path, fake):
    """Mail in the box before the first run is left alone; a new mail is drafted, approved
    and sent once, threaded, and later ticks (delta lists the sent reply's changes and
    the original again) send nothing more."""
    fake.deliver(customer_mail(1))
    w = await world(tmp_path, fake)
    try:
        assert (await w.tick()).new == 0
        original = fake.deliver(customer_mail(2))
        counts = await w.tick()
        assert (counts.fetched, counts.new, counts.drafted) == (1, 1, 1)
        (d,) = await w.drafts("<order-2@customer.test>")
        assert d.status == Status.SENT
        assert d.sent_id == reply_message_id(d)
        (reply,) = fake.sent
        assert reply.internet_id == reply_message_id(d)
        assert reply.conversation == original.conversation
        assert reply.to == ["alice@customer.test"]
        mime = parsed(reply.mime())
        assert mime["In-Reply-To"] == "<order-2@customer.test>"
        assert "Hi Alice," in reply.body
        assert await w.drafts("<order-1@customer.test>") == []
        fake.touch(original.id)  # read in Outlook: delta lists it again
        for _ in range(2):
            assert (await w.tick()).new == 0
        assert fake.sends == 1 and len(fake.sent) == 1
    finally:
        await w.close()


async def test_an_idle_tick_is_one_delta_call(tmp_path, fake):
    w = await world(tmp_path, fake)
    try:
        await w.tick()
        mark = fake.mark()
        await w.tick()
        assert fake.routes(mark) == ["delta"]
    finally:
        await w.close()


async def test_an_expired_delta_token_resyncs_without_drafting_twice(tmp_path, fake):
    """410 SyncStateNotFound: the window since the last sync is listed again; what was
    drafted is not drafted again, what arrived meanwhile is."""
    w = await world(tmp_path, fake, auto_approve=False)
    try:
        await w.tick()
        fake.deliver(customer_mail(1))
        assert (await w.tick()).new == 1
        fake.deliver(customer_mail(2))
        fake.expire_delta()
        counts = await w.tick()
        assert counts.new == 1
        assert [len(await w.drafts(f"<order-{n}@customer.test>")) for n in (1, 2)] == [1, 1]
        mark = fake.mark()
        assert (await w.tick()).new == 0
        assert fake.routes(mark) == ["delta"]  # the new token works
    finally:
        await w.close()


async def test_fifty_new_mails_are_read_in_batches_and_a_failed_part_goes_again(tmp_path, fake):
    w = await world(tmp_path, fake, auto_approve=False)
    try:
        await w.tick()
        for n in range(50):
            fake.deliver(customer_mail(n))
        fake.fail_parts(2)
        mark = fake.mark()
        counts = await w.tick()
        assert counts.new == 50
        routes = fake.routes(mark)
        assert routes.count("batch") == 3
        # Every part inside a batch is counted as a value call too; two went again alone.
        assert routes.count("value") == 48 + 2
    finally:
        await w.close()


async def test_a_dropped_send_answer_is_found_in_sent_items_and_not_resent(tmp_path, fake):
    w = await world(tmp_path, fake)
    try:
        await w.tick()
        fake.deliver(customer_mail(3))
        fake.drop_send_answer()
        await w.tick()
        (d,) = await w.drafts("<order-3@customer.test>")
        # Unknown at first; the check after it finds the reply in Sent Items.
        if d.status == Status.SEND_UNKNOWN:
            await w.tick()
            (d,) = await w.drafts("<order-3@customer.test>")
        assert d.status == Status.SENT
        assert fake.sends == 1 and len(fake.sent) == 1
    finally:
        await w.close()


async def test_throttling_shows_held_and_recovers(tmp_path, fake):
    """A 429 storm longer than the reads' attempts: the tick fails and status says held
    (until Retry-After); once the storm is over the next tick reads the mail."""
    w = await world(tmp_path, fake, auto_approve=False, account_extra="read_attempts: 2")
    try:
        await w.tick()
        fake.deliver(customer_mail(4))
        fake.throttle(1, route="delta", retry_after=1)  # waited out inside the tick
        assert (await w.tick()).new == 1
        fake.deliver(customer_mail(5))
        fake.throttle(1, route="delta", retry_after=600)  # longer than max_wait: held
        assert (await w.tick()).new == 0
        (st,) = await w.desk.status(CONSOLE)
        assert st.health == "held", st
        assert "throttling" in st.problem and "429" in st.problem
        assert (await w.tick()).new == 1
        assert len(await w.drafts("<order-5@customer.test>")) == 1
    finally:
        await w.close()


async def test_a_429_storm_on_batches_is_waited_out_and_nothing_is_lost(tmp_path, fake):
    w = await world(tmp_path, fake, auto_approve=False, account_extra="read_attempts: 3")
    try:
        await w.tick()
        for n in range(25):
            fake.deliver(customer_mail(n))
        fake.throttle(2, route="batch", retry_after=1)
        assert (await w.tick()).new == 25
    finally:
        await w.close()


async def test_microsoft_draft_saves_the_reply_in_drafts_and_sends_nothing(tmp_path, fake):
    w = await world(tmp_path, fake, sender="{type: microsoft_draft, account: office}")
    try:
        await w.tick()
        original = fake.deliver(customer_mail(6))
        await w.tick()
        (d,) = await w.drafts("<order-6@customer.test>")
        assert d.status == Status.SENT
        (saved,) = fake.in_folder("drafts")
        assert saved.is_draft and saved.internet_id == reply_message_id(d)
        assert saved.conversation == original.conversation and "Hi Alice," in saved.body
        assert fake.sent == [] and fake.sends == 0
    finally:
        await w.close()


async def test_a_send_answered_500_is_checked_not_resent(tmp_path, fake):
    """Graph answers 500 to the send and did not carry it out: the reply is still in
    Drafts, so the check says not sent; nothing is sent again on its own."""
    w = await world(tmp_path, fake)
    try:
        await w.tick()
        fake.deliver(customer_mail(7))
        fake.send_error = 500
        await w.tick()
        await w.tick()
        (d,) = await w.drafts("<order-7@customer.test>")
        assert d.status in (Status.SEND_UNKNOWN, Status.SEND_FAILED), d.status
        assert fake.sends == 0 and fake.sent == []
        assert len(fake.in_folder("drafts")) == 1  # prepared once, kept for Retry
    finally:
        await w.close()


async def test_thread_context_gives_the_conversation_the_sender_took_part_in(tmp_path, fake):
    """The earlier messages of the conversation reach the draft, ours from Sent Items
    too; a stranger's mail that joined the conversation by its References does not."""
    w = await world(tmp_path, fake, auto_approve=False, thread=5)
    try:
        await w.tick()
        fake.deliver(customer_mail(8))
        fake.deliver(b"From: Mallory <mallory@else.test>\r\nTo: support@contoso.test\r\n"
                     b"Subject: mine\r\nMessage-ID: <m@else.test>\r\n"
                     b"References: <order-8@customer.test>\r\n\r\nMallory's secret order.\r\n")
        fake.deliver(customer_mail(9, refs="<order-8@customer.test>"))
        await w.tick()
        (d,) = await w.drafts("<order-9@customer.test>")
        assert "where is my order #8?" in d.body
        assert "Mallory" not in d.body
    finally:
        await w.close()


async def test_a_send_still_in_the_outbox_stays_unknown_until_check_again_finds_it(tmp_path, fake):
    """The answer to the send is lost and Graph has not yet filed the reply: neither
    Sent Items nor Drafts has it, so the card stays unknown (Check again, Mark as sent,
    Send again) and nothing is sent again; Check again after Graph filed it: sent."""
    w = await world(tmp_path, fake)
    try:
        await w.tick()
        fake.deliver(customer_mail(10))
        fake.outbox_next = True
        await w.tick()
        await w.tick()
        (d,) = await w.drafts("<order-10@customer.test>")
        assert d.status == Status.SEND_UNKNOWN
        fake.deliver_outbox()
        checked, _ = await w.desk.check_send(CONSOLE, d.id)
        assert checked is not None and checked.status == Status.SENT
        assert fake.sends == 1 and len(fake.sent) == 1
    finally:
        await w.close()


async def test_backfill_and_a_tick_limit_take_everything_once(tmp_path, fake):
    """backfill: 2 drafts the newest two old mails on the first run; later, with
    max_per_tick: 2, five new mails are taken over three ticks (the cursor waits), each
    once."""
    for n in range(1, 5):
        fake.deliver(customer_mail(n), received=1_000_000 + n)
    w = await world(tmp_path, fake, auto_approve=False, source_extra=", backfill: 2",
                    pipeline_extra="max_per_tick: 2\n")
    try:
        assert (await w.tick()).new == 2
        assert [len(await w.drafts(f"<order-{n}@customer.test>")) for n in range(1, 5)] == \
            [0, 0, 1, 1]
        for n in range(10, 15):
            fake.deliver(customer_mail(n))
        assert [(await w.tick()).new for _ in range(4)] == [2, 2, 1, 0]
        assert [len(await w.drafts(f"<order-{n}@customer.test>")) for n in range(10, 15)] == \
            [1] * 5
    finally:
        await w.close()


async def test_an_access_token_graph_refuses_is_replaced_once(tmp_path, fake):
    """Graph answers 401 to a token the cache still holds as valid (revoked early): a
    new one is fetched with the refresh token and the tick goes on."""
    w = await world(tmp_path, fake, auto_approve=False)
    try:
        await w.tick()
        fake.deliver(customer_mail(11))
        fake.expire_tokens()
        mark = fake.mark()
        assert (await w.tick()).new == 1
        assert [c.path for c in fake.calls[mark:] if c.route == "token"] == ["refresh_token"]
    finally:
        await w.close()


async def test_a_reply_to_mail_moved_to_another_folder_still_threads(tmp_path, fake):
    """A person files the original in Archive before approving (its Graph id changes):
    the reply is created on the message found by its internetMessageId."""
    w = await world(tmp_path, fake, auto_approve=False)
    try:
        await w.tick()
        original = fake.deliver(customer_mail(12))
        await w.tick()
        fake.move(original.id, "archive")
        (d,) = await w.drafts("<order-12@customer.test>")
        await w.desk.approve(CONSOLE, d.id, d.version)
        await w.tick()
        (d,) = await w.drafts("<order-12@customer.test>")
        assert d.status == Status.SENT, d.error
        (reply,) = fake.sent
        assert reply.conversation == original.conversation
        assert reply.in_reply_to == "<order-12@customer.test>"
    finally:
        await w.close()
