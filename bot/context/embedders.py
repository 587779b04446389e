"""Embedding models for hybrid retrieval (issue 24): the bundled local one and an
OpenAI-compatible ``/v1/embeddings`` endpoint (a ``models:`` entry).

The local model is wordllama's ``l2_supercat`` at 256 dimensions: a static embedding
(a token table averaged, no network), whose weights and tokenizer ship inside the
wheel. They are read with ``tokenizers`` and ``safetensors`` and averaged here as
wordllama's ``embed(norm=True)`` does, to the bit (tested against it), without
importing wordllama's code (pydantic, requests and more: 28 MB resident) and with its
table kept in float16 as shipped, each batch's rows made float32 (float32 copy of the
table: 16 MB more; the conversion is exact). Nothing is imported or loaded until the
first embedding is asked for, so CLI reports (``status``, ``pending``) never load it.
"""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

LOCAL_MODEL = "wordllama:l2_supercat:256"
#: Texts the local model pools at a time: a batch is padded to its longest text, so its
#: intermediate arrays are batch x tokens x 256 floats; at 64 passages of 1,200
#: characters that is tens of MB a batch, which the allocator keeps (measured: the
#: resident memory of `draftgate run` grew by 120 MB embedding 2 MB of knowledge). At 4,
#: a few MB, no slower, and the same vectors to the bit (padding adds zeros).
LOCAL_BATCH = 4


class Embedder(Protocol):
    """Texts to unit vectors (numpy float32, one row per text)."""

    model: str  # the key vectors are stored under, with the text's sha256

    async def embed(self, texts: list[str]) -> Any: ...


class LocalEmbedder:
    """The bundled model, loaded in a worker thread at first use: always the same one,
    so the memory its batches free is reused, not kept by each thread that ran one
    (measured: 47 MB of `draftgate run`'s resident memory with asyncio.to_thread)."""

    model = LOCAL_MODEL

    def __init__(self) -> None:
        self._model: Any = None
        self._lock = threading.Lock()
        self._thread: ThreadPoolExecutor | None = None

    @property
    def loaded(self) -> bool:
        return self._model is not None

    async def embed(self, texts: list[str]) -> Any:
        if self._thread is None:
            self._thread = ThreadPoolExecutor(1, thread_name_prefix="draftgate-embed")
        return await asyncio.get_running_loop().run_in_executor(self._thread, self._embed, texts)

    async def close(self) -> None:
        if self._thread is not None:
            self._thread.shutdown(wait=False, cancel_futures=True)
            self._thread = None

    def embed_now(self, texts: list[str]) -> Any:
        """``texts`` embedded in the caller's thread if the model is loaded and not busy
        (a background batch holds it), else None: for a short query, where a thread
        hop costs more than the embedding."""
        import numpy as np

        if self._model is None or not self._lock.acquire(blocking=False):
            return None
        try:
            return np.asarray(self._model.embed(texts, norm=True), dtype=np.float32)
        finally:
            self._lock.release()

    def _embed(self, texts: list[str]) -> Any:
        import numpy as np

        with self._lock:
            if self._model is None:
                self._model = _load_local()
            out = self._model.embed(texts, norm=True, batch_size=LOCAL_BATCH)
        return np.asarray(out, dtype=np.float32)


def _load_local() -> _Local:
    import importlib.util
    from pathlib import Path

    from safetensors import safe_open
    from tokenizers import Tokenizer

    spec = importlib.util.find_spec("wordllama")  # its files, not its code
    assert spec is not None and spec.submodule_search_locations
    folder = Path(list(spec.submodule_search_locations)[0])
    tokenizer = Tokenizer.from_file(str(folder / "tokenizers" / "l2_supercat_tokenizer_config.json"))
    tokenizer.enable_padding()
    tokenizer.no_truncation()
    with safe_open(str(folder / "weights" / "l2_supercat_256.safetensors"), framework="np",
                   device="cpu") as f:
        return _Local(tokenizer, f.get_tensor("embedding.weight"))


class _Local:
    """wordllama's WordLlamaInference.embed(norm=True), its table left in float16."""

    def __init__(self, tokenizer: Any, table: Any) -> None:
        self.tokenizer, self.table = tokenizer, table

    def embed(self, texts: list[str], norm: bool = True, batch_size: int = LOCAL_BATCH) -> Any:
        import numpy as np

        out = np.empty((len(texts), self.table.shape[1]), dtype=np.float32)
        for i in range(0, len(texts), batch_size):
            encoded = self.tokenizer.encode_batch(texts[i:i + batch_size],
                                                  is_pretokenized=False, add_special_tokens=False)
            ids = np.array([e.ids for e in encoded], dtype=np.int32)
            mask = np.array([e.attention_mask for e in encoded], dtype=np.float32)
            np.clip(ids, 0, self.table.shape[0] - 1, out=ids)
            # Each token's row made float32 once a batch (the conversion is the slow part).
            unique, inverse = np.unique(ids.ravel(), return_inverse=True)
            rows = self.table[unique].astype(np.float32)[inverse.ravel()].reshape(
                *ids.shape, self.table.shape[1])
            count = np.maximum(mask.sum(axis=1, keepdims=True), 1.0).astype(np.float32)
            pooled = np.sum(rows * mask[..., np.newaxis], axis=1, dtype=np.float32) / count
            if norm:
                # A text with no token (empty, or only spaces) stays a zero vector, which
                # matches nothing, rather than NaNs (wordllama's own result).
                norms = np.linalg.norm(pooled, axis=1, keepdims=True)
                pooled /= np.where(norms == 0, 1, norms)
            out[i:i + len(pooled)] = pooled
        return out


class RemoteEmbedder:
    """``POST /v1/embeddings`` of a ``models:`` entry, through the openai SDK."""

    loaded = True

    def __init__(self, name: str, base_url: str | None, model: str, api_key: str,
                 timeout: float) -> None:
        self.model = f"api:{name}:{model}"
        self._name, self._base_url, self._api_model = name, base_url, model
        self._key, self._timeout = api_key, timeout
        self._client: Any = None

    async def embed(self, texts: list[str]) -> Any:
        import numpy as np
        import openai

        if self._client is None:
            self._client = openai.AsyncOpenAI(api_key=self._key, base_url=self._base_url,
                                              timeout=self._timeout, max_retries=1)
        answer = await self._client.embeddings.create(model=self._api_model, input=texts)
        rows = sorted(answer.data, key=lambda d: d.index)
        m = np.asarray([r.embedding for r in rows], dtype=np.float32)
        norms = np.linalg.norm(m, axis=1, keepdims=True)
        return m / np.where(norms == 0, 1, norms)

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()
