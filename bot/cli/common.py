"""What the draftgate commands share: common options, loading settings, opening the store."""

from __future__ import annotations

import argparse
import contextlib
from pathlib import Path

from .. import redact
from ..config.load import Settings, load_settings

REPO = Path(__file__).resolve().parents[2]  # a checkout's root, when run from one


def verbose_option(dest: str = "verbose_after") -> argparse.ArgumentParser:
    """-v before the command, or after it (`draftgate run -v`): main() adds the counts."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("-v", "--verbose", dest=dest, action="count", default=0,
                   help="more logging on stderr (-vv for debug)")
    return p


def options(config: str | None = "draftgate.yaml", *, json: bool = False) -> list:
    """Parent parsers for a command's shared options: -c, --json if it has it, -v."""
    p = argparse.ArgumentParser(add_help=False)
    # default None here, the command's own default applied in main(): so a -c given
    # before the command (`draftgate -c FILE validate`) is not overwritten by it.
    p.add_argument("-c", "--config", default=None, metavar="FILE",
                   help=f"deployment file (default: {config or 'draftgate.demo.yaml'})")
    p.set_defaults(config_default=config)
    if json:
        p.add_argument("--json", action="store_true", help="machine-readable output")
    return [p, verbose_option()]


def say(text: str) -> str:
    """Text for the terminal that may quote an outside answer (an error, a check's
    detail): without secrets and without terminal escapes."""
    return redact.escape_controls(redact.scrub(text), keep_newlines=True)


def load(path) -> Settings:
    """The settings in the deployment file at ``path``, their secrets registered."""
    from ..engine.build import register_secrets

    settings = load_settings(path)
    register_secrets(settings)  # before any stage, or library, can log one
    return settings


def store_for(settings: Settings):
    """The configured store: ``async with store_for(settings) as store:`` opens, closes it."""
    from ..store import create_store

    return create_store(settings.store)


@contextlib.asynccontextmanager
async def existing_store(settings: Settings):
    """The configured store for a command that only reads or changes what is there: a
    store that does not exist is reported (a typo in `store:` must not look like
    "never run") and nothing is created."""
    from ..store import StoreMissing

    store = store_for(settings)
    try:
        await store.open(create=False)
    except StoreMissing as exc:
        raise StoreMissing(f"{exc} (`store:` in {settings.file})") from None
    try:
        yield store
    finally:
        await store.close()


def channels(settings: Settings, store, *, demo: bool = False) -> dict:
    """The approval channels the pipelines use, by name (console always without Telegram)."""
    from ..approvals.console import ConsoleChannel

    found: dict = {}
    used = {p.approval.channel for p in settings.pipelines}
    if "console" in used or settings.telegram is None:
        found["console"] = ConsoleChannel(auto_approve=demo)
    if settings.telegram is not None:
        from ..approvals.telegram import channel as telegram

        found["telegram"] = telegram.create(settings, store)
    return found


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
