"""Read-only and operator commands: validate, status, pending, replay, sweep, review, doctor."""

from __future__ import annotations

import getpass
import json
from dataclasses import asdict

from . import ops
from .cli_common import existing_store, load, options, say
from .config import Settings
from .errors import ConfigError, DraftgateError


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
                "A failed, rejected, skipped or expired item goes back to queued; an item "
                "only seen loses its seen mark. Sent items are refused. Audited. Item ids: "
                "`draftgate status PIPELINE` lists the newest failed and skipped ones; "
                "`draftgate pending --json` shows item_id.")
    p.add_argument("pipeline")
    p.add_argument("item_id", help="the item id (Message-ID, slot, ...) as shown by "
                                   "`status PIPELINE` or `pending --json`")
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
    command("doctor", _doctor, "check the store, accounts, models and Telegram",
            "Check that the store opens, each Gmail account answers with the scopes its "
            "pipelines need, the endpoint of each model a pipeline uses answers (models no "
            "pipeline uses are not called), and the Telegram bot token works.")


def _actor() -> str:
    try:
        return f"cli:{getpass.getuser()}"
    except Exception:
        return "cli"


async def _validate(args) -> int:
    from . import scheduler
    from .build import check_all, missing_env
    from .config import collect_settings

    # Every problem in one pass: the stages of pipelines with errors of their own are
    # checked too, so fixing one typo does not reveal the next.
    settings, problems = collect_settings(args.config)
    if settings is not None:
        problems += [e for e in check_all(settings) + _not_folders(settings)
                     if e not in problems]
    if problems or settings is None:
        raise ConfigError(problems)
    print(f"{settings.file}: OK, {len(settings.pipelines)} pipeline(s)")
    for p in settings.pipelines:
        assert p.source is not None and p.sender is not None  # no problems: both were read
        print(f"  {p.name}: {scheduler.describe(p)}, source {p.source.type}, "
              f"drafter {p.drafter.model}, approval "
              f"{p.approval.channel}, sender {p.sender.type}, "
              f"recipe {p.recipe}"
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
    async with existing_store(settings) as store:
        if args.pipeline:
            detail = await ops.status_one(store, settings, args.pipeline)
            print(json.dumps(asdict(detail), indent=2) if args.json else ops.format_status_one(detail))
        else:
            items = await ops.status_all(store, settings)
            print(json.dumps([asdict(i) for i in items], indent=2) if args.json
                  else ops.format_status_all(items))
    return 0


async def _pending(args) -> int:
    settings = load(args.config)
    async with existing_store(settings) as store:
        drafts, total = await ops.pending_page(store, settings)
        if (args.all or args.json) and total > len(drafts):
            drafts, total = await ops.pending_page(store, settings, limit=total)
        holds = await ops.holds(store)
        if args.json:
            print(json.dumps([{"id": d.id, "key": d.key, "pipeline": d.pipeline,
                               "item_id": d.item_id, "status": d.status, "version": d.version,
                               "from": d.message.from_addr, "subject": d.message.subject,
                               "card": [d.approval_chat, d.approval_message_id],
                               "created_at": d.created_at,
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


def _text_argument(name: str, value: str) -> None:
    """A command-line value that is not valid UTF-8 arrives with surrogates in it and
    could never match a stored id; say so instead of failing inside the store."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        # Python decodes argv with surrogateescape: byte 0xNN became U+DCNN.
        bad = next((ord(c) - 0xDC00 for c in value if 0xDC80 <= ord(c) <= 0xDCFF), None)
        detail = f" (byte 0x{bad:02x} is not UTF-8)" if bad is not None else ""
        raise ConfigError(f"{name}: not valid text{detail}; copy it exactly as `draftgate "
                          f"pending` or `draftgate status` shows it") from None


async def _replay(args) -> int:
    _text_argument("pipeline", args.pipeline)
    _text_argument("item_id", args.item_id)
    settings = load(args.config)
    async with existing_store(settings) as store:
        result = await ops.replay(store, args.pipeline, args.item_id, _actor(), settings)
        print(ops.format_replay(args.pipeline, args.item_id, result))
        return 0 if result.outcome in ("requeued", "unseen") else 1


async def _sweep(args) -> int:
    settings = load(args.config)
    if args.days is not None and args.days < 0:
        raise ConfigError("--days: expected a number of days >= 0")
    async with existing_store(settings) as store:
        print(ops.format_sweep(await ops.sweep(store, settings, days=args.days)))
    return 0


async def _review(args) -> int:
    """Decide pending cards in the terminal."""
    from .approvals.console import ConsoleChannel
    from .engine import Engine

    settings = load(args.config)
    async with existing_store(settings) as store:
        console = ConsoleChannel(interactive=True)
        # Only the console: a Telegram pipeline's draft keeps its Telegram card (a new
        # version made here waits in ready; the running draftgate updates that card).
        engine = Engine(settings, store, {"console": console})
        await console.start(engine)
        mine = [d for d in await ops.pending(store, settings) if settings.has_pipeline(d.pipeline)]
        waiting = [d for d in mine if d.status == "awaiting"]
        # A send that failed or whose outcome is unknown: Retry, as the Telegram card
        # offers (it asks the other side first whether the reply arrived after all).
        unsent = [d for d in mine if d.status in ("send_failed", "send_unknown")]
        if not waiting and not unsent:
            print("nothing awaiting a decision")
        for d in waiting:
            await console.post(d)
            await console.ask(console.review, d)
        for d in unsent:
            await console.ask(console.review_send, d)
        await engine.wait_idle()  # a regenerated draft is shown and asked about now
        await engine.stop()
    return 0


async def _doctor(args) -> int:
    settings = load(args.config)
    results: list[tuple[str, bool, str]] = []
    try:
        async with existing_store(settings) as store:
            problems = await store.check()
        detail = ("; ".join(problems) + "; restore it from a backup or point `store:` "
                  "elsewhere") if problems else settings.store.split("@")[-1]
        results.append(("store", not problems, detail))
    except DraftgateError as exc:
        results.append(("store", False, str(exc)))
    from .approvals import telegram
    from .gmail import doctor as gmail

    for module, check in (("bot.gmail.doctor", gmail.check),
                          ("bot.approvals.telegram", telegram.doctor)):
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
    """One minimal request to each model endpoint that a pipeline uses."""
    from .build import build_drafter

    out: list[tuple[str, bool, str]] = []
    done: set[str] = set()
    for p in settings.pipelines:
        name = p.drafter.model
        if name in done:
            continue
        done.add(name)
        drafter = build_drafter(p, settings)
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


