"""Operator operations shared by the CLI and Telegram: status, pending, replay, sweep,
one item's history.

Each returns plain data (for ``--json`` and tests) and has a plain-text formatter
that both the terminal and the chat use. Everything is answered from the store's
audit tables, never from process memory, so every host gives the same answer.
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from typing import Any, overload

from .. import scheduler
from ..clock import hhmm, utc_day
from ..config import knowledge
from ..config.load import PipelineConfig, Settings
from ..context.embedders import LOCAL_MODEL  # a name: nothing is imported or loaded
from ..models import PENDING_STATUSES, STATUSES, Draft, Run, Status
from ..store import ReplayResult, Store, SweepResult
from ..store.sql import SYSTEM


@dataclass
class PipelineStatus:
    name: str
    schedule: str
    paused: bool
    last_run: dict | None
    pending: int  # awaiting a decision or a send (not configured: every unfinished draft)
    #: healthy | failing | held | backlog | paused | never run | running | stopped |
    #: not configured (README "Status" says what each means)
    health: str
    queued: int = 0  # waiting to be drafted (queued) or being drafted (drafting)
    hold: dict | None = None  # {"reason", "until"}: why drafting is held, if it is
    problem: str = ""  # what is wrong and what to do, when health is not healthy
    #: "embedding 640/2000 with <model>": the background embedding of its retrieval
    #: (hybrid), while texts are left to embed (e.g. after a change of model)
    embedding: str = ""


@dataclass
class PipelineDetail:
    name: str
    schedule: str
    paused: bool
    health: str
    problem: str
    runs: list[dict]  # newest first
    last_green: dict | None
    first_red_after_green: dict | None
    pending: int
    seen: int
    tokens_today: int
    token_budget: int | None
    by_status: dict[str, int] = field(default_factory=dict)
    #: The newest items that ended badly or were skipped, for `replay`: item id,
    #: status, reason (newest first).
    attention: list[dict] = field(default_factory=list)
    queued: int = 0  # queued or being drafted
    hold: dict | None = None


#: ``PipelineStatus.health`` of a pipeline that owns pending drafts but is not in the
#: configuration (removed or renamed): nothing will move them until it is restored.
NOT_CONFIGURED = "not configured"
_RESTORE = "restore its pipeline file and restart to finish them (or Reject on a card)"
#: Drafts that something still has to move: queued or being drafted, or pending.
UNFINISHED_STATUSES = (Status.QUEUED, Status.DRAFTING, *PENDING_STATUSES)
#: What `status <pipeline>` lists by item id, so an operator can `replay` it.
ATTENTION_STATUSES = (Status.FAILED, Status.SKIPPED, Status.REJECTED, Status.SEND_FAILED, Status.SEND_UNKNOWN, Status.EXPIRED, Status.DISMISSED, Status.CANCELLED)


@overload
def _run_dict(r: Run) -> dict: ...
@overload
def _run_dict(r: Run | None) -> dict | None: ...
def _run_dict(r: Run | None) -> dict | None:
    if r is None:
        return None
    d = asdict(r)
    d["duration"] = (r.ended_at - r.started_at) if r.ended_at else None
    return d


def _hold(holds: dict, name: str, now: float) -> dict | None:
    reason, until = holds.get(name, (None, None))
    if reason is None or (until is not None and until <= now):
        return None  # a Retry-After or a day's budget that has run out holds nothing
    return {"reason": reason, "until": until}


def _assess(p: PipelineConfig, paused: bool, runs: list[Run], hold: dict | None, waiting: list[Draft],
            now: float) -> tuple[str, str]:
    """(health, what is wrong and what to do) of a configured pipeline."""
    if paused:
        return "paused", f"paused; /resume {p.name} in Telegram schedules it again"
    if hold is not None:
        until = f" (until {_when(hold['until'])})" if hold["until"] else ""
        return "held", f"drafting held{until}: {hold['reason']}"
    done = next((r for r in runs if r.status in ("ok", "error")), None)
    if done is not None and done.status == "error":
        return "failing", done.error_text or "the last tick failed"
    if done is not None and done.counts.get("failed") and not done.counts.get("drafted"):
        return "failing", (f"every draft of the last tick failed ({done.counts['failed']}); "
                           f"`status {p.name}` lists them, `replay` retries one")
    if waiting:
        since = min(d.updated_at for d in waiting)
        # Two scheduled ticks (and a minute for the tick itself) have passed since.
        if scheduler.next_due(p, scheduler.next_due(p, since)) + 60 <= now:
            return "backlog", (f"{len(waiting)} item(s) waiting to be drafted since "
                               f"{_when(since)}; is `draftgate run` running? Its log says "
                               f"why drafting stalls")
    if done is not None and done.counts.get("triage_failed"):
        # Not a failure (every email was drafted), but triage is not doing its job.
        return "healthy", (f"triage failed for {done.counts['triage_failed']} email(s) in "
                           f"the last tick, so they were drafted to be safe; check "
                           f"triage.model in {p.file}")
    if done is None:
        if not runs:
            return "never run", ""
        return ("stopped", "stopped before its first tick ended") if runs[0].status == "stopped" \
            else (runs[0].status, "")
    return "healthy", ""


async def _health(store: Store, p: PipelineConfig, paused: bool, runs: list[Run],
                  holds: dict, now: float) -> tuple[str, str, dict | None]:
    """(health, problem, hold in force) of a configured pipeline."""
    hold = _hold(holds, p.name, now)
    health, problem = _assess(p, paused, runs, hold, await store.waiting(p.name), now)
    left_out = await asyncio.to_thread(_knowledge_left_out, p) if p.drafter.knowledge else ""
    return health, "; ".join(x for x in (problem, left_out) if x), hold


def _knowledge_left_out(p: PipelineConfig) -> str:
    """The knowledge files the index leaves out (too big, linked from outside), named."""
    skipped = knowledge.scan(p.base_dir, p.drafter.knowledge, p.drafter.knowledge_max_file).skipped
    if not skipped:
        return ""
    named = ", ".join(f"{os.path.relpath(path, p.base_dir)} ({why})" for path, why in skipped[:5])
    more = f" and {len(skipped) - 5} more" if len(skipped) > 5 else ""
    return f"knowledge file(s) left out of the index: {named}{more}"


async def status_all(store: Store, settings: Settings, now: float | None = None) -> list[PipelineStatus]:
    now = time.time() if now is None else now
    paused = await store.paused()
    holds = await store.holds()
    progress = await store.embedding_progress()
    out = []
    for p in settings.pipelines:
        # Enough runs to look past stopped ones to the last that finished.
        runs = await store.recent_runs(p.name, limit=10)
        counts = await store.count_by_status(p.name)
        health, problem, hold = await _health(store, p, p.name in paused, runs, holds, now)
        out.append(PipelineStatus(
            name=p.name, schedule=scheduler.describe(p), paused=p.name in paused,
            last_run=_run_dict(runs[0] if runs else None),
            pending=sum(counts.get(s, 0) for s in PENDING_STATUSES),
            health=health, queued=counts.get(Status.QUEUED, 0) + counts.get(Status.DRAFTING, 0),
            hold=hold, problem=problem, embedding=_embedding(p, progress)))
    # A pipeline removed from (or renamed in) the configuration may still own drafts
    # that wait for a decision or a send: show it, so they are not silently stranded.
    unfinished = await store.count_by_pipeline(UNFINISHED_STATUSES)
    stranded = {name: n for name, n in unfinished.items() if not settings.has_pipeline(name)}
    for name, n in sorted(stranded.items()):
        out.append(PipelineStatus(name=name, schedule="", paused=False, last_run=None,
                                  pending=n, health=NOT_CONFIGURED))
    return out


async def status_one(store: Store, settings: Settings, name: str, now: float | None = None,
                     limit: int = 10) -> PipelineDetail:
    p = settings.pipeline(name)
    now = time.time() if now is None else now
    paused = name in await store.paused()
    runs = await store.recent_runs(name, limit=limit)
    finished = [r for r in runs if r.status in ("ok", "error")]
    last_green = await store.last_run(name, status="ok")
    first_red = None
    # The first red after the last green: walk the newest runs back to that green.
    for r in runs:
        if last_green is not None and r.started_at <= last_green.started_at:
            break
        if r.status == "error":
            first_red = r
    if first_red is None and last_green is None and finished:
        reds = [r for r in finished if r.status == "error"]
        first_red = reds[-1] if reds else None
    counts = await store.count_by_status(name)
    health, problem, hold = await _health(store, p, paused, runs, await store.holds(), now)
    attention = [{"id": d.id, "item_id": d.item_id, "status": d.status,
                  "reason": d.error or "", "at": d.updated_at}
                 for d in await store.recent(name, ATTENTION_STATUSES, limit=limit)]
    return PipelineDetail(
        name=name, schedule=scheduler.describe(p), paused=paused, health=health,
        problem=problem, queued=counts.get(Status.QUEUED, 0) + counts.get(Status.DRAFTING, 0), hold=hold,
        runs=[_run_dict(r) for r in runs], last_green=_run_dict(last_green),
        first_red_after_green=_run_dict(first_red),
        pending=sum(counts.get(s, 0) for s in PENDING_STATUSES), seen=await store.seen_count(name),
        tokens_today=await store.tokens_used(name, utc_day(now)),
        token_budget=p.daily_token_budget, by_status=counts, attention=attention)


async def pending(store: Store, settings: Settings) -> list[Draft]:
    """Every unfinished draft: waiting to be drafted, for a decision or for a send, also
    those of a pipeline that is no longer configured (``format_pending`` says so)."""
    return await store.waiting(limit=1000) + await store.pending()


#: Drafts `draftgate pending` and /pending list before "and N more".
PENDING_PAGE = 100


async def pending_page(store: Store, settings: Settings, limit: int = PENDING_PAGE
                       ) -> tuple[list[Draft], int]:
    """The first ``limit`` unfinished drafts (those waiting for a person first: a
    decision or a send, oldest first; then those waiting to be drafted) and how many
    unfinished drafts there are in all, so a page can say how many it leaves out."""
    total = sum((await store.count_by_pipeline(UNFINISHED_STATUSES)).values())
    drafts = await store.pending(limit=limit)
    if len(drafts) < limit:
        drafts += await store.waiting(limit=limit - len(drafts))
    return drafts, total


def more_line(shown: int, total: int) -> str:
    """The last line of a page that leaves drafts out ("" when it shows them all)."""
    if total <= shown:
        return ""
    return f"… and {total - shown:,} more: `draftgate pending --all` lists every one"


async def holds(store: Store, now: float | None = None) -> dict[str, str]:
    """Pipeline -> why its drafting is held, for holds in force now."""
    now = time.time() if now is None else now
    found = await store.holds()
    return {name: h["reason"] + (f" (until {_when(h['until'])})" if h["until"] else "")
            for name in found if (h := _hold(found, name, now)) is not None}


async def replay(store: Store, pipeline: str, item_id: str, actor: str,
                 settings: Settings | None = None) -> ReplayResult:
    if settings is not None:
        settings.pipeline(pipeline)  # raises with the list of known pipelines
    return await store.replay(pipeline, item_id, actor)


async def sweep(store: Store, settings: Settings, days: float | None = None,
                now: float | None = None) -> SweepResult:
    max_attempts = max((p.max_attempts for p in settings.pipelines), default=3)
    return await store.sweep(
        seen_ttl_days=settings.seen_ttl_days if days is None else days,
        max_attempts=max_attempts, approval_ttl_days=settings.approval_ttl_days,
        runs_keep_days=settings.runs_keep_days, now=now)


@dataclass
class History:
    """One item's history: its drafts as they are now, and every audit row about them."""

    pipeline: str
    item_id: str
    timezone: str  # the pipeline's, for the times shown
    drafts: list[dict]  # id, status, version, subject, from, error
    events: list[dict]  # oldest first: at, actor, action, detail, text_sha256, draft_id


