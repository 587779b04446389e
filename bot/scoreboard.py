"""The scoreboard (issue 25): how often operators send the drafts as written, read from
the decisions the store keeps. Pure: the store gives the rows
(:meth:`bot.store.Store.quality`), this module counts them, so the desk, the digest
and ``/metrics`` give the same figures.

A draft counts in the week and the window of its decision (``decided_at``: approved or
rejected), under the operator who decided it; an override of the triage counts when
and under whom it happened. Definitions (README "Scoreboard"):

* *sent as drafted*: sent with no edit and no regenerate (the first version went out);
* *edited*: sent after at least one edit; its *edit size* is the normalised character
  edit distance (Levenshtein distance / length of the longer text, 0 to 1) between the
  text the model drafted (its first version, or after a regenerate the newest one the
  operators edited) and the text sent;
* *regenerations per sent*: regenerations (and re-drafts by /reply or replay) of the
  drafts sent, per draft sent;
* *time to decision*: from the draft's first card to the decision (p50, p90: nearest
  rank);
* *flagged*: claims the grounding check found in no source, on the first version of
  each decided draft; *flagged sent*: those still in the text that was sent.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any, Iterable, NamedTuple

from .models import Status, operator_id

WEEK = 7 * 86400.0
DAY = 86400.0
#: Statuses of a draft an operator approved (sent, or on its way).
APPROVED = (Status.APPROVED, Status.SENDING, Status.SENT, Status.SEND_FAILED,
            Status.SEND_UNKNOWN)
DECIDED = (*APPROVED, Status.REJECTED)


class Decision(NamedTuple):
    """One decided draft, as the store gives it (a tuple: a month is ~10k of them)."""

    pipeline: str
    decided_by: str
    status: str
    decided_at: float
    posted_at: float | None
    edits: int
    regenerations: int
    flagged: int  # unsupported claims of its first version
    unsupported: int  # ... of the version decided
    size: float | None = None  # edited and sent: its edit size (:func:`edit_size`)


class Override(NamedTuple):
    """A triage answered by an operator (Draft a reply on an FYI; /reply or replay of a
    skipped item)."""

    pipeline: str
    by: str
    at: float


@dataclass
class Figures:
    """The scoreboard's numbers for one slice (a pipeline, an operator, a week)."""

    decided: int = 0
    sent: int = 0
    sent_as_drafted: int = 0
    edited: int = 0
    edit_size_median: float | None = None
    regenerations: int = 0  # of the drafts sent
    regenerations_per_sent: float | None = None
    rejected: int = 0
    decision_p50: float | None = None  # seconds from first card to decision
    decision_p90: float | None = None
    overridden: int = 0
    flagged: int = 0
    flagged_per_draft: float | None = None
    flagged_sent: int = 0

    @property
    def as_drafted_share(self) -> float | None:
        """Sent as drafted / sent (None: nothing sent)."""
        return self.sent_as_drafted / self.sent if self.sent else None

    def to_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "as_drafted_share": self.as_drafted_share}


@dataclass
class Scoreboard:
    since: float
    until: float
    pipeline: str | None  # None: every pipeline
    total: Figures
    pipelines: dict[str, Figures] = field(default_factory=dict)
    operators: dict[str, Figures] = field(default_factory=dict)  # by operator id ("tg:42")
    names: dict[str, str] = field(default_factory=dict)  # operator id -> actor as recorded
    weeks: list[tuple[float, Figures]] = field(default_factory=list)  # (Monday 00:00 UTC, ...)

    def to_dict(self) -> dict[str, Any]:
        return {"since": self.since, "until": self.until, "pipeline": self.pipeline,
                "total": self.total.to_dict(),
                "pipelines": {k: v.to_dict() for k, v in self.pipelines.items()},
                "operators": {k: {"name": self.names.get(k, k), **v.to_dict()}
                              for k, v in self.operators.items()},
                "weeks": [{"week": _day(w), "start": w, **f.to_dict()} for w, f in self.weeks]}


