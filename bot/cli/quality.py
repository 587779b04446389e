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


def add_memory_verbs(verbs) -> None:
    """`memory distill` and `memory notes`, beside `memory list` and `memory forget`."""
    distill = verbs.add_parser(
        "distill", parents=options(), help="propose style notes learned from the team's edits",
        description="Ask the pipeline's model to turn the team's recent edits (pairs of the "
                    "model's first draft and the reply an operator sent instead; at least 5) "
                    "into at most 10 short style rules. They are a proposal: the running "
                    "draftgate posts them as a card in the pipeline's Telegram approvals chat "
                    "at its next tick (Approve / Edit / Reject); only approved rules are added "
                    "to the drafter's instructions, for this pipeline only. Pipelines with "
                    "console approvals: `memory notes PIPELINE --approve V`. With "
                    "style_notes: weekly in the pipeline, draftgate run does this once a week. "
                    "Audited; its tokens count in the pipeline's daily usage.")
    distill.add_argument("pipeline")
    distill.set_defaults(func=_distill)
    notes = verbs.add_parser(
        "notes", parents=options(json=True), help="list a pipeline's style notes; forget one",
        description="The versions of PIPELINE's style notes, newest first, with their status "
                    "(proposed, approved: the one drafts are given, rejected, superseded) and "
                    "who decided. --forget N drops rule N of the approved version (a new "
                    "version without it; audited). --approve V / --reject V decide a proposed "
                    "version from the terminal, as the console (pipelines whose approval.console "
                    "allows it).")
    notes.add_argument("pipeline")
    group = notes.add_mutually_exclusive_group()
    group.add_argument("--forget", type=int, metavar="N", help="drop rule N of the approved version")
    group.add_argument("--approve", type=int, metavar="V", help="approve proposed version V")
    group.add_argument("--reject", type=int, metavar="V", help="reject proposed version V")
    notes.set_defaults(func=_notes)


async def _distill(args) -> int:
    text_argument("pipeline", args.pipeline)
    settings = load(args.config)
    async with open_desk(settings) as desk:
        notes = await desk.distill_notes(CONSOLE, args.pipeline)
    where = ("the running draftgate posts the card for approval at the pipeline's next tick"
             if settings.pipeline(args.pipeline).approval.channel == "telegram" else
             f"approve them with `draftgate memory notes {args.pipeline} --approve "
             f"{notes.version}`")
    print(say(f"{args.pipeline}: style notes v{notes.version} proposed ({len(notes.rules)} "
              f"rule(s)); {where}. Nothing reaches a draft before an operator approves."))
    for i, rule in enumerate(notes.rules, 1):
        print(say(f"  {i}. {rule}"))
    return 0


async def _notes(args) -> int:
    from dataclasses import asdict

    text_argument("pipeline", args.pipeline)
    settings = load(args.config)
    async with open_desk(settings) as desk:
        if args.forget is not None:
            after = await desk.forget_note(CONSOLE, args.pipeline, args.forget)
            print(say(f"{args.pipeline}: rule {args.forget} dropped; v{after.version} is in use"
                      if after else f"{args.pipeline}: no rule {args.forget} in the approved "
                      f"version; `draftgate memory notes {args.pipeline}` lists them"))
            return 0 if after else 1
        if args.approve is not None or args.reject is not None:
            return await _decide(desk, args)
        versions = await desk.style_notes(CONSOLE, args.pipeline)
    if args.json:
        print(json.dumps([asdict(v) for v in versions], indent=2))
        return 0
    if not versions:
        print(say(f"{args.pipeline}: no style notes yet (`draftgate memory distill "
                  f"{args.pipeline}` proposes some)"))
    for v in versions:
        who = f" by {v.decided_by}" if v.decided_by else ""
        print(say(f"v{v.version}  {v.status}{who}"))
        for i, rule in enumerate(v.rules, 1):
            print(say(f"  {i}. {rule}"))
    return 0


async def _decide(desk, args) -> int:
    version = args.approve if args.approve is not None else args.reject
    decision = "approved" if args.approve is not None else "rejected"
    found = [v for v in await desk.style_notes(CONSOLE, args.pipeline) if v.version == version]
    after = await desk.decide_notes(CONSOLE, found[0].id, decision) if found else None
    print(say(f"{args.pipeline}: style notes v{version} {decision}" if after else
              f"{args.pipeline}: no proposed version v{version}; `draftgate memory notes "
              f"{args.pipeline}` lists them"))
    return 0 if after else 1
