"""What the draftgate commands share: common options, loading settings, the console's
identity, checking text arguments."""

from __future__ import annotations

import argparse

from .. import REPO, redact, version  # noqa: F401  (the commands' --version and demo)
from ..config.load import Settings, load_settings
from ..errors import ConfigError


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


def text_argument(name: str, value: str) -> None:
    """A command-line value that is not valid UTF-8 arrives with surrogates in it and
    could never match a stored id; say so instead of failing inside the store."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        # Python decodes argv with surrogateescape: byte 0xNN became U+DCNN.
        bad = next((ord(c) - 0xDC00 for c in value if 0xDC80 <= ord(c) <= 0xDCFF), None)
        detail = f" (byte 0x{bad:02x} is not UTF-8)" if bad is not None else ""
        raise ConfigError(f"{name}: not valid text{detail}; copy it exactly as `draftgate "
                          f"pending` or `draftgate status` shows it") from None
