"""What a draft is based on besides the email: the thread's earlier messages, the
team's past replies of the same pipeline (examples) and passages of its knowledge
files (see DESIGN.md, "Context and triage").

* **Thread** (``drafter.thread``): the source's ``thread(message, limit)``: Gmail's
  ``threads.get``, a maildir's earlier files by References / In-Reply-To; the newest
  ``limit`` messages before the new one, both sides, oldest first, only those the new
  mail's sender took part in (:mod:`bot.context.thread`; the card counts the rest).
  Only asked for a message that answers another one (it has References or In-Reply-To).
* **Examples** (``drafter.examples``): the store's full-text search of past originals
  of this pipeline only (:meth:`bot.store.context_sql.ContextSql.examples_for`).
* **Knowledge** (``drafter.knowledge``): :class:`bot.context.knowledge.Knowledge`, re-indexed
  when a file changes, then searched like the examples.

Everything is cut to the pipeline's ``max_input`` in that order: the new email first,
then the thread (newest messages kept), then examples, then knowledge. A context
that cannot be read (Gmail down, a bad file) never stops a draft: the draft is made
with what could be read, and its card says what that was.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Callable

from ..config.load import PipelineConfig, Settings
from ..drafters.prompt import email_size, split_quoted
from ..errors import describe_error
from ..models import Context, Draft, Example, Message, Passage, ThreadMessage
from ..stages import Source
from .knowledge import Knowledge
from .retrieval import Retrieval
from .thread import Thread

log = logging.getLogger("draftgate.context")

PASSAGES = 3  # knowledge passages given at most
MIN_PART = 200  # characters below which a part is left out rather than cut
_OVERHEAD = 40  # labels and separators around each part
#: Longest the context may take to read, as a share of the pipeline's lease.
_SHARE_OF_LEASE = 0.25


def query_text(m: Message) -> str:
    """What the new email asks, for the searches: its subject and new text."""
    return f"{m.subject}\n{split_quoted(m.body or '')[0]}"[:4000]


class ContextBuilder:
    """Assembles a draft's :class:`Context` (one per engine; knowledge per pipeline)."""

    def __init__(self, store, source: Callable[[PipelineConfig], Source | None],
                 settings: Settings | None = None, retrieval: Retrieval | None = None):
        self.store, self._source = store, source
        self._knowledge: dict[str, Knowledge] = {}
        self._searched: dict[str, str | None] = {}  # the Knowledge.version last searched
        self.retrieval = retrieval or Retrieval(store, settings)

    async def build(self, p: PipelineConfig, d: Draft,
                    keep: Callable[[Example], bool] | None = None) -> Context:
        """The context of ``d``'s request, cut to fit; empty parts where off or unreadable.
        ``keep``: which past replies may be given (``draftgate eval`` leaves out the
        item's own reply and those sent after it)."""
        try:
            # With ``keep``, a few more are asked for, as some may be left out.
            ctx = await asyncio.wait_for(self._gather(p, d.message, 0 if keep is None else 5),
                                         timeout=_context_time(p))
        except Exception as exc:
            log.warning("%s: context for %s not read, drafting without it: %s", p.name, d.key,
                        describe_error(exc) if not isinstance(exc, TimeoutError) else "timed out")
            return Context()
        if keep is not None:
            ctx = Context(ctx.thread, [e for e in ctx.examples if keep(e)][:p.drafter.examples],
                          ctx.passages, thread_left_out=ctx.thread_left_out)
        return fit(ctx, d.message, p.drafter.max_input)

    async def _gather(self, p: PipelineConfig, m: Message, extra: int = 0) -> Context:
        # The three parts are read at once: the thread from the source (Gmail's pool),
        # examples and knowledge from the store.
        o, query = p.drafter, query_text(m)
        thread, examples, passages = await asyncio.gather(
            self.thread(p, m) if o.thread and m.kind == "email" and m.references
            else _no_thread(),
            self.retrieval.examples(p, query, o.examples + extra)
            if o.examples and m.kind == "email" else _none(),
            self._passages(p, query) if o.knowledge else _none())
        return Context(thread.messages, examples, passages, thread_left_out=thread.left_out)

    async def _passages(self, p: PipelineConfig, query: str) -> list[Passage]:
        knowledge = self._knowledge.get(p.name)
        if knowledge is None or knowledge.pipeline is not p:
            knowledge = self._knowledge[p.name] = Knowledge(self.store, p)
        # A draft waits for an index pass it started at most half the time its context
        # may take; for one already running, not at all (see Knowledge.refresh).
        await knowledge.refresh(wait=_context_time(p) / 2)
        # The searches' in-memory index is read again after any pass that changed the
        # store's, also one that ended after the draft that started it went on; not
        # for a new Knowledge object of the same files (a reload), nor on every draft
        # when two take turns (they did in scripts/bench_context: 25 ms a draft).
        version = knowledge.version
        reread = self._searched.get(p.name, "") != version
        self._searched[p.name] = version
        return await self.retrieval.passages(p, query, PASSAGES, reread=reread)

    async def close(self) -> None:
        """Stop the background embedding and index passes (at shutdown)."""
        for knowledge in self._knowledge.values():
            await knowledge.close()
        await self.retrieval.close()

    async def thread(self, p: PipelineConfig, m: Message) -> Thread:
        """The earlier messages of ``m``'s thread from the pipeline's source that its
        sender took part in (:mod:`bot.context.thread`; a source without threads gives
        none). A failure is logged; the draft goes on without."""
        read = getattr(self._source(p), "thread", None)
        if read is None:
            return Thread()
        try:
            found = await read(m, p.drafter.thread)
        except Exception as exc:
            log.warning("%s: thread of %s not read, drafting without it: %s", p.name,
                        m.source_id or m.message_id, describe_error(exc))
            return Thread()
        if not isinstance(found, Thread):  # a source that gives a plain list
            found = Thread(list(found))
        return Thread(found.messages[-p.drafter.thread:], found.left_out)


