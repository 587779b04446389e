"""Mail that enters the pipeline after it arrived (issue 22, finding 13): marked "not
spam" into the inbox, or given the pipeline's label later by a filter or a colleague.
History records that as ``labelsAdded``, not ``messagesAdded``; the fake Gmail models
both as users.history.list documents them, driven by the real googleapiclient."""

from __future__ import annotations

from tests.fakes.gmail import GmailWorld, simple_message


async def test_mail_marked_not_spam_is_drafted_once(tmp_path):
    """A customer's mail lands in spam (not drafted); someone marks it "not spam", so
    it moves into the inbox: the next tick drafts it, and moving it to spam and back
    again drafts nothing more."""
    w = await GmailWorld(tmp_path).open()
    try:
        await w.tick()  # first run: cursor recorded
        gid = w.fake.add_message(simple_message(1), labels=["SPAM"])
        assert (await w.tick()).new == 0 and await w.drafts() == []
        w.fake.relabel(gid, add=["INBOX"], remove=["SPAM"])
        counts = await w.tick()
        assert counts.new == 1
        [d] = await w.drafts()
        assert (d.item_id, d.status) == (gid, "awaiting")
        w.fake.relabel(gid, add=["SPAM"], remove=["INBOX"])
        w.fake.relabel(gid, add=["INBOX"], remove=["SPAM"])
        assert (await w.tick()).new == 0 and len(await w.drafts()) == 1
    finally:
        await w.close()


async def test_mail_given_the_pipelines_label_an_hour_later_is_drafted(tmp_path):
    """source.label: the label is added after the mail arrived (a filter, a colleague):
    it is drafted on the next tick; a label added to other mail drafts nothing."""
    w = GmailWorld(tmp_path, source='{type: gmail, account: support, query: "in:inbox", '
                                    'label: Support}')
    lid = w.fake.add_label("Support")
    other = w.fake.add_label("Billing")
    await w.open()
    try:
        await w.tick()
        gid = w.fake.add_message(simple_message(1))
        later = w.fake.add_message(simple_message(2))
        assert (await w.tick()).new == 0
        w.fake.relabel(gid, add=[lid])
        w.fake.relabel(later, add=[other])
        assert (await w.tick()).new == 1
        assert [d.item_id for d in await w.drafts()] == [gid]
    finally:
        await w.close()


async def test_a_query_beyond_labels_admits_relabelled_mail_only_if_the_search_returns_it(
        tmp_path):
    """A query with search terms: mail moved into the inbox is admitted when Gmail's
    search returns it for the query, and not otherwise."""
    w = GmailWorld(tmp_path, source='{type: gmail, account: support, '
                                    'query: "in:inbox from:alice@customer.example"}')
    await w.open()
    try:
        await w.tick()
        yes = w.fake.add_message(simple_message(1), labels=["SPAM"])
        no = w.fake.add_message(simple_message(2, sender="Bob <bob@other.example>"),
                                labels=["SPAM"])
        await w.tick()
        for gid in (yes, no):
            w.fake.relabel(gid, add=["INBOX"], remove=["SPAM"])
        assert (await w.tick()).new == 1
        assert [d.item_id for d in await w.drafts()] == [yes]
    finally:
        await w.close()
