"""``draftgate stats``: the scoreboard (how often the drafts are sent as written), read
through the operator desk."""

from __future__ import annotations

import json

from ..app import open_desk
from ..desk import stats
from ..desk.operator import CONSOLE
from .common import load, options, say, text_argument


def add_cli(subparsers) -> None:
    p = subparsers.add_parser(
        "stats", parents=options(json=True),
        help="the scoreboard: drafts sent as written, edits, rejections, time to decision",
        description="Per pipeline, per operator (who decided) and per week (Monday 00:00 "
                    "UTC) over a window (default 30 days): drafts decided; sent as first "
                    "drafted (no edit, no regenerate); edited, with the median edit size "
                    "(normalised character edit distance between the model's text and "
                    "what was sent); regenerations per sent reply; rejected; time from the "
                    "first card to the decision (p50, p90); triage overridden by an operator "
                    "(Draft a reply on an FYI card, /reply or replay of a skipped item); "
                    "unsupported claims flagged per draft and how many were sent unchanged. "
                    "/stats in Telegram answers with the same figures and a chart.")
    p.add_argument("pipeline", nargs="?", help="one pipeline (default: every pipeline)")
    p.add_argument("--since", default=f"{stats.DEFAULT_DAYS}d", metavar="WINDOW",
                   help=f"how far back: 30d, 8w or 14 (days); default {stats.DEFAULT_DAYS}d, "
                        f"at most {stats.MAX_DAYS}d")
    p.set_defaults(func=_stats)


async def _stats(args) -> int:
    if args.pipeline is not None:
        text_argument("pipeline", args.pipeline)
    days = stats.parse_window(args.since)
    settings = load(args.config)
    async with open_desk(settings) as desk:
        board = await desk.stats(CONSOLE, args.pipeline, days)
    if args.json:
        print(json.dumps(board.to_dict(), indent=2))
    else:
        print(say(stats.report(board)))
    return 0
