"""`draftgate eval` (issue 25, item 2): a configuration tried on the team's own history
through the real openai SDK against the fake model server, writing nothing."""

from __future__ import annotations

import json

import pytest

from bot.clock import utc_day
from bot.desk.chrf import chrf, corpus_chrf
from bot.models import STATUSES
from tests.support.context_world import Deployment, cli, eml
from tests.support.desk import op
from tests.support.fixtures import fake_llm
from tests.support.triage import is_triage

fake = fake_llm  # the fixture here: a fake model server (desk/conftest's is Telegram)

#: (hypothesis, reference, chrF) as sacrebleu 2.6.0 printed them
#: (``CHRF().sentence_score(h, [r]).score``), and its corpus score of all of them.
SACREBLEU = [
    ("Your order ships today.", "Your order shipped today, tracking follows.", 41.27211745007501),
    ("Hello world", "Goodbye moon", 6.172839506172839),
    ("", "abc", 0.0),
    ("same text here", "same text here", 100.0),
    ("Danke für Ihre Nachricht. Wir melden uns.",
     "Vielen Dank für Ihre Nachricht! Wir melden uns morgen.", 60.10123610038921),
    ("a", "a", 100.0),
    ("ab c", "abc", 100.0),
]
SACREBLEU_CORPUS = 52.544276477188504

REPLIES = ["Your order #1001 left Leipzig today; tracking ZX-1 follows by mail.",
           "We refund the poster within 5 business days once it is back with us.",
           "The shop opens Monday to Saturday from 10:00 to 19:00."]
QUESTIONS = [("Where is my order?", "Where is my order #1001?"),
             ("Refund", "I sent the poster back. When is my refund?"),
             ("Opening hours", "When are you open on Saturday?")]


def test_chrf_is_sacrebleus():
    for hypothesis, reference, expected in SACREBLEU:
        assert chrf(hypothesis, reference) == pytest.approx(expected, abs=1e-9)
    assert corpus_chrf([(h, r) for h, r, _ in SACREBLEU]) == pytest.approx(SACREBLEU_CORPUS,
                                                                           abs=1e-9)


@pytest.fixture
async def history(tmp_path, store_url, fake):
    """Three emails of `support` drafted, edited to REPLIES and sent (priced model)."""
    w = await Deployment(tmp_path, fake, "openai", store_url,
                         extra_yaml="    price: {input: 1.0, output: 2.0}\n").open()
    for n, ((subject, body), reply) in enumerate(zip(QUESTIONS, REPLIES, strict=True), 1):
        d, _ = await w.draft("support", n, eml(n, subject, body))
        edited = await w.desk.edit(op("anna"), d.id, d.version, reply)
        await w.desk.approve(op("anna"), edited.id, edited.version)
        assert (await w.store.get_draft(d.id)).status == "sent"
    yield w
    await w.close()


async def _snapshot(w: Deployment) -> tuple:
    """What eval must not change: drafts, seen marks, audit, token usage, cards, outbox."""
    s = w.store
    drafts = [(d.id, d.status, d.version, d.body, d.tokens_in, d.tokens_out)
              for p in ("support", "sales") for d in await s.recent(p, STATUSES, 1000)]
    days = {utc_day(w.engine.clock()), utc_day(__import__("time").time())}
    tokens = [await s.tokens_used(p, day) for p in ("support", "sales") for day in sorted(days)]
    return (drafts, await s.count_by_status(), await s.seen_count("support"),
            len(await s.audit_export(0.0, 0, 100_000)), tokens, len(w.cards.cards) + len(w.cards.edits) + len(w.cards.notes),
            sorted(p.name for p in w.tmp.glob("out-*/*")))


async def test_eval_reports_the_figures_of_a_known_history_and_writes_nothing(
        history, fake, capsys):
    w = history
    before = await _snapshot(w)
    asked = len(fake.requests)
    fake.script(fake.reply(REPLIES[0], tokens_in=100, tokens_out=20),
                fake.reply("Thanks, we will look into it.", tokens_in=100, tokens_out=20),
                fake.reply(REPLIES[2], tokens_in=100, tokens_out=20))
    assert await cli(["eval", "support", "--items", "3", "--json", "-c", w.config]) == 0
    out = json.loads(capsys.readouterr().out)
    [run] = out["configurations"]
    scores = [i["chrf"] for i in run["items"]]
    assert [i["item_id"] for i in run["items"]] == [f"<m{n}@customer.example>" for n in (1, 2, 3)]
    assert scores[0] == 100.0 and scores[2] == 100.0
    assert scores[1] == pytest.approx(chrf("Thanks, we will look into it.", REPLIES[1]))
    t = run["totals"]
    assert t["chrf"] == round(corpus_chrf([(REPLIES[0], REPLIES[0]),
                                           ("Thanks, we will look into it.", REPLIES[1]),
                                           (REPLIES[2], REPLIES[2])]), 2)
    assert (t["items"], t["drafted"], t["tokens_in"], t["tokens_out"]) == (3, 3, 300, 60)
    assert t["cost"] == pytest.approx((300 * 1.0 + 60 * 2.0) / 1e6)
    # no triage: every email is drafted, which agrees with the replies the team sent
    assert (t["triage_agreed"], t["triage_judged"]) == (3, 3) and out["stopped"] is None
    # Each draft was asked without the item's own sent reply among the past replies.
    requests = fake.requests[asked:]
    assert len(requests) == 3
    for req, reply in zip(requests, REPLIES, strict=True):
        assert reply not in req.texts()[1]
    assert await _snapshot(w) == before


