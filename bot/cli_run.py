"""`draftgate run`: every enabled pipeline on its schedule until a stop signal."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
import threading
from dataclasses import replace

from .cli_common import channels, load, options, store_for
from .config import Settings
from .errors import ConfigError

log = logging.getLogger("draftgate")

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


def add_cli(subparsers) -> None:
    p = subparsers.add_parser(
        "run", parents=options(), help="run all pipelines on their schedules until SIGINT/SIGTERM",
        description="Run every enabled pipeline on its schedule, with the approval "
                    "channels, until SIGINT or SIGTERM. Stopping cancels a tick in "
                    "progress: a draft being written goes back to the queue, a send "
                    "cut off mid-call becomes send_unknown and is checked after the "
                    "restart (never resent blindly), and the run is recorded as "
                    "stopped (not a failure). A console approval prompt holds "
                    "its pipeline's ticks until it is answered.")
    p.add_argument("--pipeline", action="append", metavar="NAME",
                   help="tick only this pipeline in this process (repeatable); its Telegram "
                        "bot still decides the cards of every pipeline")
    p.add_argument("--once", action="store_true", help="one tick per pipeline, then exit")
    p.add_argument("--telegram-receive", choices=("polling", "webhook", "off"),
                   help="override telegram.receive for this process (several hosts: exactly "
                        "one polls, or all take webhooks behind a load balancer)")
    p.set_defaults(func=_run, verbose_default=1)


def _this_process(settings: Settings, args) -> tuple[Settings, set[str] | None, list]:
    """The settings as this process runs them (a copy: the loaded ones are not changed),
    the pipelines --pipeline names, and those enabled in their files that it leaves out."""
    only: set[str] | None = None
    narrowed: list = []
    if args.pipeline:
        only = {settings.pipeline(n).name for n in args.pipeline}  # unknown: exit 2
        narrowed = [p for p in settings.pipelines if p.enabled and p.name not in only]
        # Narrow what this process schedules, not what it knows: its Telegram bot
        # still decides the other pipelines' cards, and sends and drafts for them
        # (so it needs their secrets too, checked by the caller).
        settings = replace(settings, pipelines=[
            p if p.name in only else replace(p, enabled=False) for p in settings.pipelines])
    if args.telegram_receive and settings.telegram is not None:
        settings = replace(settings, telegram=replace(settings.telegram,
                                                      receive=args.telegram_receive))
    return settings, only, narrowed


async def _run(args) -> int:
    settings, only, narrowed = _this_process(load(args), args)
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
    store = store_for(settings)
    await store.open()
    engine = None
    try:
        from .progress import Bar

        engine = Engine(settings, store, channels(settings, store), progress=Bar())
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
