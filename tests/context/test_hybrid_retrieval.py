"""Hybrid retrieval (issue 24) through a real draft: the real engine and store, the
real maildir source, the real openai and anthropic SDKs against the fake model server,
embeddings from the bundled local model or from the fake's /v1/embeddings (a models:
entry). What is asserted is the request the model server received, and what
`draftgate status` says."""

from __future__ import annotations

import pytest

from bot.context.retrieval import Retrieval
from bot.models import used_line
from tests.fakes.llm import FakeLLM
from tests.retrieval_corpus import CORPUS
from tests.support.context_world import KNOWLEDGE, PROVIDERS, Deployment, cli, eml


def _retrieval(w: Deployment) -> Retrieval:
    return w.engine.drafting.context.retrieval


def _emb_yaml(fake: FakeLLM) -> str:
    return (f"  emb:\n    provider: openai\n    base_url: {fake.openai_url}\n    model: e\n"
            "    timeout: 10s\n    retries: 0\n")


def _knowledge(w_tmp, text: str) -> None:
    (w_tmp / "knowledge").mkdir(exist_ok=True)
    (w_tmp / "knowledge" / "shop.md").write_text(text)


#: No word of it is in the Refunds passage; the fake's embeddings know they mean one thing.
CASH = "When is my cash returned?"
CONCEPTS = {"refund": ["refunds", "refund", "paid", "cash", "returned"],
            "gift": ["gift", "wrapping", "wrap", "birthday", "surprise"]}


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_a_paraphrase_gets_the_right_passage_with_the_local_model(
        tmp_path, store_url, fake, deployments, provider):
    """"give back the boots" finds the handbook's Returns, not the catalogue's boots."""
    (tmp_path / "knowledge").mkdir()
    for name in ("handbook.md", "catalogue.md"):
        (tmp_path / "knowledge" / name).write_text((CORPUS / name).read_text())
    w = await deployments(fake, provider, store_url, drafter="knowledge: [knowledge/*.md]")
    await w.draft("support", 1, eml(1, "Hello", "Hello there."))  # indexes, embeds meanwhile
    await _retrieval(w).idle()
    d, req = await w.draft("support", 2, eml(2, "Question", "Can I still give back the boots I "
                                             "got three weeks ago?"))
    assert "handbook.md › Returns" in used_line(d.used)
    assert "--- handbook.md › Returns" in req.texts()[1]
    assert "within 30 days of delivery" in req.texts()[1]
    assert fake.embedding_requests == []  # local: nothing leaves the process


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_a_paraphrase_gets_the_right_passage_with_a_models_entry(
        tmp_path, store_url, fake, deployments, provider):
    _knowledge(tmp_path, KNOWLEDGE)
    fake.concepts = CONCEPTS
    w = await deployments(fake, provider, store_url, extra_yaml=_emb_yaml(fake),
                          drafter="knowledge: [knowledge/*.md], embeddings: emb")
    await w.draft("support", 1, eml(1, "Hello", "Hello there."))
    await _retrieval(w).idle()
    d, req = await w.draft("support", 2, eml(2, "Question", CASH))
    assert used_line(d.used) == "📎 shop.md › Refunds"
    assert "5 business days" in req.texts()[1] and "10:00 to 19:00" not in req.texts()[1]
    assert any(len(r) > 1 for r in fake.embedding_requests)  # the passages, in a batch
    assert [CASH] in [[t.split("\n", 1)[1].strip()] for r in fake.embedding_requests
                      for t in r if "\n" in t and CASH in t]


async def test_lexical_keeps_words_only(tmp_path, store_url, fake, deployments):
    """`retrieval: lexical`: the paraphrase finds nothing, and nothing is embedded."""
    _knowledge(tmp_path, KNOWLEDGE)
    fake.concepts = CONCEPTS
    w = await deployments(fake, "openai", store_url, extra_yaml=_emb_yaml(fake),
                          drafter="knowledge: [knowledge/*.md], embeddings: emb, "
                                  "retrieval: lexical")
    await w.draft("support", 1, eml(1, "Hello", "Hello there."))
    await _retrieval(w).idle()
    d, _ = await w.draft("support", 2, eml(2, "Question", CASH))
    assert used_line(d.used) == ""
    d, _ = await w.draft("support", 3, eml(3, "Refund", "How long does a refund take?"))
    assert used_line(d.used) == "📎 shop.md › Refunds"
    assert fake.embedding_requests == []