async def history(store: Store, settings: Settings, pipeline: str, item_id: str) -> History:
    """Every audit row of every draft of ``item_id`` in ``pipeline`` (any recipe)."""
    drafts = await store.item_drafts(pipeline, item_id)
    events: list[dict[str, Any]] = []
    order: list[tuple] = []
    for d in drafts:
        for e in reversed(await store.audit_log(d.key, limit=1000)):
            events.append({"at": e.at, "actor": e.actor, "action": e.action,
                           "detail": e.detail, "text_sha256": e.text_sha256,
                           "draft_id": d.id, "audit_id": e.id})
            order.append(_chain_position(e.seq, e.id))
    # In chain order: the hashes cover a row's position, not its id.
    events = [e for _, e in sorted(zip(order, events, strict=True), key=lambda oe: oe[0])]
    tz = settings.pipeline(pipeline).timezone if settings.has_pipeline(pipeline) else "UTC"
    return History(pipeline, item_id, tz, [
        {"id": d.id, "status": d.status, "version": d.version, "subject": d.message.subject,
         "from": d.message.from_addr, "error": d.error, "sent_id": d.sent_id}
        for d in drafts], events)


def _chain_position(seq: Any, row_id: int) -> tuple:
    """Sort key of an audit row: its chain position; a row outside the chain (or one
    whose position was tampered with into something else) after every chained one."""
    return (0, seq, row_id) if isinstance(seq, int) and not isinstance(seq, bool) else (1, 0, row_id)


