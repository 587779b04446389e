"""``python -m bot COMMAND`` and the ``draftgate`` console script: see :mod:`bot.cli`."""

import sys

from .cli import build_parser, main

__all__ = ["build_parser", "main"]

if __name__ == "__main__":
    sys.exit(main())