async def test_with_shows_a_configuration_that_gets_worse_as_worse(history, fake, capsys):
    w = history
    (w.tmp / "pipelines-try").mkdir()
    variant = w.tmp / "pipelines-try" / "skip-all.yaml"
    variant.write_text("name: support-try\nschedule: 5m\nsource: {type: maildir, path: inbox}\n"
                       "drafter: {model: llm}\ntriage: {rules: Skip every email.}\n"
                       "sender: {type: outbox, path: out-try, from: s@shop.example}\n"
                       "lease: 60s\n")
    before = await _snapshot(w)
    skip = fake.reply('{"action": "skip", "reason": "the rules say skip"}')
    fake.script(fake.reply(REPLIES[1]), skip, fake.reply(REPLIES[2]), skip)
    asked = len(fake.requests)
    assert await cli(["eval", "support", "--items", "2", "--with", str(variant),
                      "-c", w.config]) == 0
    text = capsys.readouterr().out
    assert [is_triage(r) for r in fake.requests[asked:]] == [False, True, False, True]
    assert "worse with" in text and "skip-all.yaml: 2 item(s): <m2@customer.example>, " \
                                   "<m3@customer.example>" in text
    assert "better with" in text and ": 0 item(s)" in text
    assert text.count("WORSE") == 2
    assert "not drafted (triage: skip)" in text and "triage agreed 0/2" in text
    assert await _snapshot(w) == before

    skip = fake.reply('{"action": "skip", "reason": "the rules say skip"}')
    fake.script(fake.reply(REPLIES[1]), skip, fake.reply(REPLIES[2]), skip)
    assert await cli(["eval", "support", "--items", "2", "--with", str(variant), "--json",
                      "-c", w.config]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["worse"] == ["<m2@customer.example>", "<m3@customer.example>"]
    assert out["better"] == []
    a, b = (c["totals"] for c in out["configurations"])
    assert a["chrf"] == 100.0 and b["chrf"] == 0.0 and b["drafted"] == 0


async def test_the_budget_stops_it_and_says_how_many_items_were_evaluated(history, fake, capsys):
    w = history
    before = await _snapshot(w)
    fake.script(*(fake.reply(r, tokens_in=100, tokens_out=20) for r in REPLIES))
    asked = len(fake.requests)
    assert await cli(["eval", "support", "--items", "3", "--max-tokens", "150",
                      "-c", w.config]) == 0
    captured = capsys.readouterr()
    assert len(fake.requests) - asked == 2  # 120 tokens after the first: under 150, one more
    assert "2 of 3 item(s) evaluated" in captured.out
    assert "240 of 150 tokens" in captured.out and "--max-tokens" in captured.out
    assert "eval" in captured.err  # the progress bar
    assert await _snapshot(w) == before


async def test_a_folder_of_emails_with_the_replies_sent(history, fake, capsys, tmp_path):
    w = history
    folder = tmp_path / "cases"
    folder.mkdir()
    (folder / "late.eml").write_bytes(eml(90, "Late order", "My order #77 is late."))
    (folder / "late.reply.txt").write_text("Order #77 ships tomorrow.\n")
    (folder / "spam.eml").write_bytes(eml(91, "WIN", "You won a prize"))
    (folder / "spam.triage.txt").write_text("skip\n")
    fake.script(fake.reply("Order #77 ships tomorrow."), fake.reply("Hello"))
    assert await cli(["eval", "support", "--from", str(folder), "--json", "-c", w.config]) == 0
    [run] = json.loads(capsys.readouterr().out)["configurations"]
    assert [(i["item_id"], i["chrf"]) for i in run["items"]] == [("late", 100.0), ("spam", None)]

    # triage agreement: a configuration whose triage skips everything agrees on the spam only
    variant = tmp_path / "skip-all.yaml"
    variant.write_text("name: support-try\nschedule: 5m\nsource: {type: maildir, path: inbox}\n"
                       "drafter: {model: llm}\ntriage: {rules: Skip every email.}\n"
                       "sender: {type: outbox, path: out-try, from: s@shop.example}\n"
                       "lease: 60s\n")
    skip = fake.reply('{"action": "skip", "reason": "the rules say skip"}')
    fake.script(fake.reply("Order #77 ships tomorrow."), skip, fake.reply("Hello"), skip)
    assert await cli(["eval", "support", "--from", str(folder), "--with", str(variant), "--json",
                      "-c", w.config]) == 0
    out = json.loads(capsys.readouterr().out)
    b = out["configurations"][1]
    assert [i["triage_agrees"] for i in b["items"]] == [False, True]
    assert (b["totals"]["triage_agreed"], b["totals"]["triage_judged"]) == (1, 2)
    assert out["worse"] == ["late"] and out["better"] == ["spam"]

    (folder / "spam.triage.txt").write_text("maybe\n")
    assert await cli(["eval", "support", "--from", str(folder), "-c", w.config]) == 2
    assert "spam.triage.txt: expected one word, reply, notify or skip" in capsys.readouterr().err
    empty = tmp_path / "empty"
    empty.mkdir()
    assert await cli(["eval", "support", "--from", str(empty), "-c", w.config]) == 2
    assert "no .eml files" in capsys.readouterr().err
