"""`draftgate demo`: the offline demo (or an outbox-only configuration), auto-approved."""

from __future__ import annotations

import contextlib
import email.policy
import shutil
import sys
from dataclasses import replace
from pathlib import Path

from ..config.load import Settings
from ..config.options import OutboxSenderOptions, expect
from ..desk import reports as ops
from ..errors import ConfigError
from ..redact import redact_url
from .common import REPO, load, options, say

DEMO_CONFIG = REPO / "draftgate.demo.yaml"
#: Marks a store (audit row) and an outbox (file) as the demo's own: `demo -c FILE`
#: auto-approves only into state that the demo itself created.
DEMO_MARK = "demo|own-state"
DEMO_OUTBOX_MARK = ".draftgate-demo"


def add_cli(subparsers) -> None:
    """Register `demo`."""
    p = subparsers.add_parser(
        "demo", parents=options(config=None),
        help="offline demo: sample inbox, template drafter, auto-approval",
        description="Run the demo pipeline twice against the sample inbox in demo/inbox "
                    "(SQLite, template drafter, DEMO auto-approval, replies written to "
                    "var/demo/outbox), then print status. With -c FILE, demo runs another "
                    "configuration only if every pipeline's sender is outbox and its store and "
                    "outbox folders are new or were made by the demo: demo approves by itself, "
                    "so it never writes into a real deployment's state. Logs only warnings (-v "
                    "for more).")
    p.add_argument("--fresh", action="store_true",
                   help="delete the bundled demo's state (var/demo) first")
    p.set_defaults(func=_demo)


#: Where a wheel carries the demo and the examples (setup.py copies them in).
BUNDLED = Path(__file__).resolve().parents[1] / "_bundled"
#: The folder an installed draftgate copies them to, in the current folder.
COPIED = "draftgate-demo"


def _demo_config() -> Path:
    """The bundled demo's file: beside the package in a checkout, or in the current
    folder (a checkout, or a copy made before); else, for an installed draftgate, the
    package's own copy is copied to ./draftgate-demo (with the example pipelines and
    prompts) and used from there, so the demo's state never goes into the package."""
    for folder in (REPO, Path.cwd(), Path.cwd() / COPIED):
        if (folder / DEMO_CONFIG.name).is_file():
            return folder / DEMO_CONFIG.name
    if (BUNDLED / DEMO_CONFIG.name).is_file():
        target = Path.cwd() / COPIED
        shutil.copytree(BUNDLED, target, dirs_exist_ok=True)
        print(f"(copied the demo and the example pipelines to {target}; edit them there)")
        return target / DEMO_CONFIG.name
    raise ConfigError(f"{DEMO_CONFIG.name} not found beside the installed package nor in "
                      f"{Path.cwd()}: run `draftgate demo` in the draftgate checkout, or pass "
                      f"-c FILE")


async def _foreign_demo_state(settings: Settings) -> list[str]:
    """What `demo -c FILE` would auto-approve into that the demo did not create: an
    existing store or outbox folder of a real deployment, which may feed a mail relay."""
    from ..app import StoreMissing, open_desk

    found = []
    with contextlib.suppress(StoreMissing):  # a new store: the demo creates and marks it
        async with open_desk(settings) as desk:
            if not await desk.marked(DEMO_MARK):
                found.append(f"store {redact_url(settings.store)} exists and was not "
                             f"created by the demo")
    for p in settings.pipelines:
        folder = settings.resolve(getattr(p.sender, "path", ""))
        if folder.exists() and not (folder / DEMO_OUTBOX_MARK).exists():
            found.append(f"{p.file}: outbox {folder} exists and was not created by the demo")
    return found


def _confirm(question: str) -> bool:
    try:
        terminal = sys.stdin.isatty()
    except (AttributeError, ValueError, OSError):  # closed or replaced stdin
        terminal = False
    if not terminal:
        return False  # CI, cron, a pipe: nobody to ask, so no
    try:
        return input(question).strip().lower() == "yes"
    except EOFError:
        return False


