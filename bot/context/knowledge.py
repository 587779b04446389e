"""A pipeline's knowledge files (``drafter.knowledge``), split into passages and kept
indexed in the store.

A file is split at its Markdown headings (``#`` to ``######``); under a heading, or in
a file without any, paragraphs (text between blank lines) are grouped into passages
of at most :data:`MAX_PASSAGE` characters. Each passage keeps its file and heading, so
the model and the operator see where a fact came from (``returns.md › Refunds``).

The index follows the files without a restart, cheaply: at drafting time each
matched file is stat'ed; only a file whose mtime or size changed is read and hashed,
and only one whose content hash changed is re-indexed (one transaction per file).
Files no longer matched are dropped from the index, and so are files over
``drafter.knowledge_max_file`` and links out of their folder
(:mod:`bot.config.knowledge`; named in the log and in ``status``). The pass runs
beside the drafts, never in their way (:meth:`Knowledge.refresh`).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import re
from pathlib import Path

from ..config.knowledge import scan
from ..config.load import PipelineConfig
from ..errors import describe_error

log = logging.getLogger("draftgate.knowledge")

MAX_PASSAGE = 1200  # characters of one passage
#: Seconds a draft waits for an index pass it started, unless told (Knowledge.refresh).
INDEX_WAIT = 3.0
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
    """One pipeline's knowledge index; :meth:`refresh` before searching it."""

    def __init__(self, store, pipeline: PipelineConfig):
        self.store, self.pipeline = store, pipeline
        # path -> (mtime_ns, size, sha256) as last indexed (None: not read from the store yet)
        self._known: dict[str, tuple[int, int, str]] | None = None
        self._lock = asyncio.Lock()  # one pass at a time
        self._current: set[str] = set()  # the files the globs matched at the last sync
        self._pass: asyncio.Task | None = None  # the index pass running, if any
        self._warned: set[tuple[str, str]] = set()  # skipped files already logged
        #: Moves on with every pass that changed the index (a file indexed or dropped),
        #: also one that ended after the draft that started it stopped waiting.
        self.generation = 0
        self._version: tuple[int, str] | None = None  # (generation, version) of `version`

    @property
    def version(self) -> str | None:
        """What the store's index holds for the pipeline: a digest of each indexed file's
        path and content hash (None until a pass read them). Unlike :attr:`generation`
        it is the same for every object indexing the same files, so a search re-reads
        its copy of the passages only when they changed (not when the configuration
        was reloaded, giving a new object)."""
        if self._known is None:
            return None
        if self._version is None or self._version[0] != self.generation:
            files = sorted((path, stamp[2]) for path, stamp in self._known.items())
            digest = hashlib.sha256(repr(files).encode()).hexdigest()
            self._version = (self.generation, digest)
        return self._version[1]

    async def refresh(self, wait: float = INDEX_WAIT) -> None:
        """Bring the index in step with the files, off the drafting path: a draft
        starts a pass when none is running and waits for it at most ``wait`` seconds
        (a stat of each file, usually); when a pass is already running (a big file
        being indexed) it does not wait at all. Either way the pass goes on in the
        background: a draft that times out or is cancelled does not cancel it, and the
        next draft joins it instead of starting it again. Whether the index changed
        since a caller last searched it: :attr:`generation`."""
        running = self._pass is not None and not self._pass.done()
        if not running:
            self._pass = asyncio.create_task(self.sync(), name=f"knowledge-{self.pipeline.name}")
            self._pass.add_done_callback(self._ended)
        task = self._pass
        assert task is not None
        with contextlib.suppress(TimeoutError, Exception):  # a failure: logged by _ended
            await asyncio.wait_for(asyncio.shield(task), 0 if running else wait)

    def _ended(self, task: asyncio.Task) -> None:
        exc = None if task.cancelled() else task.exception()
        if exc is not None:
            log.warning("%s: knowledge index pass failed: %s", self.pipeline.name,
                        describe_error(exc))

    async def close(self) -> None:
        """Stop a pass still running (at shutdown)."""
        if self._pass is not None and not self._pass.done():
            self._pass.cancel()
            with contextlib.suppress(BaseException):
                await self._pass

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
            if changed or gone:
                self.generation += 1
            return len(changed)

    def _changed(self, known: dict[str, tuple[int, int, str]]
                 ) -> list[tuple[str, tuple[int, int, str], list[tuple[str, str]]]]:
        """In a worker thread: the files whose content changed, with their passages."""
        o = self.pipeline.drafter
        found = scan(self.pipeline.base_dir, o.knowledge, o.knowledge_max_file)
        for path, why in found.skipped:
            if (str(path), why) not in self._warned:  # once per file and reason
                self._warned.add((str(path), why))
                log.warning("%s: knowledge file %s left out of the index: %s",
                            self.pipeline.name, path, why)
        self._current = {str(f) for f in found.files}
        out = []
        for f in found.files:
            try:
                st = os.stat(f)
                before = known.get(str(f))
                if before and before[:2] == (st.st_mtime_ns, st.st_size):
                    continue  # unchanged: no read, no hash
                if st.st_size > o.knowledge_max_file:  # grew since the scan
                    self._current.discard(str(f))
                    continue
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
