"""The whole flow with no maildir: a message lands in the (fake) Gmail inbox, is drafted
by the template drafter, approved (demo auto-approve console) and sent once as a
threaded reply; later ticks send nothing more."""

from __future__ import annotations

import email
import email.policy

from bot.models import Status
from tests.fakes.gmail import GmailWorld, simple_message


async def test_message_in_gmail_is_drafted_approved_and_sent_once_threaded(tmp_path):
    w = await GmailWorld(tmp_path, auto_approve=True).open()
    try:
        await w.tick()  # first run: cursor recorded
        gid = w.fake.add_message(simple_message(42, sender="Dana Doe <dana@customer.example>"))
        counts = await w.tick()
        assert (counts.fetched, counts.new, counts.drafted, counts.posted) == (1, 1, 1, 1)
        (d,) = await w.store.item_drafts("support", gid)
        assert d.status == Status.SENT and d.decided_by == "demo-auto-approve"
        (reply,) = w.fake.sent()
        assert d.sent_id == reply.id and reply.thread_id == w.fake.messages[gid].thread_id
        m = email.message_from_bytes(reply.raw, policy=email.policy.default)
        assert [a.addr_spec for a in m["To"].addresses] == ["dana@customer.example"]
        assert m["In-Reply-To"] == "<order-42@customer.example>"
        assert m["Subject"] == "Re: Where is my order #1042?"
        assert "Hi Dana," in m.get_content()
        assert "DEMO" in w.out.getvalue()
        for _ in range(2):  # our own reply shows up in history as Status.SENT: not work
            mark = w.fake.mark()
            await w.tick()
            assert "messages.send" not in [c.route for c in w.fake.api_calls(mark)]
        assert len(w.fake.calls_to("messages.send")) == 1
        assert len(await w.store.item_drafts("support", reply.id)) == 0
    finally:
        await w.close()
