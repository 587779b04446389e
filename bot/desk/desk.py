"""The operator desk: everything a channel or a command may do, in one typed class.

Every method takes the acting :class:`~bot.desk.operator.Operator` and checks the one
rule (:func:`~bot.desk.operator.refusal`) itself, so no handler can forget it; a
refusal is audited and raised as :class:`~bot.errors.NotAllowed`. The Telegram
channel, the console and every CLI command get a desk, never the store.

A desk without an engine (the CLI's read-only commands) reads, replays and sweeps; the
decisions that send or draft need the engine of a running process (``bot.app.App``).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, Callable

from .. import scoreboard
from ..clock import wall
from ..config.load import Settings
from ..engine import notes
from ..errors import NotAllowed, SourceError
from ..models import Draft, Example, RunCounts, Status, StyleNotes
from ..scoreboard import Scoreboard
from ..store import ReplayResult, Store, SweepResult
from . import reports, stats
from .decisions import Decisions
from .evaluate import EvalItem, Evaluation
from .operator import Operator, refusal

if TYPE_CHECKING:
    from ..engine.engine import Engine


class OperatorDesk:
    """See the module docstring."""

    def __init__(self, settings: Settings, store: Store, engine: "Engine | None" = None, *,
                 clock: Callable[[], float] | None = None):
        self.settings, self.store, self.engine = settings, store, engine
        self.clock = clock or (engine.clock if engine is not None else wall)
        self._decisions = None if engine is None else Decisions(
            settings, store, engine.channels, engine.drafting, engine.sends, engine.sender,
            self.clock, engine.spawn)

    # -- the rule ------------------------------------------------------------------------
    async def authorize(self, op: Operator, pipeline: str | None, what: str, *,
                        key: str | None = None, deciding: bool = False) -> None:
        """Raise :class:`NotAllowed` (audited) unless ``op`` may do ``what``."""
        found = refusal(self.settings, op, pipeline, deciding=deciding)
        if found is None:
            return
        await self.store.audit(op.actor, "refused", draft_key=key, now=self.clock(),
                               detail=f"{what}: {found.reason}")
        raise NotAllowed(found.text)

    def sees(self, op: Operator, pipeline: str) -> bool:
        """Does ``pipeline`` show its drafts to ``op`` (/pending, /status)?"""
        return refusal(self.settings, op, pipeline) is None

    async def _decidable(self, op: Operator, draft_id: int, what: str,
                         seen: Draft | None = None) -> Draft | None:
        d = seen if seen is not None and seen.id == draft_id else await self.store.get_draft(draft_id)
        if d is not None:
            await self.authorize(op, d.pipeline, f"{what} v{d.version}", key=d.key, deciding=True)
        return d

    @property
    def decisions(self) -> Decisions:
        if self._decisions is None:
            raise RuntimeError("this desk has no engine: decisions need a running draftgate")
        return self._decisions

    # -- decisions on a draft --------------------------------------------------------------
    async def approve(self, op: Operator, draft_id: int, version: int,
                      seen: Draft | None = None, later: str | None = None, *,
                      confirmed: bool = False) -> Draft | None:
        """Approve (a vote, below the pipeline's quorum); see Decisions.approve.
        ``later``: send later (``hour``, ``tomorrow``, ``monday``), not at once. With
        ``grounding: confirm`` a version with unsupported claims raises
        :class:`~bot.errors.NeedsConfirmation` until approved with ``confirmed``."""
        d = await self._decidable(op, draft_id, "approve" + (f" ({later})" if later else ""), seen)
        return await self.decisions.approve(draft_id, version, op.actor, d, later=later,
                                            confirmed=confirmed)

    async def undo(self, op: Operator, draft_id: int, version: int) -> Draft | None:
        """Undo a deferred send before it begins (the undo window, a later send): the
        draft awaits a decision again. None: it is being sent or was sent already."""
        await self._decidable(op, draft_id, "undo")
        return await self.decisions.undo(draft_id, version, op.actor)

    async def edit(self, op: Operator, draft_id: int, version: int, body: str) -> Draft | None:
        await self._decidable(op, draft_id, "edit")
        return await self.decisions.edit(draft_id, version, body, op.actor)

    async def regenerate(self, op: Operator, draft_id: int, version: int,
                         instruction: str = "") -> Draft | None:
        await self._decidable(op, draft_id, "regenerate")
        return await self.decisions.regenerate(draft_id, version, op.actor, instruction)

    async def reject(self, op: Operator, draft_id: int, version: int,
                     reason: str = "") -> Draft | None:
        await self._decidable(op, draft_id, "reject")
        return await self.decisions.reject(draft_id, version, op.actor, reason)

    async def retry_send(self, op: Operator, draft_id: int) -> Draft | None:
        await self._decidable(op, draft_id, "retry send")
        return await self.decisions.retry_send(draft_id, op.actor)

    async def check_send(self, op: Operator, draft_id: int) -> tuple[Draft | None, str]:
        """Check again, on an unknown send's card: ask the mailbox; never sends."""
        await self._decidable(op, draft_id, "check send")
        return await self.decisions.check_send(draft_id, op.actor)

    async def mark_sent(self, op: Operator, draft_id: int) -> Draft | None:
        """Mark as sent, on an unknown send's card: the operator saw it arrive."""
        await self._decidable(op, draft_id, "mark sent")
        return await self.decisions.mark_sent(draft_id, op.actor)

    async def draft_reply(self, op: Operator, draft_id: int, version: int) -> Draft | None:
        await self._decidable(op, draft_id, "draft a reply")
        return await self.decisions.draft_reply(draft_id, version, op.actor)

    async def dismiss(self, op: Operator, draft_id: int, version: int) -> Draft | None:
        await self._decidable(op, draft_id, "dismiss")
        return await self.decisions.dismiss(draft_id, version, op.actor)

    async def reply(self, op: Operator, pipeline: str, item_id: str, instruction: str) -> str:
        """/reply: draft (again) a reply to an admitted item, with an instruction."""
        self.settings.pipeline(pipeline)  # ConfigError names the known ones
        await self.authorize(op, pipeline, "reply", deciding=True)
        return await self.decisions.reply(pipeline, item_id, instruction, op.actor)

    async def replay(self, op: Operator, pipeline: str, item_id: str) -> ReplayResult:
        """/replay: draft a failed, rejected, skipped, dismissed or expired item again."""
        self.settings.pipeline(pipeline)
        await self.authorize(op, pipeline, "replay", deciding=True)
        return await reports.replay(self.store, pipeline, item_id, op.actor, self.settings)

    async def files(self, op: Operator, draft_id: int) -> tuple[Draft, list[tuple[str, bytes]]]:
        """📎 Files: the attachments of the mail a draft answers, whole, from its source
        (operators of its pipeline only; audited with the names and sizes)."""
        d = await self.store.get_draft(draft_id)
        if d is None:
            raise NotAllowed("No such draft.")
        await self.authorize(op, d.pipeline, f"files v{d.version}", key=d.key, deciding=True)
        if self.engine is None:
            raise RuntimeError("files needs a running draftgate")
        fetch = getattr(self.engine.source(self.settings.pipeline(d.pipeline)),
                        "attachment_files", None)
        if fetch is None:
            raise SourceError(f"the {d.pipeline} source keeps no attachments to send")
        found: list[tuple[str, bytes]] = await fetch(d.message)
        await self.store.audit(op.actor, "files", draft_key=d.key, now=self.clock(), detail=", ".join(
            f"{name} {len(data)} bytes" for name, data in found) or "none")
        return d, found

    def attachable_pipeline(self, pipeline: str) -> bool:
        """Does ``pipeline`` offer 📎 Attach (``sender.attachments``)?"""
        return self.settings.has_pipeline(pipeline) and \
            self.settings.pipeline(pipeline).attachments is not None

    def attachable(self, pipeline: str) -> list[str]:
        """The files ``sender.attachments`` of ``pipeline`` offers (📎 Attach), by name."""
        folder = self.settings.pipeline(pipeline).attachments
        if folder is None:
            return []
        return sorted(f.name for f in folder.iterdir() if f.is_file() and not f.name.startswith("."))

    async def attach(self, op: Operator, draft_id: int, version: int, name: str) -> Draft | None:
        """📎 Attach the file ``name`` of the pipeline's folder to the reply: a new
        version, which needs its own approval (None: the draft moved meanwhile)."""
        d = await self._decidable(op, draft_id, f"attach {name}")
        if d is None or name not in self.attachable(d.pipeline):
            raise SourceError(f"{name} is not in the attachments folder any more")
        folder = self.settings.pipeline(d.pipeline).attachments
        assert folder is not None
        paths = [*d.attached, str(folder / name)]
        after = await self.store.attach(draft_id, version, paths, op.actor, now=self.clock())
        if after is not None and self.engine is not None:
            await self.engine.channels.post_card(self.settings.pipeline(after.pipeline), after)
            after = await self.store.get_draft(after.id)
        return after

    async def full_text(self, op: Operator, draft: Draft) -> Draft:
        """The draft whose full text ``op`` asked for (reading is checked like acting)."""
        await self.authorize(op, draft.pipeline, f"full text v{draft.version}", key=draft.key)
        return draft

    # -- the pipelines -----------------------------------------------------------------------
    async def pause(self, op: Operator, name: str) -> None:
        self.settings.pipeline(name)
        await self.authorize(op, name, "pause")
        await self.store.set_paused(name, True, op.actor)

    async def resume(self, op: Operator, name: str) -> None:
        self.settings.pipeline(name)
        await self.authorize(op, name, "resume")
        await self.store.set_paused(name, False, op.actor)

    async def run_now(self, op: Operator, name: str) -> RunCounts:
        self.settings.pipeline(name)
        await self.authorize(op, name, "run")
        if self.engine is None:
            raise RuntimeError("run needs a running draftgate")
        return await self.engine.tick(name)

    async def sweep(self, op: Operator, days: float | None = None) -> SweepResult:
        """Delete old seen marks, requeue expired leases, expire old approvals, prune runs."""
        await self.authorize(op, None, "sweep")
        if self._decisions is not None and self.engine is not None:
            return await self._decisions.sweep(days, self.engine.lease_now)
        return await reports.sweep(self.store, self.settings, days=days)

    # -- reading ---------------------------------------------------------------------------
    async def status(self, op: Operator) -> list[reports.PipelineStatus]:
        await self.authorize(op, None, "status")
        return [s for s in await reports.status_all(self.store, self.settings)
                if s.name not in self._hidden(op)]

    async def status_of(self, op: Operator, name: str) -> reports.PipelineDetail:
        self.settings.pipeline(name)
        await self.authorize(op, name, "status")
        return await reports.status_one(self.store, self.settings, name)

    def _hidden(self, op: Operator) -> set[str]:
        return {p.name for p in self.settings.pipelines if not self.sees(op, p.name)}

    async def pending(self, op: Operator, limit: int | None = reports.PENDING_PAGE
                      ) -> tuple[list[Draft], int]:
        """A page of the unfinished drafts ``op`` may see (all with ``limit=None``), and
        how many of theirs there are in all."""
        await self.authorize(op, None, "pending")
        hidden = self._hidden(op)
        drafts, total = await reports.pending_page(self.store, self.settings,
                                                   limit=limit or reports.PENDING_PAGE)
        if (limit is None or hidden) and total > len(drafts):
            drafts, total = await reports.pending_page(self.store, self.settings, limit=total)
        if hidden:
            drafts = [d for d in drafts if d.pipeline not in hidden]
            total = len(drafts)
        return (drafts if limit is None else drafts[:limit]), total

    async def stats(self, op: Operator, pipeline: str | None = None,
                    days: float = stats.DEFAULT_DAYS) -> Scoreboard:
        """The scoreboard of the last ``days`` (:mod:`bot.scoreboard`): of ``pipeline``,
        or of every pipeline ``op`` sees. Read from the store in two queries; the edit
        sizes are measured off the event loop."""
        if pipeline is not None:
            self.settings.pipeline(pipeline)
        await self.authorize(op, pipeline, "stats")
        until = self.clock()
        since = until - days * scoreboard.DAY
        decisions, overrides = await self.store.quality(since, until, pipeline)
        if pipeline is None and (hidden := self._hidden(op)):
            decisions = [d for d in decisions if d.pipeline not in hidden]
            overrides = [o for o in overrides if o.pipeline not in hidden]
        return await asyncio.to_thread(scoreboard.build, decisions, overrides, since=since,
                                       until=until, pipeline=pipeline)

    async def holds(self, op: Operator) -> dict[str, str]:
        await self.authorize(op, None, "pending")
        hidden = self._hidden(op)
        return {k: v for k, v in (await reports.holds(self.store)).items() if k not in hidden}

    async def history(self, op: Operator, pipeline: str, item_id: str) -> reports.History:
        self.settings.pipeline(pipeline)
        await self.authorize(op, pipeline, "audit")
        return await reports.history(self.store, self.settings, pipeline, item_id)

    async def emails(self, op: Operator, pipeline: str, n: int) -> list[Draft]:
        """/emails: the newest ``n`` admitted items, newest first (audited)."""
        self.settings.pipeline(pipeline)
        await self.authorize(op, pipeline, "emails")
        return await reports.emails(self.store, self.settings, pipeline, n, op.actor,
                                    now=self.clock())

    async def examples(self, op: Operator, pipeline: str, limit: int) -> list[Example]:
        await self.authorize(op, pipeline, "memory list")
        return await self.store.list_examples(pipeline, limit)

    async def forget_example(self, op: Operator, pipeline: str, item_id: str) -> int:
        await self.authorize(op, pipeline, "memory forget")
        return await self.store.forget_example(pipeline, item_id, op.actor)

    # -- style notes learned from edits (bot.engine.notes) ---------------------------------
    async def distill_notes(self, op: Operator, pipeline: str) -> StyleNotes:
        """``memory distill``: a proposed version of the pipeline's style notes, to be
        approved on its card (TooFewEdits below 5 edit pairs)."""
        p = self.settings.pipeline(pipeline)
        await self.authorize(op, pipeline, "memory distill")
        return await notes.distill(self.settings, self.store, p, op.actor, now=self.clock())

    async def style_notes(self, op: Operator, pipeline: str) -> list[StyleNotes]:
        """``memory notes``: the pipeline's versions, newest first."""
        self.settings.pipeline(pipeline)
        await self.authorize(op, pipeline, "memory notes")
        return await self.store.notes_versions(pipeline)

    async def notes(self, note_id: int) -> StyleNotes | None:
        return await self.store.notes(note_id)

    async def decide_notes(self, op: Operator, note_id: int, decision: str,
                           rules: list[str] | None = None) -> StyleNotes | None:
        """Approve, reject or edit (``rules``, decision ``proposed``) a proposal; None
        when it was decided already. Only the pipeline's deciders may."""
        found = await self.store.notes(note_id)
        if found is None:
            return None
        await self.authorize(op, found.pipeline, f"style notes {decision} v{found.version}",
                             key=found.key, deciding=True)
        return await self.store.decide_notes(note_id, decision, op.actor, rules,
                                             now=self.clock())

    async def forget_note(self, op: Operator, pipeline: str, number: int) -> StyleNotes | None:
        """``memory notes --forget N``: a new approved version without rule ``number``
        (1-based) of the one in use; None when there is no such rule."""
        self.settings.pipeline(pipeline)
        await self.authorize(op, pipeline, "memory notes --forget", deciding=True)
        current = await self.store.approved_notes(pipeline)
        if current is None or not 1 <= number <= len(current.rules):
            return None
        rules = [r for i, r in enumerate(current.rules, 1) if i != number]
        return await self.store.add_notes(
            pipeline, rules, op.actor, status="approved", now=self.clock(),
            detail=f"v{current.version} without rule {number}: {current.rules[number - 1]}")

    # -- draftgate eval (reads only: bot.desk.evaluate) ----------------------------------
    async def eval_items(self, op: Operator, pipeline: str, limit: int) -> list[EvalItem]:
        """The newest ``limit`` items of ``pipeline`` the operators decided, oldest first:
        a reply sent (its text, the reply expected) or an FYI card dismissed (notify)."""
        self.settings.pipeline(pipeline)
        await self.authorize(op, pipeline, "eval")
        found = await self.store.recent(pipeline, (Status.SENT, Status.DISMISSED), limit)
        return [EvalItem(d.item_id, d.message, d.body if d.status == Status.SENT else None,
                         "reply" if d.status == Status.SENT else "notify", d.created_at)
                for d in reversed(found)]

    async def evaluation(self, op: Operator, pipeline: str) -> Evaluation:
        """A runner of configurations on items that reads this desk's store and writes
        nothing (``await ev.close()`` after)."""
        await self.authorize(op, pipeline, "eval")
        return Evaluation(self.settings, self.store)

    async def verify_audit(self, op: Operator) -> Any:
        """``audit verify``: walk the whole chain (a :class:`bot.store.chain.Report`)."""
        await self.authorize(op, None, "audit verify")
        return await self.store.verify_audit()

    async def audit_export(self, op: Operator, since: float, after: int, batch: int) -> list[dict]:
        """``audit export``: the chained rows with ``at >= since`` after position ``after``."""
        await self.authorize(op, None, "audit export")
        return await self.store.audit_export(since, after, batch)

    async def check_store(self, op: Operator) -> list[str]:
        """``doctor``: what is wrong with the store (nothing: an empty list)."""
        await self.authorize(op, None, "doctor")
        return await self.store.check()

    async def seen_count(self, op: Operator, pipeline: str) -> int:
        """How many items ``pipeline`` has seen (admitted or skipped)."""
        await self.authorize(op, pipeline, "status")
        return await self.store.seen_count(pipeline)

    async def marked(self, key: str) -> bool:
        """Is there an audit row under ``key`` (a mark such as the demo's own store)?"""
        return bool(await self.store.audit_log(draft_key=key, limit=1))

    async def mark(self, op: Operator, action: str, key: str, detail: str) -> None:
        """Record a mark under ``key`` in the audit (see :meth:`marked`)."""
        await self.store.audit(op.actor, action, draft_key=key, detail=detail, now=self.clock())

    # -- what a channel reads and records about its own cards -------------------------------
    async def draft(self, draft_id: int) -> Draft | None:
        """The draft as stored now (None: there is none)."""
        return await self.store.get_draft(draft_id)

    async def votes(self, d: Draft) -> tuple[list[str], int]:
        """(who approved ``d``'s current version so far, the quorum), for its card."""
        return await Decisions.votes_of(self.settings, self.store, d)

    async def record_prompt(self, op: Operator, chat: int | str, message_id: int | str,
                            record: str) -> None:
        """Remember what a prompt message asks about, so a reply to it finds its draft."""
        await self.store.record_prompt(str(chat), str(message_id), record, op.actor,
                                       now=self.clock())

    async def prompt_record(self, chat: int | str, message_id: int | str) -> str | None:
        return await self.store.prompt_record(str(chat), str(message_id))

    async def adopt_card(self, d: Draft, chat: str, message_id: str) -> Draft:
        """A card of ``d``'s version exists though ``d`` waits to be posted (Telegram
        delivered a post whose answer was lost): it becomes its card."""
        return await Decisions.adopt(self.store, d, chat, message_id, self.clock())

    async def card_stale(self, draft_id: int, stale: bool) -> None:
        await self.store.mark_card_stale(draft_id, stale)

    async def stale_cards(self, limit: int = 50) -> list[Draft]:
        return await self.store.stale_cards(limit=limit)

    def held(self) -> str | None:
        """``store unreachable since …`` while the engine holds its ticks (an outage of
        the store, bot.engine.outage), else None."""
        return self.engine.held() if self.engine is not None else None

    async def wait_idle(self) -> None:
        """Wait for the background work decisions started (a regenerate's drafting)."""
        if self.engine is not None:
            await self.engine.wait_idle()