def edit_size(first: str, sent: str) -> float:
    """Normalised character edit distance: 0 (the same text) to 1 (nothing in common)."""
    from rapidfuzz.distance import Levenshtein  # C, bit-parallel; imported where used

    return float(Levenshtein.normalized_distance(first, sent))


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile ``q`` (0-1) of ``values``; None for none."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def figures(decisions: Iterable[Decision], overrides: Iterable[Override]) -> Figures:
    """Count one slice's decisions and overrides."""
    f = Figures()
    waits: list[float] = []
    sizes: list[float] = []
    for d in decisions:
        f.decided += 1
        f.flagged += d.flagged
        if d.posted_at is not None and d.decided_at >= d.posted_at:
            waits.append(d.decided_at - d.posted_at)
        if d.status == Status.REJECTED:
            f.rejected += 1
        if d.status != Status.SENT:
            continue
        f.sent += 1
        f.regenerations += d.regenerations
        f.flagged_sent += d.unsupported
        if d.edits:
            f.edited += 1
            if d.size is not None:
                sizes.append(d.size)
        elif not d.regenerations:
            f.sent_as_drafted += 1
    f.overridden = sum(1 for _ in overrides)
    f.edit_size_median = statistics.median(sizes) if sizes else None
    f.regenerations_per_sent = f.regenerations / f.sent if f.sent else None
    f.flagged_per_draft = f.flagged / f.decided if f.decided else None
    f.decision_p50, f.decision_p90 = percentile(waits, 0.5), percentile(waits, 0.9)
    return f


def week_start(t: float) -> float:
    """Monday 00:00 UTC of the week holding ``t``."""
    day = datetime.fromtimestamp(t, timezone.utc).replace(hour=0, minute=0, second=0,
                                                          microsecond=0)
    return (day - timedelta(days=day.weekday())).timestamp()


def _day(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%d")


def build(decisions: list[Decision], overrides: list[Override], *, since: float,
          until: float, pipeline: str | None = None) -> Scoreboard:
    """The scoreboard of ``[since, until)``: in total, per pipeline, per operator and
    per week (Monday 00:00 UTC; the first and last may be partial). One pass sorts the
    rows into their slices (a month is ~10k rows: no slice scans them all again)."""
    first = week_start(since)
    slices: dict[tuple[str, Any], tuple[list, list]] = {}
    kept: tuple[list, list] = ([], [])
    ops: dict[str, str] = {}  # actor as recorded -> operator id
    latest: dict[str, float] = {}  # actor as recorded -> its newest row
    sources: tuple[tuple[int, list[Any], int], ...] = ((0, decisions, 3), (1, overrides, 2))
    for which, rows, at_index in sources:
        for row in rows:
            at = row[at_index]
            if not since <= at < until:
                continue
            actor = row[1]
            if (op := ops.get(actor)) is None:
                op = ops[actor] = operator_id(actor)
            if at > latest.get(actor, -1.0):
                latest[actor] = at
            kept[which].append(row)
            week: Any = int((at - first) // WEEK)
            for key in (("p", row[0]), ("o", op), ("w", week)):
                if (found := slices.get(key)) is None:
                    found = slices[key] = ([], [])
                found[which].append(row)
    names = {ops[a]: a for a, _ in sorted(latest.items(), key=lambda kv: kv[1])}
    board = Scoreboard(since, until, pipeline, figures(*kept), names=dict(sorted(names.items())))
    for kind, target in (("p", board.pipelines), ("o", board.operators)):
        for key in sorted(k for k in slices if k[0] == kind):
            target[key[1]] = figures(*slices[key])
    weeks = max(1, math.ceil((until - first) / WEEK))
    board.weeks = [(first + i * WEEK, figures(*slices.get(("w", i), ([], []))))
                   for i in range(weeks)]
    return board


# -- as text (the CLI, /stats, the digest) ----------------------------------------------
def pct(x: float | None) -> str:
    return "–" if x is None else f"{x * 100:.0f}%"


def duration(seconds: float | None) -> str:
    """``45s``, ``12m``, ``3h 10m``, ``2d 4h``; ``–`` for none."""
    if seconds is None:
        return "–"
    s = int(round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m"
    if s < 86400:
        return f"{s // 3600}h {s % 3600 // 60:02d}m"
    return f"{s // 86400}d {s % 86400 // 3600}h"


def figures_line(f: Figures) -> str:
    """The one line of a slice: the digest's, and each line of the summary."""
    edit = f" (median edit {pct(f.edit_size_median)})" if f.edited else ""
    regen = "–" if f.regenerations_per_sent is None else f"{f.regenerations_per_sent:.2f}"
    return (f"decided {f.decided} · sent as drafted {pct(f.as_drafted_share)} "
            f"({f.sent_as_drafted}/{f.sent}) · edited {f.edited}{edit} · "
            f"regenerations/sent {regen} · rejected {f.rejected} · "
            f"decision p50 {duration(f.decision_p50)} p90 {duration(f.decision_p90)} · "
            f"triage overridden {f.overridden}")


def claims_line(f: Figures) -> str:
    per = "–" if f.flagged_per_draft is None else f"{f.flagged_per_draft:.2f}"
    return f"unsupported claims {per}/draft ({f.flagged}), {f.flagged_sent} sent unchanged"
