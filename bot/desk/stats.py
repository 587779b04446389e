"""The scoreboard as operators read it: the window an operator asks for (``30d``,
``8w``), and the text that the CLI, ``/stats`` and the digest print. The figures come
from :mod:`bot.scoreboard`; nothing here reads the store."""

from __future__ import annotations

import re
import time

from ..errors import ConfigError
from ..scoreboard import DAY, Figures, Scoreboard

#: The window when none is given.
DEFAULT_DAYS = 30
#: The longest window: a year and a bit (the store keeps what a year of decisions needs).
MAX_DAYS = 400
_WINDOW = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([dw]?)\s*$")


def parse_window(text: str) -> float:
    """``30d``, ``8w`` or ``14`` (days) -> days; ConfigError saying what is expected."""
    m = _WINDOW.match(text or "")
    days = float(m.group(1)) * (7 if m.group(2) == "w" else 1) if m else 0.0
    if not 0 < days <= MAX_DAYS:
        raise ConfigError(f"--since {text!r}: expected a window like 30d, 8w or 14 (days), "
                          f"more than 0 and at most {MAX_DAYS} days")
    return days


def _pct(x: float | None) -> str:
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
    edit = f" (median edit {_pct(f.edit_size_median)})" if f.edited else ""
    regen = "–" if f.regenerations_per_sent is None else f"{f.regenerations_per_sent:.2f}"
    return (f"decided {f.decided} · sent as drafted {_pct(f.as_drafted_share)} "
            f"({f.sent_as_drafted}/{f.sent}) · edited {f.edited}{edit} · "
            f"regenerations/sent {regen} · rejected {f.rejected} · "
            f"decision p50 {duration(f.decision_p50)} p90 {duration(f.decision_p90)} · "
            f"triage overridden {f.overridden}")


def claims_line(f: Figures) -> str:
    per = "–" if f.flagged_per_draft is None else f"{f.flagged_per_draft:.2f}"
    return f"unsupported claims {per}/draft ({f.flagged}), {f.flagged_sent} sent unchanged"


def _span(board: Scoreboard) -> str:
    days = (board.until - board.since) / DAY
    return (f"{days:g} days to {time.strftime('%d %b %H:%M UTC', time.gmtime(board.until))}")


def summary(board: Scoreboard) -> str:
    """A few lines: the whole window (what ``/stats`` puts beside its chart)."""
    head = f"📈 {board.pipeline or 'all pipelines'} · {_span(board)}"
    if not board.total.decided and not board.total.overridden:
        return f"{head}\nno draft decided in this window"
    return "\n".join([head, figures_line(board.total), claims_line(board.total)])


def report(board: Scoreboard) -> str:
    """The full text (``draftgate stats``): the summary, each pipeline, each operator,
    each week."""
    lines = [summary(board)]
    if len(board.pipelines) > 1:
        lines += ["", "by pipeline:"] + [f"  {name}: {figures_line(f)}"
                                         for name, f in board.pipelines.items()]
    if board.operators:
        lines += ["", "by operator (who decided):"] + [
            f"  {board.names.get(op, op)}: {figures_line(f)}" for op, f in board.operators.items()]
    lines += ["", "week of (UTC)  decided  sent  as drafted  edited  rejected  decision p50  p90"]
    for start, f in board.weeks:
        lines.append(f"{time.strftime('%d %b %Y', time.gmtime(start)):<13}  {f.decided:>7}  "
                     f"{f.sent:>4}  {_pct(f.as_drafted_share):>11}  {f.edited:>6}  "
                     f"{f.rejected:>8}  {duration(f.decision_p50):>12}  "
                     f"{duration(f.decision_p90):>6}")
    return "\n".join(lines)
