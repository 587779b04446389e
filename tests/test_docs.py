"""The docs are part of the product: every command is in README.md and has --help."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from bot.__main__ import build_parser, main

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")


def _subcommands(parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield prefix + (name,), sub
                yield from _subcommands(sub, prefix + (name,))


COMMANDS = sorted(path for path, _ in _subcommands(build_parser()))


def test_the_cli_has_the_commands_the_docs_promise():
    names = {p[0] for p in COMMANDS}
    assert {"run", "demo", "validate", "status", "pending", "replay", "sweep", "doctor",
            "auth", "migrate-store"} <= names


@pytest.mark.parametrize("path", COMMANDS, ids=" ".join)
def test_every_cli_command_is_in_the_readme_with_a_description(path):
    line = next((l for l in README.splitlines() if f"`draftgate {' '.join(path)}" in l), None)
    assert line is not None, f"README.md does not document `draftgate {' '.join(path)}`"
    assert len(line.split("|")) >= 3 or len(line) > 40


@pytest.mark.parametrize("path", COMMANDS, ids=" ".join)
def test_every_cli_command_has_help(path, capsys):
    with pytest.raises(SystemExit) as exit_:
        main([*path, "--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: draftgate " + " ".join(path))


def test_every_telegram_command_is_in_the_readme():
    from bot.approvals.telegram.channel import COMMANDS as TELEGRAM

    for name, _args, description in TELEGRAM:
        assert description
        assert f"`/{name}" in README, f"README.md does not document /{name}"


def test_the_readme_starts_with_the_two_commands():
    top = README[:1500]
    assert "./scripts/demo" in top and "./scripts/test" in top


def test_python_dash_m_bot_and_the_console_script_both_answer():
    out = subprocess.run([sys.executable, "-m", "bot", "--help"], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0 and "usage: draftgate" in out.stdout
    script = Path(sys.executable).parent / "draftgate"
    if script.exists():
        out = subprocess.run([str(script), "--help"], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0 and "usage: draftgate" in out.stdout


def test_bad_arguments_get_a_usage_line_and_exit_2(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["replay", "only-one-arg"])
    assert exit_.value.code == 2
    assert "usage: draftgate replay" in capsys.readouterr().err
