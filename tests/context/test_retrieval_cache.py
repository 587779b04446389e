"""Hybrid retrieval's in-memory index (issue 24) is read and built again only when its
texts changed: not for a new Knowledge object of the same files (a reload, or two
taking turns as in scripts/bench_context: 25 ms a draft), nor when the examples are
read again after EXAMPLES_TTL and none is new. The real store; a fake embedder."""

from __future__ import annotations

import hashlib

import numpy as np

from bot.config.load import load_settings
from bot.context import retrieval
from bot.context.builder import ContextBuilder
from bot.context.knowledge import Knowledge
from bot.mail.mime import parse_email
from bot.models import Draft
from bot.store import create_store


class _Embedder:
    """Words hashed into 64 dimensions: texts sharing words are similar."""

    model, loaded = "fake", True

    async def embed(self, texts: list[str]) -> np.ndarray:
        m = np.zeros((len(texts), 64), dtype=np.float32)
        for i, t in enumerate(texts):
            for word in t.lower().split():
                m[i, hashlib.sha256(word.encode()).digest()[0] % 64] += 1
        return m / np.maximum(np.linalg.norm(m, axis=1, keepdims=True), 1e-9)


def _world(tmp_path, store_url: str):
    (tmp_path / "kb").mkdir()
    (tmp_path / "kb" / "shop.md").write_text(
        "## Refunds\n\nA refund takes 5 business days.\n\n## Hours\n\nOpen 10:00 to 19:00.\n")
    (tmp_path / "pipelines").mkdir()
    (tmp_path / "draftgate.yaml").write_text(f"store: {store_url}\n")
    (tmp_path / "pipelines" / "support.yaml").write_text(
        "name: support\nschedule: 1h\nsource: {type: maildir, path: inbox}\n"
        "drafter: {model: template, knowledge: [kb/*.md], examples: 3, thread: 0}\n"
        "sender: {type: outbox, path: out, from: support@shop.example}\n")
    return load_settings(str(tmp_path / "draftgate.yaml"))


def _draft(n: int, question: str) -> Draft:
    raw = (f"From: Kim <kim@customer.example>\nTo: support@shop.example\nSubject: Question\n"
           f"Message-ID: <q{n}@customer.example>\n\n{question}\n").encode()
    return Draft(id=n, key=f"support|s|q{n}|v1", pipeline="support", scope="s",
                 item_id=f"<q{n}@customer.example>", recipe="v1", status="drafting",
                 message=parse_email(raw))


async def _open(tmp_path, store_url: str):
    settings = _world(tmp_path, store_url)
    store = create_store(settings.store)
    await store.open()
    builder = ContextBuilder(store, lambda _p: None, settings,
                             retrieval.Retrieval(store, settings, local=_Embedder))
    return settings.pipelines[0], store, builder


async def test_the_passages_are_read_again_only_when_the_files_changed(tmp_path, store_url):
    p, store, builder = await _open(tmp_path, store_url)
    reads = []
    passage_texts = store.passage_texts

    async def counted(pipeline: str):
        reads.append(pipeline)
        return await passage_texts(pipeline)

    store.passage_texts = counted
    try:
        await builder.build(p, _draft(1, "How long does a refund take?"))
        await builder.retrieval.idle()
        first = await builder.build(p, _draft(1, "How long does a refund take?"))
        assert [x.heading for x in first.passages] == ["Refunds"]
        other = Knowledge(store, p)  # the same files: a reload's object, or a benchmark's
        for n, knowledge in enumerate([other, builder._knowledge[p.name]] * 2, 2):
            builder._knowledge[p.name] = knowledge
            ctx = await builder.build(p, _draft(n, "How long does a refund take?"))
            assert ctx.passages == first.passages
        assert len(reads) == 1
        (tmp_path / "kb" / "shop.md").write_text("## Gift wrapping\n\nWe wrap any order.\n")
        ctx = await builder.build(p, _draft(9, "Do you wrap gifts?"))
        assert len(reads) == 2
        assert [x.heading for x in ctx.passages] == ["Gift wrapping"]
    finally:
        await builder.close()
        await store.close()


async def test_examples_read_again_keep_their_matrix_until_one_is_new(
        tmp_path, store_url, monkeypatch):
    monkeypatch.setattr(retrieval, "EXAMPLES_TTL", -1.0)  # read again at every draft
    p, store, builder = await _open(tmp_path, store_url)
    hashed: list[str] = []
    sha = retrieval.sha
    monkeypatch.setattr(retrieval, "sha", lambda t: hashed.append(t) or sha(t))

    async def remember(n: int) -> None:
        await store._script([(
            "INSERT INTO examples (pipeline, item_id, draft_key, original, reply, edited, "
            "sent_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
            ("support", f"<e{n}@x>", f"support|s|e{n}|v1", f"Refund question {n}",
             f"Reply {n}", False, 1.7e9 + n))])

    try:
        for n in range(3):
            await remember(n)
        await builder.build(p, _draft(1, "refund question"))
        await builder.retrieval.idle()
        first = await builder.build(p, _draft(2, "refund question"))
        assert first.examples
        index = builder.retrieval._indexes[("support", "examples", "fake")]
        matrix, hashed[:] = index.matrix, []
        for n in range(3, 6):
            ctx = await builder.build(p, _draft(n, "refund question"))
            assert ctx.examples == first.examples
        assert builder.retrieval._indexes[("support", "examples", "fake")] is index
        assert index.matrix is matrix and hashed == []
        await remember(3)
        await builder.build(p, _draft(7, "refund question"))
        assert hashed == ["Refund question 3"]  # the others' hashes are kept
    finally:
        await builder.close()
        await store.close()


async def test_the_local_model_gives_wordllamas_vectors_to_the_bit():
    """Read and averaged here (LOCAL_BATCH texts at a time, the table in float16) for
    resident memory, the vectors are those wordllama's own loader gives in one batch:
    the vectors already stored stay valid."""
    from pathlib import Path

    import wordllama
    from wordllama import WordLlama

    from bot.context.embedders import LOCAL_BATCH, LocalEmbedder

    texts = [f"Refunds\n{'A refund takes five business days. ' * n}" for n in range(1, 30)]
    texts += ["When is my cash returned?", "Grüße, naïve café ☃ 東京", "x" * 5000]
    emb = LocalEmbedder()
    ours = await emb.embed(texts)
    assert len(texts) > LOCAL_BATCH
    theirs = WordLlama.load(config="l2_supercat", dim=256, disable_download=True,
                            cache_dir=Path(wordllama.__file__).parent)
    want = np.asarray(theirs.embed(texts, norm=True, batch_size=len(texts)), dtype=np.float32)
    assert ours.dtype == np.float32 and np.array_equal(ours, want)
    assert np.array_equal(emb.embed_now(texts[-3:-2]), want[-3:-2])  # a query's path
    # A text with no token (empty) is a zero vector (wordllama gives NaNs), so it matches nothing.
    blank = await emb.embed(["", "Refunds", ""])
    assert not np.isnan(blank).any() and not blank[0].any() and not blank[2].any()
    assert blank[1].any()
    await emb.close()
