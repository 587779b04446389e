"""draftgate command line: ``draftgate COMMAND`` or ``python -m bot COMMAND``: parser, dispatch,
logging, and `run` with its stop handling (other commands: bot.cli.demo, bot.cli.ops).

Exit codes: 0 success, 1 runtime failure, 2 bad configuration or arguments.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import sys
import threading
from dataclasses import replace

from ..config.load import Settings
from ..desk.operator import CONSOLE
from ..errors import ConfigError, DraftgateError
from ..gmail import auth as gmail_auth
from ..service import logfmt
from . import audit as cli_audit
from . import auth_microsoft as ms_auth
from . import demo, migrate
from . import ops as cli_ops
from . import quality as cli_quality
from . import stats as cli_stats
from .common import load, options, say, verbose_option, version

log = logging.getLogger("draftgate")


_handler: logging.Handler | None = None  # ours, when main() set logging up


def _setup_logging(verbose: int, fmt: str = "text") -> None:
    global _handler
    level = logging.DEBUG if verbose > 1 else logging.INFO if verbose else logging.WARNING
    # httpx logs every request URL at INFO; with the token hidden it is still noise.
    for noisy in ("httpx", "httpcore", "httpx2", "httpcore2", "telegram.ext.Updater",
                  "googleapiclient.discovery_cache"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    if logging.getLogger().handlers:
        return  # embedded (e.g. in a test runner): its logging is not ours to change
    # Every line, third-party loggers' too, passes the redaction layer: registered
    # secrets and credentials hidden, control and bidi characters escaped.
    _handler = logging.StreamHandler(sys.stderr)
    _handler.setFormatter(logfmt.formatter(fmt))
    logging.basicConfig(level=level, handlers=[_handler])
    logging.captureWarnings(True)
    # A traceback that escapes main() or a thread is written through it too.
    sys.excepthook = _uncaught

    def thread_failed(a: threading.ExceptHookArgs) -> None:
        if a.exc_type is not SystemExit:
            logging.getLogger("draftgate").error(
                "thread %s failed", a.thread.name if a.thread else "?",
                exc_info=a.exc_value)  # its __traceback__ is a.exc_traceback

    threading.excepthook = thread_failed


def _uncaught(*ei) -> None:
    if _json_logs():
        log.critical("uncaught exception", exc_info=ei)
    elif _handler is not None and _handler.formatter is not None:
        print(_handler.formatter.formatException(ei), file=sys.stderr)


def _json_logs() -> bool:
    return _handler is not None and isinstance(_handler.formatter, logfmt.JsonFormatter)


def _say(text: str) -> None:
    """A line for the operator on stderr: a log record when the logs are JSON."""
    if _json_logs():
        log.info(text)
    else:
        print(text, file=sys.stderr, flush=True)


class _LogLines:
    """A stream for :class:`bot.cli.progress.Bar` that logs each line (JSON logs)."""

    def write(self, text: str) -> None:
        if text.strip():
            log.info(text.strip())

    def flush(self) -> None:
        pass

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


def _add_run(subparsers) -> None:
    p = subparsers.add_parser(
        "run", parents=options(), help="run all pipelines on their schedules until SIGINT/SIGTERM",
        description="Run every enabled pipeline on its schedule, with the approval channels, "
                    "until SIGINT or SIGTERM. Stopping cancels a tick in progress: a draft being "
                    "written goes back to the queue, a send cut off mid-call becomes "
                    "send_unknown and is checked after the restart (never resent blindly), and "
                    "the run is recorded as stopped (not a failure). A console approval prompt "
                    "holds its pipeline's ticks until it is answered.")
    p.add_argument("--pipeline", action="append", metavar="NAME",
                   help="tick only this pipeline in this process (repeatable); its Telegram "
                        "bot still decides the cards of every pipeline")
    p.add_argument("--once", action="store_true", help="one tick per pipeline, then exit")
    p.add_argument("--log-format", choices=("text", "json"), dest="log_format_after",
                   help="log lines as text or one JSON object per line (overrides logging.format)")
    p.add_argument("--telegram-receive", choices=("polling", "webhook", "off"),
                   help="override telegram.receive for this process (several hosts: exactly "
                        "one polls, or all take webhooks behind a load balancer)")
    p.set_defaults(func=_run, verbose_default=1)


async def _run(args) -> int:
    from ..app import App
    from ..service.observe import Service
    from .progress import Bar

    settings, only = _run_settings(args)
    app = App(settings, progress=Bar(_LogLines()) if _json_logs() else Bar())
    await app.open()
    service = None
    started = False
    try:
        service = await Service(settings, app.store).start()
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError):
                loop.add_signal_handler(sig, _stopper.request, stop)
        started = True
        await app.start()
        if posted := await app.post_unposted():
            log.info("posted %d card(s) that were waiting from before", posted)
        if args.once:
            return await _run_once(settings, app, only)
        await _serve(settings, app, service, stop)
    finally:
        if service is not None:
            service.stopping()
        if started:
            await app.engine.stop()
        if service is not None:
            await service.close()
        await app.store.close()
    _stopper.code = 0
    return 0


def _run_settings(args) -> tuple[Settings, set[str] | None]:
    """The settings `run` runs with (narrowed by --pipeline, --telegram-receive), once
    every stage can be built and every secret it needs is set; and the pipelines
    --pipeline named (None: all)."""
    from ..engine.build import check_all, missing_env

    settings = load(args.config)
    if _handler is not None and not _log_format(args):
        _handler.setFormatter(logfmt.formatter(settings.log_format))
    only: set[str] | None = None
    narrowed: list = []  # pipelines enabled in their files that --pipeline leaves out
    if args.pipeline:
        only = {settings.pipeline(n).name for n in args.pipeline}  # unknown: exit 2
        narrowed = [p for p in settings.pipelines if p.enabled and p.name not in only]
        # Narrow what this process schedules, not what it knows: its Telegram bot
        # still decides the other pipelines' cards, and sends and drafts for them
        # (so it needs their secrets too, checked below). A copy: settings stay as loaded.
        settings = replace(settings, pipelines=[
            p if p.name in only else replace(p, enabled=False) for p in settings.pipelines])
    if args.telegram_receive and settings.telegram is not None:
        settings = replace(settings, telegram=replace(settings.telegram,
                                                      receive=args.telegram_receive))
    if problems := check_all(settings):
        raise ConfigError(problems)
    # Checked now rather than at the first tick, where every new item would fail
    # while status still said healthy.
    receiving = settings.telegram is not None and settings.telegram.receive != "off"
    if problems := missing_env(settings, [p for p in settings.pipelines if p.enabled]
                               + (narrowed if receiving else [])):
        raise ConfigError(problems)
    return settings, only


async def _serve(settings: Settings, app, service, stop: asyncio.Event) -> None:
    """Every pipeline on its schedule until ``stop`` (SIGINT, SIGTERM)."""
    running = [p.name for p in settings.pipelines if p.enabled]
    _say(f"draftgate running {len(running)} pipeline(s) [{', '.join(running)}]; "
         f"Ctrl-C or SIGTERM stops")
    service.ready()
    await app.run_forever(stop)
    service.stopping()
    _say("draftgate stopping: ticks in progress are interrupted; a draft being written "
         "goes back to the queue and an interrupted send is checked at the next start")


async def _run_once(settings: Settings, app, only: set[str] | None) -> int:
    """One tick of each pipeline; 1 when a tick failed, so a cron job or CI notices."""
    desk = app.desk
    paused = {s.name for s in await desk.status(CONSOLE) if s.paused}
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
            await desk.run_now(CONSOLE, p.name)
            runs = (await desk.status_of(CONSOLE, p.name)).runs
            last = runs[0] if runs else None
            if last is None or last["status"] != "ok":
                why = "the tick did not run" if last is None else (
                    last.get("error_text") or f"its run is {last['status']} (another process holds it)")
                failed.append(f"{p.name}: {why}")
    for line in failed:
        print(f"tick failed: {line}", file=sys.stderr)
    return 1 if failed else 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="draftgate",
        description="Drafts email replies with an LLM; sends nothing without a human's approval.",
        epilog="Docs: README.md. Start with ./scripts/demo.", parents=[verbose_option("verbose")])
    parser.add_argument("--version", action="version", version=f"draftgate {version()}")
    parser.add_argument("--log-format", choices=("text", "json"),
                        help="log lines as text (default) or one JSON object per line; for "
                             "run, overrides logging.format")
    # Its own dest: main() tells a -c before the command from one after it.
    parser.add_argument("-c", "--config", dest="config_before", metavar="FILE",
                        help="deployment file, for every command except migrate-store (also "
                             "accepted after the command)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for add_cli in (_add_run, demo.add_cli, cli_ops.add_cli, cli_quality.add_cli, cli_stats.add_cli,
                    cli_audit.add_cli):  # in `--help` order
        add_cli(sub)
    kinds = gmail_auth.add_cli(sub, parents=[verbose_option()])  # its own -c, the shared -v
    ms_auth.add_cli(kinds, parents=[verbose_option()])
    migrate.add_cli(sub, parents=[verbose_option()])
    return parser


def _log_format(args) -> str | None:
    """--log-format, given before the command or after `run`."""
    return getattr(args, "log_format_after", None) or args.log_format


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    # -c given before the command or after it, once; else the command's own default.
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
    _setup_logging(max(verbose, getattr(args, "verbose_default", 0)), _log_format(args) or "text")
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
            print(f"  {say(str(e))}", file=sys.stderr)
        return 2
    except DraftgateError as exc:
        print(f"error: {say(str(exc))}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
