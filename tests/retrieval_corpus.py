"""The retrieval evaluation of issue 24 (scripts/eval_retrieval; a test runs a part).

tests/corpus_retrieval/ holds a shop's handbook (20 sections), a catalogue of product
passages that answer none of the questions (larger than ``max_input``; it shares the
product words customers use, not the policy words), 40 paraphrased questions over the
handbook, and team memory: 20 past replies with a paraphrased question each, plus
past replies no question is about.

Each question goes through the real context builder (the store's full-text search,
the in-process embeddings, the fusion, the cut to ``max_input``) of a pipeline with
``retrieval: lexical`` and one with ``hybrid``, as a draft's request would be made.
Counted per request: is the passage (or past reply) that answers it in the request
(recall), and how many given passages (or past replies) are unrelated to it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from bot.config.load import load_settings
from bot.context.builder import ContextBuilder
from bot.mail.mime import parse_email
from bot.models import Draft
from bot.store import create_store

CORPUS = Path(__file__).parent / "corpus_retrieval"
MODES = ("lexical", "hybrid")


@dataclass
class Figures:
    """One mode's figures over one kind of question (``handbook`` or ``memory``)."""

    requests: int = 0
    found: int = 0
    unrelated: int = 0
    worst: int = 0  # most unrelated texts in one request
    misses: list[str] = field(default_factory=list)

    @property
    def recall(self) -> float:
        return self.found / self.requests if self.requests else 0.0

    @property
    def unrelated_per_request(self) -> float:
        return self.unrelated / self.requests if self.requests else 0.0

    def count(self, question: str, hit: bool, unrelated: int) -> None:
        self.requests += 1
        self.found += hit
        self.unrelated += unrelated
        self.worst = max(self.worst, unrelated)
        if not hit:
            self.misses.append(question)


def load() -> tuple[list[dict], dict[str, Any]]:
    """(handbook questions, team memory) from the corpus."""
    questions = yaml.safe_load((CORPUS / "questions.yaml").read_text(encoding="utf-8"))
    memory = yaml.safe_load((CORPUS / "memory.yaml").read_text(encoding="utf-8"))
    return questions, memory


def _deployment(tmp: Path, store_url: str, embeddings: str, models_yaml: str) -> str:
    (tmp / "kb").mkdir(exist_ok=True)
    (tmp / "pipelines").mkdir(exist_ok=True)
    for name in ("handbook.md", "catalogue.md"):
        (tmp / "kb" / name).write_text((CORPUS / name).read_text(encoding="utf-8"))
    (tmp / "draftgate.yaml").write_text(f"store: {store_url}\n{models_yaml}")
    for mode in MODES:
        (tmp / "pipelines" / f"{mode}.yaml").write_text(
            f"name: {mode}\nschedule: 1h\nsource: {{type: maildir, path: inbox}}\n"
            f"drafter: {{model: template, knowledge: [kb/*.md], examples: 3, thread: 0, "
            f"retrieval: {mode}, embeddings: {embeddings}}}\n"
            "sender: {type: outbox, path: out, from: support@northfield.example}\n")
    return str(tmp / "draftgate.yaml")


async def _remember(store, pipeline: str, memory: dict[str, Any]) -> None:
    """The past replies, as sends would have left them (distractors first, older)."""
    rows = [(f"<d{i}@memory>", e["original"], e["reply"])
            for i, e in enumerate(memory["distractors"])]
    rows += [(f"<{k}@memory>", e["original"], e["reply"]) for k, e in memory["examples"].items()]
    values = [v for i, (item, original, reply) in enumerate(rows)
              for v in (pipeline, item, f"{pipeline}|s|{item}|v1", original, reply, 0,
                        1.7e9 + i)]
    await store._script([("INSERT INTO examples (pipeline, item_id, draft_key, original, reply, "
                          "edited, sent_at) VALUES " + ", ".join(["(?, ?, ?, ?, ?, ?, ?)"] * len(rows)),
                          tuple(values))])


def _draft(n: int, pipeline: str, question: str) -> Draft:
    raw = (f"From: Kim <kim@customer.example>\nTo: support@northfield.example\n"
           f"Subject: Question\nMessage-ID: <q{n}@customer.example>\n\n{question}\n").encode()
    return Draft(id=n, key=f"{pipeline}|s|q{n}|v1", pipeline=pipeline, scope="s",
                 item_id=f"<q{n}@customer.example>", recipe="v1", status="drafting",
                 message=parse_email(raw))


async def evaluate(tmp: Path, store_url: str, *, questions: list[dict] | None = None,
                   queries: list[dict] | None = None, embeddings: str = "local",
                   models_yaml: str = "") -> dict[tuple[str, str], Figures]:
    """(mode, kind) -> figures; ``questions`` / ``queries``: a part of the corpus."""
    all_questions, memory = load()
    questions = all_questions if questions is None else questions
    queries = memory["queries"] if queries is None else queries
    settings = load_settings(_deployment(tmp, store_url, embeddings, models_yaml))
    store = create_store(settings.store)
    await store.open()
    builder = ContextBuilder(store, lambda _p: None, settings)
    out: dict[tuple[str, str], Figures] = {}
    try:
        for p in settings.pipelines:
            await _remember(store, p.name, memory)
            # One request first: it indexes the files and starts the background
            # embedding, which a running draftgate does long before its drafts.
            await builder.build(p, _draft(0, p.name, "warm up"))
            await builder.retrieval.idle()
            hb = out[(p.name, "handbook")] = Figures()
            for n, q in enumerate(questions, 1):
                ctx = await builder.build(p, _draft(n, p.name, q["q"]))
                given = [x.heading for x in ctx.passages]
                ok = {q["answer"], *q.get("also", ())}
                hb.count(q["q"], q["answer"] in given, sum(h not in ok for h in given))
            mem = out[(p.name, "memory")] = Figures()
            for n, q in enumerate(queries, 1000):
                ctx = await builder.build(p, _draft(n, p.name, q["q"]))
                given = [e.item_id for e in ctx.examples]
                want = f"<{q['answer']}@memory>"
                mem.count(q["q"], want in given, sum(i != want for i in given))
    finally:
        await builder.close()
        await store.close()
    return out
