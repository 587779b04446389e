"""Reading the files of a configuration: YAML, strictly (no base-60 numbers, no
duplicate keys), and the pipeline files that ``pipelines:`` names or globs. Problems
go to the :class:`Checker`, as everywhere in :mod:`bot.config.load`."""

from __future__ import annotations

import glob
import os
import re
from pathlib import Path
from typing import Any

import yaml

from .checker import Checker, kind_of, shown


class _Loader(yaml.SafeLoader):
    """SafeLoader without YAML 1.1's base-60 numbers (``schedule: 9:00`` would be 540,
    every 9 minutes; here it stays the string "9:00" and is explained), and with
    duplicate keys refused (YAML keeps the last one silently)."""


_INT = "tag:yaml.org,2002:int"
_FLOAT = "tag:yaml.org,2002:float"
_NO_SEXAGESIMAL = {
    _INT: re.compile(r"""^(?:[-+]?0b[0-1_]+
                    |[-+]?0[0-7_]+
                    |[-+]?(?:0|[1-9][0-9_]*)
                    |[-+]?0x[0-9a-fA-F_]+)$""", re.X),
    _FLOAT: re.compile(r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+][0-9]+)?
                    |\.[0-9][0-9_]*(?:[eE][-+][0-9]+)?
                    |[-+]?\.(?:inf|Inf|INF)
                    |\.(?:nan|NaN|NAN))$""", re.X),
}
_Loader.yaml_implicit_resolvers = {
    first: [(tag, _NO_SEXAGESIMAL.get(tag, rx)) for tag, rx in resolvers]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}


class _DuplicateKey(Exception):
    def __init__(self, message: str, line: int):
        super().__init__(message)
        self.line = line


def _check_duplicate_keys(node: yaml.Node) -> None:
    """Raise _DuplicateKey for the first mapping that names a key twice (merge keys
    ``<<`` excepted: overriding a merged key is what they are for)."""
    todo, done = [node], set()
    while todo:
        n = todo.pop()
        if id(n) in done:
            continue
        done.add(id(n))
        if isinstance(n, yaml.MappingNode):
            first: dict[tuple[str, str], int] = {}
            for key, value in n.value:
                todo.append(value)
                if not isinstance(key, yaml.ScalarNode) or key.tag == "tag:yaml.org,2002:merge":
                    continue
                line = key.start_mark.line + 1
                if (key.tag, key.value) in first:
                    raise _DuplicateKey(
                        f"duplicate key {key.value!r} (first on line "
                        f"{first[(key.tag, key.value)]}); YAML would silently keep only the "
                        f"last one, so delete or rename one of them", line)
                first[(key.tag, key.value)] = line
        elif isinstance(n, yaml.SequenceNode):
            todo.extend(n.value)


#: How much larger than written aliases (``*name``) may make a file, counted in values
#: (a scalar, list or mapping; a long text counts once per 100 characters). Anchors
#: and merge keys for shared settings stay far below it; a few lines of nested
#: aliases ("billion laughs") would expand past any memory.
ALIAS_LIMIT = 10_000
_TEXT_UNIT = 100


def _alias_growth(root: yaml.Node) -> int | None:
    """How many values aliases add to the document (its size as a tree minus its size
    as written), capped just above :data:`ALIAS_LIMIT`; None when an alias contains
    itself (it would expand without end). Each node is visited once."""
    written = sum(_weight(n) for n in _nodes(root))
    cap = written + ALIAS_LIMIT + 1  # no need to count further: ints stay small
    size: dict[int, int] = {}
    on_path: set[int] = set()
    todo: list[tuple[yaml.Node, bool]] = [(root, False)]
    while todo:
        node, children_done = todo.pop()
        kids = (node.value if isinstance(node, yaml.SequenceNode) else
                [n for pair in node.value for n in pair]
                if isinstance(node, yaml.MappingNode) else [])
        if children_done:
            on_path.discard(id(node))
            size[id(node)] = min(_weight(node) + sum(size[id(k)] for k in kids), cap)
            continue
        if id(node) in size:
            continue
        if id(node) in on_path:
            return None
        on_path.add(id(node))
        todo.append((node, True))
        todo.extend((k, False) for k in kids if id(k) not in size)
    return max(0, size[id(root)] - written)


def _weight(node: yaml.Node) -> int:
    return 1 + len(node.value) // _TEXT_UNIT if isinstance(node, yaml.ScalarNode) else 1


def _nodes(root: yaml.Node) -> list[yaml.Node]:
    """Every node of the document once, as written (an alias's target counted once)."""
    seen: dict[int, yaml.Node] = {}
    todo = [root]
    while todo:
        node = todo.pop()
        if id(node) in seen:
            continue
        seen[id(node)] = node
        if isinstance(node, yaml.SequenceNode):
            todo.extend(node.value)
        elif isinstance(node, yaml.MappingNode):
            todo.extend(n for pair in node.value for n in pair)
    return list(seen.values())


def load_yaml(path: Path, ck: Checker) -> Any:
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        ck.error("", "file not found; create it or pass another with -c FILE")
        return None
    except IsADirectoryError:
        ck.error("", "is a folder; expected a YAML file")
        return None
    except OSError as exc:
        ck.error("", f"cannot read: {exc.strerror or exc}")
        return None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        ck.error("", f"not UTF-8 (byte 0x{raw[exc.start]:02x} at offset {exc.start}); "
                     f"save it as UTF-8")
        return None
    loader = _Loader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _check_duplicate_keys(node)
        growth = _alias_growth(node)
        if growth is None or growth > ALIAS_LIMIT:
            ck.error("", ("an alias (*name) contains itself, so it would expand without end"
                          if growth is None else
                          f"its aliases (*name) expand it by more than {ALIAS_LIMIT} values "
                          f"(a long text counts once per {_TEXT_UNIT} characters)")
                     + "; aliases are for small repeated pieces: write the values out or "
                       "nest aliases less deeply")
            return None
        return loader.construct_document(node)
    except _DuplicateKey as exc:
        ck.error("", f"line {exc.line}: {exc}")
        return None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        ck.error("", f"{where}not valid YAML: {getattr(exc, 'problem', exc)}")
        return None
    finally:
        loader.dispose()


def pipeline_files(ck: Checker, data: dict, base: Path) -> list[Path]:
    """The pipeline files ``pipelines:`` names (a file, a glob or a list of them), each once."""
    pattern = ck.get(data, "pipelines", "", (str, list), default="pipelines/*.yaml")
    if isinstance(pattern, list) and not pattern:
        ck.error("pipelines", "expected at least one pipeline file or glob, like pipelines/*.yaml")
    patterns: list[tuple[str, str]] = []  # (key path, pattern)
    for i, pat in enumerate([pattern] if isinstance(pattern, str) else pattern or []):
        where = "pipelines" if isinstance(pattern, str) else f"pipelines[{i}]"
        if isinstance(pat, str) and pat.strip():
            patterns.append((where, pat))
        else:
            ck.error(where, f"expected a file name or a glob like pipelines/*.yaml, got "
                            f"{kind_of(pat)} {shown(pat)}")
    files: dict[Path, Path] = {}  # resolved: as matched; one matched twice is loaded once
    for where, pat in patterns:
        full = os.path.expanduser(pat)
        full = full if os.path.isabs(full) else str(base / full)
        if not glob.has_magic(pat):
            if os.path.isdir(full):
                ck.error(where, f"{pat} is a folder; name its files with a glob like "
                                f"{pat.rstrip('/')}/*.yaml")
            elif not os.path.exists(full):
                ck.error(where, f"{pat}: file not found (looked for {full})")
        matched = [m for m in sorted(glob.glob(full)) if not os.path.isdir(m)]
        if not matched and glob.has_magic(pat):
            # A glob may well match nothing (*.yml beside *.yaml); a folder that does
            # not exist is a typo (pipelnes/*.yaml) and is named.
            folder = full
            while glob.has_magic(folder):
                folder = os.path.dirname(folder)
            if not os.path.isdir(folder):
                ck.error(where, f"no pipeline files match {pat}: folder {folder} not found")
        for m in matched:
            files.setdefault(Path(m).resolve(), Path(m))
    if patterns and not files and not ck.errors:
        ck.error("pipelines", "no pipeline files match "
                 + ", ".join(pat for _, pat in patterns) + f" (in {base})")
    return list(files.values())
