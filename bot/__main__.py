"""draftgate command line: ``draftgate COMMAND`` or ``python -m bot COMMAND``.

Exit codes: 0 success, 1 runtime failure, 2 bad configuration or arguments.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import getpass
import importlib
import json
import logging
import os
import shutil
import signal
import sys
import threading
from dataclasses import asdict
from pathlib import Path

from . import ops, redact
from .config import Settings, load_settings
from .errors import ConfigError, DraftgateError

log = logging.getLogger("draftgate")
REPO = Path(__file__).resolve().parent.parent
DEMO_CONFIG = REPO / "draftgate.demo.yaml"


def _actor() -> str:
    try:
        return f"cli:{getpass.getuser()}"
    except Exception:
        return "cli"


def _setup_logging(verbose: int) -> None:
    level = logging.DEBUG if verbose > 1 else logging.INFO if verbose else logging.WARNING
    # httpx logs every request URL at INFO; with the token hidden it is still noise.
    for noisy in ("httpx", "httpcore", "httpx2", "httpcore2", "telegram.ext.Updater",
                  "googleapiclient.discovery_cache"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    if logging.getLogger().handlers:
        return  # embedded (e.g. in a test runner): its logging is not ours to change
    # Every line, third-party loggers' too, passes the redaction layer: registered
    # secrets and credentials hidden, control and bidi characters escaped.
    formatter = redact.LogFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter)
    logging.basicConfig(level=level, handlers=[handler])
    logging.captureWarnings(True)
    # A traceback that escapes main() or a thread is written through it too.
    sys.excepthook = lambda *ei: print(formatter.formatException(ei), file=sys.stderr)

    def thread_failed(a: threading.ExceptHookArgs) -> None:
        if a.exc_type is not SystemExit:
            logging.getLogger("draftgate").error(
                "thread %s failed", a.thread.name if a.thread else "?",
                exc_info=(a.exc_type, a.exc_value, a.exc_traceback))

    threading.excepthook = thread_failed


def _say(text: str) -> str:
    """Text for the terminal that may quote an outside answer (an error, a check's
    detail): without secrets and without terminal escapes."""
    return redact.escape_controls(redact.scrub(text), keep_newlines=True)


def _load(args) -> Settings:
    from .build import register_secrets

    settings = load_settings(args.config)
    register_secrets(settings)  # before any stage, or library, can log one
    return settings


def _store(settings: Settings):
    """The configured store, to use as ``async with _store(settings) as store:`` (opened
    on entry, closed on exit)."""
    from .store import create_store

    return create_store(settings.store)


async def _open_store(settings: Settings):
    store = _store(settings)
    await store.open()
    return store


@contextlib.asynccontextmanager
async def _existing_store(settings: Settings):
    """The configured store for a command that only reads or changes what is there: a
    store that does not exist is reported (a typo in `store:` must not look like
    "never run") and nothing is created."""
    from .store import StoreMissing

    store = _store(settings)
    try:
        await store.open(create=False)
    except StoreMissing as exc:
        raise StoreMissing(f"{exc} (`store:` in {settings.file})") from None
    try:
        yield store
    finally:
        await store.close()


def _channels(settings: Settings, store, *, demo: bool = False) -> dict:
    from .approvals.console import ConsoleChannel

    channels: dict = {}
    used = {p.approval.channel for p in settings.pipelines}
    if "console" in used or settings.telegram is None:
        channels["console"] = ConsoleChannel(auto_approve=demo)
    if settings.telegram is not None:
        telegram = importlib.import_module("bot.approvals.telegram")
        channels["telegram"] = telegram.create(settings, store)
    return channels


# -- run -----------------------------------------------------------------------------------

#: Seconds from SIGINT/SIGTERM until the process exits, even if a worker thread is stuck.
STOP_GRACE = 10.0


class _Stopper:
    """Makes a stop request end the process within :data:`STOP_GRACE` seconds.

    A Gmail read that never answers, or any call running through ``asyncio.to_thread``
    or a thread pool, cannot be cancelled: the orderly stop waits for it (closing the
    Gmail client), ``asyncio.run`` waits for the default executor, and the interpreter
    joins every pool thread at exit. So once a stop is asked for, a daemon timer ends
    the process after the grace with ``os._exit``. That is safe for the same reason a
    SIGKILL is: every state change is a committed store transaction; an abandoned read
    or parse has admitted nothing, so its mail is fetched again; a drafting claim is
    released by the orderly stop or expires, so the item is drafted again; and a send
    is recorded as ``sending`` before the call, so the next start checks it instead of
    sending again."""

    def __init__(self) -> None:
        self.code = 1  # until _run has finished its orderly stop: it did not finish
        self._timer: threading.Timer | None = None

    def request(self, stop: asyncio.Event) -> None:
        stop.set()
        if self._timer is None:
            self._timer = threading.Timer(STOP_GRACE, self._expire)
            self._timer.daemon = True
            self._timer.start()

    def _expire(self) -> None:
        busy = sorted(t.name for t in threading.enumerate()
                      if t is not threading.main_thread() and not t.daemon and t.is_alive())
        log.warning("%gs after the stop signal, %s; exiting without waiting any longer "
                    "(still busy: %s). Nothing committed is lost: interrupted work is done "
                    "again at the next start", STOP_GRACE,
                    "the stop is done but worker threads are still busy" if self.code == 0
                    else "the stop has not finished", ", ".join(busy) or "none")
        logging.shutdown()  # flushes the handlers; os._exit skips every exit handler
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(self.code)


_stopper = _Stopper()


async def _run(args) -> int:
    settings = _load(args)
    only: set[str] | None = None
    narrowed: list = []  # pipelines enabled in their files that --pipeline leaves out
    if args.pipeline:
        only = {settings.pipeline(n).name for n in args.pipeline}  # unknown: exit 2
        narrowed = [p for p in settings.pipelines if p.enabled and p.name not in only]
        # Narrow what this process schedules, not what it knows: its Telegram bot
        # still decides the other pipelines' cards, and sends and drafts for them
        # (so it needs their secrets too, checked below).
        settings.pipelines = [p if p.name in only else dataclasses.replace(p, enabled=False)
                              for p in settings.pipelines]
    if args.telegram_receive and settings.telegram is not None:
        settings.telegram.receive = args.telegram_receive
    from .build import check_all, missing_env
    from .engine import Engine

    problems = check_all(settings)
    if problems:
        raise ConfigError(problems)
    # Checked now rather than at the first tick, where every new item would fail
    # while status still said healthy.
    receiving = settings.telegram is not None and settings.telegram.receive != "off"
    problems = missing_env(settings, [p for p in settings.pipelines if p.enabled]
                           + (narrowed if receiving else []))
    if problems:
        raise ConfigError(problems)
    store = await _open_store(settings)
    engine = None
    try:
        from .progress import Bar

        engine = Engine(settings, store, _channels(settings, store), progress=Bar())
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError):
                loop.add_signal_handler(sig, _stopper.request, stop)
        await engine.start()
        posted = await engine.post_unposted()
        if posted:
            log.info("posted %d card(s) that were waiting from before", posted)
        running = [p.name for p in settings.pipelines if p.enabled]
        if args.once:
            return await _run_once(settings, store, engine, only)
        print(f"draftgate running {len(running)} pipeline(s) [{', '.join(running)}]; "
              f"Ctrl-C or SIGTERM stops", file=sys.stderr, flush=True)
        await engine.run_forever(stop)
        print("draftgate stopping: ticks in progress are interrupted; a draft being written "
              "goes back to the queue and an interrupted send is checked at the next start",
              file=sys.stderr, flush=True)
    finally:
        if engine is not None:
            await engine.stop()
        await store.close()
    _stopper.code = 0
    return 0


async def _run_once(settings: Settings, store, engine, only: set[str] | None) -> int:
    """One tick of each pipeline; 1 when a tick failed, so a cron job or CI notices."""
    paused = await store.paused()
    failed: list[str] = []
    for p in settings.pipelines:
        if only is not None and p.name not in only:
            continue
        if not p.enabled:
            print(f"{p.name}: not run: enabled: false in {p.file}", file=sys.stderr)
        elif p.name in paused:
            print(f"{p.name}: not run: paused (/resume {p.name} in Telegram schedules "
                  f"it again)", file=sys.stderr)
        else:
            await engine.tick(p.name)
            last = (await store.recent_runs(p.name, limit=1) or [None])[0]
            if last is None or last.status != "ok":
                why = "the tick did not run" if last is None else (
                    last.error_text or f"its run is {last.status} (another process holds it)")
                failed.append(f"{p.name}: {why}")
    for line in failed:
        print(f"tick failed: {line}", file=sys.stderr)
    return 1 if failed else 0


# -- demo ----------------------------------------------------------------------------------

def _demo_config() -> Path:
    """The bundled demo's file: beside the package in a checkout, or in the current
    folder (a checkout) when draftgate was installed with `pip install .`."""
    for folder in (REPO, Path.cwd()):
        if (folder / DEMO_CONFIG.name).is_file():
            return folder / DEMO_CONFIG.name
    raise ConfigError(f"{DEMO_CONFIG.name} not found beside the installed package nor in "
                      f"{Path.cwd()}: run `draftgate demo` in the draftgate checkout, or pass "
                      f"-c FILE")


#: Marks a store (audit row) and an outbox (file) as the demo's own: `demo -c FILE`
#: auto-approves only into state that the demo itself created.
DEMO_MARK = "demo|own-state"
DEMO_OUTBOX_MARK = ".draftgate-demo"


async def _foreign_demo_state(settings: Settings) -> list[str]:
    """What `demo -c FILE` would auto-approve into that the demo did not create: an
    existing store or outbox folder of a real deployment, which may feed a mail relay."""
    from .store import StoreMissing

    found = []
    try:
        async with _existing_store(settings) as store:
            if not await store.audit_log(draft_key=DEMO_MARK, limit=1):
                found.append(f"store {settings.store.split('@')[-1]} exists and was not "
                             f"created by the demo")
    except StoreMissing:
        pass  # a new store: the demo creates it and marks it as its own
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


async def _demo(args) -> int:
    bundled = _demo_config()
    own = args.config is None or Path(args.config).resolve() == bundled.resolve()
    settings = load_settings(bundled if own else args.config)
    from .build import register_secrets

    register_secrets(settings)
    # Demo mode approves every draft by itself: it must never reach a real recipient.
    real = [f"{p.file}: sender.type is {p.sender.type!r}" for p in settings.pipelines
            if p.sender.type != "outbox"]
    if real:
        raise ConfigError(
            ["demo approves every draft automatically, so it runs only pipelines whose "
             "sender is outbox (replies written to a folder); use `draftgate run` for a "
             "deployment that sends:"] + real)
    settings.demo = True
    from .engine import Engine

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
    models = sorted({settings.models[p.drafter.model].provider
                     for p in settings.pipelines})
    drafter = ("offline template drafter" if models == ["template"]
               else f"drafter: {', '.join(models)} (calls the model)")
    print("=" * 72)
    print(f" draftgate DEMO: SQLite store, sample inbox, {drafter}." if own else
          f" draftgate DEMO with {settings.file}: {drafter}.")
    print(" Approvals are AUTOMATIC in demo mode and labelled so on every card.")
    print(f" config: {settings.file}")
    print(f" store:  {_say(settings.store)}")
    print("=" * 72)
    folders = [settings.resolve(p.sender.path) for p in settings.pipelines]
    before = {f: set(f.glob("*.eml")) if f.exists() else set() for f in folders}
    async with _store(settings) as store:
        if not await store.audit_log(draft_key=DEMO_MARK, limit=1):
            await store.audit("draftgate", "demo", draft_key=DEMO_MARK,
                              detail="store created by draftgate demo")
        for folder in folders:
            folder.mkdir(parents=True, exist_ok=True)
            (folder / DEMO_OUTBOX_MARK).touch()
        engine = Engine(settings, store, _channels(settings, store, demo=True))
        await engine.start()
        for n in (1, 2):
            for p in settings.pipelines:
                seen = await store.seen_count(p.name)
                what = (f"{seen} item(s) already seen" if seen else
                        "fetch, filter, admit, draft, approve, send")
                print(f"\n▶ {p.name}: tick {n}: {what}")
                c = (await engine.tick(p.name)).to_dict()
                print(f"  fetched {c['fetched']} · new {c['new']} · skipped {c['skipped']} · "
                      f"drafted {c['drafted']} · cards {c['posted']} · sent {c['sent']} · "
                      f"failed {c['failed']}")
                if not (c["new"] or c["drafted"] or c["sent"]):
                    print(f"  nothing new: found {await store.seen_count(p.name)} already "
                          f"seen; nothing drafted, nothing written")
        for folder in folders:
            files = sorted(folder.glob("*.eml"))
            new = [f for f in files if f not in before[folder]]
            print(f"\noutbox {folder}: {len(new)} repl{'y' if len(new) == 1 else 'ies'} "
                  f"written by this run ({len(files)} in the folder)")
            for f in new[:12]:
                print(f"  {f.name}")
            if new:
                import email
                import email.policy

                first = email.message_from_bytes(new[0].read_bytes(), policy=email.policy.default)
                print(f"\n  headers of {new[0].name}:")
                for h in ("From", "To", "Subject", "Message-ID", "In-Reply-To", "References"):
                    print(f"    {h}: {first.get(h, '')}")
        print("\n" + "=" * 72 + "\n status\n" + "=" * 72)
        print(ops.format_status_all(await ops.status_all(store, settings)))
        for p in settings.pipelines:
            print()
            print(ops.format_status_one(await ops.status_one(store, settings, p.name)))
        await engine.stop()
    print("\nRun ./scripts/demo again: nothing is drafted or sent twice. "
          "Start over with ./scripts/demo --fresh.")
    return 0


# -- read-only and operator commands --------------------------------------------------------

async def _validate(args) -> int:
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
    from . import scheduler

    for p in settings.pipelines:
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
    settings = _load(args)
    async with _existing_store(settings) as store:
        if args.pipeline:
            detail = await ops.status_one(store, settings, args.pipeline)
            print(json.dumps(asdict(detail), indent=2) if args.json else ops.format_status_one(detail))
        else:
            items = await ops.status_all(store, settings)
            print(json.dumps([asdict(i) for i in items], indent=2) if args.json
                  else ops.format_status_all(items))
    return 0


async def _pending(args) -> int:
    settings = _load(args)
    async with _existing_store(settings) as store:
        drafts = await ops.pending(store, settings)
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
    settings = _load(args)
    async with _existing_store(settings) as store:
        result = await ops.replay(store, args.pipeline, args.item_id, _actor(), settings)
        print(ops.format_replay(args.pipeline, args.item_id, result))
        return 0 if result.outcome in ("requeued", "unseen") else 1


async def _sweep(args) -> int:
    settings = _load(args)
    if args.days is not None and args.days < 0:
        raise ConfigError("--days: expected a number of days >= 0")
    async with _existing_store(settings) as store:
        print(ops.format_sweep(await ops.sweep(store, settings, days=args.days)))
    return 0


async def _review(args) -> int:
    """Decide pending cards in the terminal."""
    from .approvals.console import ConsoleChannel
    from .engine import Engine

    settings = _load(args)
    async with _existing_store(settings) as store:
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
    settings = _load(args)
    results: list[tuple[str, bool, str]] = []
    try:
        async with _existing_store(settings) as store:
            problems = await store.check()
        detail = ("; ".join(problems) + "; restore it from a backup or point `store:` "
                  "elsewhere") if problems else settings.store.split("@")[-1]
        results.append(("store", not problems, detail))
    except DraftgateError as exc:
        results.append(("store", False, str(exc)))
    for module in ("bot.gmail.doctor", "bot.approvals.telegram"):
        try:
            mod = importlib.import_module(module)
        except ImportError:
            continue
        check = getattr(mod, "doctor", None) or getattr(mod, "check", None)
        if check is None:
            continue
        try:
            results.extend(await check(settings))
        except Exception as exc:
            results.append((module, False, str(exc)))
    results.extend(await _doctor_models(settings))
    width = max(len(n) for n, _, _ in results)
    for name, ok, detail in results:
        print(f"{'✅' if ok else '❌'} {name:<{width}}  {_say(str(detail))}")
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


# -- parser ----------------------------------------------------------------------------------

def _add_config(p: argparse.ArgumentParser, default: str | None = "draftgate.yaml") -> None:
    # default None here, the command's own default applied in main(): so a -c given
    # before the command (`draftgate -c FILE validate`) is not overwritten by it.
    p.add_argument("-c", "--config", default=None, metavar="FILE",
                   help=f"deployment file (default: {default or 'draftgate.demo.yaml'})")
    p.set_defaults(config_default=default)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="draftgate",
        description="Drafts email replies with an LLM; sends nothing without a human's approval.",
        epilog="Docs: README.md. Start with ./scripts/demo.")
    parser.add_argument("-v", "--verbose", action="count", default=0,
                        help="more logging on stderr (-vv for debug)")
    parser.add_argument("--version", action="version", version=f"draftgate {_version()}")
    parser.add_argument("-c", "--config", dest="config_before", metavar="FILE",
                        help="deployment file, for every command except migrate-store (also "
                             "accepted after the command)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    p = sub.add_parser("run", help="run all pipelines on their schedules until SIGINT/SIGTERM",
                       description="Run every enabled pipeline on its schedule, with the approval "
                                   "channels, until SIGINT or SIGTERM. Stopping cancels a tick in "
                                   "progress: a draft being written goes back to the queue, a send "
                                   "cut off mid-call becomes send_unknown and is checked after the "
                                   "restart (never resent blindly), and the run is recorded as "
                                   "stopped (not a failure). A console approval prompt holds "
                                   "its pipeline's ticks until it is answered.")
    _add_config(p)
    p.add_argument("--pipeline", action="append", metavar="NAME",
                   help="tick only this pipeline in this process (repeatable); its Telegram "
                        "bot still decides the cards of every pipeline")
    p.add_argument("--once", action="store_true", help="one tick per pipeline, then exit")
    p.add_argument("--telegram-receive", choices=("polling", "webhook", "off"),
                   help="override telegram.receive for this process (several hosts: exactly "
                        "one polls, or all take webhooks behind a load balancer)")
    p.set_defaults(func=_run, verbose_default=1)

    p = sub.add_parser("demo", help="offline demo: sample inbox, template drafter, auto-approval",
                       description="Run the demo pipeline twice against the sample inbox in "
                                   "demo/inbox (SQLite, template drafter, DEMO auto-approval, "
                                   "replies written to var/demo/outbox), then print status. "
                                   "With -c FILE, demo runs another configuration only if "
                                   "every pipeline's sender is outbox and its store and "
                                   "outbox folders are new or were made by the demo: demo "
                                   "approves by itself, so it never writes into a real "
                                   "deployment's state. Logs only warnings (-v for more).")
    _add_config(p, default=None)
    p.add_argument("--fresh", action="store_true",
                   help="delete the bundled demo's state (var/demo) first")
    p.set_defaults(func=_demo)

    p = sub.add_parser("validate", help="check the configuration; print every error",
                       description="Load and check the deployment file and every pipeline "
                                   "file; exit 2 listing every problem.")
    _add_config(p)
    p.set_defaults(func=_validate)

    p = sub.add_parser("status", help="one line per pipeline, or recent runs of one",
                       description="Without PIPELINE: one line per pipeline. With it: recent "
                                   "runs newest first, last green, first red after it, pending, "
                                   "seen count, tokens today, and the newest failed, skipped, "
                                   "expired and unsent items with their item ids and reasons "
                                   "(the ids `draftgate replay` takes).")
    _add_config(p)
    p.add_argument("pipeline", nargs="?", help="pipeline name")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=_status)

    p = sub.add_parser("pending", help="drafts waiting for a decision",
                       description="Drafts not yet posted, awaiting a decision, approved or "
                                   "being sent, or whose send failed or has an unknown outcome. "
                                   "--json also gives each draft's item_id.")
    _add_config(p)
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=_pending)

    p = sub.add_parser("replay", help="send an item back through the pipeline",
                       description="A failed, rejected, skipped or expired item goes back to "
                                   "queued; an item only seen loses its seen mark. Sent items "
                                   "are refused. Audited. Item ids: `draftgate status PIPELINE` "
                                   "lists the newest failed and skipped ones; `draftgate pending "
                                   "--json` shows item_id.")
    _add_config(p)
    p.add_argument("pipeline")
    p.add_argument("item_id", help="the item id (Message-ID, slot, ...) as shown by "
                                   "`status PIPELINE` or `pending --json`")
    p.set_defaults(func=_replay)

    p = sub.add_parser("sweep", help="expire old seen marks, leases, approvals and runs",
                       description="Delete seen marks older than the TTL (--days, default "
                                   "sweep.seen_ttl_days, itself 90 by default), return expired "
                                   "drafting leases to the queue, expire stale approvals if "
                                   "sweep.approval_ttl_days is set, prune old runs. Also runs "
                                   "on sweep.every inside `draftgate run`; that sweep and /sweep "
                                   "also update the Telegram cards of the approvals they "
                                   "expire, this command does not.")
    _add_config(p)
    p.add_argument("--days", type=float, default=None,
                   help="seen-mark TTL in days (default: sweep.seen_ttl_days)")
    p.set_defaults(func=_sweep)

    p = sub.add_parser("review", help="decide awaiting drafts in the terminal",
                       description="Show each draft awaiting a decision and approve, edit, "
                                   "regenerate or reject it from the terminal; then each "
                                   "reply whose send failed or is unknown, with Retry (for an "
                                   "unknown one it first checks again whether it arrived). A "
                                   "draft that also has a Telegram card keeps it: a new version "
                                   "made here is put on that card by the running draftgate; "
                                   "after Approve or Reject here the card keeps its buttons, and "
                                   "a tap on it says who decided. There is no operator "
                                   "allow-list here: whoever can run this with the "
                                   "configuration decides (audited with their user name).")
    _add_config(p)
    p.set_defaults(func=_review)

    p = sub.add_parser("doctor", help="check the store, accounts, models and Telegram",
                       description="Check that the store opens, each Gmail account answers with "
                                   "the scopes its pipelines need, the endpoint of each model "
                                   "a pipeline uses answers (models no pipeline uses are not "
                                   "called), and the Telegram bot token works.")
    _add_config(p)
    p.set_defaults(func=_doctor)

    for module in ("bot.gmail.auth", "bot.migrate"):
        try:
            mod = importlib.import_module(module)
        except ImportError:
            continue
        if hasattr(mod, "add_cli"):
            mod.add_cli(sub)
    for command in _leaf_parsers(sub):
        # -v after the command too (`draftgate run -v`), counted with the one before.
        if "-v" not in command._option_string_actions:
            command.add_argument("-v", "--verbose", dest="verbose_after", action="count",
                                 default=0, help="more logging on stderr (-vv for debug)")
    return parser


def _version() -> str:
    from importlib import metadata

    try:
        return metadata.version("draftgate")
    except metadata.PackageNotFoundError:  # run from a checkout that was never installed
        import tomllib

        with contextlib.suppress(OSError, tomllib.TOMLDecodeError):
            return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
        return "unknown"


def _leaf_parsers(sub) -> list[argparse.ArgumentParser]:
    out = []
    for command in dict.fromkeys(sub.choices.values()):
        nested = [a for a in command._actions if isinstance(a, argparse._SubParsersAction)]
        out.extend(_leaf_parsers(nested[0]) if nested else [command])
    return out


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.config_before is not None:
        if not hasattr(args, "config"):
            parser.error(f"-c/--config does not apply to {args.command}")
        if args.config is not None and args.config != args.config_before:
            parser.error(f"-c given twice ({args.config_before} before the command, "
                         f"{args.config} after it); give it once")
        args.config = args.config_before
    if getattr(args, "config", None) is None and hasattr(args, "config_default"):
        args.config = args.config_default
    verbose = args.verbose + getattr(args, "verbose_after", 0)
    _setup_logging(max(verbose, getattr(args, "verbose_default", 0)))
    try:
        result = args.func(args)
        if asyncio.iscoroutine(result):
            result = asyncio.run(result)
        sys.stdout.flush()  # here, so a closed pipe is handled below, not at exit
        return int(result or 0)
    except BrokenPipeError:
        # The reader went away (`draftgate pending | head -3`). Python's documented
        # recipe: point stdout at devnull so the flush at exit does not fail again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1
    except ConfigError as exc:
        print("configuration error:" if len(exc.errors) == 1 else
              f"configuration errors ({len(exc.errors)}):", file=sys.stderr)
        for e in exc.errors:
            print(f"  {_say(str(e))}", file=sys.stderr)
        return 2
    except DraftgateError as exc:
        print(f"error: {_say(str(exc))}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
