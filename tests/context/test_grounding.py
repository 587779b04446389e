"""The grounding check (issue 24): a draft's checkable claims that its sources do not
support are found, however either side writes them; the draft is never changed."""

from __future__ import annotations

import pytest

from bot.context.grounding import claims, unsupported
from tests.grounding_corpus import evaluate, load_cases

CASES = load_cases()


def test_the_corpus_has_60_cases_in_english_and_german():
    """The corpus is large enough to say something, in both languages."""
    assert len(CASES) >= 60
    assert {c["lang"] for c in CASES} == {"en", "de"}


def test_at_most_5_percent_wrong_flags_and_5_percent_missed():
    """Across the corpus: few supported claims flagged, few unsupported ones missed."""
    f = evaluate(CASES)
    assert f.wrongly_flagged_share <= 0.05, f.differences
    assert f.missed_share <= 0.05, f.differences


@pytest.mark.parametrize("case", CASES, ids=lambda c: c["draft"][:50])
def test_case(case):
    """Each case flags exactly the claims its sources do not support."""
    got = [g.lower() for g in unsupported(case["draft"], case["sources"])]
    assert got == [w.lower() for w in case["unsupported"]]


@pytest.mark.parametrize("draft, source", [
    ("within 14 days", "within fourteen days"),
    ("in 2 working days", "in two business days"),
    ("€25 off", "25 EUR off"),
    ("€25 off", "25,00 € off"),
    ("on 12.03.2026", "on 12 March 2026"),
    ("at 5 pm", "at 17:00"),
    ("in vierzehn Tagen", "in 14 days"),
    ("fünfundzwanzig Euro", "€25"),
])
def test_the_same_claim_written_differently_is_supported(draft, source):
    """What people write differently is one claim."""
    assert claims(draft), draft
    assert unsupported(draft, [source]) == []


def test_a_claim_found_nowhere_is_named_as_the_draft_wrote_it():
    """The card shows the draft's own words, in the draft's order."""
    draft = "Refunds take 14 days and we give you €25 off."
    assert unsupported(draft, ["Refunds take 30 days."]) == ["14 days", "€25"]
    assert unsupported(draft, []) == ["14 days", "€25"]


def test_text_without_claims_has_nothing_to_flag():
    """Plain words and single digits are no claims."""
    assert unsupported("Thanks, I have passed this on to our 2 colleagues.", []) == []


def test_a_source_read_again_comes_from_the_cache_with_the_same_keys(monkeypatch):
    """The keys of a text read lately are kept (bounded, by a digest of the text):
    the same keys as a first reading, and a caller's set is its own to change."""
    from bot.context import grounding

    monkeypatch.setattr(grounding, "_cache", type(grounding._cache)())
    monkeypatch.setattr(grounding, "_CACHE_SIZE", 3)
    sources = ["Refunds take 14 days.", "Call +49 30 1234567 Mo-Fr 9-17 Uhr.", "On 12 March 2026."]
    first = grounding.source_keys(sources)
    first.add("num:999")
    again = grounding.source_keys(sources)
    assert "num:999" not in again
    assert again == {k for k in first if k != "num:999"}
    assert "wd:3" in again  # 12 March 2026 is a Thursday: derived after the union
    assert len(grounding._cache) == 3
    grounding.source_keys(["Order 4711.", "Order 4712."])
    assert len(grounding._cache) == 3  # the oldest out
    assert unsupported("within 14 days, order 4711", sources + ["Order 4711."]) == []


@pytest.mark.parametrize("text", ["1" * 8000, "1." * 4000, "1-" * 4000, "a-" * 4000,
                                  "a." * 4000, "1a-" * 2666, "a.b@" * 2000, "1/" * 4000],
                         ids=["digits", "digit-dots", "digit-hyphens", "letter-hyphens",
                              "letter-dots", "tokens", "at-signs", "slashes"])
def test_a_hostile_email_is_read_in_linear_time(text):
    """An email cut to max_input (8,000 characters) but made of one long run of digits,
    dots or hyphens once cost 1-24 s of CPU per draft (patterns retried from every
    position); each is now read in a few hundredths of a second. CPU time, not wall
    time, with a bound 10x above what it takes, so a busy machine does not fail it."""
    import time

    from bot.context.grounding import source_keys

    start = time.process_time()
    claims(text)
    source_keys([text + " "])  # another text: not the cache's
    assert time.process_time() - start < 1.0