#: How the known audit actions read in a history; others are shown by their name.
_DID = {"admit": "admitted", "triage": "triaged", "draft": "drafted", "edit": "edited",
        "approve": "approved", "reject": "rejected", "regenerate": "asked for a new draft",
        "sent": "sent", "retry_send": "send retried", "replay": "replayed",
        "reply": "reply asked", "notice": "notice"}


def format_history(h: History) -> str:
    if not h.drafts:
        return (f"nothing known about item {h.item_id} in {h.pipeline}: no draft was made "
                f"for it (`status {h.pipeline}` and `pending --json` show item ids)")
    tz = scheduler.zone(h.timezone)
    lines = [f"{h.pipeline} · item {h.item_id} (times {h.timezone})"]
    for d in h.drafts:
        state = f"#{d['id']} v{d['version']} {d['status']}" + (
            f" as {d['sent_id']}" if d["sent_id"] else "") + (
            f" ({d['error']})" if d["error"] else "")
        lines.append(f"{state} · {d['subject'] or '(no subject)'} · from {d['from'] or '?'}")
    for e in h.events:
        when = _stamp(e["at"], tz)
        who = "" if e["actor"] == SYSTEM else f" by {e['actor']}"
        what = f": {e['detail']}" if e["detail"] else ""
        lines.append(f"{when} {_DID.get(e['action'], e['action'])}{who}{what}")
    return "\n".join(lines)


