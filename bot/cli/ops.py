"""Read-only and operator commands: validate, status, pending, replay, emails, sweep, review,
doctor."""

from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict

from ..app import open_desk
from ..config.load import Settings
from ..desk import reports as ops
from ..desk.operator import CONSOLE
from ..errors import ConfigError, DraftgateError, StoreError
from ..models import public_used, unsupported_of, used_line
from ..redact import redact_url
from .common import load, options, say, text_argument


def add_cli(subparsers) -> None:
    """Register the operator commands, in the order `draftgate --help` lists them."""
    def command(name: str, func, help: str, description: str, *, json: bool = False):
        p = subparsers.add_parser(name, parents=options(json=json), help=help,
                                  description=description)
        p.set_defaults(func=func)
        return p

    command("validate", _validate, "check the configuration; print every error",
            "Load and check the deployment file and every pipeline file; exit 2 listing "
            "every problem.")
    command("status", _status, "one line per pipeline, or recent runs of one",
            "Without PIPELINE: one line per pipeline. With it: recent runs newest first, last "
            "green, first red after it, pending, seen count, tokens today, and the newest "
            "failed, skipped, expired and unsent items with their item ids and reasons (the "
            "ids `draftgate replay` takes).", json=True,
            ).add_argument("pipeline", nargs="?", help="pipeline name")
    command("pending", _pending, "drafts waiting for a decision",
            "Drafts not yet posted, awaiting a decision, approved or being sent, or whose "
            "send failed or has an unknown outcome, then those waiting to be drafted; the "
            f"first {ops.PENDING_PAGE} and how many more (--all: every one). --json lists "
            "every one and also gives each draft's item_id.", json=True,
            ).add_argument("--all", action="store_true", help="list every unfinished draft")
    p = command("replay", _replay, "send an item back through the pipeline",
                "A failed, rejected, skipped, dismissed or expired item goes back to queued "
                "and is drafted without triage; an item only seen loses its seen mark. Sent "
                "items are refused. Audited. Item ids: "
                "`draftgate status PIPELINE` lists the newest failed and skipped ones; "
                "`draftgate pending --json` shows item_id.")
    p.add_argument("pipeline")
    p.add_argument("item_id", help="the item id (Message-ID, slot, ...) as shown by "
                                   "`status PIPELINE` or `pending --json`")
    p = command("emails", _emails, "the newest admitted items of a pipeline, with ids",
                "The newest N admitted items of PIPELINE, newest first: draft number, status "
                "(a skip with its reason), subject and item id (what /reply and `replay` "
                "take), as /emails in Telegram. Audited.", json=True)
    p.add_argument("pipeline")
    p.add_argument("-n", type=int, default=10, help=f"how many (1 to {ops.MAX_EMAILS}, "
                                                    "default 10)")
    command("sweep", _sweep, "expire old seen marks, leases, approvals and runs",
            "Delete seen marks older than the TTL (--days, default sweep.seen_ttl_days, itself "
            "90 by default), return expired drafting leases to the queue, expire stale "
            "approvals if sweep.approval_ttl_days is set, prune old runs. Also runs on "
            "sweep.every inside `draftgate run`; that sweep and /sweep also update the "
            "Telegram cards of the approvals they expire, this command does not.",
            ).add_argument("--days", type=float, default=None,
                           help="seen-mark TTL in days (default: sweep.seen_ttl_days)")
    command("review", _review, "decide awaiting drafts in the terminal",
            "Show each draft awaiting a decision and approve, edit, regenerate or reject it "
            "from the terminal; then each reply whose send failed or is unknown, with Retry "
            "(for an unknown one it first checks again whether it arrived). A draft that also "
            "has a Telegram card keeps it: a new version made here is put on that card by the "
            "running draftgate; after Approve or Reject here the card keeps its buttons, and a "
            "tap on it says who decided. There is no operator allow-list here: whoever can "
            "run this with the configuration decides (audited with their user name).")
    _add_memory(subparsers)
    command("doctor", _doctor, "check the store, accounts, models and Telegram",
            "Check that the store opens, each Gmail account answers with the scopes its "
            "pipelines need, the endpoint of each model a pipeline uses answers (models no "
            "pipeline uses are not called), and the Telegram bot token works.")


