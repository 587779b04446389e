"""gmail_reply / gmail_draft: the threaded reply goes out exactly once, through the real
googleapiclient against the fake Gmail API, driven by the real Engine."""

from __future__ import annotations

import asyncio
import base64
import email
import email.policy

import google_auth_httplib2
import httplib2
import pytest

from bot.mail.reply import reply_message_id
from bot.models import Status
from tests.fakes.gmail import GmailWorld, simple_message
from tests.support.desk import op
from tests.support.fixtures import gmail_world


async def _awaiting(w: GmailWorld, *raws: bytes, labels=("INBOX", "UNREAD")):
    """Deliver ``raws`` and tick until each has a draft awaiting approval."""
    await w.tick()
    for raw in raws:
        w.fake.add_message(raw, labels=list(labels))
    await w.tick()
    drafts = [d for d in await w.drafts() if d.status == Status.AWAITING]
    assert len(drafts) == len(raws)
    return sorted(drafts, key=lambda d: d.id)


world = gmail_world  # the fixture: an opened GmailWorld (support/fixtures.py)


def _parsed(raw: bytes):
    return email.message_from_bytes(raw, policy=email.policy.default)


async def test_reply_mime_is_threaded_to_the_original_sender(world):
    """The sent MIME: threadId of the original, In-Reply-To/References, Re: subject,
    recipient from From, Message-ID from the draft key, From the account."""
    original = simple_message(1, extra_headers="References: <a@x.example> <b@x.example>\r\n")
    (d,) = await _awaiting(world, original)
    after = await world.desk.approve(op("op"), d.id, d.version)
    assert after.status == Status.SENT
    (post,) = world.fake.calls_to("messages.send")
    assert post.body["threadId"] == d.message.thread_id
    (raw,) = world.fake.received_raw
    m = _parsed(raw)
    assert [a.addr_spec for a in m["To"].addresses] == ["alice@customer.example"]
    assert m["From"].addresses[0].addr_spec == world.fake.address
    assert m["Subject"] == "Re: Where is my order #1001?"
    assert m["In-Reply-To"] == "<order-1@customer.example>"
    assert m["References"].split() == ["<a@x.example>", "<b@x.example>",
                                       "<order-1@customer.example>"]
    assert m["Message-ID"] == reply_message_id(after)
    assert m.get_content().replace("\r\n", "\n").strip() == d.body.strip()
    (sent,) = world.fake.sent()
    assert sent.thread_id == d.message.thread_id and after.sent_id == sent.id


async def test_reply_goes_to_reply_to_and_never_to_addresses_in_the_draft(world):
    """The original asked for Reply-To: the reply goes there, whatever the text says."""
    original = simple_message(2, extra_headers="Reply-To: Orders <orders@customer.example>\r\n",
                              subject="Re: RE: invoice")
    (d,) = await _awaiting(world, original)
    d = await world.desk.edit(op("op"), d.id, d.version, "Send it to attacker@evil.example\nBcc: x@y")
    await world.engine.drain("support")
    d = await world.store.get_draft(d.id)
    await world.desk.approve(op("op"), d.id, d.version)
    m = _parsed(world.fake.received_raw[0])
    assert [a.addr_spec for a in m["To"].addresses] == ["orders@customer.example"]
    assert m["Cc"] is None and m["Bcc"] is None
    assert m["Subject"] == "Re: RE: invoice"


async def _control_send(world: GmailWorld, *, num_retries: int) -> None:
    """The library's default path: a stock httplib2.Http (which re-sends a request whose
    response was lost) and execute(num_retries=N) (which retries POSTs on 5xx)."""
    client = world.engine.sender(world.settings.pipeline("support")).client
    body = {"raw": base64.urlsafe_b64encode(simple_message(77)).decode(),
            "threadId": next(iter(world.fake.messages))}

    def run():
        request = client.service().users().messages().send(userId="me", body=body)
        stock = httplib2.Http(timeout=10)
        request.http = google_auth_httplib2.AuthorizedHttp(client.credentials(), http=stock)
        request._sleep = lambda seconds: None  # the backoff itself is not under test
        try:
            return request.execute(num_retries=num_retries)
        finally:
            stock.close()

    await asyncio.to_thread(run)


