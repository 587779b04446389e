"""The store's half of hybrid retrieval (issue 24): embedding vectors kept beside the
texts they embed, keyed by the text's sha256 and the embedding model, in the
``embeddings`` table of either backend (BLOB / BYTEA of float32). Similarity is
scored in process (bot/context/retrieval.py), so no vector extension is needed."""

from __future__ import annotations

import time

from .base import Backend

_CHUNK = 400  # keys per IN (...) and rows per INSERT


class VectorSql(Backend):
    """Vectors by (model, sha256); see the module docstring."""

    async def vectors(self, model: str, shas: list[str]) -> dict[str, bytes]:
        """The stored vectors of ``shas`` for ``model`` (those not embedded yet are absent)."""
        out: dict[str, bytes] = {}
        for i in range(0, len(shas), _CHUNK):
            chunk = shas[i:i + _CHUNK]
            rows = await self._query(
                "SELECT sha256, vector FROM embeddings WHERE model = ? AND sha256 IN ("
                + ", ".join(["?"] * len(chunk)) + ")", (model, *chunk))
            out.update((r[0], bytes(r[1])) for r in rows)
        return out

    async def put_vectors(self, model: str, rows: list[tuple[str, bytes]]) -> None:
        """Keep ``(sha256, vector)`` rows for ``model``; one already kept stays as it is
        (the same text embeds to the same vector)."""
        for i in range(0, len(rows), _CHUNK):
            chunk = rows[i:i + _CHUNK]
            await self._script([(
                "INSERT INTO embeddings (model, sha256, vector) VALUES "
                + ", ".join(["(?, ?, ?)"] * len(chunk)) + " ON CONFLICT (model, sha256) DO NOTHING",
                tuple(v for sha, vec in chunk for v in (model, sha, vec)))])

    async def passage_texts(self, pipeline: str) -> list[tuple[str, str, str]]:
        """Every knowledge passage of ``pipeline`` as (path, heading, text), in file order."""
        rows = await self._query("SELECT path, heading, text FROM knowledge_passages "
                                 "WHERE pipeline = ? ORDER BY id", (pipeline,))
        return [(r[0], r[1], r[2]) for r in rows]

    async def set_embedding_progress(self, model: str, done: int, total: int) -> None:
        """How far the background embedding with ``model`` has got (for ``status``)."""
        await self._execute(
            "INSERT INTO embedding_progress (model, done, total, updated_at) VALUES (?, ?, ?, ?) "
            "ON CONFLICT (model) DO UPDATE SET done = excluded.done, total = excluded.total, "
            "updated_at = excluded.updated_at", (model, done, total, time.time()))

    async def embedding_progress(self) -> dict[str, tuple[int, int, float]]:
        """model -> (done, total, updated at) of the last background embedding."""
        rows = await self._query("SELECT model, done, total, updated_at FROM embedding_progress")
        return {r[0]: (int(r[1]), int(r[2]), float(r[3])) for r in rows}
