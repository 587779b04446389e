"""The shape rules of bot/ (issue 12), kept true: no module over 600 lines, no function
over 80. A failure names the offender, so it is split where it grows, not later."""

from __future__ import annotations

import ast
from pathlib import Path

BOT = Path(__file__).resolve().parent.parent / "bot"
MAX_MODULE, MAX_FUNCTION = 600, 80


def _modules() -> list[Path]:
    return sorted(BOT.rglob("*.py"))


def test_no_module_in_bot_is_over_600_lines():
    long = [f"{p.relative_to(BOT.parent)}: {n} lines" for p in _modules()
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_MODULE]
    assert not long, f"modules over {MAX_MODULE} lines: {long}"


def test_no_function_in_bot_is_over_80_lines():
    long = []
    for p in _modules():
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                start = min([node.lineno, *(d.lineno for d in node.decorator_list)])
                if (n := node.end_lineno - start + 1) > MAX_FUNCTION:
                    long.append(f"{p.relative_to(BOT.parent)}:{node.lineno} {node.name}: {n} lines")
    assert not long, f"functions over {MAX_FUNCTION} lines: {long}"
