"""The scoreboard as operators read it: the window an operator asks for (``30d``,
``8w``), and the text that the CLI, ``/stats`` and the digest print. The figures come
from :mod:`bot.scoreboard`; nothing here reads the store."""

from __future__ import annotations

import re
import time

from ..errors import ConfigError
from ..scoreboard import DAY, Scoreboard, claims_line, duration, figures_line, pct

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
                     f"{f.sent:>4}  {pct(f.as_drafted_share):>11}  {f.edited:>6}  "
                     f"{f.rejected:>8}  {duration(f.decision_p50):>12}  "
                     f"{duration(f.decision_p90):>6}")
    return "\n".join(lines)