@pytest.mark.parametrize("fault", ["drop", "500"])
async def test_ambiguous_send_is_posted_once_and_ends_sent_after_the_check(world, fault):
    """Gmail accepts the send, then the connection drops (or it answers 500): exactly one
    POST and one delivered message; the draft is send_unknown, then `sent` once the
    rfc822msgid: check finds it. Control: the library's default path posts twice."""
    (d,) = await _awaiting(world, simple_message(3))
    if fault == "drop":
        world.fake.drop_after_accept("messages.send")
    else:
        world.fake.error_after_accept("messages.send", 500)
    after = await world.desk.approve(op("op"), d.id, d.version)
    assert after.status == "send_unknown"
    assert "may have been delivered" in after.error or "500" in after.error
    await world.engine.drain("support")
    final = await world.store.get_draft(d.id)
    assert final.status == Status.SENT
    assert len(world.fake.calls_to("messages.send")) == 1
    assert len(world.fake.sent()) == 1 and final.sent_id == world.fake.sent()[0].id
    (check,) = world.fake.calls_to("messages.list")[-1:]
    assert check.query["q"] == [f"rfc822msgid:{reply_message_id(final).strip('<>')}"]
    # Control: the same fault on the library's default path makes a second POST.
    before = len(world.fake.calls_to("messages.send"))
    if fault == "drop":
        world.fake.drop_after_accept("messages.send")
        await _control_send(world, num_retries=0)
    else:
        world.fake.error_after_accept("messages.send", 500)
        await _control_send(world, num_retries=1)
    assert len(world.fake.calls_to("messages.send")) - before == 2
    assert len(world.fake.sent()) == 3  # ours once, the control's twice


async def test_not_found_after_unknown_send_stays_unknown_and_never_resends(world):
    """A 500 that Gmail did NOT act on: the check finds nothing, nothing is resent, the
    operator is told and offered Retry."""
    (d,) = await _awaiting(world, simple_message(4))
    world.fake.fail("messages.send", 503)
    after = await world.desk.approve(op("op"), d.id, d.version)
    assert after.status == "send_unknown"
    await world.engine.drain("support")
    assert (await world.store.get_draft(d.id)).status == "send_unknown"
    assert len(world.fake.calls_to("messages.send")) == 1 and world.fake.sent() == []
    assert "tap Retry" in world.out.getvalue()
    retried = await world.desk.retry_send(op("op"), d.id)
    assert retried.status == Status.SENT and len(world.fake.sent()) == 1


@pytest.mark.parametrize("labels", [["INBOX", "UNREAD"], ["SPAM"], ["TRASH"]],
                         ids=["inbox", "spam", "trash"])
async def test_a_planted_message_with_the_replys_message_id_does_not_mark_it_sent(world, labels):
    """Someone mails us a message carrying the reply's Message-ID, threaded to the
    original (it lands in the inbox, spam or trash). A send that failed without
    delivery must stay unknown, and the operator hears it is not in Sent: counted as
    sent, the reply would never go out and nobody would know."""
    (d,) = await _awaiting(world, simple_message(16))
    # The id is unguessable until the send begins: planted while the send is in flight.
    release = world.fake.hold("messages.send")
    world.fake.fail("messages.send", 503)
    approving = asyncio.create_task(world.desk.approve(op("op"), d.id, d.version))
    assert await asyncio.to_thread(world.fake.reached("messages.send").wait, 60)
    sending = await world.store.get_draft(d.id)
    planted = simple_message(99, sender="Mallory <m@evil.example>").replace(
        b"<order-99@customer.example>", reply_message_id(sending).encode())
    world.fake.add_message(planted, labels=labels, thread_id=d.message.thread_id)
    release.set()
    assert (await asyncio.wait_for(approving, 60)).status == "send_unknown"
    await world.engine.drain("support")
    assert (await world.store.get_draft(d.id)).status == "send_unknown"
    assert world.fake.sent() == [] and "not in Sent" in world.out.getvalue()
    assert (await world.desk.retry_send(op("op"), d.id)).status == Status.SENT
    assert len(world.fake.sent()) == 1


async def test_4xx_is_send_failed_with_the_reason(world):
    (d,) = await _awaiting(world, simple_message(5))
    world.fake.fail("messages.send", 400, message="Invalid To header")
    after = await world.desk.approve(op("op"), d.id, d.version)
    assert after.status == Status.SEND_FAILED
    assert "Gmail 400 on messages.send: Invalid To header" in after.error
    assert world.fake.sent() == []


