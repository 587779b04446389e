"""The draft state machine, written once for every backend.

``TRANSITIONS`` lists every move a draft may make: from which states, to which state,
and whether an operator-visible audit row goes with it. A store changes a draft's status
only through :func:`cas`, which builds the compare-and-set ``UPDATE drafts SET status=?,
... WHERE ... AND status IN (<from states>)`` from that table (``?`` placeholders; the
PostgreSQL store renumbers them). A move the table does not allow cannot be written, and
asking for one raises :class:`IllegalTransition` (a programming error, loud in tests).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from ..models import REPLAYABLE_STATUSES, Status


class IllegalTransition(RuntimeError):
    """A store asked for a status change the transition table does not allow."""


@dataclass(frozen=True)
class Transition:
    name: str
    src: tuple[Status, ...]
    dst: Status
    audited: bool = False  # an audit row goes with it, in the same transaction


CLAIM = Transition("claim", (Status.QUEUED,), Status.DRAFTING)
FINISH = Transition("finish", (Status.DRAFTING,), Status.READY, audited=True)  # "draft": model, tokens
RETRY = Transition("retry", (Status.DRAFTING,), Status.QUEUED)  # a retryable drafting error
FAIL = Transition("fail", (Status.DRAFTING,), Status.FAILED)
RELEASE = Transition("release", (Status.DRAFTING,), Status.QUEUED)  # budget spent, shutdown
LEASE_RETRY = Transition("lease_retry", (Status.DRAFTING,), Status.QUEUED)  # lease expired
LEASE_FAIL = Transition("lease_fail", (Status.DRAFTING,), Status.FAILED)  # ... on the last attempt
POST = Transition("post", (Status.READY,), Status.AWAITING)
APPROVE = Transition("approve", (Status.AWAITING,), Status.APPROVED, audited=True)
EDIT = Transition("edit", (Status.AWAITING,), Status.READY, audited=True)
REGENERATE = Transition("regenerate", (Status.AWAITING,), Status.QUEUED, audited=True)
REJECT = Transition("reject", (Status.AWAITING,), Status.REJECTED, audited=True)
EXPIRE = Transition("expire", (Status.AWAITING, Status.NOTIFIED), Status.EXPIRED)
BEGIN_SEND = Transition("begin_send", (Status.APPROVED,), Status.SENDING)  # once send_after passed
# Undo (the undo window) and Cancel (a later send): back to a decision, same version,
# votes cleared. A CAS on `approved`, so it loses to BEGIN_SEND's claim.
UNDO = Transition("undo", (Status.APPROVED,), Status.AWAITING, audited=True)
# 📎 Attach: files go with the reply, as a new version (it needs its own approval).
ATTACH = Transition("attach", (Status.AWAITING,), Status.READY, audited=True)
# A follow-up not sent yet whose recipient answered meanwhile (loses to BEGIN_SEND too).
CANCEL = Transition("cancel", (Status.QUEUED, Status.DRAFTING, Status.READY, Status.AWAITING,
                               Status.APPROVED), Status.CANCELLED, audited=True)
MARK_SENT = Transition("sent", (Status.SENDING, Status.SEND_UNKNOWN), Status.SENT, audited=True)
MARK_SEND_FAILED = Transition("send_failed", (Status.SENDING,), Status.SEND_FAILED)
MARK_SEND_UNKNOWN = Transition("send_unknown", (Status.SENDING,), Status.SEND_UNKNOWN)
RECOVER_SEND = Transition("recover_send", (Status.SENDING,), Status.SEND_UNKNOWN)  # its sender is gone
RETRY_SEND = Transition("retry_send", (Status.SEND_FAILED, Status.SEND_UNKNOWN), Status.APPROVED, audited=True)
# Triage (before drafting version 1): its decision is stored with the draft and audited
# in the same transaction. reply keeps the claim (and renews its lease) for drafting.
TRIAGE_REPLY = Transition("triage_reply", (Status.DRAFTING,), Status.DRAFTING, audited=True)
TRIAGE_NOTIFY = Transition("triage_notify", (Status.DRAFTING,), Status.NOTIFIED, audited=True)
TRIAGE_SKIP = Transition("triage_skip", (Status.DRAFTING,), Status.SKIPPED, audited=True)
POST_FYI = Transition("post_fyi", (Status.NOTIFIED,), Status.NOTIFIED)  # its FYI card is recorded
DRAFT_REPLY = Transition("draft_reply", (Status.NOTIFIED,), Status.QUEUED, audited=True)  # an operator asks
DISMISS = Transition("dismiss", (Status.NOTIFIED,), Status.DISMISSED, audited=True)
REPLAY = Transition("replay", tuple(Status(s) for s in REPLAYABLE_STATUSES), Status.QUEUED, audited=True)
# /reply: an operator asks for a (new) draft of an item that waits for a decision or
# ended without a send (skipped, rejected, failed, expired, dismissed), or an FYI card
# (as Draft a reply does); never of a sent one.
ON_DEMAND = Transition("on_demand", (Status.AWAITING, Status.NOTIFIED, *REPLAY.src), Status.QUEUED, audited=True)

#: APPROVE's extra condition: as many distinct operators approved this very version as
#: the quorum (``?``). Votes are rows of ``approvals`` (see :data:`VOTE_SQL`), so the
#: CAS that moves the draft is the one that sees the quorum met, whoever tapped last.
QUORUM_MET = ("(SELECT COUNT(*) FROM approvals WHERE approvals.draft_id = drafts.id"
              " AND approvals.version = drafts.version) >= ?")
#: One operator's vote for one version, only while that version awaits a decision; the
#: same operator twice is one row. Args: operator, actor, at, draft id, version, Status.AWAITING.
VOTE_SQL = ("INSERT INTO approvals (draft_id, version, operator, actor, at)"
            " SELECT id, version, CAST(? AS TEXT), CAST(? AS TEXT), CAST(? AS DOUBLE PRECISION)"
            " FROM drafts WHERE id = ? AND version = ? AND status = ?"
            " ON CONFLICT (draft_id, version, operator) DO NOTHING RETURNING operator")
VOTES_SQL = ("SELECT operator, actor, at FROM approvals WHERE draft_id = ? AND version = ?"
             " ORDER BY at, operator")

TRANSITIONS: dict[str, Transition] = {t.name: t for t in (
    CLAIM, FINISH, RETRY, FAIL, RELEASE, LEASE_RETRY, LEASE_FAIL, POST, APPROVE, EDIT,
    REGENERATE, REJECT, EXPIRE, BEGIN_SEND, MARK_SENT, MARK_SEND_FAILED, MARK_SEND_UNKNOWN,
    RECOVER_SEND, RETRY_SEND, REPLAY, ON_DEMAND, TRIAGE_REPLY, TRIAGE_NOTIFY, TRIAGE_SKIP,
    POST_FYI, DRAFT_REPLY, DISMISS, UNDO, CANCEL, ATTACH)}


def allowed(t: Transition, src: tuple[str, ...] | None = None) -> tuple[Status, ...]:
    """The from-states of ``t``, or ``src`` if every one of them is one (a narrower
    CAS, e.g. replay of a draft known to be ``failed``)."""
    if TRANSITIONS.get(t.name) is not t:
        raise IllegalTransition(f"{t.name}: not in the transition table")
    if src is None:
        return t.src
    bad = [s for s in src if s not in t.src]
    if bad or not src:
        raise IllegalTransition(f"{t.name}: {', '.join(bad) or 'no state'} -> {t.dst} "
                                "is not an allowed transition")
    return tuple(Status(s) for s in src)


@functools.lru_cache(maxsize=256)
def _update_sql(assign: str, where: str, n_src: int, returning: str) -> str:
    marks = ", ".join("?" * n_src)
    sql = f"UPDATE drafts SET status = ?, {assign} WHERE {where} AND status IN ({marks})"
    return f"{sql} RETURNING {returning}" if returning else sql


def cas(t: Transition, assign: str, assign_args: tuple, where: str, where_args: tuple, *,
        src: tuple[str, ...] | None = None, returning: str = "") -> tuple[str, tuple]:
    """The compare-and-set of ``t``: ``(sql, args)``. ``assign`` sets the other columns,
    ``where`` picks the rows (the status condition is added here)."""
    states = allowed(t, src)
    return (_update_sql(assign, where, len(states), returning),
            (t.dst, *assign_args, *where_args, *states))


@dataclass(frozen=True)
class Step:
    """One compare-and-set of a single draft (see :func:`cas`)."""

    t: Transition
    assign: str
    assign_args: tuple
    where: str
    where_args: tuple

    def sql(self, returning: str) -> tuple[str, tuple]:
        return cas(self.t, self.assign, self.assign_args, self.where, self.where_args,
                   returning=returning)
