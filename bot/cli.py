"""draftgate command line: ``draftgate COMMAND`` or ``python -m bot COMMAND``.

Exit codes: 0 success, 1 runtime failure, 2 bad configuration or arguments.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import sys
import threading
from pathlib import Path

from . import cli_ops, cli_run, demo, migrate, redact
from .cli_common import VERBOSE_HELP, say, verbose_option
from .errors import ConfigError, DraftgateError
from .gmail import auth as gmail_auth

REPO = Path(__file__).resolve().parent.parent


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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="draftgate",
        description="Drafts email replies with an LLM; sends nothing without a human's approval.",
        epilog="Docs: README.md. Start with ./scripts/demo.")
    parser.add_argument("-v", "--verbose", action="count", default=0, help=VERBOSE_HELP)
    parser.add_argument("--version", action="version", version=f"draftgate {_version()}")
    # Its own dest: main() tells a -c before the command from one after it.
    parser.add_argument("-c", "--config", dest="config_before", metavar="FILE",
                        help="deployment file, for every command except migrate-store (also "
                             "accepted after the command)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module in (cli_run, demo, cli_ops):  # in the order `draftgate --help` lists them
        module.add_cli(sub)
    gmail_auth.add_cli(sub, parents=[verbose_option()])
    migrate.add_cli(sub, parents=[verbose_option()])
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


def _config(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """-c given before the command or after it, once; else the command's default."""
    if args.config_before is not None:
        if not hasattr(args, "config"):
            parser.error(f"-c/--config does not apply to {args.command}")
        if args.config is not None and args.config != args.config_before:
            parser.error(f"-c given twice ({args.config_before} before the command, "
                         f"{args.config} after it); give it once")
        args.config = args.config_before
    if getattr(args, "config", None) is None and hasattr(args, "config_default"):
        args.config = args.config_default


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    _config(parser, args)
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
            print(f"  {say(str(e))}", file=sys.stderr)
        return 2
    except DraftgateError as exc:
        print(f"error: {say(str(exc))}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
