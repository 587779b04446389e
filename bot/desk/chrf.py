"""chrF, the character n-gram F-score (Popović 2015), computed exactly as sacrebleu 2.x
computes it with its defaults (``sacrebleu.metrics.CHRF()``: character n-grams of 1 to
6, no word n-grams, beta 2, whitespace removed, no epsilon smoothing), without the
dependency. ``tests/test_eval.py`` checks it against figures sacrebleu 2.6.0 printed.

Per order n: precision and recall of the hypothesis' n-grams against the reference's
(counts clipped); the orders where both texts have n-grams are averaged, then
``F = (1 + beta²) P R / (beta² P + R)``, as a score from 0 to 100. A corpus score sums
the counts of every pair first (sacrebleu's ``corpus_score``), so it is not the mean
of the per-pair scores.
"""

from __future__ import annotations

from collections import Counter

ORDER = 6
BETA = 2.0


def stats(hypothesis: str, reference: str) -> list[int]:
    """Per order 1..6: hypothesis n-grams, reference n-grams, matches (18 counts)."""
    hyp, ref = "".join(hypothesis.split()), "".join(reference.split())
    out: list[int] = []
    for n in range(1, ORDER + 1):
        h = Counter(hyp[i:i + n] for i in range(len(hyp) - n + 1))
        r = Counter(ref[i:i + n] for i in range(len(ref) - n + 1))
        out += [sum(h.values()), sum(r.values()), sum((h & r).values())]
    return out


def score(counts: list[int]) -> float:
    """chrF (0 to 100) of summed :func:`stats`."""
    factor = BETA ** 2
    precision = recall = 0.0
    orders = 0
    for i in range(ORDER):
        n_hyp, n_ref, n_match = counts[3 * i:3 * i + 3]
        if n_hyp > 0 and n_ref > 0:
            precision += n_match / n_hyp
            recall += n_match / n_ref
            orders += 1
    if orders == 0:
        return 0.0
    precision, recall = precision / orders, recall / orders
    if precision + recall == 0:
        return 0.0
    return 100 * (1 + factor) * precision * recall / (factor * precision + recall)


def chrf(hypothesis: str, reference: str) -> float:
    """The sentence-level chrF of ``hypothesis`` against ``reference``."""
    return score(stats(hypothesis, reference))


def corpus_chrf(pairs: list[tuple[str, str]]) -> float:
    """chrF of many (hypothesis, reference) pairs, their counts summed."""
    total = [0] * (3 * ORDER)
    for hypothesis, reference in pairs:
        total = [a + b for a, b in zip(total, stats(hypothesis, reference), strict=True)]
    return score(total)
