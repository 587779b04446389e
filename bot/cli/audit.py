"""``draftgate audit show|verify|export``: one item's history, and the audit chain."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path
from typing import IO

from ..app import OperatorDesk, open_desk
from ..desk import reports as ops
from ..desk.operator import CONSOLE
from ..errors import ConfigError
from ..store import chain
from .common import load, options, say

_DESCRIPTION = """\
The audit table records every state change a human caused and every step of an item
(admitted, drafted, edited, approved, sent...). Each row carries the SHA-256 of its
content and of the row before it, so `verify` finds a row that was changed, removed
or inserted afterwards. See README "Audit" for what the chain proves and what not."""


def add_cli(subparsers) -> None:
    """Register ``audit`` and its three subcommands."""
    p = subparsers.add_parser("audit", help="one item's history; verify or export the audit",
                              description=_DESCRIPTION,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="audit_command", metavar="SUBCOMMAND", required=True)
    show = sub.add_parser(
        "show", parents=options(json=True), help="one item's history",
        description="Everything the audit knows about one item, oldest first: admitted, "
                    "drafted (version, model, tokens), edited, approved, sent (message id), "
                    "each by whom and when (in the pipeline's timezone).")
    show.add_argument("pipeline")
    show.add_argument("item_id", help="the item id (Message-ID, slot, ...) as `status "
                                      "PIPELINE` or `pending --json` show it")
    show.set_defaults(func=_show)
    verify = sub.add_parser(
        "verify", parents=options(), help="check the audit chain",
        description="Recompute every audit row's hash in chain order. Exit 0 printing the "
                    "number of rows checked and the chain head (position and hash: note it "
                    "down to detect later rewrites), or exit 1 naming the first row that was "
                    "changed, removed or inserted.")
    verify.add_argument("--file", metavar="JSONL", type=Path,
                        help="verify an export written by `audit export` instead of the store "
                             "(needs no configuration or store access)")
    verify.set_defaults(func=_verify)
    export = sub.add_parser(
        "export", parents=options(), help="write audit rows as JSON Lines",
        description="Write the audit rows from DATE on, in chain order, one JSON object per "
                    "line with their chain position, previous hash and hash: `audit verify "
                    "--file` checks such a file anywhere.")
    export.add_argument("--since", required=True, metavar="DATE",
                        help="first day (YYYY-MM-DD, UTC) or moment (ISO 8601, e.g. "
                             "2026-12-01T09:00+01:00) to export")
    export.add_argument("-o", "--output", metavar="FILE", type=Path,
                        help="write here instead of standard output")
    export.set_defaults(func=_export)


async def _show(args) -> int:
    settings = load(args.config)
    async with open_desk(settings) as desk:
        h = await desk.history(CONSOLE, args.pipeline, args.item_id)
    # Subjects and details come from outside: no terminal escapes reach the screen.
    print(json.dumps(asdict(h), indent=2) if args.json else say(ops.format_history(h)))
    return 0 if h.drafts else 1


def _say_report(r: chain.Report, where: str) -> int:
    if r.ok:
        head = f"; head: position {r.head[0]}, sha256 {r.head[1]}" if r.head else ""
        print(f"audit chain intact: {r.checked} row(s) checked{head}")
        return 0
    print(f"audit chain broken ({where}): {r.problem}. {r.checked} row(s) before it are "
          "intact.")
    return 1


async def _verify(args) -> int:
    if args.file is not None:
        return _say_report(verify_file(args.file), str(args.file))
    settings = load(args.config)
    async with open_desk(settings) as desk:
        report = await desk.verify_audit(CONSOLE)
    return _say_report(report, "store")


def verify_file(path: Path) -> chain.Report:
    """Check an export: its rows must chain from the first row's recorded prev_hash (the
    start value when the export begins at position 1)."""
    walker: chain.Walker | None = None
    try:
        with path.open(encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                row = _export_row(line, path, n)
                if walker is None:
                    start = chain.GENESIS if row["seq"] == 1 else row["prev_hash"]
                    walker = chain.Walker(str(start), int(row["seq"]) - 1)
                if not walker.feed(row):
                    break
    except OSError as exc:
        raise ConfigError(f"--file: cannot read {path}: {exc.strerror}") from None
    return walker.finish(None) if walker else chain.Report()


def _export_row(line: str, path: Path, n: int) -> dict:
    with contextlib.suppress(json.JSONDecodeError):
        row = json.loads(line)
        if isinstance(row, dict) and all(c in row for c in chain.CHAIN_COLS) \
                and isinstance(row["seq"], int) and isinstance(row["id"], int):
            return row
    raise ConfigError(f"--file: {path} line {n} is not an audit row as `audit export` writes "
                      f"them (a JSON object with {', '.join(chain.CHAIN_COLS)})")


def parse_since(text: str) -> float:
    """``--since``: a UTC date or an ISO 8601 moment (UTC unless it names an offset)."""
    try:
        when = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ConfigError(f"--since: expected a date like 2026-12-01 or a moment like "
                          f"2026-12-01T09:00+01:00, got {text!r}") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return when.timestamp()


async def _export(args) -> int:
    since = parse_since(args.since)
    settings = load(args.config)
    out: IO[str] = sys.stdout
    if args.output is not None:
        try:
            out = args.output.open("w", encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"--output: cannot write {args.output}: {exc.strerror}") from None
    try:
        async with open_desk(settings) as desk:
            count = await write_export(desk, since, out)
    finally:
        if out is not sys.stdout:
            out.close()
    if args.output is not None:
        print(f"{count} audit row(s) written to {args.output}")
    return 0


async def write_export(desk: OperatorDesk, since: float, out: IO[str], batch: int = 1000) -> int:
    """Write the chained rows with ``at >= since`` as JSON Lines, in chain order."""
    count, after = 0, 0
    while True:
        rows = await desk.audit_export(CONSOLE, since, after, batch)
        for row in rows:
            out.write(chain.export_line(row) + "\n")
        count += len(rows)
        if len(rows) < batch:
            return count
        after = rows[-1]["seq"]
