"""The IMAP source and the smtp_reply / imap_draft senders against a real Dovecot, with
an SMTP server that delivers over LMTP and fails at exact points (tests/_dovecot.py)."""

from __future__ import annotations

import email
import email.policy

import pytest

from bot.mail.reply import reply_message_id
from bot.models import Status
from tests._dovecot import PASSWORD, USERS, Dovecot, SmtpRelay
from tests._imap_world import ImapWorld, order_mail
from tests.support.desk import CONSOLE

ALICE = USERS[1]


@pytest.fixture
def dovecot():
    d = Dovecot().start()
    yield d
    d.stop()


@pytest.fixture
async def relay(dovecot):
    r = SmtpRelay(dovecot).start()
    yield r
    r.stop()


def parsed(raw: bytes):
    return email.message_from_bytes(raw, policy=email.policy.default)


async def world(tmp_path, dovecot, relay=None, **kw) -> ImapWorld:
    return await ImapWorld(tmp_path, dovecot, relay, **kw).open()


async def test_new_mail_is_drafted_once_and_stays_unread(tmp_path, dovecot, relay):
    """A mail arriving after the first run is drafted once, sent once as a threaded
    reply that lands in the customer's mailbox and in our Sent folder, and the
    original keeps its unread state (BODY.PEEK)."""
    dovecot.deliver(order_mail(1))  # in the box before the first run: not drafted
    w = await world(tmp_path, dovecot, relay)
    try:
        first = await w.tick()
        assert first.new == 0
        dovecot.deliver(order_mail(2))
        counts = await w.tick()
        assert (counts.fetched, counts.new, counts.drafted) == (1, 1, 1)
        (d,) = await w.drafts("<order-2@customer.test>")
        assert d.status == Status.SENT
        assert await w.drafts("<order-1@customer.test>") == []
        (reply,) = [parsed(m) for m in dovecot.messages(ALICE)]
        assert reply["In-Reply-To"] == "<order-2@customer.test>"
        assert reply["Subject"] == "Re: Where is my order #2?"
        assert reply["Message-ID"] == reply_message_id(d)
        assert "Hi Alice," in reply.get_content()
        (filed,) = [parsed(m) for m in dovecot.messages(USERS[0], "Sent")]
        assert filed["Message-ID"] == reply["Message-ID"]
        for _ in range(2):
            assert (await w.tick()).fetched == 0
        assert len(relay.delivered) == 1
        c = dovecot.imap()
        c.select("INBOX", readonly=True)
        assert c.uid("SEARCH", None, "UNSEEN")[1][0].split() == [b"1", b"2"]
        c.logout()
    finally:
        await w.close()


async def test_backfill_drafts_the_newest_old_mails(tmp_path, dovecot):
    for n in range(1, 5):
        dovecot.deliver(order_mail(n))
    w = await world(tmp_path, dovecot, auto_approve=False, source_extra=", backfill: 2",
                    sender="{type: imap_draft, account: shop}")
    try:
        counts = await w.tick()
        assert counts.new == 2
        assert [len(await w.drafts(f"<order-{n}@customer.test>")) for n in range(1, 5)] == \
            [0, 0, 1, 1]
    finally:
        await w.close()


async def test_uidvalidity_change_drafts_nothing_twice_and_loses_nothing(tmp_path, dovecot):
    """The folder is rebuilt (new UIDVALIDITY, every UID new) with the old mail and one
    that arrived meanwhile: only that one is drafted."""
    folder = "Support"
    dovecot.append(order_mail(1), folder, ago=3600)  # in the box before draftgate came
    w = await world(tmp_path, dovecot, auto_approve=False, folder=folder,
                    sender="{type: imap_draft, account: shop}")
    try:
        await w.tick()
        dovecot.append(order_mail(2), folder)
        dovecot.append(order_mail(3, message_id=""), folder)  # no Message-ID: a digest
        assert (await w.tick()).new == 2
        before = dovecot.uidvalidity(folder)
        dovecot.append(order_mail(4), folder)
        dovecot.recreate(folder)
        assert dovecot.uidvalidity(folder) != before
        counts = await w.tick()
        assert counts.new == 1
        assert len(await w.drafts("<order-4@customer.test>")) == 1
        assert len(await w.drafts("<order-2@customer.test>")) == 1
        assert await w.drafts("<order-1@customer.test>") == []
        dovecot.append(order_mail(5), folder)
        assert (await w.tick()).new == 1  # the new cursor goes on from the rebuilt folder
    finally:
        await w.close()


