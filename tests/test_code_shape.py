"""The shape rules of bot/ and tests/ (issues 12 and 23), kept true. A failure names the
offender, so it is split or moved where it grows, not later.

- No module over 500 lines, no function over 60.
- Imports go down the layers below (a package imports only packages listed before it,
  and itself), and no import cycle between modules.
- No Telegram handler nor CLI command reaches the store or the engine: they act through
  the operator desk (``bot.desk``) and the composition root (``bot.app``).
- Nothing in bot/ reads a test-only environment variable.
- No test module imports another test module (shared helpers live in tests/support/).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BOT = ROOT / "bot"
TESTS = ROOT / "tests"
MAX_MODULE, MAX_FUNCTION = 500, 60

#: Lowest first. A module may import its own package and the packages before it.
LAYERS = ["redact", "errors", "models", "clock", "shared", "scoreboard", "stages", "scheduler",
          "store", "mail", "config", "service", "gmail", "drafters", "context", "imap", "microsoft",
          "sources", "senders",
          "engine", "desk", "approvals", "app", "cli", "__main__"]
#: Modules a handler or command may import from the store or the engine: pure helpers
#: with no I/O (the audit chain's hashing; building stages for `validate`/`doctor`).
PURE = {"bot.store.chain", "bot.engine.build"}


def _modules() -> list[Path]:
    return sorted(BOT.rglob("*.py"))


def _name(p: Path) -> str:
    parts = list(p.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(p: Path, *, top_only: bool) -> set[str]:
    """The bot modules ``p`` imports (``top_only``: at import time, not in functions);
    ``if TYPE_CHECKING`` blocks are not imports."""
    mod = _name(p)
    pkg = mod if p.name == "__init__.py" else mod.rsplit(".", 1)[0]
    found: set[str] = set()

    def visit(nodes, in_function: bool) -> None:
        for n in nodes:
            if isinstance(n, ast.If) and "TYPE_CHECKING" in ast.unparse(n.test):
                continue
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if not top_only:
                    visit(n.body, True)
            elif isinstance(n, ast.Import):
                found.update(a.name for a in n.names if a.name.split(".")[0] == "bot")
            elif isinstance(n, ast.ImportFrom):
                base = n.module or ""
                if n.level:
                    parts = pkg.split(".")
                    base = ".".join(parts[:len(parts) - n.level + 1] + ([n.module] if n.module else []))
                if base.split(".")[0] != "bot":
                    continue
                for a in n.names:
                    sub = f"{base}.{a.name}"
                    path = ROOT / sub.replace(".", "/")
                    found.add(sub if path.with_suffix(".py").exists() or path.is_dir() else base)
            else:
                for field in ("body", "orelse", "handlers", "finalbody"):
                    visit(getattr(n, field, []), in_function)

    visit(ast.parse(p.read_text(encoding="utf-8")).body, False)
    found.discard(mod)
    return found


def _package(mod: str) -> str:
    return mod.split(".")[1] if "." in mod else "__init__"


def test_no_module_in_bot_is_over_500_lines():
    long = [f"{p.relative_to(ROOT)}: {n} lines" for p in _modules()
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_MODULE]
    assert not long, f"modules over {MAX_MODULE} lines: {long}"


def test_no_function_in_bot_is_over_60_lines():
    long = []
    for p in _modules():
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                start = min([node.lineno, *(d.lineno for d in node.decorator_list)])
                if (n := node.end_lineno - start + 1) > MAX_FUNCTION:
                    long.append(f"{p.relative_to(ROOT)}:{node.lineno} {node.name}: {n} lines")
    assert not long, f"functions over {MAX_FUNCTION} lines: {long}"


def test_imports_go_down_the_layers():
    up = []
    for p in _modules():
        mod = _name(p)
        here = _package(mod)
        if here == "__init__":
            continue
        for target in _imports(p, top_only=False):
            there = _package(target)
            if there == "__init__" or there == here:
                continue
            assert here in LAYERS and there in LAYERS, f"{mod} -> {target}: add it to LAYERS"
            if LAYERS.index(there) > LAYERS.index(here):
                up.append(f"{mod} -> {target}")
    assert not up, f"imports from a lower layer to a higher one: {up}"


def test_no_import_cycle_between_modules():
    graph = {_name(p): _imports(p, top_only=True) for p in _modules()}
    cycles, done, path = [], set(), []

    def walk(node: str) -> None:
        if node in path:
            cycles.append(path[path.index(node):] + [node])
            return
        if node in done or node not in graph:
            return
        path.append(node)
        for nxt in sorted(graph[node]):
            walk(nxt)
        path.pop()
        done.add(node)

    for node in sorted(graph):
        walk(node)
    assert not cycles, f"import cycles: {cycles[:5]}"


def test_handlers_and_commands_reach_state_only_through_the_desk():
    """Telegram handlers, the console and every CLI command get the desk, never the
    store or the engine (the desk's methods are the only way a channel changes state)."""
    found = []
    for p in [*(BOT / "approvals").rglob("*.py"), *(BOT / "cli").rglob("*.py")]:
        for target in _imports(p, top_only=False):
            if target.startswith(("bot.store", "bot.engine")) and target not in PURE:
                found.append(f"{p.relative_to(ROOT)} imports {target}")
    assert not found, found


def test_nothing_in_bot_reads_a_test_only_environment_variable():
    found = [str(p.relative_to(ROOT)) for p in _modules()
             if "DRAFTGATE_TEST" in p.read_text(encoding="utf-8")]
    assert not found, f"inject through a constructor instead: {found}"


def test_no_test_module_imports_another_test_module():
    found = []
    for p in sorted(TESTS.rglob("*.py")):
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
            names = []
            if isinstance(node, ast.ImportFrom):
                names = [node.module or ""] + [a.name for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            if any(n.rsplit(".", 1)[-1].startswith("test_") for n in names):
                found.append(f"{p.relative_to(ROOT)}:{node.lineno}")
    assert not found, f"move what they share into tests/support/: {found}"
