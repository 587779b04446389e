"""Follow-ups on Gmail (issue 28): the same chain as on a maildir (tests/test_phone_desk.py),
against the fake Gmail API. The demo console approves each card at once, so a follow-up
that is queued is sent; an answer in the Gmail thread (another subject) stops the chain.
"""

from __future__ import annotations

import email
import email.policy
import io

from bot.approvals.console import ConsoleChannel
from bot.config.load import load_settings
from bot.store import create_store
from tests.fakes.gmail import GmailWorld, simple_message
from tests.support.clock import Clock
from tests.support.desk import started

T0 = 1796396400.0  # Fri 2026-12-04 15:00 UTC




async def _open(tmp_path):
    w = GmailWorld(tmp_path, auto_approve=True)
    pipeline = tmp_path / "pipelines" / "support.yaml"
    pipeline.write_text(pipeline.read_text() + "followup: {after: 2d, working_days: false, max: 1}\n")
    w.settings = load_settings(w.config)
    w.store = create_store(w.settings.store)
    await w.store.open()
    w.out = io.StringIO()
    clock = Clock(T0)
    w.app = await started(w.settings, w.store, {"console": ConsoleChannel(
        auto_approve=True, interactive=False, out=w.out)}, send_check_delay=0.0, clock=clock)
    w.engine = w.app.engine
    await w.tick()  # first run: the cursor
    return w, clock


def _sent(w) -> list:
    return [email.message_from_bytes(m.raw, policy=email.policy.default) for m in w.fake.sent()]


async def test_an_unanswered_gmail_reply_gets_one_follow_up_in_its_thread(tmp_path):
    w, clock = await _open(tmp_path)
    try:
        gid = w.fake.add_message(simple_message(7, sender="Dana Doe <dana@customer.example>"))
        await w.tick()
        assert len(w.fake.sent()) == 1
        clock.t = T0 + 2 * 86400 - 60
        await w.tick()
        assert len(w.fake.sent()) == 1
        clock.t = T0 + 2 * 86400
        await w.tick()
        first, follow = w.fake.sent()
        assert follow.thread_id == first.thread_id == w.fake.messages[gid].thread_id
        m = _sent(w)[1]
        assert m["In-Reply-To"] == "<order-7@customer.example>"
        assert [a.addr_spec for a in m["To"].addresses] == ["dana@customer.example"]
        [f] = [d for d in await w.store.item_drafts("support", gid) if d.scope == "followup"]
        assert (f.key, f.status) == (f"support|followup|{gid}|1", "sent")
        clock.t += 30 * 86400  # max 1
        await w.tick()
        assert len(w.fake.sent()) == 2
    finally:
        await w.close()


async def test_an_answer_in_the_gmail_thread_means_no_follow_up(tmp_path):
    w, clock = await _open(tmp_path)
    try:
        gid = w.fake.add_message(simple_message(8, sender="Dana Doe <dana@customer.example>"))
        await w.tick()
        clock.t = T0 + 3600
        thanks = w.fake.add_message(simple_message(9, sender="Dana Doe <dana@customer.example>",
                                                   subject="Thanks!", body="That helps.\n"),
                                    thread_id=w.fake.messages[gid].thread_id)
        await w.tick()
        assert len(w.fake.sent()) == 2  # our reply, and the (demo) reply to her thanks
        # Both replies are past `after` now: the one she answered gets no follow-up, the
        # (demo) reply to her thanks, unanswered, gets its one.
        clock.t = T0 + 3600 + 2 * 86400
        await w.tick()
        assert [d for d in await w.store.item_drafts("support", gid) if d.scope == "followup"] == []
        assert [d.status for d in await w.store.item_drafts("support", thanks)
                if d.scope == "followup"] == ["sent"]
        assert len(w.fake.sent()) == 3
    finally:
        await w.close()


async def test_files_reads_a_gmail_messages_attachments_whole(tmp_path):
    from email.message import EmailMessage

    from bot.desk.operator import CONSOLE
    w = GmailWorld(tmp_path)
    await w.open()
    try:
        await w.tick()
        m = EmailMessage()
        m["From"], m["To"] = "Dana Doe <dana@customer.example>", "support@example.com"
        m["Subject"], m["Message-ID"] = "Invoice", "<inv-1@customer.example>"
        m.set_content("The invoice is attached.\n")
        pdf = b"%PDF-1.4 " + bytes(5000)
        m.add_attachment(pdf, maintype="application", subtype="pdf", filename="invoice.pdf")
        gid = w.fake.add_message(m.as_bytes())
        await w.tick()
        [d] = await w.store.item_drafts("support", gid)
        assert (d.message.attachments, d.message.attachment_sizes) == (["invoice.pdf"], [5009])
        _, files = await w.app.desk.files(CONSOLE, d.id)
        assert files == [("invoice.pdf", pdf)]
        assert [e.detail for e in await w.store.audit_log(d.key) if e.action == "files"] == [
            "invoice.pdf 5009 bytes"]
    finally:
        await w.close()