@pytest.mark.parametrize("saves_sent", [False, True])
async def test_connection_dropped_after_accept_delivers_once_and_says_so(
        tmp_path, dovecot, relay, saves_sent):
    """The server takes the reply, then the connection drops before its 250: one
    message reaches the customer. Where the provider files SMTP mail in Sent the check
    finds it (sent); where it does not, the outcome is honestly unknown and nothing is
    resent."""
    relay.fail = "drop"
    relay.files_sent = saves_sent
    w = await world(tmp_path, dovecot, relay,
                    account_extra="saves_sent: true" if saves_sent else "")
    try:
        await w.tick()
        dovecot.deliver(order_mail(7))
        await w.tick()
        await w.engine.wait_idle()
        for _ in range(2):
            await w.tick()
        (d,) = await w.drafts("<order-7@customer.test>")
        assert len(dovecot.messages(ALICE)) == 1
        assert len(relay.accepted) == 1  # never handed over a second time
        if saves_sent:
            assert d.status == Status.SENT
        else:
            assert d.status == Status.SEND_UNKNOWN
            assert "connection lost" in (d.error or "")
            assert "cannot tell whether the reply was sent" in w.out.getvalue()
            assert dovecot.messages(USERS[0], "Sent") == []
            # The operator's Check again asks the mailbox and says it cannot tell.
            after, note = await w.desk.check_send(CONSOLE, d.id)
            assert note.startswith("❓ Still unknown") and after.status == Status.SEND_UNKNOWN
            assert len(relay.accepted) == 1
    finally:
        await w.close()


@pytest.mark.parametrize("code", ["451", "550"])
async def test_smtp_refusal_is_send_failed_with_the_servers_words(tmp_path, dovecot, relay,
                                                                  code):
    relay.fail = code
    w = await world(tmp_path, dovecot, relay)
    try:
        await w.tick()
        dovecot.deliver(order_mail(8))
        await w.tick()
        (d,) = await w.drafts("<order-8@customer.test>")
        assert d.status == Status.SEND_FAILED
        assert code in d.error and "test fault" in d.error
        assert dovecot.messages(ALICE) == [] and dovecot.messages(USERS[0], "Sent") == []
    finally:
        await w.close()


async def test_imap_draft_saves_the_reply_in_drafts_once(tmp_path, dovecot):
    w = await world(tmp_path, dovecot, sender="{type: imap_draft, account: shop}")
    try:
        await w.tick()
        dovecot.deliver(order_mail(9))
        await w.tick()
        (d,) = await w.drafts("<order-9@customer.test>")
        assert d.status == Status.SENT and d.sent_id == reply_message_id(d)
        (saved,) = [parsed(m) for m in dovecot.messages(USERS[0], "Drafts")]
        assert saved["To"] == "Alice Buyer <alice@customer.test>"
        assert saved["In-Reply-To"] == "<order-9@customer.test>"
        c = dovecot.imap()
        c.select("Drafts", readonly=True)
        assert c.uid("SEARCH", None, "DRAFT")[1][0].split() == [b"1"]
        c.logout()
        assert await w.engine.sender(w.settings.pipeline("shop")).check(d) == d.sent_id
    finally:
        await w.close()


