"""The store's half of a draft's context (issue 13): team memory (examples of sent
replies) and knowledge passages, searched with the database's own full-text search:
SQLite FTS5 ranked by bm25, PostgreSQL a stored ``tsvector`` ranked by ``ts_rank``.
No other index, no other service.

Shared by both SQL stores (a mixin of :class:`bot.store.sql.SqlStore`); the backend
says which search SQL it speaks with ``FTS``. An example is written by ``mark_sent``
in the transaction that records the send (``sql.example_row``); knowledge passages are
written here, one transaction per changed file.

A search looks for the rarest words of the new email only (:func:`rarest`), their
row counts taken in one query and the common ones cached: ranking costs per matching
row, and over 50,000 replies a common word matches most of them (issue 13's figures:
from 33 ms to about 10 ms a draft's context on SQLite).
"""

from __future__ import annotations

import re
import time
from typing import Any

from ..models import Example, Passage
from .base import Backend

#: Terms of the new email a search uses at most, and how many of its words are weighed
#: for that (the longest ones first).
MAX_TERMS, CANDIDATE_TERMS = 8, 16
#: A search ranks the rows that contain its rarest terms only: terms are taken rarest
#: first while the rows containing them stay within this many (or 1/20 of the table).
#: A word most rows contain ("order" in a shop's mail) ranks everything and tells
#: little (bm25 gives it almost no weight); it is searched only when nothing rarer is.
CANDIDATE_ROWS = 500
#: How long a term's row count is trusted, and from how many rows on it is kept at all:
#: a common word's count is costly to take and one more row hardly changes it; a rare
#: word's is cheap, and is taken again each time (so a new example or passage with a
#: new word is found at once). Knowledge counts are dropped when this process
#: re-indexes a file.
COUNT_TTL, COUNT_KEPT_FROM = 600.0, 100
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
#: The window: rows of the pipeline's newest MEMORY_WINDOW examples (id at least that).
_WINDOW = ("coalesce((SELECT id FROM examples WHERE pipeline = ? ORDER BY id DESC "
           "LIMIT 1 OFFSET ?), 0)")
_SEARCH = {
    # Ranked inside the full-text query, then the few winners joined (a ranked join
    # costs 3x more), their pipeline tested on the join. If other pipelines crowded it
    # out of the candidates, the search runs again with the pipeline in the MATCH
    # (exact but slower: that token matches all its rows). See _fts.
    "sqlite": {
        "examples": f"SELECT {_EXAMPLE_COLS} FROM (SELECT rowid, bm25(examples_fts, 0.0, 1.0) "
                    f"AS score FROM examples_fts WHERE examples_fts MATCH ? AND rowid >= {_WINDOW} "
                    "ORDER BY score LIMIT ?) f JOIN examples e ON e.id = f.rowid "
                    "WHERE e.pipeline = ? "
                    "ORDER BY f.score * (1 + e.edited), e.sent_at DESC LIMIT ?",
        "knowledge": "SELECT p.path, p.heading, p.text FROM (SELECT rowid, "
                     "bm25(knowledge_fts, 0.0, 2.0, 1.0) AS score FROM knowledge_fts WHERE "
                     "knowledge_fts MATCH ? ORDER BY score LIMIT ?) f "
                     "JOIN knowledge_passages p ON p.id = f.rowid WHERE p.pipeline = ? "
                     "ORDER BY f.score, p.id LIMIT ?",
    },
    "postgres": {
        "examples": f"SELECT {_EXAMPLE_COLS} FROM examples e, to_tsquery('english', ?) q "
                    f"WHERE e.pipeline = ? AND e.id >= {_WINDOW} AND e.tsv @@ q "
                    "ORDER BY ts_rank(e.tsv, q) * (1 + e.edited) DESC, e.sent_at DESC LIMIT ?",
        "knowledge": "SELECT p.path, p.heading, p.text FROM knowledge_passages p, "
                     "to_tsquery('english', ?) q WHERE p.pipeline = ? AND p.tsv @@ q "
                     "ORDER BY ts_rank(p.tsv, q) DESC, p.id LIMIT ?",
    },
}


def search_terms(text: str, limit: int = CANDIDATE_TERMS) -> list[str]:
    """The words of ``text`` a search looks for: letters and digits only (so nothing
    in an email is search syntax), no stop words, the longest ``limit`` of them."""
    words = dict.fromkeys(w for w in _WORD.findall(text.lower()) if w not in _STOP)
    return sorted(words, key=len, reverse=True)[:limit]