def _stamp(at: Any, tz) -> str:
    """A history row's time; one that is no time (a tampered row) is shown as such."""
    try:
        return datetime.fromtimestamp(at, tz).strftime("%Y-%m-%d %H:%M:%S")
    except (TypeError, ValueError, OverflowError, OSError):
        return f"{'(bad time)':19}"


# -- formatting ----------------------------------------------------------------------------

_ICON = {"ok": "✅", "error": "❌", "running": "⏳", "stopped": "⏹"}


def _when(t: float | None) -> str:
    if not t:
        return "never"
    return datetime.fromtimestamp(t, tz=timezone.utc).strftime("%d %b %H:%M UTC")


def _counts(c: dict) -> str:
    keys = ("fetched", "new", "drafted", "skipped", "notified", "failed", "posted", "sent")
    return " ".join(f"{k} {c.get(k, 0)}" for k in keys if k in c)


def _embedding(p: PipelineConfig, progress: dict[str, tuple[int, int, float]]) -> str:
    """The background embedding of ``p``'s model while it has texts left (read from the
    store: ``status`` never loads a model)."""
    o = p.drafter
    if o.retrieval != "hybrid":
        return ""
    for model, (done, total, _) in progress.items():
        mine = model == LOCAL_MODEL if o.embeddings == "local" else \
            model.startswith(f"api:{o.embeddings}:")
        if mine and done < total:
            return f"embedding {done}/{total} with {model} (found by words until embedded)"
    return ""


