"""``draftgate eval``: a pipeline's triage, context and drafter run on past items, or on
a folder of emails, and compared with what the team did (see DESIGN.md, "The quality
loop").

It writes nothing: no draft row, no card, no send, no seen mark, no audit row, no token
usage of the live pipeline. The store is only read (the item, past replies, knowledge
passages); the models are called directly, not through the engine. Its tokens count in
a budget of its own (:class:`Budget`).

Per item and configuration: the new triage decision and whether it agrees with what
the operators did (a reply sent: ``reply``; an FYI card dismissed: ``notify``), the new
draft, its chrF against the reply that was sent (:mod:`bot.desk.chrf`), the claims no
source supports (:mod:`bot.context.grounded`), tokens and, with ``models.<name>.price``,
the cost. A draft is given the past replies the team had sent before the item arrived,
never the item's own reply.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from ..config.load import PipelineConfig, Settings
from ..context import grounded
from ..context.builder import ContextBuilder
from ..engine.build import build_model, build_source, build_triager
from ..errors import ConfigError, describe_error
from ..mail.mime import UnparseableMessage, parse_email
from ..models import Draft, DraftRequest, Example, Message
from .chrf import chrf

log = logging.getLogger("draftgate.eval")

#: Default of ``--max-tokens``: eval's own budget, never the live pipeline's.
DEFAULT_MAX_TOKENS = 200_000
EXPECTED = ("reply", "notify", "skip")


@dataclass
class EvalItem:
    """A past item: the email, the reply the team sent (None: none) and what the
    operators did with it, as the triage label it agrees with."""

    item_id: str
    message: Message
    sent: str | None
    expected: str | None  # reply | notify | skip; None: unknown
    arrived: float | None = None  # when it came in (past replies after it are not given)


@dataclass
class ItemResult:
    item_id: str
    subject: str
    triage: str | None = None  # the new decision; None: the configuration has no triage
    triage_agrees: bool | None = None  # None: nothing to compare with
    draft: str | None = None  # None: not drafted (triage, or an error)
    error: str | None = None
    chrf: float | None = None  # against the sent reply; None: no sent reply
    unsupported: list[str] = field(default_factory=list)
    tokens_in: int = 0
    tokens_out: int = 0
    cost: float | None = None  # None: a model without a price


@dataclass
class EvalRun:
    """One configuration's results over the items."""

    label: str  # the pipeline file
    model: str
    results: list[ItemResult] = field(default_factory=list)


class Budget:
    """Eval's tokens, counted against ``limit`` (never the pipeline's daily budget)."""

    def __init__(self, limit: int):
        self.limit, self.used = limit, 0

    @property
    def spent(self) -> bool:
        return self.used >= self.limit


def folder_items(folder: Path) -> list[EvalItem]:
    """The emails of ``folder``: each ``NAME.eml`` with, beside it, ``NAME.reply.txt``
    (the reply the team sent: triage should say reply) and optionally
    ``NAME.triage.txt`` (one word, reply, notify or skip: what triage should say).
    Sorted by name. Raises ConfigError naming what is wrong and how to fix it."""
    if not folder.is_dir():
        raise ConfigError(f"--from: {folder} is not a folder; give a folder of NAME.eml files "
                          f"with NAME.reply.txt beside each")
    items: list[EvalItem] = []
    for path in sorted(folder.glob("*.eml")):
        try:
            message = parse_email(path.read_bytes(), source_id=path.name)
        except (OSError, UnparseableMessage) as exc:
            raise ConfigError(f"--from: {path}: cannot read it as an email ({exc}); fix or "
                              f"remove the file") from None
        name = path.name[:-len(".eml")]
        reply, label = path.with_name(f"{name}.reply.txt"), path.with_name(f"{name}.triage.txt")
        sent = reply.read_text(encoding="utf-8").strip() if reply.exists() else None
        expected = "reply" if sent is not None else None
        if label.exists():
            expected = label.read_text(encoding="utf-8").strip().lower()
            if expected not in EXPECTED:
                raise ConfigError(f"--from: {label}: expected one word, reply, notify or "
                                  f"skip, got {expected[:40]!r}")
        items.append(EvalItem(name, message, sent, expected))
    if not items:
        raise ConfigError(f"--from: no .eml files in {folder}; put each email in NAME.eml "
                          f"and the reply the team sent in NAME.reply.txt")
    return items