async def test_unreachable_gmail_is_send_failed_not_unknown(world):
    """Nothing listening: the connection was never opened, so nothing can have gone out."""
    (d,) = await _awaiting(world, simple_message(6))
    client = world.engine.sender(world.settings.pipeline("support")).client
    client.service()  # built while the fake is up
    client.api_endpoint = "http://127.0.0.1:9/"
    client._service = None
    after = await world.desk.approve(op("op"), d.id, d.version)
    assert after.status == Status.SEND_FAILED and "unreachable" in after.error


async def test_mark_read_and_label_after_send(tmp_path):
    """mark_read / label: the original loses UNREAD and gains the label after the send;
    a failing modify leaves the reply sent."""
    w = GmailWorld(tmp_path, sender="{type: gmail_reply, account: support, mark_read: true, "
                                    "label: Answered}")
    lid = w.fake.add_label("Answered")
    await w.open()
    try:
        d1, d2 = await _awaiting(w, simple_message(7), simple_message(8))
        assert (await w.desk.approve(op("op"), d1.id, d1.version)).status == Status.SENT
        original = w.fake.messages[d1.item_id]
        assert "UNREAD" not in original.labels and lid in original.labels
        w.fake.fail("messages.modify", 400, times=5)
        assert (await w.desk.approve(op("op"), d2.id, d2.version)).status == Status.SENT
        assert len(w.fake.sent()) == 2
    finally:
        await w.close()


async def test_gmail_draft_sender_creates_one_draft_in_the_thread(tmp_path):
    """gmail_draft: the reply is saved as a Gmail draft in the thread; a connection
    dropped after the create is resolved by drafts.list, without a second create."""
    w = GmailWorld(tmp_path, sender="{type: gmail_draft, account: support}")
    await w.open()
    try:
        d1, d2 = await _awaiting(w, simple_message(9), simple_message(10))
        ok = await w.desk.approve(op("op"), d1.id, d1.version)
        assert ok.status == Status.SENT and ok.sent_id in w.fake.drafts
        (create,) = w.fake.calls_to("drafts.create")
        assert create.body["message"]["threadId"] == d1.message.thread_id
        w.fake.drop_after_accept("drafts.create")
        assert (await w.desk.approve(op("op"), d2.id, d2.version)).status == "send_unknown"
        await w.engine.drain("support")
        final = await w.store.get_draft(d2.id)
        assert final.status == Status.SENT and final.sent_id in w.fake.drafts
        assert len(w.fake.calls_to("drafts.create")) == 2 and len(w.fake.drafts) == 2
        assert w.fake.calls_to("messages.send") == []
        m = _parsed(w.fake.received_raw[1])
        assert m["In-Reply-To"] == "<order-10@customer.example>"
    finally:
        await w.close()


async def test_check_finds_a_reply_gmail_stored_under_its_own_message_id(world):
    """If Gmail keeps the reply under a Message-ID of its own (or search lags), the
    check reads the thread and recognises the reply by X-Draftgate-Key: still `sent`,
    still one POST."""
    world.fake.rewrite_message_id = True
    (d,) = await _awaiting(world, simple_message(11))
    world.fake.drop_after_accept("messages.send")
    assert (await world.desk.approve(op("op"), d.id, d.version)).status == "send_unknown"
    await world.engine.drain("support")
    final = await world.store.get_draft(d.id)
    assert final.status == Status.SENT and final.sent_id == world.fake.sent()[0].id
    assert len(world.fake.calls_to("messages.send")) == 1
    threads = world.fake.calls_to("threads.get")
    assert threads and all(c.path.endswith("/" + d.message.thread_id) for c in threads)


async def test_send_timeout_is_unknown_and_resolved_without_a_second_post(tmp_path):
    """Gmail takes longer than the client's timeout and delivers afterwards: the draft
    is send_unknown (not failed, not resent) and ends `sent` once the check finds it."""
    w = GmailWorld(tmp_path, account_extra="backoff: 0.01\n      timeout: 0.5")
    await w.open()
    try:
        (d,) = await _awaiting(w, simple_message(12))
        release = w.fake.hold("messages.send")
        after = await w.desk.approve(op("op"), d.id, d.version)
        assert after.status == "send_unknown" and "timed out" in after.error
        w.fake.accepted.clear()
        release.set()
        assert await asyncio.to_thread(w.fake.accepted.wait, 10)
        await w.engine.drain("support")
        final = await w.store.get_draft(d.id)
        assert final.status == Status.SENT
        assert len(w.fake.calls_to("messages.send")) == 1 and len(w.fake.sent()) == 1
    finally:
        await w.close()