def format_status_all(items: list[PipelineStatus]) -> str:
    if not items:
        return "no pipelines configured"
    width = max(len(s.name) for s in items)
    lines = []
    for s in items:
        if s.health == NOT_CONFIGURED:
            lines.append(f"{s.name:<{width}}  ⚠ not configured  unfinished {s.pending}: {_RESTORE}")
            continue
        if s.paused:
            lines.append(f"{s.name:<{width}}  ⏸ paused  pending {s.pending}")
            continue
        r = s.last_run
        queued = f"  queued {s.queued}" if s.queued else ""
        tail = (f"  {s.problem}" if s.problem else "") + (f"  {s.embedding}" if s.embedding else "")
        if r is None:
            lines.append(f"{s.name:<{width}}  · never run  {s.schedule}  pending {s.pending}"
                         f"{queued}{tail}")
            continue
        icon = {"failing": "❌", "held": "⚠", "backlog": "⚠"}.get(s.health) \
            or _ICON.get(r["status"], "?")
        lines.append(f"{s.name:<{width}}  {icon} {hhmm(r['started_at'])}  {s.schedule}  "
                     f"pending {s.pending}{queued}{tail}")
    return "\n".join(lines)


def format_status_one(d: PipelineDetail) -> str:
    lines = [f"{d.name} · {d.schedule} · {d.health}"]
    if d.problem:
        lines.append(f"⚠ {d.problem}")
    if d.runs:
        strip = "".join(_ICON.get(r["status"], "?") for r in reversed(d.runs))
        lines.append(f"runs {strip} (newest right)")
        for r in d.runs:
            dur = f"{r['duration']:.1f}s" if r.get("duration") is not None else "running"
            err = f"  {r['error_text']}" if r.get("error_text") else ""
            lines.append(f"{hhmm(r['started_at'])} {r['status']} {dur} {_counts(r['counts'])}{err}")
    else:
        lines.append("no runs yet")
    lines.append(f"last green {_when(d.last_green['started_at']) if d.last_green else 'never'}")
    if d.first_red_after_green:
        r = d.first_red_after_green
        lines.append(f"first red after it {_when(r['started_at'])}: {r.get('error_text') or ''}")
    budget = f" / {d.token_budget:,}" if d.token_budget else ""
    lines.append(f"pending {d.pending} · queued {d.queued} · seen {d.seen:,} · tokens today "
                 f"{d.tokens_today:,}{budget}")
    if d.attention:
        lines.append("recent failed / skipped / rejected (replay with the item id):")
        for a in d.attention:
            reason = " ".join(a["reason"].split())
            reason = reason if len(reason) <= 80 else reason[:79] + "…"
            lines.append(f"  #{a['id']} {a['status']} {a['item_id']}  {reason}".rstrip())
    return "\n".join(lines)


#: How `pending` names each unfinished state.
_PENDING_STATE: dict[str, str] = {
    Status.QUEUED: "queued for drafting", Status.DRAFTING: "being drafted",
    Status.READY: "not posted yet", Status.AWAITING: "awaiting decision",
    Status.APPROVED: "approved, sending", Status.SENDING: "sending", Status.SEND_FAILED: "send failed, Retry offered",
    Status.SEND_UNKNOWN: "send outcome unknown, being checked",
    Status.NOTIFIED: "FYI card, no draft (Draft a reply or Dismiss)",
}


