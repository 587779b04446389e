"""Hybrid retrieval (issue 24, ``drafter.retrieval: hybrid``): knowledge passages and
team-memory examples found by their words (the store's full-text search, as with
``lexical``) and by their meaning (cosine similarity of embeddings), fused by
:func:`fuse` (similarity plus a bonus for the full-text rank, in proportion to the
share of the email's rarer words the text contains: :func:`coverage`), with a floor
and a margin to the best so an unrelated text is not given just because it ranks first
among unrelated ones.

* Vectors live in the store beside the texts (:mod:`bot.store.vectors_sql`), keyed by
  the text's sha256 and the embedding model; in memory each pipeline keeps a matrix
  of its passages and of its newest :data:`~bot.store.context_sql.MEMORY_WINDOW`
  examples (256 floats each: 2 MB of knowledge is about 2,000 passages, 2 MB of
  memory; scoring them is one matrix product, well under a millisecond).
* A draft never waits for embedding: a text without a vector yet is found lexically
  only, and one background task per process embeds what is missing (progress in the
  log and in the store for ``status``). A change of model embeds everything again,
  beside the old vectors.
* The query is embedded when the draft is made: the local model in a worker thread
  once loaded (it is loaded in the background: until then drafts are lexical), a
  ``models:`` entry with one ``/v1/embeddings`` call; a failure falls back to words.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import logging
import math
import re
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable

from ..config.load import PipelineConfig, Settings
from ..errors import describe_error
from ..models import Example, Passage
from .embedders import Embedder, LocalEmbedder, RemoteEmbedder

log = logging.getLogger("draftgate.retrieval")

#: Lexical candidates taken for fusion, per search.
CANDIDATES = 12
#: Fusion (measured with scripts/eval_retrieval, see :func:`fuse`): a text's score is
#: its cosine similarity to the email plus LEXICAL_BONUS * its coverage / (1 + its rank
#: among the full-text matches). It is given when the score reaches FLOOR and lies within
#: MARGIN of the best score: an unrelated text is not given just because it ranks
#: first among unrelated ones, nor because slots are left. Measured worse with the
#: bundled model, so not used: token-level late interaction (each query token's best
#: cosine to the passage's tokens, IDF-weighted) as a reranker, the best of a passage's
#: sentence vectors, reciprocal rank fusion; the bonus by rank alone (before coverage).
LEXICAL_BONUS, FLOOR, MARGIN = 0.10, 0.15, 0.08
#: The similarity assumed for a full-text match that has no vector yet (its words decide).
UNEMBEDDED = 0.25
#: How long a pipeline's example rows are reused before they are read again (a new
#: example is found lexically meanwhile).
EXAMPLES_TTL = 30.0
BATCH = 64  # texts per embedding call in the background
QUERIES_KEPT = 64  # query vectors remembered (a draft's searches share its query's)
_WORD = re.compile(r"\w+")


def sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "replace")).hexdigest()


def passage_text(p: Passage) -> str:
    return f"{p.heading}\n{p.text}" if p.heading else p.text


@functools.lru_cache(maxsize=1024)  # the same passages compete for many emails
def words(text: str) -> frozenset[str]:
    return frozenset(_WORD.findall(text.lower()))


def coverage(query: str, texts: list[str], pool: list[str]) -> list[float]:
    """The share of ``query``'s words, each weighted by its inverse document frequency
    among the ``pool`` of texts that compete for it (the full-text matches and the
    nearest by meaning), that each of ``texts`` (of the pool) contains. A full-text
    match on a word that the competing texts share (a product's name, "order") earns
    little of the lexical bonus, one on the email's rarer words all of it: the
    full-text rank alone says neither."""
    have = {t: words(t) for t in pool}
    df = Counter(w for t in have.values() for w in t)
    idf = {w: math.log((len(have) + 1) / (df[w] + 0.5)) for w in words(query)}
    weights = {w: v for w, v in idf.items() if v > 0}
    total = sum(weights.values())
    if not total:
        return [0.0] * len(texts)
    return [sum(v for w, v in weights.items() if w in have[t]) / total for t in texts]


def _passage_key(p: Passage) -> tuple:
    return (p.path, p.heading, p.text)


def _text(x: Passage | Example) -> str:
    return passage_text(x) if isinstance(x, Passage) else x.original


def _example_key(e: Example) -> tuple:
    return (e.item_id, e.sent_at)


@dataclass
class _Index:
    """One pipeline's passages or examples, with the vectors known so far."""

    items: list[Any]
    shas: list[str]
    read_at: float
    position: dict[Any, int] = field(default_factory=dict)  # item key -> position
    built: int = -1  # the generation of vectors the matrix was built from
    rows: list[int] = field(default_factory=list)  # positions of items that have a vector
    row_of: dict[int, int] = field(default_factory=dict)  # position -> row of the matrix
    matrix: Any = None
    missing: list[int] = field(default_factory=list)  # positions without a vector at build


def fuse(lexical_sims: list[float | None], sims: dict[Any, float], lexical: list[Any],
         limit: int, covered: list[float] | None = None) -> list[Any]:
    """The keys to give, best first: ``lexical`` are the full-text matches' keys in rank
    order (``lexical_sims`` their similarities, None: not embedded yet; ``covered``
    their :func:`coverage`, None: all of the email's words), ``sims`` the similarity of
    the best embedded texts by key."""
    scores = dict(sims)
    covered = [1.0] * len(lexical) if covered is None else covered
    for rank, (k, s, c) in enumerate(zip(lexical, lexical_sims, covered, strict=True)):
        scores[k] = (UNEMBEDDED if s is None else s) + LEXICAL_BONUS * c / (1 + rank)
    if not scores:
        return []
    best = max(scores.values())
    return [k for k in sorted(scores, key=lambda k: -scores[k])[:limit]
            if scores[k] >= FLOOR and scores[k] >= best - MARGIN]


class Retrieval:
    """Hybrid search for one engine (all pipelines); :meth:`close` at shutdown."""

    def __init__(self, store, settings: Settings | None = None,
                 local: Callable[[], Any] = LocalEmbedder):
        self.store, self.settings, self._make_local = store, settings, local
        self._embedders: dict[str, Any] = {}
        self._vectors: dict[tuple[str, str], Any] = {}  # (model, sha) -> unit vector
        self._indexes: dict[tuple[str, str, str], _Index] = {}  # (pipeline, kind, model)
        self._queue: dict[str, dict[str, str]] = {}  # model -> sha -> text to embed
        self._worker: asyncio.Task | None = None
        self._queries: dict[tuple[str, str], Any] = {}  # (model, query) -> its vector
        self.generation = 0  # + 1 whenever vectors were added in memory

    def embedder(self, p: PipelineConfig) -> Embedder | None:
        """The pipeline's embedding model, None when its retrieval is lexical."""
        o = p.drafter
        if o.retrieval != "hybrid":
            return None
        if o.embeddings not in self._embedders:
            self._embedders[o.embeddings] = self._new_embedder(p)
        return self._embedders[o.embeddings]  # None: it could not be made

    def _embedder(self, p: PipelineConfig) -> Embedder | None:
        try:
            return self.embedder(p)
        except Exception as exc:  # e.g. its key variable unset: words alone, said once
            log.warning("%s: embeddings %s cannot be used, searching by words only: %s",
                        p.name, p.drafter.embeddings, describe_error(exc))
            self._embedders[p.drafter.embeddings] = None
            return None

    def _new_embedder(self, p: PipelineConfig) -> Any:
        name = p.drafter.embeddings
        if name == "local" or self.settings is None:
            return self._make_local()
        o = self.settings.models[name]
        return RemoteEmbedder(name, o.base_url, o.model, o.api_key(), o.timeout)

    # -- searches -----------------------------------------------------------------------
    async def passages(self, p: PipelineConfig, query: str, limit: int,
                       reread: bool) -> list[Passage]:
        """The ``limit`` passages for ``query``; ``reread``: the files changed."""
        lexical = await self.store.passages_for(p.name, query, max(limit, CANDIDATES))
        emb = self._embedder(p)
        if emb is None:
            return lexical[:limit]

        async def read() -> list[Passage]:
            return [Passage(*r) for r in await self.store.passage_texts(p.name)]

        index = await self._index(p, "knowledge", emb, read, passage_text, _passage_key, reread)
        return await self._fuse(emb, index, query, lexical, limit, _passage_key)

    async def examples(self, p: PipelineConfig, query: str, limit: int) -> list[Example]:
        """The ``limit`` past replies for ``query`` (this pipeline's only)."""
        from ..store.context_sql import MEMORY_WINDOW

        lexical = await self.store.examples_for(p.name, query, max(limit, CANDIDATES))
        emb = self._embedder(p)
        if emb is None:
            return lexical[:limit]

        async def read() -> list[Example]:
            return list(await self.store.list_examples(p.name, MEMORY_WINDOW))

        index = await self._index(p, "examples", emb, read, lambda e: e.original,
                                  _example_key, False)
        return await self._fuse(emb, index, query, lexical, limit, _example_key)

    async def _fuse(self, emb: Any, index: _Index, query: str, lexical: list, limit: int,
                    key: Callable[[Any], Any]) -> list:
        """Both rankings fused, each text at most once, floors applied (see
        :func:`fuse`)."""
        if not index.items:
            # Nothing to rank by meaning (no knowledge, no team memory yet): neither the
            # model nor numpy is loaded for it (tens of MB a pipeline without context
            # never needs).
            return lexical[:limit]
        import numpy as np

        scores = await self._scores(emb, index, query)
        if scores is None:
            return lexical[:limit]
        found: dict[Any, Any] = {key(x): x for x in lexical}
        top: dict[Any, float] = {}
        if len(scores):
            k = min(CANDIDATES, len(scores))
            for r in np.argpartition(-scores, k - 1)[:k].tolist():
                item = index.items[index.rows[r]]
                top[key(item)] = float(scores[r])
                found.setdefault(key(item), item)
        rows = [index.row_of.get(index.position.get(key(x), -1)) for x in lexical]
        covered = coverage(query, [_text(x) for x in lexical],
                           [_text(x) for x in found.values()])
        ranked = fuse([None if r is None else float(scores[r]) for r in rows], top,
                      [key(x) for x in lexical], limit, covered)
        return [found[k] for k in ranked]

    async def _scores(self, emb: Any, index: _Index, query: str) -> Any:
        """The cosine similarity of each row of ``index``'s matrix to ``query``; None
        when the query cannot be embedded now (the model is still loading, or the
        endpoint failed): the draft goes by words alone."""
        import numpy as np

        if not getattr(emb, "loaded", True):
            self._start()
            return None
        q = await self._query_vector(emb, query[:4000])
        if q is None:
            return None
        if self.pending():
            self._start()  # texts left by an embedding that stopped: try again
        if index.built != self.generation:
            self._build(emb.model, index)
        if index.matrix is None:
            return np.zeros(0, dtype=np.float32)
        # einsum, not matmul: BLAS threads for one matrix-vector product cost 10x more
        # than they save on a busy machine (measured: 20 ms against 1.5 ms at 3,100 rows).
        return np.einsum("ij,j->i", index.matrix, q)

    async def _query_vector(self, emb: Any, query: str) -> Any:
        """``query`` embedded once per draft (its examples and passages share it); the
        local model on the loop when it is free (a fraction of a millisecond: a
        thread hop costs more), else in its thread."""
        cached = self._queries.get((emb.model, query))
        if cached is not None:
            return cached
        try:
            now = getattr(emb, "embed_now", None)
            vectors = now([query]) if now is not None else None
            q = (vectors if vectors is not None else await emb.embed([query]))[0]
        except Exception as exc:
            log.warning("query not embedded (%s), searching by words only: %s", emb.model,
                        describe_error(exc))
            return None
        if len(self._queries) >= QUERIES_KEPT:
            self._queries.clear()
        self._queries[(emb.model, query)] = q
        return q

    # -- the in-memory index and the background embedding -----------------------------
    async def _index(self, p: PipelineConfig, kind: str, emb: Any, read, text: Callable,
                     key: Callable, reread: bool) -> _Index:
        k = (p.name, kind, emb.model)
        index = self._indexes.get(k)
        stale = kind == "examples" and index is not None and \
            time.monotonic() - index.read_at > EXAMPLES_TTL
        if index is None or reread or stale:
            items = await read()
            texts = [text(x) for x in items]
            if index is None or items != index.items:  # the same texts: hashes, matrix kept
                known = {} if index is None else \
                    dict(zip(map(text, index.items), index.shas, strict=True))
                index = _Index(items, [known.get(t) or sha(t) for t in texts], 0.0,
                               {key(x): i for i, x in enumerate(items)})
                self._indexes[k] = index
            index.read_at = time.monotonic()
            await self._load_vectors(emb.model, index, texts)  # e.g. embedded elsewhere
        return index

    async def _load_vectors(self, model: str, index: _Index, texts: list[str]) -> None:
        """Vectors of ``index`` from the store into memory; the missing ones queued."""
        unknown = [s for s in index.shas if (model, s) not in self._vectors]
        stored = await self.store.vectors(model, list(dict.fromkeys(unknown))) if unknown else {}
        if stored:
            import numpy as np
        for s, blob in stored.items():
            self._vectors[(model, s)] = np.frombuffer(blob, dtype=np.float32)
        if stored:
            self.generation += 1
        queue = self._queue.setdefault(model, {})
        for s, t in zip(index.shas, texts, strict=True):
            if (model, s) not in self._vectors:
                queue[s] = t
        if queue:  # nothing to embed: the model is not loaded for nothing
            self._start()

    def _build(self, model: str, index: _Index) -> None:
        """The matrix of ``index``'s texts that have a vector, built again only when one
        of those it lacked got one (vectors are added, never changed or dropped)."""
        import numpy as np

        if index.built >= 0 and not any((model, index.shas[i]) in self._vectors
                                        for i in index.missing):
            index.built = self.generation  # new vectors, none of them this index's
            return
        index.rows = [i for i, s in enumerate(index.shas) if (model, s) in self._vectors]
        index.row_of = {i: r for r, i in enumerate(index.rows)}
        index.missing = [i for i in range(len(index.shas)) if i not in index.row_of]
        index.matrix = np.vstack([self._vectors[(model, index.shas[i])] for i in index.rows]) \
            if index.rows else None
        index.built = self.generation

    def _start(self) -> None:
        if self._worker is None or self._worker.done():
            self._worker = asyncio.create_task(self._embed_missing())

    async def _embed_missing(self) -> None:
        """Embed every queued text, a batch at a time, and keep the vectors."""
        for emb in [e for e in self._embedders.values() if e is not None]:
            queue = self._queue.get(emb.model, {})
            if not queue and not getattr(emb, "loaded", True):
                with contextlib.suppress(Exception):
                    await emb.embed(["warm up"])  # load the model off the event loop
            done = 0
            if queue:
                log.info("embedding %d text(s) with %s in the background (found by words "
                         "until embedded)", len(queue), emb.model)
            while queue:
                batch = list(queue.items())[:BATCH]
                try:
                    vectors = await emb.embed([t for _, t in batch])
                    await self.store.put_vectors(emb.model, [(s, v.tobytes()) for (s, _), v
                                                             in zip(batch, vectors, strict=True)])
                except Exception as exc:
                    log.warning("embedding with %s stopped, %d text(s) left (found by words "
                                "until the next try): %s", emb.model, len(queue),
                                describe_error(exc))
                    return
                for (s, _), v in zip(batch, vectors, strict=True):
                    self._vectors[(emb.model, s)] = v
                    queue.pop(s, None)
                self.generation += 1
                done += len(batch)
                if not queue or done % (BATCH * 10) == 0:
                    log.info("embedded %d of %d text(s) with %s", done, done + len(queue),
                             emb.model)
                await self._progress(emb.model, done, done + len(queue))

    async def _progress(self, model: str, done: int, total: int) -> None:
        """Kept in the store, so ``draftgate status`` in another process shows it."""
        with contextlib.suppress(Exception):  # progress is news, never a reason to stop
            await self.store.set_embedding_progress(model, done, total)

    def pending(self) -> int:
        """Texts waiting to be embedded (for ``status`` and the log)."""
        return sum(len(q) for q in self._queue.values())

    async def idle(self) -> None:
        """Wait until the background embedding has finished (benchmarks, tests)."""
        while self._worker is not None and not self._worker.done():
            await asyncio.shield(self._worker)

    async def close(self) -> None:
        if self._worker is not None:
            self._worker.cancel()
            with contextlib.suppress(BaseException):
                await self._worker
        for emb in self._embedders.values():
            if emb is not None and hasattr(emb, "close"):
                await emb.close()
