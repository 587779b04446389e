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

from ..app import migrate_store, safe_url, store_of_url
from ..errors import StoreError
from .progress import Bar

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
            store_of_url(url)  # parses the URL only; a bad one is a bad argument: exit 2
        except (StoreError, ValueError) as e:
            print(f"migrate-store: {option}: {e}", file=sys.stderr)
            return 2
    try:
        copied = asyncio.run(migrate_store(args.src, args.dst, force=args.force, progress=_Bar()))
    except (StoreError, ValueError) as e:
        print(f"migrate-store: {e}", file=sys.stderr)
        return 1
    summary = ", ".join(f"{n} {t}" for t, n in copied.items())
    print(f"copied {summary} from {safe_url(args.src)} to {safe_url(args.dst)}")
    return 0
