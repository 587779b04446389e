"""``draftgate migrate-store``: copy one store into another (SQLite <-> PostgreSQL).

Everything that decides what happens next is copied as it is: seen marks (so no mail
is fetched again), drafts with their ids, keys, status, versions, fences and approval
message ids (so cards already in Telegram still work), cursors, runs, audit, token
usage and pause flags. Lease rows (``locks``) are not: they belong to processes of
the old store.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from typing import Callable
from urllib.parse import urlsplit, urlunsplit

from ..errors import StoreError
from ..store import create_store
from ..store._copy import COPY_TABLES, copier
from .progress import Bar

#: Copy order. Drafts before audit so a reader of the target never sees an audit
#: row for a draft that is not there yet.
TABLES = ("seen_items", "cursors", "drafts", "pipeline_runs", "audit", "token_usage",
          "pipeline_flags", "approvals", "sent_notices", "examples", "knowledge_files",
          "knowledge_passages")
BATCH = 5000

Progress = Callable[[str, int, int], None]


def _safe(url: str) -> str:
    """``url`` with any password masked, for messages."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.netloc.rsplit("@", 1)[-1]
    return urlunsplit(parts._replace(netloc=f"{parts.username or ''}:***@{host}"))


async def migrate_store(src_url: str, dst_url: str, *, force: bool = False,
                        progress: Progress | None = None, batch: int = BATCH) -> dict[str, int]:
    """Copy every table of the store at ``src_url`` into ``dst_url``; returns rows
    copied per table. Refuses a target that already holds data unless ``force``
    (then rows already in the target, by key or id, are kept and the rest added)."""
    if src_url == dst_url:
        raise StoreError("--from and --to are the same store; give the new store as --to")
    src = create_store(src_url)
    # Opening a SQLite URL creates the file: a mistyped --from would "copy" an empty
    # store without a word.
    path = getattr(src, "path", None)
    if path and path != ":memory:" and not Path(path).exists():
        raise StoreError(f"the source store {path} does not exist; check --from "
                         "(sqlite:////absolute/path/to/state.db with four slashes; "
                         "sqlite:///path is relative to the current directory)")
    dst = create_store(dst_url)
    async with src, dst:
        return await _copy_all(src, dst, src_url, dst_url, force, progress, batch)


async def _copy_all(src, dst, src_url, dst_url, force, progress, batch) -> dict[str, int]:
    s, d = copier(src), copier(dst)
    existing = {t: await d.copy_count(t) for t in TABLES}
    if any(existing.values()) and not force:
        held = ", ".join(f"{n} {t}" for t, n in existing.items() if n)
        raise StoreError(
            f"the target store {_safe(dst_url)} is not empty ({held}). migrate-store "
            "copies into an empty store so nothing is mixed up by accident; point --to at "
            "a new database (or schema), or re-run with --force to add the source's rows "
            "to it (rows already there, by key or id, are kept as they are)")
    totals = {t: await s.copy_count(t) for t in TABLES}
    if not any(totals.values()):
        raise StoreError(f"the source store {_safe(src_url)} holds nothing to copy; check --from")
    copied: dict[str, int] = {}
    for table in TABLES:
        total = totals[table]
        done = 0
        copied[table] = 0
        if progress:
            progress(table, 0, total)
        after = None
        key = COPY_TABLES[table]
        while True:
            rows = await s.export_rows(table, after, batch)
            if not rows:
                break
            copied[table] += await d.import_rows(table, rows)
            done += len(rows)
            after = tuple(rows[-1][c] for c in key)
            if progress:
                progress(table, done, max(total, done))
            if len(rows) < batch:
                break
    await d.finish_import()
    return copied


# -- CLI -------------------------------------------------------------------------------

_DESCRIPTION = """\
Copy a draftgate store into another one, e.g. from SQLite to PostgreSQL when moving
to several hosts. Seen marks, drafts (with their ids, versions and approval message
ids), cursors, runs, audit, token usage and pause flags are copied, so after the
switch nothing is fetched or drafted again and cards already posted still work.
Stop every `draftgate run` on the old store first. The target must be empty unless
--force is given.

migrate-store reads no deployment file (it takes no -c): a SQLite URL with three
slashes, sqlite:///state.db, is relative to the current directory here, not to the
deployment file's folder as in `store:`. Give the absolute path with four slashes,
e.g. --from sqlite:////var/lib/draftgate/state.db."""


def add_cli(subparsers, parents=()) -> argparse.ArgumentParser:
    """Register ``migrate-store`` (and the ``parents``' options) on argparse subparsers."""
    p = subparsers.add_parser(
        "migrate-store", parents=list(parents),
        help="copy the store to another backend (e.g. SQLite -> PostgreSQL)",
        description=_DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--from", dest="src", required=True, metavar="URL",
                   help="store to copy from, e.g. sqlite:////var/lib/draftgate/state.db (four "
                        "slashes: an absolute path; three: relative to the current directory)")
    p.add_argument("--to", dest="dst", required=True, metavar="URL",
                   help="store to copy into, e.g. postgresql://draftgate@db.internal/draftgate")
    p.add_argument("--force", action="store_true",
                   help="copy into a target that already holds data (existing rows are kept)")
    p.set_defaults(func=run_cli)
    return p


def _Bar(out=None, width: int = 30) -> Bar:
    """migrate-store is run by hand: always draw the bar."""
    return Bar(out, width, tty=True)


def run_cli(args) -> int:
    """Run ``migrate-store`` from parsed arguments; prints a summary, returns the exit code."""
    for option, url in (("--from", args.src), ("--to", args.dst)):
        try:
            create_store(url)  # parses the URL only; a bad one is a bad argument: exit 2
        except (StoreError, ValueError) as e:
            print(f"migrate-store: {option}: {e}", file=sys.stderr)
            return 2
    try:
        copied = asyncio.run(migrate_store(args.src, args.dst, force=args.force, progress=_Bar()))
    except (StoreError, ValueError) as e:
        print(f"migrate-store: {e}", file=sys.stderr)
        return 1
    summary = ", ".join(f"{n} {t}" for t, n in copied.items())
    print(f"copied {summary} from {_safe(args.src)} to {_safe(args.dst)}")
    return 0