def _add_memory(subparsers) -> None:
    memory = subparsers.add_parser(
        "memory", help="past replies used as examples; style notes learned from edits",
        description="Team memory: every sent reply is kept with its original email as an "
                    "example for drafting later emails of the same pipeline (drafter.examples). "
                    "`memory list` shows them, `memory forget` removes one item's. Style "
                    "notes: `memory distill` proposes rules learned from the team's edits, "
                    "`memory notes` lists them and forgets one.")
    verbs = memory.add_subparsers(dest="memory_command", metavar="VERB", required=True)
    listing = verbs.add_parser("list", parents=options(json=True), help="newest examples first",
                               description="The newest examples of PIPELINE: item id, when "
                                           "it was sent, edited or not, the start of the "
                                           "original and of the reply.")
    listing.add_argument("pipeline")
    listing.add_argument("--limit", type=int, default=20, help="how many (default 20)")
    listing.set_defaults(func=_memory_list)
    forget = verbs.add_parser("forget", parents=options(), help="remove one item's example",
                              description="Remove the example kept for ITEM_ID of PIPELINE, "
                                          "so no later draft is shown it. Audited.")
    forget.add_argument("pipeline")
    forget.add_argument("item_id", help="as `draftgate memory list PIPELINE` shows it")
    forget.set_defaults(func=_memory_forget)
    from .quality import add_memory_verbs

    add_memory_verbs(verbs)


async def _memory_list(args) -> int:
    text_argument("pipeline", args.pipeline)
    if args.limit < 1:
        raise ConfigError("--limit: expected a number of examples of at least 1")
    settings = load(args.config)
    async with open_desk(settings) as desk:
        examples = await desk.examples(CONSOLE, args.pipeline, args.limit)
    if args.json:
        print(json.dumps([asdict(e) for e in examples], indent=2))
        return 0
    if not examples:
        print(say(f"{args.pipeline}: no examples yet (each sent reply becomes one)"))
    for e in examples:
        print(say(f"{e.item_id}  {time.strftime('%d %b %Y %H:%M UTC', time.gmtime(e.sent_at))}{'  edited' if e.edited else ''}\n"
                  f"  » {_start(e.original)}\n  ↳ {_start(e.reply)}"))
    return 0


def _start(text: str) -> str:
    line = " ".join(text.split())
    return line if len(line) <= 100 else line[:99] + "…"


def _item_desk(args):
    """The operator desk, for a command on one item (``args.pipeline`` and
    ``args.item_id``, checked first)."""
    text_argument("pipeline", args.pipeline)
    text_argument("item_id", args.item_id)
    return open_desk(load(args.config))


async def _memory_forget(args) -> int:
    async with _item_desk(args) as desk:
        n = await desk.forget_example(CONSOLE, args.pipeline, args.item_id)
    print(say(f"{args.pipeline} {args.item_id}: " + (
        "example removed; later drafts no longer see it" if n else
        "no example kept for this item; `draftgate memory list PIPELINE` shows the item ids")))
    return 0 if n else 1


async def _validate(args) -> int:
    from .. import scheduler
    from ..config import knowledge
    from ..config.load import collect_settings
    from ..engine.build import check_all, missing_env

    # Every problem in one pass: the stages of pipelines with errors of their own are
    # checked too, so fixing one typo does not reveal the next.
    settings, problems = collect_settings(args.config)
    if settings is not None:
        problems += [e for e in check_all(settings) + _not_folders(settings)
                     + knowledge.problems(settings.pipelines) if e not in problems]
    if problems or settings is None:
        raise ConfigError(problems)
    print(f"{settings.file}: OK, {len(settings.pipelines)} pipeline(s)")
    for p in settings.pipelines:
        assert p.source is not None and p.sender is not None  # no problems: both were read
        print(f"  {p.name}: {scheduler.describe(p)}, source {p.source.type}, "
              f"drafter {p.drafter.model}, "
              + (f"triage {p.triage.model}, " if p.triage is not None else "") + "approval "
              f"{p.approval.channel}, sender {p.sender.type}, recipe {p.recipe}"
              + ("" if p.enabled else " (enabled: false)"))
    # Secrets may well live only on the machine that runs draftgate: a notice, not an
    # error, so validate stays usable anywhere; `run` refuses to start without them.
    unset = missing_env(settings, [p for p in settings.pipelines if p.enabled])
    unset += _not_folders(settings, missing=True)
    if unset:
        print(f"not set or not found here ({len(unset)}; `draftgate run` needs them):")
        for line in unset:
            print(f"  {line}")
    return 0


