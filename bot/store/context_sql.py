"""The store's half of a draft's context (issue 13): team memory (examples of sent
replies) and knowledge passages, searched with the database's own full-text search:
SQLite FTS5 ranked by bm25, PostgreSQL a stored ``tsvector`` ranked by ``ts_rank``.
No other index, no other service.

Shared by both SQL stores (a mixin of :class:`bot.store.sql.SqlStore`); the backend
says which search SQL it speaks with ``FTS``. An example is written by ``mark_sent``
in the transaction that records the send (``sql.example_row``); knowledge passages are
written here, one transaction per changed file.
"""

from __future__ import annotations

import re
import time
from typing import Any, Sequence

from ..models import Example, Passage
from .chain import Record

#: Terms of the new email a search uses at most (the longest ones: rarer, and fewer
#: terms keep an OR query over 50,000 examples fast).
MAX_TERMS = 8
#: Team memory searches the newest this many examples of a pipeline: relevance ranking
#: costs per matching reply, and common words ("order") match most of them.
MEMORY_WINDOW = 1000
_WORD = re.compile(r"[^\W_]{3,}")
_STOP = frozenset(
    "the and for are but not you your with this that have has had was were will would "
    "can could should from they them their there what when where which who why how all "
    "any our out get got just about into been also than then some more very much please "
    "thanks thank hello dear regards best kind sent wrote".split())
_INSERT_ROWS = 200  # passages per INSERT statement

_EXAMPLE_COLS = "e.pipeline, e.item_id, e.original, e.reply, e.edited, e.sent_at"
# An operator-edited reply counts double; newer above older on ties.
_SEARCH = {
    # Ranked inside the full-text query, then the few winners joined (a ranked join
    # costs 3x more). Examples: the pipeline is named in the MATCH, so only its rows in
    # the window are ranked. Knowledge: the pipeline is tested on the join; if other
    # pipelines crowded it out of the candidates, the search runs again with the
    # pipeline in the MATCH (exact but slower: that token matches all its rows).
    "sqlite": {
        "examples": f"SELECT {_EXAMPLE_COLS} FROM (SELECT rowid, bm25(examples_fts, 0.0, 1.0) "
                    "AS score FROM examples_fts WHERE examples_fts MATCH ? AND rowid >= ? "
                    "ORDER BY score LIMIT ?) f JOIN examples e ON e.id = f.rowid "
                    "WHERE e.pipeline = ? "
                    "ORDER BY f.score * (1 + e.edited), e.sent_at DESC LIMIT ?",
        "knowledge": "SELECT p.path, p.heading, p.text FROM (SELECT rowid, "
                     "bm25(knowledge_fts, 0.0, 2.0, 1.0) AS score FROM knowledge_fts WHERE "
                     "knowledge_fts MATCH ? AND rowid >= ? ORDER BY score LIMIT ?) f "
                     "JOIN knowledge_passages p ON p.id = f.rowid WHERE p.pipeline = ? "
                     "ORDER BY f.score, p.id LIMIT ?",
    },
    "postgres": {
        "examples": f"SELECT {_EXAMPLE_COLS} FROM examples e, to_tsquery('english', ?) q "
                    "WHERE e.pipeline = ? AND e.id >= ? AND e.tsv @@ q "
                    "ORDER BY ts_rank(e.tsv, q) * (1 + e.edited) DESC, e.sent_at DESC LIMIT ?",
        "knowledge": "SELECT p.path, p.heading, p.text FROM knowledge_passages p, "
                     "to_tsquery('english', ?) q WHERE p.pipeline = ? AND p.tsv @@ q "
                     "ORDER BY ts_rank(p.tsv, q) DESC, p.id LIMIT ?",
    },
}


def search_terms(text: str, limit: int = MAX_TERMS) -> list[str]:
    """The words of ``text`` a search looks for: letters and digits only (so nothing
    in an email is search syntax), no stop words, the longest ``limit`` of them."""
    words = dict.fromkeys(w for w in _WORD.findall(text.lower()) if w not in _STOP)
    return sorted(words, key=len, reverse=True)[:limit]


def _match(fts: str, terms: list[str], columns: str, pipeline: str | None = None) -> str:
    """The full-text query for ``terms`` in ``columns`` (SQLite), and only in
    ``pipeline``'s rows when given (pipeline names are letters, digits, "-", "_", ".")."""
    if fts != "sqlite":
        return " | ".join(terms)
    match = f"{{{columns}}} : (" + " OR ".join(f'"{t}"' for t in terms) + ")"
    return f'pipeline : "{pipeline}" AND {match}' if pipeline else match


#: Candidates ranked in the full-text query before the edited / newer order decides.
_CANDIDATES = 50


