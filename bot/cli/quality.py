"""The quality loop's commands: `draftgate eval` (a configuration tried on past items,
writing nothing) and the style notes of `draftgate memory` (distill, notes)."""

from __future__ import annotations

import json
from pathlib import Path

from ..app import open_desk
from ..desk import eval_report
from ..desk.evaluate import DEFAULT_MAX_TOKENS, Budget, folder_items
from ..desk.operator import CONSOLE
from ..errors import ConfigError
from .common import load, options, say, text_argument
from .progress import Bar

EVAL_DESCRIPTION = (
    "Try a pipeline's configuration on the team's own history before it goes live: the "
    "newest N items the operators decided (a reply sent, or an FYI card dismissed), or the "
    "emails of --from DIR, go through triage, context and drafting as the configuration "
    "says; nothing is posted, sent, or written (no draft row, seen mark, audit row or token "
    "usage of the pipeline). Per item and in total: chrF of the new draft against the reply "
    "that was sent (0-100, as sacrebleu computes it), whether triage agrees with what the "
    "operators did, claims no source supports, tokens and, for models with a price "
    "(models.NAME.price: {input: 0.4, output: 1.6}, dollars per million tokens), the cost. "
    "--with FILE.yaml runs a second configuration (a pipeline file) on the same items and "
    "shows both side by side, with the items that got better and worse. A draft is given "
    "only the past replies sent before its item arrived, never the item's own. The tokens "
    "count against --max-tokens, never the pipeline's daily budget; when it is spent, eval "
    "stops and says how many items it evaluated. Progress on stderr.")


def add_cli(subparsers) -> None:
    p = subparsers.add_parser("eval", parents=options(json=True),
                              help="try a configuration on past items; writes nothing",
                              description=EVAL_DESCRIPTION)
    p.add_argument("pipeline", help="the pipeline whose items (and configuration) to use")
    p.add_argument("--items", type=int, default=20, metavar="N",
                   help="the newest N decided items (default 20)")
    p.add_argument("--from", dest="from_dir", metavar="DIR",
                   help="a folder of NAME.eml files instead, each with the reply the team "
                        "sent in NAME.reply.txt beside it (and optionally NAME.triage.txt: "
                        "reply, notify or skip, what triage should say)")
    p.add_argument("--with", dest="with_file", metavar="FILE.yaml",
                   help="a pipeline file with another configuration to compare (another "
                        "prompt, model, triage or context options; the deployment's models)")
    p.add_argument("--max-tokens", type=int, default=DEFAULT_MAX_TOKENS, metavar="N",
                   help=f"eval's own token budget (default {DEFAULT_MAX_TOKENS:,})")
    p.set_defaults(func=_eval)


async def _eval(args) -> int:
    from ..config.variant import load_variant
    from ..engine.build import build_model, build_triager

    text_argument("pipeline", args.pipeline)
    if args.items < 1:
        raise ConfigError("--items: expected a number of items of at least 1")
    if args.max_tokens < 1:
        raise ConfigError("--max-tokens: expected a number of tokens of at least 1")
    settings = load(args.config)
    configs = [settings.pipeline(args.pipeline)]
    if args.with_file:
        configs.append(load_variant(settings, args.with_file))
    for p in configs:  # a model or triage that cannot be built: said before any call
        build_model(p, settings, p.drafter.model)
        build_triager(p, settings)
    async with open_desk(settings) as desk:
        if args.from_dir:
            items = folder_items(Path(args.from_dir))[:args.items]
        else:
            items = await desk.eval_items(CONSOLE, args.pipeline, args.items)
        if not items:
            print(say(f"{args.pipeline}: no decided items yet (a reply sent or an FYI card "
                      f"dismissed); try --from DIR with emails and the replies sent"))
            return 1
        evaluation = await desk.evaluation(CONSOLE, args.pipeline)
        budget, bar = Budget(args.max_tokens), Bar()
        try:
            runs = await evaluation.run(configs, items, budget,
                                        lambda done, total: bar("eval", done, total))
        finally:
            await evaluation.close()
    stopped = None
    if len(runs[0].results) < len(items):
        stopped = (f"eval's token budget is spent ({budget.used:,} of {budget.limit:,} tokens; "
                   f"raise --max-tokens to evaluate more)")
    if args.json:
        print(json.dumps(eval_report.as_json(runs, items, stopped), indent=2))
    else:
        print(say(eval_report.format_text(runs, items, stopped)))
    return 0