class Evaluation:
    """Runs configurations on items; the store is read, never written."""

    def __init__(self, settings: Settings, store: Any):
        self.settings, self.store = settings, store
        self._sources: dict[str, Any] = {}
        self.context = ContextBuilder(store, self._source, settings)
        self.style_notes: tuple[str, ...] = ()

    def _source(self, p: PipelineConfig) -> Any:
        """The pipeline's source, for the thread of an item (None if it cannot be built
        here: the draft is made without the thread, as live drafting would)."""
        if p.name not in self._sources:
            try:
                self._sources[p.name] = build_source(p, self.settings)
            except Exception as exc:
                log.warning("%s: source not usable here, no thread given: %s", p.name,
                            describe_error(exc))
                self._sources[p.name] = None
        return self._sources[p.name]

    async def close(self) -> None:
        for source in self._sources.values():
            if source is not None:
                await source.close()
        await self.context.close()

    async def run(self, configs: list[PipelineConfig], items: list[EvalItem], budget: Budget,
                  progress: Callable[[int, int], None] | None = None) -> list[EvalRun]:
        """Each configuration on each item, item by item (so every configuration has the
        same items when the budget stops it)."""
        # The live pipeline's approved style notes, as its drafts are given them.
        notes = await self.store.approved_notes(configs[0].name)
        self.style_notes = tuple(notes.rules) if notes else ()
        runs = [EvalRun(p.file, self.settings.models[p.drafter.model].model
                        or p.drafter.model) for p in configs]
        stages = [(build_triager(p, self.settings), build_model(p, self.settings,
                                                                p.drafter.model)) for p in configs]
        try:
            for done, item in enumerate(items):
                if budget.spent:
                    break
                for p, run, (triager, drafter) in zip(configs, runs, stages, strict=True):
                    result = await self._one(p, item, triager, drafter)
                    budget.used += result.tokens_in + result.tokens_out
                    run.results.append(result)
                if progress is not None:
                    progress(done + 1, len(items))
        finally:
            for triager, drafter in stages:
                for stage in (triager, drafter):
                    if stage is not None:
                        await stage.close()
        return runs

    async def _one(self, p: PipelineConfig, item: EvalItem, triager: Any,
                   drafter: Any) -> ItemResult:
        m = item.message
        r = ItemResult(item.item_id, m.subject)
        if triager is not None:
            decision = await triager.triage(m)
            r.triage, r.tokens_in = decision.action, decision.tokens
            r.cost = self._cost(p.triage.model if p.triage else "", decision.tokens, 0)
            if item.expected is not None:
                r.triage_agrees = (decision.action == item.expected or
                                   (item.expected != "reply" and decision.action != "reply"))
        elif item.expected is not None:  # without triage every email is drafted: "reply"
            r.triage_agrees = item.expected == "reply"
        if r.triage in (None, "reply"):
            await self._draft(p, item, drafter, r)
        if item.sent is not None:
            r.chrf = chrf(r.draft or "", item.sent)
        return r

    async def _draft(self, p: PipelineConfig, item: EvalItem, drafter: Any, r: ItemResult) -> None:
        d = Draft(id=0, key=f"{p.name}|eval|{item.item_id}", pipeline=p.name, scope="eval",
                  item_id=item.item_id, recipe=p.recipe, status="eval", message=item.message)

        def keep(e: Example) -> bool:  # what the team had sent before, not this reply
            return e.item_id != item.item_id and (item.arrived is None or e.sent_at < item.arrived)

        context = await self.context.build(p, d, keep)
        request = DraftRequest(pipeline=p.name, message=item.message, draft_key=d.key,
                               context=context, style_notes=self.style_notes)
        try:
            result = await asyncio.wait_for(drafter.draft(request), timeout=p.lease * 0.9)
        except Exception as exc:
            r.error = describe_error(exc)
            # An unusable answer was paid for too (counted as output).
            self._spent(p, r, 0, int(getattr(exc, "tokens", 0) or 0))
            return
        r.draft = (result.body or "").strip()
        used = await asyncio.to_thread(grounded.check, p, request, r.draft, context.used())
        r.unsupported = [str(c) for c in used.get(grounded.UNSUPPORTED) or []]
        self._spent(p, r, result.tokens_in, result.tokens_out)

    def _spent(self, p: PipelineConfig, r: ItemResult, tokens_in: int, tokens_out: int) -> None:
        """The drafter's tokens and cost added to the item's (its triage's, if any)."""
        if not tokens_in + tokens_out:
            return
        r.tokens_in += tokens_in
        r.tokens_out += tokens_out
        cost = self._cost(p.drafter.model, tokens_in, tokens_out)
        r.cost = None if cost is None or (r.cost is None and r.triage is not None) else \
            cost + (r.cost or 0.0)

    def _cost(self, model: str, tokens_in: int, tokens_out: int) -> float | None:
        config = self.settings.models.get(model)
        price = config.price if config is not None else None
        return None if price is None else price.cost(tokens_in, tokens_out)
