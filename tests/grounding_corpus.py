"""The grounding corpus (tests/corpus_grounding/cases.yaml) and its figures, shared by
tests/test_grounding.py and scripts/eval_grounding."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import yaml

from bot.context.grounding import claims, unsupported

CASES = Path(__file__).parent / "corpus_grounding" / "cases.yaml"


def load_cases() -> list[dict]:
    return yaml.safe_load(CASES.read_text(encoding="utf-8"))


@dataclass
class Figures:
    cases: int = 0
    supported: int = 0  # claims of the drafts that their sources support
    wrongly_flagged: int = 0
    unsupported: int = 0  # claims the corpus says no source supports
    missed: int = 0
    differences: list[str] = field(default_factory=list)

    @property
    def wrongly_flagged_share(self) -> float:
        return self.wrongly_flagged / max(1, self.supported)

    @property
    def missed_share(self) -> float:
        return self.missed / max(1, self.unsupported)


def evaluate(cases: list[dict]) -> Figures:
    f = Figures(cases=len(cases))
    for c in cases:
        want = {w.lower() for w in c["unsupported"]}
        got = {g.lower() for g in unsupported(c["draft"], c["sources"])}
        f.supported += max(0, len(claims(c["draft"])) - len(want))
        f.unsupported += len(want)
        f.wrongly_flagged += len(got - want)
        f.missed += len(want - got)
        if got != want:
            f.differences.append(f"{c['draft']!r}: flagged {sorted(got)}, "
                                 f"expected {sorted(want)}")
    return f
