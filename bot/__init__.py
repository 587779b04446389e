"""draftgate: email replies drafted by a model, sent only after a human approves them."""

from __future__ import annotations

import contextlib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]  # a checkout's root, when run from one


def version() -> str:
    """draftgate's version: the installed package's, else the checkout's pyproject.toml."""
    from importlib import metadata

    try:
        return metadata.version("draftgate")
    except metadata.PackageNotFoundError:  # run from a checkout that was never installed
        import tomllib

        with contextlib.suppress(OSError, tomllib.TOMLDecodeError):
            return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
        return "unknown"
