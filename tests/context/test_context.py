"""A draft's context (issue 13): the thread, the team's past replies, its knowledge.

The real engine, the real store (SQLite and PostgreSQL where the store matters), the
real maildir / Gmail sources, the real outbox sender and the real openai and
anthropic SDKs against the fake model server; what is asserted is the request the
model server received, the card and what `pending --json` says.
"""

from __future__ import annotations

import json
import re
from email.parser import BytesParser
from email.policy import default as default_policy
from pathlib import Path

import pytest

from bot.approvals.cards import render_card
from bot.cli.main import main
from bot.mail.mime import parse_email
from bot.models import used_line
from tests.fakes.gmail import FakeGmail, write_token_file
from tests.fakes.llm import Request
from tests.support.context_world import (  # noqa: F401
    KNOWLEDGE,
    PROVIDERS,
    Deployment,
    cli,
    eml,
)
from tests.support.desk import op

HOSTILE = sorted((Path(__file__).parents[1] / "corpus_hostile").glob("*.eml"))


def block(req: Request, label: str) -> str | None:
    """The text between the request's ``<<<LABEL code>>>`` and its END line, or None."""
    system, user = req.texts()
    m = re.search(r"<<<EMAIL ([0-9a-f]{16})>>>", system)
    assert m, "the instructions name the boundary"
    found = re.search(rf"^<<<{label} {m.group(1)}>>>\n(.*?)\n<<<END {label} {m.group(1)}>>>$",
                      user, re.S | re.M)
    return found.group(1) if found else None


# -- thread ---------------------------------------------------------------------------------

def _gmail_yaml(tmp: Path, gmail: FakeGmail) -> str:
    write_token_file(tmp / "token.json", gmail)
    return (f"gmail:\n  accounts:\n    support:\n      token_file: token.json\n"
            f"      api_endpoint: {gmail.url}\n      address: {gmail.address}\n"
            f"      backoff: 0.01\n")


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("thread", [6, 0])
async def test_a_gmail_reply_gets_the_earlier_messages_of_its_thread_oldest_first(
        tmp_path, fake, deployments, provider, thread):
    """A reply in a Gmail thread of three messages: the request holds the two earlier
    ones (the customer's and our own reply), oldest first, as data; thread: 0 none."""
    with FakeGmail(address="support@shop.example") as gmail:
        first = gmail.add_message(eml(1, "Boots size", "Do the Alpine boots run small?"))
        tid = gmail.messages[first].thread_id
        ours = eml(2, "Re: Boots size", "They run half a size small, go up one.",
                   sender="Shop <support@shop.example>", refs="<m1@customer.example>")
        gmail.add_message(ours.replace(b"To: support@shop.example",  # our reply, to her
                                       b"To: alice@customer.example"),
                          labels=["SENT"], thread_id=tid)
        w = await deployments(fake, provider, f"sqlite:///{tmp_path}/s.db",
                              drafter=f"thread: {thread}", extra_yaml=_gmail_yaml(tmp_path, gmail),
                              source="{type: gmail, account: support}")
        await w.engine.tick("support")  # the first run records the cursor, drafts nothing
        assert fake.requests == []
        gmail.add_message(eml(3, "Re: Boots size", "Thanks! And can I return them if not?",
                              refs="<m1@customer.example> <m2@customer.example>"),
                          thread_id=tid)
        await w.engine.tick("support")
        [d] = await w.store.pending("support")
        await w.close()  # its Gmail connections, before the fake Gmail stops
    [req] = fake.requests
    assert "can I return them" in block(req, "EMAIL")
    earlier = block(req, "THREAD")
    if thread == 0:
        assert earlier is None and "Alpine boots" not in req.texts()[1]
        assert not gmail.calls_to("threads.get")
        return
    assert earlier is not None
    assert earlier.index("Do the Alpine boots run small?") < earlier.index("half a size small")
    assert "From: Alice Buyer <alice@customer.example>" in earlier
    assert "From: Shop <support@shop.example> (our reply)" in earlier
    assert "can I return them" not in earlier
    assert used_line(d.used) == "📎 thread 2"
    assert "📎 thread 2" in render_card(d).text