class ContextSql:
    """Examples and knowledge; see the module docstring. Needs the SqlStore primitives."""

    FTS = "sqlite"  # which search SQL the backend speaks: "sqlite" | "postgres"

    async def _query(self, sql: str, args: tuple = ()) -> list[Any]:
        raise NotImplementedError

    async def _script(self, statements: list[tuple[str, tuple]],
                      records: Sequence[Record] = ()) -> None:
        raise NotImplementedError

    def _clean(self, text: str | None) -> str | None:
        raise NotImplementedError

    def _audit_row(self, t: float, actor: str, action: str, key: str | None,
                   text: str | None, detail: str | None) -> Record:
        raise NotImplementedError

    # -- team memory ------------------------------------------------------------------
    async def examples_for(self, pipeline: str, text: str, limit: int) -> list[Example]:
        """The ``limit`` past replies of ``pipeline`` whose original emails are most
        like ``text`` (never another pipeline's)."""
        terms = search_terms(text)
        if not terms or limit < 1:
            return []
        oldest = await self._query("SELECT id FROM examples WHERE pipeline = ? ORDER BY id DESC "
                                   "LIMIT 1 OFFSET ?", (pipeline, MEMORY_WINDOW - 1))
        since = oldest[0][0] if oldest else 0
        if self.FTS != "sqlite":
            rows = await self._query(_SEARCH[self.FTS]["examples"],
                                     (_match(self.FTS, terms, ""), pipeline, since, int(limit)))
        else:
            # The window holds other pipelines' rows too: name the pipeline in the MATCH.
            rows = await self._query(_SEARCH["sqlite"]["examples"], (
                _match(self.FTS, terms, "original", pipeline), since, _CANDIDATES * int(limit),
                pipeline, int(limit)))
        return [_example(r) for r in rows]

    async def list_examples(self, pipeline: str, limit: int = 50) -> list[Example]:
        """The newest ``limit`` examples of ``pipeline`` (``draftgate memory list``)."""
        rows = await self._query(f"SELECT {_EXAMPLE_COLS} FROM examples e WHERE e.pipeline = ? "
                                 "ORDER BY e.sent_at DESC, e.id DESC LIMIT ?",
                                 (pipeline, int(limit)))
        return [_example(r) for r in rows]

    async def forget_example(self, pipeline: str, item_id: str, actor: str) -> int:
        """Remove the examples of one item (``draftgate memory forget``), audited; how
        many there were."""
        rows = await self._query("SELECT draft_key, reply FROM examples WHERE pipeline = ? "
                                 "AND item_id = ?", (pipeline, item_id))
        if rows:
            t = time.time()
            await self._script(
                [("DELETE FROM examples WHERE pipeline = ? AND item_id = ?", (pipeline, item_id))],
                [self._audit_row(t, actor, "memory_forget", r[0], r[1], f"{pipeline} {item_id}")
                   for r in rows])
        return len(rows)

    # -- knowledge ----------------------------------------------------------------------
    async def knowledge_files(self, pipeline: str) -> dict[str, tuple[str, int, int]]:
        """path -> (sha256, mtime_ns, size) of each file indexed for ``pipeline``."""
        rows = await self._query("SELECT path, sha256, mtime_ns, size FROM knowledge_files "
                                 "WHERE pipeline = ?", (pipeline,))
        return {r[0]: (r[1], int(r[2]), int(r[3])) for r in rows}

    async def index_knowledge(self, pipeline: str, path: str, stamp: tuple[str, int, int],
                              passages: list[tuple[str, str]]) -> None:
        """Replace the passages (heading, text) of one file, in one transaction, and
        record its (sha256, mtime_ns, size)."""
        c = self._clean
        statements: list[tuple[str, tuple]] = [
            ("DELETE FROM knowledge_passages WHERE pipeline = ? AND path = ?", (pipeline, path)),
            ("INSERT INTO knowledge_files (pipeline, path, sha256, mtime_ns, size) "
             "VALUES (?, ?, ?, ?, ?) ON CONFLICT (pipeline, path) DO UPDATE SET "
             "sha256 = excluded.sha256, mtime_ns = excluded.mtime_ns, size = excluded.size",
             (pipeline, path, *stamp))]
        for i in range(0, len(passages), _INSERT_ROWS):
            chunk = passages[i:i + _INSERT_ROWS]
            statements.append((
                "INSERT INTO knowledge_passages (pipeline, path, heading, text) VALUES "
                + ", ".join(["(?, ?, ?, ?)"] * len(chunk)),
                tuple(v for h, t in chunk for v in (pipeline, path, c(h), c(t)))))
        await self._script(statements)

    async def drop_knowledge(self, pipeline: str, paths: list[str]) -> None:
        """Forget files no longer matched by the pipeline's ``knowledge`` globs."""
        await self._script([s for path in paths for s in (
            ("DELETE FROM knowledge_passages WHERE pipeline = ? AND path = ?", (pipeline, path)),
            ("DELETE FROM knowledge_files WHERE pipeline = ? AND path = ?", (pipeline, path)))])

    async def passages_for(self, pipeline: str, text: str, limit: int) -> list[Passage]:
        """The ``limit`` knowledge passages of ``pipeline`` most relevant to ``text``."""
        terms = search_terms(text)
        if not terms or limit < 1:
            return []
        if self.FTS != "sqlite":
            rows = await self._query(_SEARCH[self.FTS]["knowledge"],
                                     (_match(self.FTS, terms, ""), pipeline, int(limit)))
        else:
            rows = await self._fts(_SEARCH["sqlite"]["knowledge"], terms, "heading text",
                                   pipeline, 0, int(limit))
        return [Passage(r[0], r[1], r[2]) for r in rows]


    async def _fts(self, sql: str, terms: list[str], columns: str, pipeline: str, since: int,
                   limit: int) -> list[Any]:
        """SQLite knowledge: the fast search, then the exact one if it found too few."""
        args = (since, _CANDIDATES * limit, pipeline, limit)
        rows = await self._query(sql, (_match(self.FTS, terms, columns), *args))
        if len(rows) < limit:
            rows = await self._query(sql, (_match(self.FTS, terms, columns, pipeline), *args))
        return rows


def _example(r: Any) -> Example:
    return Example(pipeline=r[0], item_id=r[1], original=r[2], reply=r[3], edited=bool(r[4]),
                   sent_at=float(r[5]))
