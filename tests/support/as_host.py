"""Run draftgate as if on another machine, or with a clock that is off, for tests of
several hosts on one machine: ``python -m tests.support.as_host [--home NAME]
[--clock-offset SECONDS] -- <draftgate arguments>``.

The product takes a host and a clock only through its constructors (nothing in bot/
reads a test variable); this wrapper stands in for the other machine by replacing
:func:`bot.engine.lease.process_home` and :func:`bot.clock.wall` before draftgate's
modules are imported.
"""

from __future__ import annotations

import argparse
import sys
import time


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="as_host")
    parser.add_argument("--home", default=None, help="this process's machine, as leases name it")
    parser.add_argument("--clock-offset", type=float, default=0.0,
                        help="seconds this process's wall clock is ahead (negative: behind)")
    parser.add_argument("rest", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    rest = args.rest[1:] if args.rest[:1] == ["--"] else args.rest

    import bot.clock

    if args.clock_offset:
        offset = args.clock_offset
        bot.clock.wall = lambda: time.time() + offset  # before any module imports it
    import bot.engine.lease

    if args.home:
        home = args.home
        bot.engine.lease.process_home = lambda: home
    from bot.cli.main import main as draftgate

    return draftgate(rest)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