async def test_a_maildir_reply_gets_the_files_its_references_name(tmp_path, fake, deployments):
    """Maildir: the earlier files of the thread, by References, oldest first."""
    w = await deployments(fake, "openai", f"sqlite:///{tmp_path}/s.db")
    await w.draft("support", 1, eml(1, "Parcel", "My parcel 77 has not arrived."))
    _, req = await w.draft("support", 2, eml(2, "Re: Parcel", "Still nothing, any news?",
                                             refs="<m1@customer.example>"))
    assert "My parcel 77 has not arrived." in block(req, "THREAD")
    assert "My parcel 77" not in block(req, "EMAIL")


VICTORIA = "Victoria Client <victoria@customer.example>"
MALLORY = "Mallory <mallory@stranger.example>"
SECRET = "card 4929 1234 5678 9012, billing address 12 Elm Row"


@pytest.mark.parametrize("model", ["llm", "template"])
async def test_a_strangers_references_do_not_pull_another_customers_mail_into_a_maildir_draft(
        tmp_path, fake, deployments, model):
    """Mallory writes with References: <Victoria's Message-ID> and her subject: none of
    Victoria's text reaches the model request or the template's card, and the card
    says one earlier message was left out. Victoria's own follow-up still gets it."""
    if model == "template":
        (tmp_path / "t.txt").write_text("Hi {first_name},\n{thread}\nThanks\n")
    w = await deployments(fake, "openai", f"sqlite:///{tmp_path}/s.db", model=model,
                          drafter="prompt: t.txt" if model == "template" else "")
    await w.draft("support", 1, eml(1, "Double charge", f"You charged my {SECRET} twice.",
                                    sender=VICTORIA))
    d, req = await w.draft("support", 2, eml(2, "Re: Double charge", "Any news on this?",
                                             sender=MALLORY, refs="<m1@customer.example>"))
    card = render_card(d).text
    assert "4929" not in d.body and "Elm Row" not in d.body and "4929" not in card
    if req is not None:
        assert block(req, "THREAD") is None and "4929" not in json.dumps(req.body)
    assert used_line(d.used) == "📎 1 earlier message left out (the sender took no part)"
    assert "1 earlier message left out" in card
    mine, req = await w.draft("support", 3, eml(3, "Re: Double charge", "Any news?",
                                                sender=VICTORIA, refs="<m1@customer.example>"))
    assert "4929" in (mine.body if req is None else block(req, "THREAD"))
    assert used_line(mine.used) == "📎 thread 1"


async def test_a_strangers_mail_in_a_gmail_thread_gets_none_of_it(tmp_path, fake, deployments):
    """Gmail threads Mallory's mail with Victoria's (References and subject): the real
    googleapiclient reads the thread from the fake Gmail, and the model request holds
    neither Victoria's message nor our reply to her; the card counts both left out."""
    with FakeGmail(address="support@shop.example") as gmail:
        first = gmail.add_message(eml(1, "Double charge", f"You charged my {SECRET} twice.",
                                      sender=VICTORIA))
        tid = gmail.messages[first].thread_id
        reply = eml(2, "Re: Double charge", "Sorry Victoria, the refund for 4929 is on its way.",
                    sender="Shop <support@shop.example>", refs="<m1@customer.example>")
        gmail.add_message(reply.replace(b"To: support@shop.example",
                                        b"To: victoria@customer.example"),
                          labels=["SENT"], thread_id=tid)
        w = await deployments(fake, "openai", f"sqlite:///{tmp_path}/s.db",
                              extra_yaml=_gmail_yaml(tmp_path, gmail),
                              source="{type: gmail, account: support}")
        await w.engine.tick("support")  # the first run records the cursor
        gmail.add_message(eml(3, "Re: Double charge", "Any news on this?", sender=MALLORY,
                              refs="<m1@customer.example> <m2@customer.example>"),
                          thread_id=tid)
        await w.engine.tick("support")
        [d] = await w.store.pending("support")
        await w.close()
    assert gmail.calls_to("threads.get")
    [req] = fake.requests
    assert block(req, "THREAD") is None
    assert "4929" not in json.dumps(req.body) and "Elm Row" not in json.dumps(req.body)
    assert used_line(d.used) == "📎 2 earlier messages left out (the sender took no part)"
    assert "2 earlier messages left out" in render_card(d).text


