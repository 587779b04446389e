"""The store's half of hybrid retrieval (issue 24): embedding vectors kept beside the
texts they embed, keyed by the text's sha256 and the embedding model, in the
``embeddings`` table of either backend (BLOB / BYTEA of float32). Similarity is
scored in process (bot/context/retrieval.py), so no vector extension is needed."""

from __future__ import annotations

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