def format_pending(drafts: list[Draft], settings: Settings | None = None) -> str:
    """One line per draft; with ``settings``, drafts of a pipeline that is not
    configured any more are flagged with what to do."""
    if not drafts:
        return "nothing pending"
    lines = []
    for d in drafts:
        if settings is not None and not settings.has_pipeline(d.pipeline):
            what = "restore its file and restart to finish this draft"
            if d.status == Status.AWAITING:
                what += ", or Reject it on its card"
            lines.append(f"{d.pipeline} #{d.id} v{d.version} · {d.status} · ⚠ pipeline "
                         f"{d.pipeline} is not configured: {what}")
            continue
        who = d.message.from_addr or d.message.slot
        subj = d.message.subject or "(no subject)"
        state = _PENDING_STATE.get(d.status, d.status)
        if d.status == Status.NOTIFIED and not d.approval_message_id:
            state = "FYI card not posted yet"
        elif d.status == Status.APPROVED and d.send_after and settings is not None:
            state = f"🕘 sends {scheduler.local_label(d.send_after, settings.pipeline(d.pipeline).timezone)}"
        where = f" · card {d.approval_chat}/{d.approval_message_id}" if d.approval_message_id else ""
        lines.append(f"{d.pipeline} #{d.id} v{d.version} · {state} · {who} · {subj[:60]}{where}")
    return "\n".join(lines)


def format_replay(pipeline: str, item_id: str, r: ReplayResult) -> str:
    prefix = f"{pipeline} {item_id}: "
    if len(item_id) > 200:  # echo a long id shortened, so the outcome stays readable
        item_id = item_id[:100] + "…" + item_id[-20:]
    if r.outcome == "requeued":
        return f"{pipeline} {item_id}: back in the queue; it will be drafted on the next tick"
    if r.outcome == "unseen":
        return f"{pipeline} {item_id}: seen mark removed; the next fetch takes it again"
    if r.outcome == "refused":  # the store's detail starts with "pipeline item_id: " too
        return f"{pipeline} {item_id}: refused: {r.detail.removeprefix(prefix)}"
    return f"{pipeline} {item_id}: not found (no seen mark and no draft for this item id)"


#: Most items /emails lists at once.
MAX_EMAILS = 50


async def emails(store: Store, settings: Settings, pipeline: str, n: int, actor: str,
                 now: float | None = None) -> list[Draft]:
    """The newest ``n`` admitted items of ``pipeline`` (any status), newest first, for an
    operator picking one to /reply to. Audited with who asked."""
    settings.pipeline(pipeline)  # raises with the list of known pipelines
    await store.audit(actor, "emails", now=now, detail=f"{pipeline} {n}")
    return await store.recent(pipeline, STATUSES, limit=n)


def format_emails(pipeline: str, drafts: list[Draft]) -> str:
    """/emails: one line per admitted item, newest first: id, status, subject, item id
    (what /reply takes)."""
    if not drafts:
        return f"{pipeline}: no admitted items yet"
    lines = []
    for d in drafts:
        subject = " ".join((d.message.subject or d.message.slot or "(no subject)").split())
        reason = f" ({d.error[:60]})" if d.status == Status.SKIPPED and d.error else ""
        lines.append(f"#{d.id} {d.status}{reason} · {subject[:60]}\n   {d.item_id}")
    return "\n".join(lines)


def format_sweep(r: SweepResult) -> str:
    return (f"swept: {r.seen_deleted} seen marks deleted, {r.leases_requeued} expired leases "
            f"requeued, {r.leases_failed} failed after their last attempt, "
            f"{r.approvals_expired} approvals expired, {r.runs_pruned} old runs pruned")
