"""A part of scripts/eval_retrieval's corpus (tests/corpus_retrieval/): hybrid finds
paraphrases that words alone do not, and gives no more unrelated passages than the
words alone. The full figures are printed by the script."""

from __future__ import annotations

from tests.retrieval_corpus import evaluate, load

#: Questions hybrid answers and words alone do not (measured with the script).
PART = ("I ordered the wrong colour ten minutes ago, can you stop it?",
        "The courier seems to have misplaced my order, it never came.",
        "When can I come by the shop in town?",
        "What personal information do you store about me under GDPR?")
MEMORY_PART = ("Could you put my name letters on the cup?",
               "Is there a reduced price if I am at university?")


async def test_hybrid_finds_paraphrases_that_words_miss(tmp_path):
    questions, memory = load()
    part = [q for q in questions if q["q"] in PART]
    figures = await evaluate(tmp_path, f"sqlite:///{tmp_path}/e.db", questions=part,
                             queries=[q for q in memory["queries"] if q["q"] in MEMORY_PART])
    hybrid, lexical = figures[("hybrid", "handbook")], figures[("lexical", "handbook")]
    assert hybrid.found > lexical.found, (hybrid.misses, lexical.misses)
    assert hybrid.unrelated <= lexical.unrelated
    assert figures[("hybrid", "memory")].found > figures[("lexical", "memory")].found
