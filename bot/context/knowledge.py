"""A pipeline's knowledge files (``drafter.knowledge``), split into passages and kept
indexed in the store.

A file is split at its Markdown headings (``#`` to ``######``); under a heading, or in
a file without any, paragraphs (text between blank lines) are grouped into passages
of at most :data:`MAX_PASSAGE` characters. Each passage keeps its file and heading, so
the model and the operator see where a fact came from (``returns.md › Refunds``).

The index follows the files without a restart, cheaply: at drafting time each
matched file is stat'ed; only a file whose mtime or size changed is read and hashed,
and only one whose content hash changed is re-indexed (one transaction per file).
Files no longer matched are dropped from the index.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import re
from pathlib import Path

from ..config.load import PipelineConfig, knowledge_files

log = logging.getLogger("draftgate.knowledge")

MAX_PASSAGE = 1200  # characters of one passage
_HEADING = re.compile(r"^ {0,3}(#{1,6})[ \t]+(.*?)[ \t#]*$")


def split_passages(text: str, max_chars: int = MAX_PASSAGE) -> list[tuple[str, str]]:
    """(heading, text) passages of a knowledge file; see the module docstring."""
    out: list[tuple[str, str]] = []
    heading = ""
    paragraphs: list[str] = []
    lines: list[str] = []

    def end_paragraph() -> None:
        if lines:
            paragraphs.append("\n".join(lines).strip())
            lines.clear()

    def end_section() -> None:
        end_paragraph()
        out.extend((heading, chunk) for chunk in _group(paragraphs, max_chars))
        paragraphs.clear()

    for line in text.splitlines():
        m = _HEADING.match(line)
        if m:
            end_section()
            heading = m.group(2).strip()[:200]
        elif line.strip():
            lines.append(line.rstrip())
        else:
            end_paragraph()
    end_section()
    return out


def _group(paragraphs: list[str], max_chars: int) -> list[str]:
    """Paragraphs joined into chunks of at most ``max_chars`` (a longer one is cut)."""
    chunks: list[str] = []
    current = ""
    for para in (p for p in paragraphs if p):
        for start in range(0, len(para), max_chars):
            piece = para[start:start + max_chars]
            if current and len(current) + 2 + len(piece) <= max_chars:
                current += "\n\n" + piece
            else:
                if current:
                    chunks.append(current)
                current = piece
    if current:
        chunks.append(current)
    return chunks


class Knowledge:
    """One pipeline's knowledge index; :meth:`sync` before searching it."""

    def __init__(self, store, pipeline: PipelineConfig):
        self.store, self.pipeline = store, pipeline
        # path -> (mtime_ns, size, sha256) as last indexed (None: not read from the store yet)
        self._known: dict[str, tuple[int, int, str]] | None = None
        self._lock = asyncio.Lock()  # concurrent drafts of one pipeline index a file once
        self._current: set[str] = set()  # the files the globs matched at the last sync

    async def sync(self) -> int:
        """Bring the index in step with the files; how many files were re-indexed."""
        async with self._lock:
            p = self.pipeline
            if self._known is None:
                stored = await self.store.knowledge_files(p.name)
                self._known = {path: (m, size, sha) for path, (sha, m, size) in stored.items()}
            known = self._known
            changed = await asyncio.to_thread(self._changed, known)
            for path, stamp, passages in changed:
                await self.store.index_knowledge(p.name, path, (stamp[2], stamp[0], stamp[1]),
                                                 passages)
                known[path] = stamp
                log.info("%s: knowledge %s indexed: %d passage(s)", p.name, path, len(passages))
            gone = [path for path in known if path not in self._current]
            if gone:
                await self.store.drop_knowledge(p.name, gone)
                for path in gone:
                    del known[path]
            return len(changed)

    def _changed(self, known: dict[str, tuple[int, int, str]]
                 ) -> list[tuple[str, tuple[int, int, str], list[tuple[str, str]]]]:
        """In a worker thread: the files whose content changed, with their passages."""
        files = knowledge_files(self.pipeline.base_dir, self.pipeline.drafter.knowledge)
        self._current = {str(f) for f in files}
        out = []
        for f in files:
            try:
                st = os.stat(f)
                before = known.get(str(f))
                if before and before[:2] == (st.st_mtime_ns, st.st_size):
                    continue  # unchanged: no read, no hash
                data = Path(f).read_bytes()
            except OSError as exc:
                log.warning("%s: knowledge file %s cannot be read: %s", self.pipeline.name, f,
                            exc.strerror or exc)
                continue
            sha = hashlib.sha256(data).hexdigest()
            stamp = (st.st_mtime_ns, st.st_size, sha)
            if before and before[2] == sha:
                known[str(f)] = stamp  # touched, not changed
                continue
            out.append((str(f), stamp, split_passages(data.decode("utf-8", "replace"))))
        return out
