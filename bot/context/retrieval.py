"""Hybrid retrieval (issue 24, ``drafter.retrieval: hybrid``): knowledge passages and
team-memory examples found by their words (the store's full-text search, as with
``lexical``) and by their meaning (cosine similarity of embeddings), fused by
:func:`fuse` (similarity plus a bonus for the full-text rank), with a floor and a
margin to the best so an unrelated text is not given just because it ranks first
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
import hashlib
import logging
import time
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
#: its cosine similarity to the email plus LEXICAL_BONUS / (1 + its rank among the
#: full-text matches). It is given when the score reaches FLOOR and lies within
#: MARGIN of the best score: an unrelated text is not given just because it ranks
#: first among unrelated ones, nor because slots are left.
LEXICAL_BONUS, FLOOR, MARGIN = 0.10, 0.15, 0.08
#: The similarity assumed for a full-text match that has no vector yet (its words decide).
UNEMBEDDED = 0.25
#: How long a pipeline's example rows are reused before they are read again (a new
#: example is found lexically meanwhile).
EXAMPLES_TTL = 30.0
BATCH = 64  # texts per embedding call in the background


def sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "replace")).hexdigest()


def passage_text(p: Passage) -> str:
    return f"{p.heading}\n{p.text}" if p.heading else p.text


@dataclass
class _Index:
    """One pipeline's passages or examples, with the vectors known so far."""

    items: list[Any]
    shas: list[str]
    read_at: float
    built: int = -1  # the generation of vectors the matrix was built from
    rows: list[int] = field(default_factory=list)  # items that have a vector
    matrix: Any = None


def fuse(lexical_sims: list[float | None], sims: dict[Any, float], lexical: list[Any],
         limit: int) -> list[Any]:
    """The keys to give, best first: ``lexical`` are the full-text matches' keys in rank
    order (``lexical_sims`` their similarities, None: not embedded yet), ``sims`` the
    similarity of the best embedded texts by key."""
    scores = dict(sims)
    for rank, (k, s) in enumerate(zip(lexical, lexical_sims, strict=True)):
        scores[k] = (UNEMBEDDED if s is None else s) + LEXICAL_BONUS / (1 + rank)
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
        from ..drafters.llm import DEFAULT_KEY_ENV, model_options

        o = model_options(self.settings.models[name], p, self.settings,
                          default_base_url="https://api.openai.com/v1",
                          default_key_env=DEFAULT_KEY_ENV["openai"])
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

        index = await self._index(p, "knowledge", emb, read, passage_text, reread)
        return await self._fuse(emb, index, query, lexical, limit,
                                lambda x: (x.path, x.heading, x.text))

    async def examples(self, p: PipelineConfig, query: str, limit: int) -> list[Example]:
        """The ``limit`` past replies for ``query`` (this pipeline's only)."""
        from ..store.context_sql import MEMORY_WINDOW

        lexical = await self.store.examples_for(p.name, query, max(limit, CANDIDATES))
        emb = self._embedder(p)
        if emb is None:
            return lexical[:limit]

        async def read() -> list[Example]:
            return list(await self.store.list_examples(p.name, MEMORY_WINDOW))

        index = await self._index(p, "examples", emb, read, lambda e: e.original, False)
        return await self._fuse(emb, index, query, lexical, limit,
                                lambda x: (x.item_id, x.sent_at))

    async def _fuse(self, emb: Any, index: _Index, query: str, lexical: list, limit: int,
                    key: Callable[[Any], Any]) -> list:
        """Both rankings fused, each text at most once, floors applied (see
        :func:`fuse`)."""
        sims = await self._similarities(emb, index, query)
        if sims is None:
            return lexical[:limit]
        position = {key(x): i for i, x in enumerate(index.items)}
        top = sorted(sims.items(), key=lambda kv: -kv[1])[:CANDIDATES]
        found: dict[Any, Any] = {key(x): x for x in lexical}
        found.update((key(index.items[i]), index.items[i]) for i, _ in top)
        ranked = fuse([sims.get(position.get(key(x), -1)) for x in lexical],
                      {key(index.items[i]): s for i, s in top}, [key(x) for x in lexical], limit)
        return [found[k] for k in ranked]
    async def _similarities(self, emb: Any, index: _Index, query: str) -> dict[int, float] | None:
        """Item position -> cosine similarity to ``query``, for the embedded items;
        None when the query cannot be embedded now (the model is still loading, or
        the endpoint failed): the draft goes by words alone."""
        if not getattr(emb, "loaded", True):
            self._start()
            return None
        try:
            q = (await emb.embed([query[:4000]]))[0]
        except Exception as exc:
            log.warning("query not embedded (%s), searching by words only: %s", emb.model,
                        describe_error(exc))
            return None
        if self.pending():
            self._start()  # texts left by an embedding that stopped: try again
        if index.built != self.generation:
            self._build(emb.model, index)
        if index.matrix is None:
            return {}
        return dict(zip(index.rows, (index.matrix @ q).tolist(), strict=True))

    # -- the in-memory index and the background embedding -----------------------------
    async def _index(self, p: PipelineConfig, kind: str, emb: Any, read, text: Callable,
                     reread: bool) -> _Index:
        k = (p.name, kind, emb.model)
        index = self._indexes.get(k)
        stale = kind == "examples" and index is not None and \
            time.monotonic() - index.read_at > EXAMPLES_TTL
        if index is None or reread or stale:
            items = await read()
            index = _Index(items, [sha(text(x)) for x in items], time.monotonic())
            self._indexes[k] = index
            await self._load_vectors(emb.model, index, [text(x) for x in items])
        return index

    async def _load_vectors(self, model: str, index: _Index, texts: list[str]) -> None:
        """Vectors of ``index`` from the store into memory; the missing ones queued."""
        import numpy as np

        unknown = [s for s in index.shas if (model, s) not in self._vectors]
        stored = await self.store.vectors(model, list(dict.fromkeys(unknown))) if unknown else {}
        for s, blob in stored.items():
            self._vectors[(model, s)] = np.frombuffer(blob, dtype=np.float32)
        if stored:
            self.generation += 1
        queue = self._queue.setdefault(model, {})
        for s, t in zip(index.shas, texts, strict=True):
            if (model, s) not in self._vectors:
                queue[s] = t
        self._start()

    def _build(self, model: str, index: _Index) -> None:
        import numpy as np

        index.rows = [i for i, s in enumerate(index.shas) if (model, s) in self._vectors]
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