def rarest(counts: dict[str, int], total: int) -> list[str]:
    """The terms a search uses, rarest first (see :data:`CANDIDATE_ROWS`); none when no
    row contains any of them."""
    budget, rows = max(CANDIDATE_ROWS, total // 20), 0
    out: list[str] = []
    for term in sorted((t for t in counts if counts[t]), key=lambda t: (counts[t], t)):
        if out and (rows + counts[term] > budget or len(out) == MAX_TERMS):
            break
        out.append(term)
        rows += counts[term]
    return out


def _match(fts: str, terms: list[str], columns: str, pipeline: str | None = None) -> str:
    """The full-text query for ``terms`` in ``columns`` (SQLite), and only in
    ``pipeline``'s rows when given (pipeline names are letters, digits, "-", "_", ".")."""
    if fts != "sqlite":
        return " | ".join(terms)
    match = f"{{{columns}}} : (" + " OR ".join(f'"{t}"' for t in terms) + ")"
    return f'pipeline : "{pipeline}" AND {match}' if pipeline else match


#: Candidates ranked in the full-text query before the edited / newer order decides.
_CANDIDATES = 50
#: The columns each search looks in (SQLite), and the query that counts a term's rows.
_COLUMNS = {"examples": "original", "knowledge": "heading text"}
_COUNT = {
    "sqlite": {"examples": "(SELECT count(*) FROM examples_fts WHERE examples_fts MATCH ?)",
               "knowledge": "(SELECT count(*) FROM knowledge_fts WHERE knowledge_fts MATCH ?)"},
    "postgres": {
        "examples": "(SELECT count(*) FROM examples WHERE tsv @@ to_tsquery('english', ?))",
        "knowledge": "(SELECT count(*) FROM knowledge_passages "
                     "WHERE tsv @@ to_tsquery('english', ?))"},
}
_TOTAL = {"examples": "(SELECT count(*) FROM examples)",
          "knowledge": "(SELECT count(*) FROM knowledge_passages)"}
_MAX_COUNTS = 50_000  # cached term counts kept at most


class ContextSql(Backend):
    """Examples and knowledge; see the module docstring."""

    FTS = "sqlite"  # which search SQL the backend speaks: "sqlite" | "postgres"
    #: (search, term) -> (rows containing it, monotonic time it is trusted until);
    #: term "" holds the table's row count.
    _term_rows: dict[tuple[str, str], tuple[int, float]] | None = None

    # -- team memory ------------------------------------------------------------------
    async def examples_for(self, pipeline: str, text: str, limit: int) -> list[Example]:
        """The ``limit`` past replies of ``pipeline`` whose original emails are most
        like ``text`` (never another pipeline's)."""
        terms = await self._terms("examples", text) if limit > 0 else []
        if not terms:
            return []
        window = (pipeline, MEMORY_WINDOW - 1)
        if self.FTS != "sqlite":
            rows = await self._query(_SEARCH[self.FTS]["examples"],
                                     (_match(self.FTS, terms, ""), pipeline, *window, int(limit)))
        else:
            rows = await self._fts(_SEARCH["sqlite"]["examples"], terms, "original", pipeline,
                                   window, int(limit))
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
        self._recount("knowledge")

    async def drop_knowledge(self, pipeline: str, paths: list[str]) -> None:
        """Forget files no longer matched by the pipeline's ``knowledge`` globs."""
        await self._script([s for path in paths for s in (
            ("DELETE FROM knowledge_passages WHERE pipeline = ? AND path = ?", (pipeline, path)),
            ("DELETE FROM knowledge_files WHERE pipeline = ? AND path = ?", (pipeline, path)))])
        self._recount("knowledge")

    async def passages_for(self, pipeline: str, text: str, limit: int) -> list[Passage]:
        """The ``limit`` knowledge passages of ``pipeline`` most relevant to ``text``."""
        terms = await self._terms("knowledge", text) if limit > 0 else []
        if not terms:
            return []
        if self.FTS != "sqlite":
            rows = await self._query(_SEARCH[self.FTS]["knowledge"],
                                     (_match(self.FTS, terms, ""), pipeline, int(limit)))
        else:
            rows = await self._fts(_SEARCH["sqlite"]["knowledge"], terms, "heading text",
                                   pipeline, (), int(limit))
        return [Passage(r[0], r[1], r[2]) for r in rows]


    async def _terms(self, search: str, text: str) -> list[str]:
        """The terms of ``text`` that ``search`` ("examples" | "knowledge") looks for:
        its rarest words in that table (:func:`rarest`), counted with one query for the
        words whose count is not cached."""
        words = search_terms(text)
        if not words:
            return []
        if self._term_rows is None or len(self._term_rows) > _MAX_COUNTS:
            self._term_rows = {}
        cache, now = self._term_rows, time.monotonic()
        counts = {w: cache[(search, w)][0] for w in ["", *words]
                  if cache.get((search, w), (0, 0.0))[1] > now}
        missing = [w for w in ["", *words] if w not in counts]
        if missing:
            sql = ", ".join(_COUNT[self.FTS][search] if w else _TOTAL[search] for w in missing)
            args = tuple(_match(self.FTS, [w], _COLUMNS[search]) for w in missing if w)
            row = (await self._query(f"SELECT {sql}", args))[0]
            for word, n in zip(missing, row, strict=True):
                counts[word] = int(n)
                if n >= COUNT_KEPT_FROM:
                    cache[(search, word)] = (int(n), now + COUNT_TTL)
        return rarest({w: counts[w] for w in words}, counts[""])

    def _recount(self, search: str) -> None:
        """Drop the cached counts of ``search`` (its rows just changed here)."""
        if self._term_rows:
            self._term_rows = {k: v for k, v in self._term_rows.items() if k[0] != search}

    async def _fts(self, sql: str, terms: list[str], columns: str, pipeline: str,
                   window: tuple, limit: int) -> list[Any]:
        """SQLite: the fast search, then the exact one if it found too few."""
        args = (*window, _CANDIDATES * limit, pipeline, limit)
        rows = await self._query(sql, (_match(self.FTS, terms, columns), *args))
        if len(rows) < limit:
            rows = await self._query(sql, (_match(self.FTS, terms, columns, pipeline), *args))
        return rows


def _example(r: Any) -> Example:
    return Example(pipeline=r[0], item_id=r[1], original=r[2], reply=r[3], edited=bool(r[4]),
                   sent_at=float(r[5]))