def _not_folders(settings: Settings, *, missing: bool = False) -> list[str]:
    """Maildir sources whose path is a file (an error), or with ``missing``, whose
    folder is not there (a notice, like an unset secret: the mail may live only on the
    machine that runs draftgate). Either way `run` would fail every tick."""
    out = []
    for p in settings.pipelines:
        path = getattr(p.source, "path", None)  # a maildir source's
        if getattr(p.source, "type", None) != "maildir" or not path or not p.enabled:
            continue
        found = p.path(path)
        if missing and not found.exists():
            out.append(f"{p.file}: source.path: folder not found: {path} (looked for {found})")
        elif not missing and found.exists() and not found.is_dir():
            out.append(f"{p.file}: source.path: {path} is a file ({found}); expected the "
                       f"folder of .eml files or the Maildir")
    return out


async def _status(args) -> int:
    settings = load(args.config)
    from ..service.observe import held_by_service

    # The running service knows whether the store is unreachable (its /healthz); a
    # store that still answers reads (a full SQLite disk) would not tell.
    if held := await held_by_service(settings):
        print(f"⏸ held: {held}", file=sys.stderr if args.json else sys.stdout, flush=True)
    try:
        return await _print_status(args, settings)
    except StoreError:
        if held:
            return 1  # said above, with the time it began
        raise


async def _print_status(args, settings: Settings) -> int:
    async with open_desk(settings) as desk:
        if args.pipeline:
            detail = await desk.status_of(CONSOLE, args.pipeline)
            print(json.dumps(asdict(detail), indent=2) if args.json else ops.format_status_one(detail))
        else:
            items = await desk.status(CONSOLE)
            print(json.dumps([asdict(i) for i in items], indent=2) if args.json
                  else ops.format_status_all(items))
    return 0


async def _pending(args) -> int:
    settings = load(args.config)
    async with open_desk(settings) as desk:
        drafts, total = await desk.pending(CONSOLE, None if args.all or args.json else
                                           ops.PENDING_PAGE)
        holds = await desk.holds(CONSOLE)
        if args.json:
            print(json.dumps([{"id": d.id, "key": d.key, "pipeline": d.pipeline,
                               "item_id": d.item_id, "status": d.status, "version": d.version,
                               "from": d.message.from_addr, "subject": d.message.subject,
                               "card": [d.approval_chat, d.approval_message_id],
                               "created_at": d.created_at, "send_after": d.send_after,
                               "triage": d.triage, "triage_reason": d.triage_reason,
                               "used": public_used(d.used), "used_line": used_line(d.used),
                               "unsupported": unsupported_of(d.used),
                               "configured": settings.has_pipeline(d.pipeline),
                               "held": holds.get(d.pipeline) if d.status == "queued" else None}
                              for d in drafts], indent=2))
        else:
            print(ops.format_pending(drafts, settings))
            if more := ops.more_line(len(drafts), total):
                print(more)
            for name, reason in sorted(holds.items()):
                print(f"⚠ {name}: drafting held: {reason}")
    return 0


async def _replay(args) -> int:
    async with _item_desk(args) as desk:
        result = await desk.replay(CONSOLE, args.pipeline, args.item_id)
        print(ops.format_replay(args.pipeline, args.item_id, result))
        return 0 if result.outcome in ("requeued", "unseen") else 1


async def _emails(args) -> int:
    text_argument("pipeline", args.pipeline)
    if not 1 <= args.n <= ops.MAX_EMAILS:
        raise ConfigError(f"-n: expected a number of items from 1 to {ops.MAX_EMAILS}, "
                          f"got {args.n}")
    settings = load(args.config)
    async with open_desk(settings) as desk:
        found = await desk.emails(CONSOLE, args.pipeline, args.n)
    if args.json:
        print(json.dumps([{"id": d.id, "item_id": d.item_id, "status": d.status,
                           "reason": d.error if d.status == "skipped" else None,
                           "subject": d.message.subject, "from": d.message.from_addr,
                           "created_at": d.created_at} for d in found], indent=2))
    else:
        print(ops.format_emails(args.pipeline, found))
    return 0