async def test_revoked_token_at_send_is_send_failed_with_the_command(world):
    """A 401 happens before Gmail accepts anything: send_failed, naming the command."""
    (d,) = await _awaiting(world, simple_message(13))
    world.fake.revoke()
    after = await world.desk.approve(op("op"), d.id, d.version)
    assert after.status == Status.SEND_FAILED
    assert "token expired or revoked; run `draftgate auth gmail --account support" in after.error
    assert world.fake.sent() == []


@pytest.mark.parametrize("case", ["token endpoint down", "refresh token revoked"])
async def test_token_refresh_failing_before_the_send_is_send_failed(world, tmp_path, case):
    """The access token has expired and refreshing it fails before messages.send is
    issued: nothing can have gone out, so the draft is send_failed with the reason
    (and the command to run for a revoked token), not "cannot tell whether it was
    sent"."""
    import json

    (d,) = await _awaiting(world, simple_message(14))
    token = tmp_path / "support-token.json"
    data = json.loads(token.read_text())
    data["expiry"] = "2000-01-01T00:00:00Z"
    if case == "token endpoint down":
        data["token_uri"] = "http://127.0.0.1:9/token"  # nothing listens there
    else:
        world.fake.refresh_ok = False
    token.write_text(json.dumps(data))
    after = await world.desk.approve(op("op"), d.id, d.version)
    assert after.status == Status.SEND_FAILED, after.error
    if case == "token endpoint down":
        assert "cannot refresh the access token" in after.error
        assert "nothing was sent" in after.error
    else:
        assert "token expired or revoked; run `draftgate auth gmail --account support" \
            in after.error
    assert world.fake.calls_to("messages.send") == [] and world.fake.sent() == []
    assert "cannot tell" not in world.out.getvalue()


async def test_retry_after_reauthorising_sends_without_a_restart(world, tmp_path):
    """A send failed because the refresh token was revoked; after `draftgate auth
    gmail` wrote a new token file, the operator's Retry sends the reply once."""
    from tests.fakes.gmail import write_token_file

    (d,) = await _awaiting(world, simple_message(15))
    world.fake.revoke()
    after = await world.desk.approve(op("op"), d.id, d.version)
    assert after.status == Status.SEND_FAILED and "draftgate auth gmail" in after.error
    access, refresh = world.fake.reauthorise()  # what `draftgate auth gmail` obtains
    write_token_file(tmp_path / "support-token.json", world.fake, token=access,
                     refresh_token=refresh)
    assert (await world.desk.retry_send(op("op"), d.id)).status == Status.SENT
    assert len(world.fake.calls_to("messages.send")) == 2  # the 401, then the reply
    assert len(world.fake.sent()) == 1


async def test_a_send_begun_before_the_upgrade_is_still_found_by_its_old_message_id(tmp_path):
    """A reply sent by the version before random Message-IDs, whose outcome was unknown
    when the upgrade came: the migration keeps that row on the id derived from its key,
    so the rfc822msgid: check finds what it sent and marks it sent, without resending."""
    import sqlite3

    from bot.mail.reply import legacy_message_id
    from bot.store.schema import LATEST

    w = await GmailWorld(tmp_path).open()
    fake = w.fake
    try:
        (d,) = await _awaiting(w, simple_message(21))
        fake.fail("messages.send", 503)
        assert (await w.desk.approve(op("op"), d.id, d.version)).status == "send_unknown"
        await w.engine.drain("support")
    finally:
        await w.engine.stop()
        await w.store.close()
    # The store as the previous version left it (no random part), and the reply that
    # version had sent, in Sent under the id derived from the key alone.
    with sqlite3.connect(tmp_path / "state.db", isolation_level=None) as db:
        db.execute("ALTER TABLE drafts DROP COLUMN reply_nonce")
        db.execute(f"PRAGMA user_version = {LATEST - 1}")
    ours = simple_message(21, sender=f"Support <{fake.address}>").replace(
        b"<order-21@customer.example>", legacy_message_id(d.key).encode())
    fake.add_message(ours, labels=["SENT"], thread_id=d.message.thread_id)
    w = await GmailWorld(tmp_path, fake=fake).open()
    try:
        await w.tick()
        after = await w.store.get_draft(d.id)
        assert after.status == Status.SENT and after.reply_nonce == ""
        assert len(fake.calls_to("messages.send")) == 1  # the failed one; nothing resent
    finally:
        await w.close()