async def test_thread_context_holds_only_messages_the_sender_took_part_in(tmp_path, dovecot):
    """Mallory names Victoria's message and Alice's in References: only Alice's reaches
    Alice's draft, and none of them Mallory's."""
    victoria = order_mail(20, sender="Victoria <victoria@customer.test>").replace(
        b"It was due Friday.", b"My card is 4111 1111 1111 1111.")
    dovecot.deliver(victoria)
    dovecot.deliver(order_mail(21).replace(b"It was due Friday.", b"ALICE-EARLIER"))
    w = await world(tmp_path, dovecot, auto_approve=False, thread=5,
                    sender="{type: imap_draft, account: shop}")
    try:
        await w.tick()
        refs = "<order-20@customer.test> <order-21@customer.test>"
        dovecot.deliver(order_mail(22, refs=refs))
        dovecot.deliver(order_mail(23, sender="Mallory <mallory@evil.test>", refs=refs))
        await w.tick()
        (alice,) = await w.drafts("<order-22@customer.test>")
        (mallory,) = await w.drafts("<order-23@customer.test>")
        assert "ALICE-EARLIER" in alice.body and "4111" not in alice.body
        assert "4111" not in mallory.body and "ALICE-EARLIER" not in mallory.body
    finally:
        await w.close()


async def _until(predicate, timeout: float = 30.0):
    """Wait for ``predicate()`` (a coroutine function) to be truthy; its value."""
    import asyncio

    deadline = asyncio.get_running_loop().time() + timeout
    while not (value := await predicate()):
        assert asyncio.get_running_loop().time() < deadline, "timed out waiting"
        await asyncio.sleep(0.05)
    return value


async def test_idle_gives_new_mail_a_card_between_slots_and_survives_a_kick(tmp_path, dovecot,
                                                                           caplog):
    """A schedule of 5 minutes, and mail still gets its card at once: IDLE starts the
    tick. The server kills the IDLE connection; the watcher reconnects and the next
    mail gets its card too."""
    import asyncio

    from tests._dovecot import kick

    w = await world(tmp_path, dovecot, auto_approve=False,
                    sender="{type: imap_draft, account: shop}")
    stop = asyncio.Event()
    try:
        await w.tick()  # the first run's cursor
        loop = asyncio.create_task(w.app.run_forever(stop))
        assert len(await _until(_idle_tasks)) == 1  # one IDLE for the account's folder
        dovecot.deliver(order_mail(30))
        (d,) = await _until(lambda: w.drafts("<order-30@customer.test>"))
        await _until(lambda: _awaiting(w, "<order-30@customer.test>"))
        kick(dovecot)
        await _until(lambda: _logged(caplog, "IDLE on INBOX broke"))
        dovecot.deliver(order_mail(31))
        await _until(lambda: _awaiting(w, "<order-31@customer.test>"))
        assert "Where is my order #31?" in w.out.getvalue()
    finally:
        stop.set()
        await asyncio.wait_for(loop, 20)
        await w.close()


async def _idle_tasks():
    import asyncio

    return [t for t in asyncio.all_tasks() if t.get_name().startswith("idle:")]


async def _logged(caplog, text: str) -> bool:
    return any(text in r.getMessage() for r in caplog.records)


async def _awaiting(w, item_id: str) -> bool:
    return any(d.status == Status.AWAITING for d in await w.drafts(item_id))


@pytest.mark.parametrize("security", ["tls", "starttls"])
async def test_tls_is_verified_and_a_private_ca_can_be_named(tmp_path, security):
    """TLS on 993 or STARTTLS on 143 against Dovecot with a certificate of a private
    CA: refused without ca_file (verification is on), read with it."""
    import os

    from bot.config.imap import ImapAccount
    from bot.errors import SourceError
    from bot.imap.client import ImapClient
    from tests._imap_world import PASSWORD_ENV

    d = Dovecot(tls=True).start()
    os.environ[PASSWORD_ENV] = PASSWORD
    try:
        d.deliver(order_mail(40))
        port = d.imaps_port if security == "tls" else d.imap_port
        base = dict(name="shop", host="127.0.0.1", port=port, username=USERS[0],
                    security=security, password_env=PASSWORD_ENV)
        client = ImapClient(ImapAccount(**base))
        with pytest.raises(SourceError, match="CERTIFICATE_VERIFY_FAILED|certificate verify"):
            await client.select("INBOX")
        await client.close()
        client = ImapClient(ImapAccount(**base, ca_file=str(d.ca_file)))
        try:
            assert (await client.select("INBOX")).exists == 1
            assert len(await client.fetch("INBOX", await client.search("INBOX", "ALL"))) == 1
        finally:
            await client.close()
    finally:
        os.environ.pop(PASSWORD_ENV, None)
        d.stop()
