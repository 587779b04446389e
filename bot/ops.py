"""Operator operations shared by the CLI and Telegram: status, pending, replay, sweep.

Each returns plain data (for ``--json`` and tests) and has a plain-text formatter
that both the terminal and the chat use. Everything is answered from the store's
audit tables, never from process memory, so every host gives the same answer.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone

from . import scheduler
from .config import Settings
from .engine import utc_day
from .models import (APPROVED, AWAITING, DRAFTING, EXPIRED, FAILED, PENDING_STATUSES, QUEUED,
                     READY, REJECTED, SEND_FAILED, SEND_UNKNOWN, SENDING, SKIPPED, Draft, Run)
from .store import ReplayResult, Store, SweepResult


@dataclass
class PipelineStatus:
    name: str
    schedule: str
    paused: bool
    last_run: dict | None
    pending: int  # awaiting a decision or a send (not configured: every unfinished draft)
    health: str  # healthy | failing | paused | never run | running | not configured


@dataclass
class PipelineDetail:
    name: str
    schedule: str
    paused: bool
    health: str
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


#: ``PipelineStatus.health`` of a pipeline that owns pending drafts but is not in the
#: configuration (removed or renamed): nothing will move them until it is restored.
NOT_CONFIGURED = "not configured"
_RESTORE = "restore its pipeline file and restart to finish them (or Reject on a card)"
#: Drafts that something still has to move: queued or being drafted, or pending.
UNFINISHED_STATUSES = (QUEUED, DRAFTING, *PENDING_STATUSES)
#: What `status <pipeline>` lists by item id, so an operator can `replay` it.
ATTENTION_STATUSES = (FAILED, SKIPPED, REJECTED, SEND_FAILED, SEND_UNKNOWN, EXPIRED)


def _run_dict(r: Run | None) -> dict | None:
    if r is None:
        return None
    d = asdict(r)
    d["duration"] = (r.ended_at - r.started_at) if r.ended_at else None
    return d


def _health(paused: bool, last: Run | None) -> str:
    if paused:
        return "paused"
    if last is None:
        return "never run"
    return {"ok": "healthy", "error": "failing", "running": "running"}.get(last.status, last.status)


async def status_all(store: Store, settings: Settings, now: float | None = None) -> list[PipelineStatus]:
    paused = await store.paused()
    out = []
    for p in settings.pipelines:
        runs = await store.recent_runs(p.name, limit=1)
        last = runs[0] if runs else None
        counts = await store.count_by_status(p.name)
        out.append(PipelineStatus(
            name=p.name, schedule=scheduler.describe(p), paused=p.name in paused,
            last_run=_run_dict(last), pending=sum(counts.get(s, 0) for s in PENDING_STATUSES),
            health=_health(p.name in paused, last)))
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
    attention = [{"id": d.id, "item_id": d.item_id, "status": d.status,
                  "reason": d.error or "", "at": d.updated_at}
                 for d in await store.recent(name, ATTENTION_STATUSES, limit=limit)]
    return PipelineDetail(
        name=name, schedule=scheduler.describe(p), paused=paused,
        health=_health(paused, runs[0] if runs else None),
        runs=[_run_dict(r) for r in runs], last_green=_run_dict(last_green),
        first_red_after_green=_run_dict(first_red),
        pending=sum(counts.get(s, 0) for s in PENDING_STATUSES),
        seen=await store.seen_count(name),
        tokens_today=await store.tokens_used(name, utc_day(now)),
        token_budget=p.daily_token_budget, by_status=counts, attention=attention)


async def pending(store: Store, settings: Settings) -> list[Draft]:
    """Every draft waiting for a decision or a send, also those of a pipeline that is
    no longer configured (``format_pending`` says so next to them)."""
    return await store.pending()


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


# -- formatting ----------------------------------------------------------------------------

_ICON = {"ok": "✅", "error": "❌", "running": "⏳"}


def _hhmm(t: float | None) -> str:
    if not t:
        return "--:--"
    return datetime.fromtimestamp(t, tz=timezone.utc).strftime("%H:%M")


def _when(t: float | None) -> str:
    if not t:
        return "never"
    return datetime.fromtimestamp(t, tz=timezone.utc).strftime("%d %b %H:%M UTC")


def _counts(c: dict) -> str:
    keys = ("fetched", "new", "drafted", "skipped", "failed", "posted", "sent")
    return " ".join(f"{k} {c.get(k, 0)}" for k in keys if k in c)


def format_status_all(items: list[PipelineStatus]) -> str:
    if not items:
        return "no pipelines configured"
    width = max(len(s.name) for s in items)
    lines = []
    for s in items:
        if s.health == NOT_CONFIGURED:
            lines.append(f"{s.name:<{width}}  ⚠ not configured  unfinished {s.pending}: "
                         f"{_RESTORE}")
            continue
        if s.paused:
            lines.append(f"{s.name:<{width}}  ⏸ paused  pending {s.pending}")
            continue
        r = s.last_run
        if r is None:
            lines.append(f"{s.name:<{width}}  · never run  {s.schedule}  pending {s.pending}")
            continue
        icon = _ICON.get(r["status"], "?")
        tail = f"  {r['error_text']}" if r["status"] == "error" and r.get("error_text") else ""
        lines.append(f"{s.name:<{width}}  {icon} {_hhmm(r['started_at'])}  {s.schedule}  "
                     f"pending {s.pending}{tail}")
    return "\n".join(lines)


def format_status_one(d: PipelineDetail) -> str:
    lines = [f"{d.name} · {d.schedule} · {d.health}"]
    if d.runs:
        strip = "".join(_ICON.get(r["status"], "?") for r in reversed(d.runs))
        lines.append(f"runs {strip} (newest right)")
        for r in d.runs:
            dur = f"{r['duration']:.1f}s" if r.get("duration") is not None else "running"
            err = f"  {r['error_text']}" if r.get("error_text") else ""
            lines.append(f"{_hhmm(r['started_at'])} {r['status']} {dur} {_counts(r['counts'])}{err}")
    else:
        lines.append("no runs yet")
    lines.append(f"last green {_when(d.last_green['started_at']) if d.last_green else 'never'}")
    if d.first_red_after_green:
        r = d.first_red_after_green
        lines.append(f"first red after it {_when(r['started_at'])}: {r.get('error_text') or ''}")
    budget = f" / {d.token_budget:,}" if d.token_budget else ""
    lines.append(f"pending {d.pending} · seen {d.seen:,} · tokens today {d.tokens_today:,}{budget}")
    if d.attention:
        lines.append("recent failed / skipped / rejected (replay with the item id):")
        for a in d.attention:
            reason = " ".join(a["reason"].split())
            reason = reason if len(reason) <= 80 else reason[:79] + "…"
            lines.append(f"  #{a['id']} {a['status']} {a['item_id']}  {reason}".rstrip())
    return "\n".join(lines)


def format_pending(drafts: list[Draft], settings: Settings | None = None) -> str:
    """One line per draft; with ``settings``, drafts of a pipeline that is not
    configured any more are flagged with what to do."""
    if not drafts:
        return "nothing pending"
    lines = []
    for d in drafts:
        if settings is not None and not settings.has_pipeline(d.pipeline):
            what = "restore its file and restart to finish this draft"
            if d.status == AWAITING:
                what += ", or Reject it on its card"
            lines.append(f"{d.pipeline} #{d.id} v{d.version} · {d.status} · ⚠ pipeline "
                         f"{d.pipeline} is not configured: {what}")
            continue
        who = d.message.from_addr or d.message.slot
        subj = d.message.subject or "(no subject)"
        state = {READY: "not posted yet", AWAITING: "awaiting decision",
                 APPROVED: "approved, sending", SENDING: "sending",
                 SEND_FAILED: "send failed, Retry offered",
                 SEND_UNKNOWN: "send outcome unknown, being checked"}.get(d.status, d.status)
        where = f" · card {d.approval_chat}/{d.approval_message_id}" if d.approval_message_id else ""
        lines.append(f"{d.pipeline} #{d.id} v{d.version} · {state} · {who} · {subj[:60]}{where}")
    return "\n".join(lines)


def format_replay(pipeline: str, item_id: str, r: ReplayResult) -> str:
    if len(item_id) > 200:  # echo a long id shortened, so the outcome stays readable
        item_id = item_id[:100] + "…" + item_id[-20:]
    if r.outcome == "requeued":
        return f"{pipeline} {item_id}: back in the queue; it will be drafted on the next tick"
    if r.outcome == "unseen":
        return f"{pipeline} {item_id}: seen mark removed; the next fetch takes it again"
    if r.outcome == "refused":
        return f"{pipeline} {item_id}: refused: {r.detail}"
    return f"{pipeline} {item_id}: not found (no seen mark and no draft for this item id)"


def format_sweep(r: SweepResult) -> str:
    return (f"swept: {r.seen_deleted} seen marks deleted, {r.leases_requeued} expired leases "
            f"requeued, {r.leases_failed} failed after their last attempt, "
            f"{r.approvals_expired} approvals expired, {r.runs_pruned} old runs pruned")