def _context_time(p: PipelineConfig) -> float:
    """Seconds a draft's context may take to read."""
    return max(5.0, p.lease * _SHARE_OF_LEASE)


async def _none() -> list:
    return []


async def _no_thread() -> Thread:
    return Thread()


def fit(ctx: Context, m: Message, max_input: int) -> Context:
    """``ctx`` cut to what ``max_input`` leaves after the email, in budget order."""
    left = max_input - email_size(m, max_input, quoted=not ctx.thread)
    thread: list[ThreadMessage] = []
    for t in reversed(ctx.thread):  # the newest earlier messages matter most
        cost = len(t.sender) + len(t.date) + _OVERHEAD
        text = _within(t.text, left - cost)
        if text is None:
            break
        thread.insert(0, ThreadMessage(t.sender, t.date, text, t.ours))
        left -= cost + len(text)
    examples: list[Example] = []
    for e in ctx.examples:
        original = _within(e.original, min(len(e.original), (left - 2 * _OVERHEAD) // 2))
        reply = _within(e.reply, left - 2 * _OVERHEAD - len(original or ""))
        if original is None or reply is None:
            break
        examples.append(Example(e.pipeline, e.item_id, original, reply, e.edited, e.sent_at))
        left -= 2 * _OVERHEAD + len(original) + len(reply)
    passages: list[Passage] = []
    for ps in ctx.passages:
        text = _within(ps.text, left - len(ps.name) - _OVERHEAD)
        if text is None:
            break
        passages.append(Passage(ps.path, ps.heading, text))
        left -= len(ps.name) + _OVERHEAD + len(text)
    return Context(thread, examples, passages, thread_left_out=ctx.thread_left_out)


def _within(text: str, room: int) -> str | None:
    """``text`` cut to ``room`` characters, or None when too little room is left."""
    if len(text) <= room:
        return text
    if room < MIN_PART:
        return None
    return text[:room - 12].rstrip() + "\n[truncated]"