async def test_a_passage_added_to_a_file_is_found_by_the_next_draft(
        tmp_path, store_url, fake, deployments):
    """At once by its words (a draft never waits for embedding), by its meaning once
    embedded; no restart."""
    _knowledge(tmp_path, KNOWLEDGE)
    fake.concepts = CONCEPTS
    w = await deployments(fake, "anthropic", store_url, extra_yaml=_emb_yaml(fake),
                          drafter="knowledge: [knowledge/*.md], embeddings: emb")
    await w.draft("support", 1, eml(1, "Hello", "Hello there."))
    await _retrieval(w).idle()
    _knowledge(tmp_path, KNOWLEDGE + "\n## Gift wrapping\n\nWe wrap any order in recycled "
                                     "paper for €3.\n")
    d, _ = await w.draft("support", 2, eml(2, "Wrapping", "Do you offer gift wrapping?"))
    assert "shop.md › Gift wrapping" in used_line(d.used)
    await _retrieval(w).idle()
    d, req = await w.draft("support", 3, eml(3, "Party", "Could my birthday surprise look nice?"))
    assert used_line(d.used) == "📎 shop.md › Gift wrapping"
    assert "recycled paper" in req.texts()[1]


async def test_status_shows_the_embedding_left_and_it_resumes(
        tmp_path, store_url, fake, deployments, capsys):
    """A change of model (here: the first embedding) that stops half way shows in
    `status` until the rest is embedded; the next draft tries again."""
    _knowledge(tmp_path, "".join(f"## Topic {i}\n\nFact number {i} of the shop.\n\n"
                                 for i in range(100)))
    fake.embeddings_fail_after = 1
    w = await deployments(fake, "openai", store_url, extra_yaml=_emb_yaml(fake),
                          drafter="knowledge: [knowledge/*.md], embeddings: emb")
    await w.draft("support", 1, eml(1, "Hello", "Hello there."))
    await _retrieval(w).idle()
    assert await cli(["status", "-c", w.config]) == 0
    out = capsys.readouterr().out
    assert "embedding 64/100 with api:emb:e" in out, out
    fake.embeddings_fail_after = None
    await w.draft("support", 2, eml(2, "Hello", "Hello again."))
    await _retrieval(w).idle()
    assert await cli(["status", "-c", w.config]) == 0
    assert "embedding" not in capsys.readouterr().out


def test_fusion_gives_nothing_unrelated_just_because_it_ranks_first():
    """Floors of the fusion (bot.context.retrieval.fuse), by table: texts far from the
    email are not given, however they rank; a full-text match not embedded yet is
    given by its words; both rankings agreeing put a text first."""
    from bot.context.retrieval import FLOOR, MARGIN, fuse

    weak = {"a": FLOOR - 0.05, "b": FLOOR - 0.08}
    assert fuse([], weak, [], 3) == []
    strong = {"answer": 0.5, "near": 0.5 - MARGIN / 2, "far": 0.5 - 2 * MARGIN}
    assert fuse([], strong, [], 3) == ["answer", "near"]
    assert fuse([None], {}, ["new passage"], 3) == ["new passage"]
    assert fuse([0.3, 0.05], {"x": 0.35, "lex": 0.3}, ["lex", "unrelated words"], 3)[0] == "lex"


def test_a_full_text_match_on_words_its_rivals_share_earns_little_of_the_bonus():
    """The lexical bonus of the fusion goes with the share of the email's rarer words a
    match contains (bot.context.retrieval.coverage), not with its full-text rank alone:
    a match on a word every competing text has (a product's name) does not outrank the
    one that has the words only it shares with the email."""
    from bot.context.retrieval import coverage, fuse

    pool = ["Rain jacket: a light jacket with a hood.", "Fleece jacket, warm and soft.",
            "Returns: send an item back within 30 days for a refund.",
            "Down jacket for cold mornings."]
    email = "Can I send the jacket back?"
    covered = coverage(email, pool, pool)
    assert covered[2] > max(covered[0], covered[1], covered[3])
    # Full-text search ranked the rain jacket first; both are as near by meaning.
    ranked = fuse([0.3, 0.3], {}, ["rain jacket", "returns"], 1, [covered[0], covered[2]])
    assert ranked == ["returns"]
    assert fuse([0.3, 0.3], {}, ["rain jacket", "returns"], 1) == ["rain jacket"]
    assert coverage("?!", ["the end"], ["the end", "the start"]) == [0.0]  # no words