async def _demo_settings(args) -> tuple[Settings, bool]:
    """The demo's settings, and whether they are the bundled demo's; refuses any other."""
    bundled = _demo_config()
    own = args.config is None or Path(args.config).resolve() == bundled.resolve()
    settings = load(bundled if own else args.config)
    # Demo mode approves every draft by itself: it must never reach a real recipient.
    real = [f"{p.file}: sender.type is {p.sender.type!r}" for p in settings.pipelines
            if p.sender is not None and p.sender.type != "outbox"]  # load(): none is None
    if real:
        raise ConfigError(
            ["demo approves every draft automatically, so it runs only pipelines whose "
             "sender is outbox (replies written to a folder); use `draftgate run` for a "
             "deployment that sends:"] + real)
    settings = replace(settings, demo=True)
    if args.fresh:
        if not own:
            raise ConfigError("--fresh resets only the bundled demo (its var/demo folder); "
                              "to start your own configuration over, delete its store file")
        state = bundled.parent / "var" / "demo"
        if state.exists():
            shutil.rmtree(state)
            print(f"(--fresh: removed {state})")
    if not own and (foreign := await _foreign_demo_state(settings)):
        question = ("demo would approve every draft by itself into:\n  " + "\n  ".join(foreign)
                    + "\nType yes to go on anyway: ")
        if not _confirm(question):
            raise ConfigError(["demo auto-approves, so with -c it writes only into a store and "
                               "outbox it created itself; use `draftgate run` (a human "
                               "approves), or point store: and sender.path at new places:"]
                              + foreign)
    return settings, own


async def _demo(args) -> int:
    from ..app import App, channels
    from ..desk.operator import DEMO

    settings, own = await _demo_settings(args)
    models = sorted({settings.models[p.drafter.model].provider for p in settings.pipelines})
    drafter = ("offline template drafter" if models == ["template"]
               else f"drafter: {', '.join(models)} (calls the model)")
    print("=" * 72)
    print(f" draftgate DEMO: SQLite store, sample inbox, {drafter}." if own else
          f" draftgate DEMO with {settings.file}: {drafter}.")
    print(" Approvals are AUTOMATIC in demo mode and labelled so on every card.")
    print(f" config: {settings.file}")
    print(f" store:  {say(settings.store)}")
    print("=" * 72)
    folders = [settings.resolve(expect(p.sender, OutboxSenderOptions).path)
               for p in settings.pipelines]  # each an outbox: see _demo_settings
    before = {f: set(f.glob("*.eml")) if f.exists() else set() for f in folders}
    for folder in folders:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / DEMO_OUTBOX_MARK).touch()
    async with App(settings, channels(settings, demo=True)) as app:
        desk = app.desk
        if not await desk.marked(DEMO_MARK):
            await desk.mark(DEMO, "demo", DEMO_MARK, "store created by draftgate demo")
        for n in (1, 2):
            for p in settings.pipelines:
                seen = await desk.seen_count(DEMO, p.name)
                what = (f"{seen} item(s) already seen" if seen else
                        "fetch, filter, admit, draft, approve, send")
                print(f"\n▶ {p.name}: tick {n}: {what}")
                c = (await desk.run_now(DEMO, p.name)).to_dict()
                print(f"  fetched {c['fetched']} · new {c['new']} · skipped {c['skipped']} · "
                      f"drafted {c['drafted']} · cards {c['posted']} · sent {c['sent']} · "
                      f"failed {c['failed']}")
                if not (c["new"] or c["drafted"] or c["sent"]):
                    print(f"  nothing new: found {await desk.seen_count(DEMO, p.name)} already "
                          f"seen; nothing drafted, nothing written")
        for folder in folders:
            files = sorted(folder.glob("*.eml"))
            new = [f for f in files if f not in before[folder]]
            print(f"\noutbox {folder}: {len(new)} repl{'y' if len(new) == 1 else 'ies'} "
                  f"written by this run ({len(files)} in the folder)")
            for f in new[:12]:
                print(f"  {f.name}")
            if new:
                first = email.message_from_bytes(new[0].read_bytes(), policy=email.policy.default)
                print(f"\n  headers of {new[0].name}:")
                for h in ("From", "To", "Subject", "Message-ID", "In-Reply-To", "References"):
                    print(f"    {h}: {first.get(h, '')}")
        print("\n" + "=" * 72 + "\n status\n" + "=" * 72)
        print(ops.format_status_all(await desk.status(DEMO)))
        for p in settings.pipelines:
            print()
            print(ops.format_status_one(await desk.status_of(DEMO, p.name)))
    print("\nRun ./scripts/demo again: nothing is drafted or sent twice. "
          "Start over with ./scripts/demo --fresh.")
    return 0