async def _sweep(args) -> int:
    settings = load(args.config)
    if args.days is not None and args.days < 0:
        raise ConfigError("--days: expected a number of days >= 0")
    async with open_desk(settings) as desk:
        print(ops.format_sweep(await desk.sweep(CONSOLE, days=args.days)))
    return 0


async def _review(args) -> int:
    """Decide pending cards in the terminal, as the host's console (one identity, whoever
    runs it; it decides only pipelines whose ``approval.console`` allows it)."""
    from ..app import App, channels
    from ..approvals.console import ConsoleChannel

    settings = load(args.config)
    console = ConsoleChannel(interactive=True)
    # Only the console: a Telegram pipeline's draft keeps its Telegram card (a new
    # version made here waits in ready; the running draftgate updates that card).
    app = App(settings, channels(settings, console=console), create=False)
    await app.open()
    try:
        await app.start()
        await _review_all(console, app.desk, settings)
        await app.desk.wait_idle()  # a regenerated draft is shown and asked about now
    finally:
        await app.close()
    return 0


async def _review_all(console, desk, settings: Settings) -> None:
    drafts, _ = await desk.pending(CONSOLE, None)
    mine = [d for d in drafts if settings.has_pipeline(d.pipeline)]
    waiting = [d for d in mine if d.status == "awaiting"]
    fyi = [d for d in mine if d.status == "notified"]  # triage said notify
    # A send that failed or whose outcome is unknown: Retry, as the Telegram card
    # offers (it asks the other side first whether the reply arrived after all).
    unsent = [d for d in mine if d.status in ("send_failed", "send_unknown")]
    if not waiting and not unsent and not fyi:
        print("nothing awaiting a decision")
    for d in waiting:
        await console.post(d)
        await console.ask(console.review, d)
    for d in fyi:
        await console.post(d)
        await console.ask(console.review_fyi, d)
    for d in unsent:
        await console.ask(console.review_send, d)


async def _doctor(args) -> int:
    settings = load(args.config)
    results: list[tuple[str, bool, str]] = []
    try:
        async with open_desk(settings) as desk:
            problems = await desk.check_store(CONSOLE)
        detail = ("; ".join(problems) + "; restore it from a backup or point `store:` "
                  "elsewhere") if problems else redact_url(settings.store)
        results.append(("store", not problems, detail))
    except DraftgateError as exc:
        results.append(("store", False, str(exc)))
    from ..approvals.telegram import doctor as telegram
    from ..gmail import doctor as gmail
    from ..imap import doctor as imap
    from ..microsoft import doctor as microsoft

    for module, check in (("bot.gmail.doctor", gmail.check), ("bot.imap.doctor", imap.check),
                          ("bot.microsoft.doctor", microsoft.check),
                          ("bot.approvals.telegram.doctor", telegram.doctor)):
        try:
            results.extend(await check(settings))
        except Exception as exc:
            results.append((module, False, str(exc)))
    results.extend(await _doctor_models(settings))
    width = max(len(n) for n, _, _ in results)
    for name, ok, detail in results:
        print(f"{'✅' if ok else '❌'} {name:<{width}}  {say(str(detail))}")
    return 0 if all(ok for _, ok, _ in results) else 1


async def _doctor_models(settings: Settings) -> list[tuple[str, bool, str]]:
    """One minimal request to each model endpoint that a pipeline uses (to draft or to
    triage)."""
    from ..engine.build import build_model

    out: list[tuple[str, bool, str]] = []
    done: set[str] = set()
    used = [(p, p.drafter.model) for p in settings.pipelines]
    used += [(p, p.triage.model) for p in settings.pipelines if p.triage is not None]
    for p, name in used:
        if name in done:
            continue
        done.add(name)
        drafter = build_model(p, settings, name)
        ping = getattr(drafter, "ping", None)
        if ping is None:
            out.append((f"model {name}", True, "offline template drafter"))
            continue
        try:
            out.append((f"model {name}", True, await ping()))
        except Exception as exc:
            out.append((f"model {name}", False, str(exc)))
        finally:
            await drafter.close()
    return out


