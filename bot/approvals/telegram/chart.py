"""The chart ``/stats`` sends: a PNG of WIDTH x HEIGHT pixels (README "Scoreboard").

Top: each week's drafts decided (bars) and the share sent as first drafted (line, 0-100 %).
Bottom: each week's time from card to decision, p50 and p90, in hours.

matplotlib is imported here, when a chart is drawn, never at start (``draftgate
status`` does not pay for it), and drawn on its Agg canvas through the object API
(no pyplot, no global figure state), so :func:`render` may run in a worker thread
(``asyncio.to_thread``) while the event loop answers taps.
"""

from __future__ import annotations

import io
import time

from ...scoreboard import Scoreboard

WIDTH, HEIGHT, DPI = 1200, 800, 100


def render(board: Scoreboard) -> bytes:
    """The chart of ``board`` as PNG bytes, WIDTH x HEIGHT pixels."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(WIDTH / DPI, HEIGHT / DPI), dpi=DPI)
    FigureCanvasAgg(fig)
    top, bottom = fig.subplots(2, 1, sharex=True)
    labels = [time.strftime("%d %b", time.gmtime(start)) for start, _ in board.weeks]
    xs = list(range(len(labels)))
    decided = [f.decided for _, f in board.weeks]
    share = [None if f.as_drafted_share is None else f.as_drafted_share * 100
             for _, f in board.weeks]
    top.bar(xs, decided, color="#9ecae1", label="decided")
    top.set_ylabel("drafts decided")
    top.set_title(f"{board.pipeline or 'all pipelines'}: "
                  f"{(board.until - board.since) / 86400:g} days by week (UTC)")
    right = top.twinx()
    right.plot(xs, [float("nan") if s is None else s for s in share], color="#d62728",
               marker="o", label="sent as drafted")
    right.set_ylim(0, 100)
    right.set_ylabel("sent as drafted (%)")
    handles = top.get_legend_handles_labels()[0] + right.get_legend_handles_labels()[0]
    top.legend(handles, ["decided", "sent as drafted %"], loc="upper left")
    for q, color in (("decision_p50", "#2ca02c"), ("decision_p90", "#ff7f0e")):
        hours = [float("nan") if getattr(f, q) is None else getattr(f, q) / 3600
                 for _, f in board.weeks]
        bottom.plot(xs, hours, marker="o", color=color, label=q.replace("decision_", ""))
    bottom.set_ylabel("card to decision (hours)")
    bottom.set_ylim(bottom=0)
    bottom.legend(loc="upper left")
    bottom.set_xticks(xs, labels)
    bottom.set_xlabel("week of")
    fig.tight_layout()
    out = io.BytesIO()
    fig.savefig(out, format="png", dpi=DPI)
    return out.getvalue()
