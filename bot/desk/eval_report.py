"""What ``draftgate eval`` prints: per item and in total, one configuration or two side by
side (which items got better, which worse)."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from .chrf import corpus_chrf
from .evaluate import EvalItem, EvalRun, ItemResult

#: chrF points by which a configuration must beat the other on an item to count as
#: better there (smaller differences are noise of the sampling).
MARGIN = 1.0


def totals(run: EvalRun, items: list[EvalItem]) -> dict[str, Any]:
    """The run's figures over the items it evaluated."""
    sent = {i.item_id: i.sent for i in items if i.sent is not None}
    rs = run.results
    pairs = [(r.draft or "", sent[r.item_id]) for r in rs if r.item_id in sent]
    judged = [r for r in rs if r.triage_agrees is not None]
    costs = [r.cost for r in rs if r.tokens_in + r.tokens_out]
    return {
        "configuration": run.label, "model": run.model, "items": len(rs),
        "drafted": sum(r.draft is not None for r in rs),
        "errors": sum(r.error is not None for r in rs),
        # sacrebleu's corpus chrF (counts summed), and the mean of the items' scores
        "chrf": round(corpus_chrf(pairs), 2) if pairs else None,
        "chrf_mean": round(sum(r.chrf or 0.0 for r in rs if r.item_id in sent) / len(pairs), 2)
        if pairs else None,
        "triage_agreed": sum(bool(r.triage_agrees) for r in judged),
        "triage_judged": len(judged),
        "triage": any(r.triage is not None for r in rs),
        "unsupported_claims": sum(len(r.unsupported) for r in rs),
        "drafts_with_unsupported": sum(bool(r.unsupported) for r in rs),
        "tokens_in": sum(r.tokens_in for r in rs), "tokens_out": sum(r.tokens_out for r in rs),
        "cost": round(sum(c for c in costs if c is not None), 6)
        if costs and None not in costs else None,
    }


def compare(a: EvalRun, b: EvalRun) -> tuple[list[str], list[str]]:
    """The item ids where ``b`` is better than ``a`` by more than :data:`MARGIN` chrF
    points (or agrees with the operators where ``a`` did not), and where it is worse."""
    better, worse = [], []
    for ra, rb in zip(a.results, b.results, strict=False):
        delta = _delta(ra, rb)
        if delta > 0:
            better.append(ra.item_id)
        elif delta < 0:
            worse.append(ra.item_id)
    return better, worse


def _delta(ra: ItemResult, rb: ItemResult) -> int:
    if ra.chrf is not None and rb.chrf is not None and abs(rb.chrf - ra.chrf) > MARGIN:
        return 1 if rb.chrf > ra.chrf else -1
    if ra.triage_agrees is not None and rb.triage_agrees is not None:
        return int(rb.triage_agrees) - int(ra.triage_agrees)
    return 0


def as_json(runs: list[EvalRun], items: list[EvalItem], stopped: str | None) -> dict[str, Any]:
    out: dict[str, Any] = {"items_asked": len(items), "stopped": stopped,
                           "configurations": [{"totals": totals(r, items),
                                               "items": [asdict(x) for x in r.results]}
                                              for r in runs]}
    if len(runs) == 2:
        better, worse = compare(runs[0], runs[1])
        out["better"], out["worse"] = better, worse
    return out


def format_text(runs: list[EvalRun], items: list[EvalItem], stopped: str | None) -> str:
    lines: list[str] = []
    if len(runs) == 1:
        lines += [_item_line(r) for r in runs[0].results]
    else:
        lines += _side_by_side(runs[0], runs[1])
    lines.append("")
    for run in runs:
        lines.append(_totals_line(totals(run, items)))
    if len(runs) == 2:
        better, worse = compare(runs[0], runs[1])
        lines.append(f"better with {runs[1].label}: {len(better)} item(s)"
                     + (f": {', '.join(better)}" if better else ""))
        lines.append(f"worse with {runs[1].label}: {len(worse)} item(s)"
                     + (f": {', '.join(worse)}" if worse else ""))
    done = len(runs[0].results) if runs else 0
    if stopped:
        lines.append(f"⏸ stopped: {stopped}; {done} of {len(items)} item(s) evaluated")
    return "\n".join(lines)


def _figure(r: ItemResult) -> str:
    if r.error:
        return f"error: {r.error}"[:80]
    if r.draft is None:
        return f"not drafted (triage: {r.triage})"
    return "chrF " + ("-" if r.chrf is None else f"{r.chrf:5.1f}")


def _item_line(r: ItemResult) -> str:
    parts = [f"{r.item_id}  {_short(r.subject)}", _figure(r)]
    if r.triage is not None:
        parts.append(f"triage {r.triage}" + {True: " ✓", False: " ✗", None: ""}[r.triage_agrees])
    if r.unsupported:
        parts.append(f"unsupported: {', '.join(r.unsupported)}")
    parts.append(f"{r.tokens_in + r.tokens_out} tokens"
                 + ("" if r.cost is None else f" ${r.cost:.4f}"))
    return "  ".join(parts)


def _side_by_side(a: EvalRun, b: EvalRun) -> list[str]:
    lines = [f"item  |  {a.label}  |  {b.label}"]
    for ra, rb in zip(a.results, b.results, strict=False):
        mark = {1: "better", -1: "WORSE", 0: "same"}[_delta(ra, rb)]
        lines.append(f"{ra.item_id}  {_short(ra.subject)}  |  {_figure(ra)}  |  {_figure(rb)}"
                     f"  {mark}")
    return lines


def _totals_line(t: dict[str, Any]) -> str:
    chrf = "-" if t["chrf"] is None else f"{t['chrf']:.1f} (mean {t['chrf_mean']:.1f})"
    triage = (f", triage agreed {t['triage_agreed']}/{t['triage_judged']}"
              + ("" if t["triage"] else " (no triage: every email drafted)")
              if t["triage_judged"] else "")
    cost = "" if t["cost"] is None else f", ${t['cost']:.4f}"
    return (f"{t['configuration']} ({t['model']}): {t['items']} item(s), {t['drafted']} "
            f"drafted, chrF {chrf}{triage}, {t['unsupported_claims']} unsupported claim(s) in "
            f"{t['drafts_with_unsupported']} draft(s), {t['tokens_in'] + t['tokens_out']:,} "
            f"tokens ({t['tokens_in']:,} in, {t['tokens_out']:,} out){cost}"
            + (f", {t['errors']} error(s)" if t["errors"] else ""))


def _short(text: str, width: int = 40) -> str:
    line = " ".join((text or "").split())
    return line if len(line) <= width else line[:width - 1] + "…"
