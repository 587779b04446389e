"""Which files a pipeline's ``drafter.knowledge`` globs give the knowledge index.

A matched file is left out, and named (``validate`` as an error, ``status`` at run
time, a warning in the log), when it is bigger than ``drafter.knowledge_max_file``
(a 50 MB file took 10 s and 196 MB to index) or when it is a symlink, or sits under
one, that resolves outside the folder its glob starts from (``kb/*.md``: ``kb``): the
knowledge folder is what the operator chose to show the model, not the files a link
in it points at.
"""

from __future__ import annotations

import glob
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable


@dataclass(frozen=True)
class KnowledgeFiles:
    """What the globs matched: the files indexed, and those left out with why."""

    files: list[Path] = field(default_factory=list)
    skipped: list[tuple[Path, str]] = field(default_factory=list)


def _resolve(base: Path, value: str) -> Path:
    p = Path(os.path.expanduser(value))
    return p if p.is_absolute() else base / p


def _root(pattern: Path) -> Path:
    """The folder a glob starts from: its part before the first wildcard (a plain
    file's own folder)."""
    parts = pattern.parts
    for i, part in enumerate(parts):
        if glob.has_magic(part):
            return Path(*parts[:i]) if i else Path(".")
    return pattern.parent


def size_text(n: int) -> str:
    """``2000000`` -> ``2 MB`` (decimal units, as sizes are written in the config)."""
    for unit, factor in (("GB", 1000**3), ("MB", 1000**2), ("kB", 1000)):
        if n >= factor:
            return f"{n / factor:.3g} {unit}"
    return f"{n} bytes"


def scan(base: Path, patterns: tuple[str, ...], max_file: int | None = None) -> KnowledgeFiles:
    """The files the ``patterns`` match (relative to ``base``), sorted, each once,
    without those over ``max_file`` bytes or linked from outside their glob's folder.
    Blocking (stat and realpath): call it off the event loop."""
    found: dict[Path, str | None] = {}
    for pattern in patterns:
        where = _resolve(base, pattern)
        root = os.path.realpath(_root(where))
        for f in glob.glob(str(where), recursive=True):
            path = Path(f)
            if path in found or not os.path.isfile(f):
                continue
            real = os.path.realpath(f)
            if os.path.commonpath([real, root]) != root:
                found[path] = f"a link to {real}, outside {root}"
                continue
            try:
                size = os.stat(f).st_size
            except OSError:
                continue  # gone since the glob
            if max_file is not None and size > max_file:
                found[path] = (f"{size_text(size)}, over drafter.knowledge_max_file "
                               f"({size_text(max_file)})")
            else:
                found[path] = None
    return KnowledgeFiles(sorted(p for p, why in found.items() if why is None),
                          sorted((p, why) for p, why in found.items() if why is not None))


def knowledge_files(base: Path, patterns: tuple[str, ...], max_file: int | None = None
                    ) -> list[Path]:
    """The files the knowledge index holds for the pipeline (see :func:`scan`)."""
    return scan(base, patterns, max_file).files


def problems(pipelines: Iterable[Any]) -> list[str]:
    """``validate``'s errors: every knowledge file a pipeline's index would leave out,
    with its file, path and the fix. (Not a load error: a running service skips such
    a file, logs it and names it in ``status``.)"""
    out = []
    for p in pipelines:
        for i, pattern in enumerate(p.drafter.knowledge):
            for path, why in scan(p.base_dir, (pattern,), p.drafter.knowledge_max_file).skipped:
                out.append(f"{p.file}: drafter.knowledge[{i}]: {path} is left out of the "
                           f"knowledge index: {why}; " + (
                               "shorten or split it, or raise drafter.knowledge_max_file"
                               if "knowledge_max_file" in why else
                               "copy the file into the folder instead of linking it"))
    return out