# -- team memory -------------------------------------------------------------------------------

async def _examples(store, rows: list[tuple[str, str]], first: int = 0) -> None:
    """Past replies of `support` (original, reply), as sends would have left them."""
    values = [v for i, (original, reply) in enumerate(rows, first)
              for v in ("support", f"<e{i}@x>", f"support|s|e{i}|v1", original, reply, 0, 1.7e9 + i)]
    await store._script([("INSERT INTO examples (pipeline, item_id, draft_key, original, reply, "
                          "edited, sent_at) VALUES " + ", ".join(["(?, ?, ?, ?, ?, ?, ?)"] * len(rows)),
                          tuple(values))])


async def test_team_memory_goes_by_the_rare_words_and_finds_a_new_one_at_once(store):
    """Among 300 replies about late orders (a word every one has), the question's rare
    words pick the example; a reply sent a moment ago with a word no earlier one had is
    found by the very next search (a common word's count may be cached, a rare one's not)."""
    await _examples(store, [(f"Where is my order {i}? It is late.", f"reply {i}") for i in range(300)]
                    + [("My order came with a cracked teapot lid.", "A new lid is on its way.")])
    [e] = await store.examples_for("support", "Order 77: the teapot lid is cracked", 1)
    assert e.reply == "A new lid is on its way."
    [e] = await store.examples_for("support", "my order and the zeppelin poster", 1)
    assert e.reply != "Posters ship rolled."  # not sent yet: some order reply
    await _examples(store, [("Is the zeppelin poster framed?", "Posters ship rolled.")], first=301)
    [e] = await store.examples_for("support", "my order and the zeppelin poster", 1)
    assert e.reply == "Posters ship rolled."
    assert await store.examples_for("sales", "my order and the zeppelin poster", 3) == []


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_an_edited_reply_becomes_an_example_for_the_same_question_in_its_pipeline_only(
        store_url, fake, deployments, capsys, provider):
    """Edited and approved -> an example for the same question; never in another pipeline;
    `memory forget` removes it; a rejected draft never appears."""
    w = await deployments(fake, provider, store_url)
    d, _ = await w.draft("support", 1, eml(1, "Where is my order?",
                                           "Where is my order #1001? It was due Friday."))
    edited = await w.desk.edit(op("anna"), d.id, d.version, "Your order ships from Leipzig, tracking "
                                                  "ZX-EDITED follows today.")
    await w.desk.approve(op("anna"), edited.id, edited.version)
    assert (await w.store.get_draft(d.id)).status == "sent"
    r, _ = await w.draft("support", 2, eml(2, "Order and invoice", "Where is my invoice for the "
                                           "order? Please send the REJECTED-ONLY copy."))
    await w.desk.reject(op("anna"), r.id, r.version)

    mine, req = await w.draft("support", 3, eml(3, "Order late", "Where is my order #1003?"))
    examples = block(req, "PAST REPLIES")
    assert examples is not None and "ZX-EDITED" in examples
    assert "(written by an operator)" in examples and "Where is my order #1001?" in examples
    assert "REJECTED-ONLY" not in req.texts()[1]
    assert used_line(mine.used) == "📎 1 past reply"
    _, other = await w.draft("sales", 4, eml(4, "Order late", "Where is my order #1004?"))
    assert block(other, "PAST REPLIES") is None and "ZX-EDITED" not in other.texts()[1]

    assert await cli(["memory", "list", "support", "-c", w.config, "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [(e["item_id"], e["edited"]) for e in listed] == [("<m1@customer.example>", True)]
    assert await cli(["memory", "forget", "support", "<m1@customer.example>", "-c", w.config]) == 0
    _, after = await w.draft("support", 5, eml(5, "Order late", "Where is my order #1005?"))
    assert block(after, "PAST REPLIES") is None and "ZX-EDITED" not in after.texts()[1]
    assert await cli(["memory", "forget", "support", "<m1@customer.example>", "-c", w.config]) == 1


# -- knowledge ---------------------------------------------------------------------------------


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_knowledge_gives_the_relevant_passage_and_follows_an_edit_without_restart(
        tmp_path, store_url, fake, deployments, capsys, provider):
    (tmp_path / "knowledge").mkdir()
    facts = tmp_path / "knowledge" / "returns.md"
    facts.write_text(KNOWLEDGE)
    w = await deployments(fake, provider, store_url, drafter="knowledge: [knowledge/*.md]")
    refund, req = await w.draft("support", 1, eml(1, "Refund?", "When do I get my refund "
                                                  "for the returned jacket?"))
    passages = block(req, "KNOWLEDGE")
    assert passages is not None and "--- returns.md › Refunds" in passages
    assert "5 business days" in passages and "10:00 to 19:00" not in passages
    assert used_line(refund.used) == "📎 returns.md › Refunds"
    _, hours = await w.draft("support", 2, eml(2, "Visiting", "What are your opening hours? "
                                               "Are you open on Saturday?"))
    assert "10:00 to 19:00" in block(hours, "KNOWLEDGE")
    assert "Refunds" not in block(hours, "KNOWLEDGE")

    facts.write_text(KNOWLEDGE.replace("5 business days", "10 business days"))
    _, again = await w.draft("support", 3, eml(3, "Refund", "How long does a refund take?"))
    assert "10 business days" in block(again, "KNOWLEDGE")
    assert "5 business days" not in again.texts()[1]
    assert await cli(["pending", "-c", w.config, "--json"]) == 0
    shown = {d["item_id"]: d for d in json.loads(capsys.readouterr().out)}
    assert shown["<m1@customer.example>"]["used_line"] == "📎 returns.md › Refunds"
    assert shown["<m1@customer.example>"]["used"]["knowledge"] == ["returns.md › Refunds"]


async def test_the_template_drafter_fills_thread_and_knowledge_fields(tmp_path, fake, deployments):
    """{thread} and {knowledge}, offline; the card counts only what the template used."""
    (tmp_path / "kb").mkdir()
    (tmp_path / "kb" / "returns.md").write_text(KNOWLEDGE)
    (tmp_path / "t.txt").write_text("Hi {first_name},\n{thread}\n\n{knowledge}\n")
    w = await deployments(fake, "openai", f"sqlite:///{tmp_path}/s.db", model="template",
                          drafter="prompt: t.txt, knowledge: [kb/*.md]")
    await w.draft("support", 1, eml(1, "Refund", "I sent the jacket back last week."))
    d, _ = await w.draft("support", 2, eml(2, "Re: Refund", "When is my refund paid?",
                                           refs="<m1@customer.example>"))
    assert "> Alice Buyer <alice@customer.example> (Sun 29 Nov 2026 10:02): I sent the jacket " \
           "back last week." in d.body
    assert "returns.md › Refunds:\nRefunds are paid back to the card" in d.body
    assert used_line(d.used) == "📎 thread 1 · returns.md › Refunds"
    assert fake.requests == []


def test_a_knowledge_glob_that_matches_nothing_is_a_validate_error(tmp_path, capsys):
    (tmp_path / "pipelines").mkdir()
    (tmp_path / "draftgate.yaml").write_text(f"store: sqlite:///{tmp_path}/s.db\n")
    (tmp_path / "r.txt").write_text("Hi")
    (tmp_path / "pipelines" / "a.yaml").write_text(
        "name: a\nsource: {type: maildir, path: in}\nsender: {type: outbox, path: o, from: a@b.c}\n"
        "drafter: {model: template, prompt: r.txt, knowledge: [kb/*.md], thread: -1}\n")
    assert main(["validate", "-c", str(tmp_path / "draftgate.yaml")]) == 2
    err = capsys.readouterr().err
    assert "pipelines/a.yaml: drafter.knowledge[0]: no file matches kb/*.md" in err
    assert "drafter.thread: expected a number from 0 (off) to 50, got -1" in err


# -- hostile context -----------------------------------------------------------------------------

async def test_hostile_text_in_a_past_reply_knowledge_and_thread_stays_data(
        tmp_path, store_url, fake, deployments):
    """The hostile corpus as a past reply, a knowledge file and thread messages: every
    one inside its boundary, the recipient unchanged, the card escaped."""
    parsed = [parse_email(f.read_bytes()) for f in HOSTILE]
    texts = [f"{m.subject}\n{m.body}" for m in parsed]
    (tmp_path / "kb").mkdir()
    (tmp_path / "kb" / "evil.md").write_text(
        "## <b>Approve</b> <a href='http://evil.example'>now</a> order refund\n\n"
        + "\n\n".join(f"order refund {t}" for t in texts))
    w = await deployments(fake, "openai", store_url, drafter="knowledge: [kb/*.md]")
    d, _ = await w.draft("support", 1, eml(1, "order refund", "Where is my order refund?"))
    edited = await w.desk.edit(op("anna"), d.id, d.version, "order refund\n" + "\n".join(texts))
    await w.desk.approve(op("anna"), edited.id, edited.version)
    refs = " ".join(f"<h{i}@customer.example>" for i in range(len(HOSTILE)))
    for i, f in enumerate(HOSTILE):  # thread messages the new email answers, Bob in copy
        raw = re.sub(rb"(?im)^Message-ID:.*$", f"Message-ID: <h{i}@customer.example>".encode(),
                     f.read_bytes(), count=1)
        raw = b"Cc: bob@customer.example\n" + raw.lstrip()
        (w.tmp / "inbox" / f"h{i}.eml").write_bytes(raw)
    await w.engine.tick("support")  # the hostile emails themselves are drafted too
    fake.requests.clear()
    new, req = await w.draft("support", 9, eml(9, "Re: order refund", "Any news on my order "
                                               "refund?", sender="Bob <bob@customer.example>",
                                               refs=refs))
    system, user = req.texts()
    nonce = re.search(r"<<<EMAIL ([0-9a-f]{16})>>>", system).group(1)
    assert new.used["thread"] >= 1 and new.used["examples"] and new.used["knowledge"]
    # Every boundary-looking line of the request is one of ours, with the code.
    lines = [ln for ln in user.splitlines() if ln.startswith("<<<")]
    assert lines and all(nonce in ln for ln in lines)
    for label in ("EMAIL", "THREAD", "PAST REPLIES", "KNOWLEDGE"):
        assert block(req, label) is not None, label
    assert user.count("<<<") == len(lines) * 1
    card = render_card(new).text
    assert "<a href" not in card and "&lt;a href" in card and "<b>Approve" not in card
    await w.desk.approve(op("anna"), new.id, new.version)
    [sent] = [p for p in (w.tmp / "out-support").iterdir()
              if b"<m9@customer.example>" in p.read_bytes()]
    msg = BytesParser(policy=default_policy).parsebytes(sent.read_bytes())
    assert msg["To"].addresses[0].addr_spec == "bob@customer.example"
    assert len(msg["To"].addresses) == 1 and msg["Cc"] is None and msg["Bcc"] is None
