"""``python -m bot COMMAND`` and the ``draftgate`` console script: see :mod:`bot.cli.main`."""

from .cli.main import build_parser, main  # noqa: F401 (build_parser: for the docs tests)

if __name__ == "__main__":
    raise SystemExit(main())
