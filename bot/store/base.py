"""The store contract. Every backend (SQLite, PostgreSQL) implements exactly this, and
``tests/test_store_contract.py`` runs the same tests against each.

Rules every backend keeps:

* ``admit`` writes the seen marks, the new ``drafts`` rows and the source cursor in ONE
  transaction. Marking seen and queueing are never two commits.
* Every draft transition is a compare-and-set (``UPDATE ... WHERE id=? AND
  status IN (<expected>) [AND fence=? | AND version=?]``) built from the one table of
  allowed transitions in ``transitions.py``. A method whose CAS matched nothing returns
  ``None`` (or ``False``) and changes nothing.
* Operator decisions (approve, edit, reject, replay, retry) append an ``audit`` row in
  the same transaction as the transition, with the sha256 of the text involved.
* No method holds a transaction across anything but the database.
* Times are float epoch seconds. ``now`` parameters exist so tests can move time.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Any, Iterable

from ..errors import StoreError
from ..models import AuditEntry, Draft, Item, Run, Vote
from .chain import Report


class StoreMissing(StoreError):
    """``open(create=False)`` found no store where the URL points; nothing was created."""


#: Error text of a ``sending`` row whose sending process is gone (recover_abandoned_sends).
ABANDONED_SEND = "interrupted mid-send: the process sending it stopped; it may have been delivered"

#: Lock-row name prefix of a process's heartbeat: ``process:<holder>``, renewed every
#: few seconds by a running engine (see ``recover_abandoned_sends``).
HEARTBEAT_PREFIX = "process:"


@dataclass
class AdmitResult:
    new: list[str] = field(default_factory=list)  # keys of drafts queued now
    skipped: list[str] = field(default_factory=list)  # keys recorded as skipped now
    already_seen: int = 0  # items that were seen (or had a draft) before


@dataclass
class SweepResult:
    seen_deleted: int = 0
    leases_requeued: int = 0  # expired drafting leases -> queued
    leases_failed: int = 0  # expired leases past max_attempts -> failed
    approvals_expired: int = 0
    runs_pruned: int = 0
    sending_unknown: int = 0  # rows stuck in sending -> send_unknown (start-up only)

    def to_dict(self) -> dict[str, int]:
        return dict(self.__dict__)


@dataclass
class ReplayResult:
    outcome: str  # "requeued" | "unseen" | "refused" | "not_found"
    detail: str = ""
    draft: Draft | None = None


class Store(abc.ABC):
    """Durable state of draftgate. Open once at start, close at shutdown."""

    url: str

    # -- lifecycle ---------------------------------------------------------------
    @abc.abstractmethod
    async def open(self, *, create: bool = True) -> None:
        """Connect and run pending numbered migrations. With ``create=False`` (read-only
        commands) a store that does not exist yet raises :class:`StoreMissing` and
        nothing (no file, folder, schema or table) is created."""

    @abc.abstractmethod
    async def close(self) -> None: ...

    async def __aenter__(self) -> "Store":
        await self.open()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    # -- fetch side ----------------------------------------------------------------
    @abc.abstractmethod
    async def unseen(self, pipeline: str, scope: str, item_ids: list[str]) -> set[str]:
        """The subset of ``item_ids`` with no seen mark (so a source can avoid
        downloading bodies it already has)."""

    @abc.abstractmethod
    async def admit(
        self,
        pipeline: str,
        scope: str,
        recipe: str,
        items: list[Item],
        *,
        cursor: str | None = None,
        mark_seen: bool = True,
        now: float | None = None,
    ) -> AdmitResult:
        """One transaction: for each item not yet seen (and with no draft of the same
        key), write the seen mark (unless ``mark_seen`` is False) and insert a drafts
        row, ``queued`` or, when ``item.skip_reason`` is set, ``skipped`` with that
        reason as error text. If ``cursor`` is given, store it as the cursor of
        ``(pipeline, scope)`` in the same transaction. Items seen before are counted
        in ``already_seen`` and change nothing."""

    @abc.abstractmethod
    async def mark_seen(self, pipeline: str, scope: str, item_ids: list[str],
                        now: float | None = None) -> None:
        """Write seen marks (used by ``mark_seen: on_success`` pipelines)."""

    @abc.abstractmethod
    async def get_cursor(self, pipeline: str, scope: str) -> str | None: ...

    # -- drafting ------------------------------------------------------------------
    @abc.abstractmethod
    async def claim(self, pipeline: str, lease_seconds: float, *, limit: int = 1,
                    now: float | None = None) -> list[Draft]:
        """CAS up to ``limit`` ``queued`` drafts of ``pipeline`` (oldest first) to
        ``drafting`` with ``lease_until = now + lease_seconds`` and a NEW fence token
        each. Safe from many processes at once: each draft is returned to exactly one
        caller."""

    @abc.abstractmethod
    async def claim_key(self, key: str, lease_seconds: float,
                        now: float | None = None) -> Draft | None:
        """Claim one specific queued draft by key; ``None`` if it is not queued."""

    @abc.abstractmethod
    async def finish_draft(self, draft_id: int, fence: int, body: str, *,
                           tokens_in: int = 0, tokens_out: int = 0, model: str = "",
                           now: float | None = None,
                           used: dict[str, Any] | None = None) -> Draft | None:
        """Fenced ``drafting -> ready`` storing the body and what its request ``used``
        (:meth:`Context.used`). ``None`` when the fence no
        longer matches (the lease was lost): a stale worker changes nothing. Token use
        is added to the draft and to the pipeline's usage for the UTC day of ``now``.
        Audited as ``draft`` (version, ``model``, tokens)."""

    @abc.abstractmethod
    async def fail_draft(self, draft_id: int, fence: int, error: str, *,
                         retryable: bool, max_attempts: int,
                         now: float | None = None) -> Draft | None:
        """Fenced: ``drafting -> queued`` with attempt + 1 when ``retryable`` and
        attempt + 1 < max_attempts, else ``drafting -> failed`` with ``error``.
        ``None`` when the fence no longer matches."""

    @abc.abstractmethod
    async def release(self, draft_id: int, fence: int) -> bool:
        """Fenced ``drafting -> queued`` without counting an attempt (budget spent,
        shutdown)."""

    @abc.abstractmethod
    async def record_triage(self, draft_id: int, fence: int, action: str, reason: str, *,
                            tokens: int = 0, lease_seconds: float,
                            now: float | None = None) -> Draft | None:
        """Fenced, one transaction: store the triage decision (``reply | notify | skip``)
        and its reason with the draft, add ``tokens`` to the day's usage and append an
        audit row. ``reply``: stays ``drafting`` with its lease renewed for
        ``lease_seconds``; ``notify``: ``notified`` (an FYI card to post); ``skip``:
        ``skipped`` with the reason as error text. ``None`` when the fence moved."""

    @abc.abstractmethod
    async def add_tokens(self, pipeline: str, tokens: int, now: float | None = None) -> None:
        """Count tokens spent that did not end in a stored draft (failed attempts)."""

    @abc.abstractmethod
    async def tokens_used(self, pipeline: str, day: str) -> int:
        """Tokens used by ``pipeline`` on UTC ``day`` (``YYYY-MM-DD``)."""

    # -- approval ------------------------------------------------------------------
    @abc.abstractmethod
    async def unposted(self, pipeline: str | None = None, limit: int = 100) -> list[Draft]:
        """Drafts in ``ready`` (never posted, or re-drafted) and ``notified`` ones whose
        FYI card was never posted, oldest first."""

    @abc.abstractmethod
    async def mark_posted(self, draft_id: int, version: int, chat: str,
                          message_id: str, now: float | None = None) -> Draft | None:
        """CAS ``ready -> awaiting`` for that version, keeping the card's chat and
        message id; for a ``notified`` draft (an FYI card) the status stays;
        ``updated_at`` becomes ``now`` (reminders count from it)."""

    @abc.abstractmethod
    async def draft_reply(self, draft_id: int, version: int, actor: str,
                          now: float | None = None) -> Draft | None:
        """CAS ``notified -> queued`` for ``version`` (an operator tapped Draft a reply
        on the FYI card): version + 1, so it is drafted without triage. Audited."""

    @abc.abstractmethod
    async def dismiss(self, draft_id: int, version: int, actor: str,
                      now: float | None = None) -> Draft | None:
        """CAS ``notified -> dismissed`` for ``version``. Audited."""

    @abc.abstractmethod
    async def approve(self, draft_id: int, version: int, actor: str,
                      now: float | None = None, *, quorum: int = 1,
                      body: str | None = None, key: str | None = None) -> Draft | None:
        """Record ``actor``'s vote for ``version`` (one per operator and version, only
        while it awaits a decision), then CAS ``awaiting -> approved`` if ``quorum``
        distinct operators voted for it; audit row with the sha256 of the body the
        operator saw. ``None`` if the draft did not move: anything differs, or the
        quorum is not met yet (then a new vote is audited, with ``body`` and ``key``
        of the version voted for)."""

    @abc.abstractmethod
    async def votes(self, draft_id: int, version: int) -> list[Vote]:
        """The approvals of that version, oldest first."""

    @abc.abstractmethod
    async def redraft(self, draft_id: int, actor: str, instruction: str = "",
                      now: float | None = None) -> Draft | None:
        """/reply: CAS an ``awaiting``, skipped, rejected, failed or expired draft to
        ``queued`` with version + 1 and ``instruction`` for the drafter. Audited."""

    @abc.abstractmethod
    async def claim_notice(self, key: str, now: float | None = None, *,
                           draft_id: int | None = None, version: int | None = None) -> bool:
        """Claim the right to send the notice ``key`` (a reminder, a digest) once, across
        restarts and hosts: True for exactly one caller. With ``draft_id``, only while
        that ``version`` of the draft awaits a decision."""

    @abc.abstractmethod
    async def item_drafts(self, pipeline: str, item_id: str) -> list[Draft]:
        """Every draft of ``item_id`` in ``pipeline`` (any scope or recipe), oldest first."""

    @abc.abstractmethod
    async def edit(self, draft_id: int, version: int, body: str, actor: str,
                   now: float | None = None) -> Draft | None:
        """CAS on ``awaiting`` and ``version``: new body, version + 1, status ``ready``
        so the card is re-rendered (the approval message id is kept). Audited."""

    @abc.abstractmethod
    async def regenerate(self, draft_id: int, version: int, actor: str,
                         instruction: str = "", now: float | None = None) -> Draft | None:
        """CAS on ``awaiting`` and ``version``: status ``queued``, version + 1,
        ``instruction`` stored for the drafter, attempt reset. Audited."""

    @abc.abstractmethod
    async def reject(self, draft_id: int, version: int, actor: str, reason: str = "",
                     now: float | None = None) -> Draft | None:
        """CAS ``awaiting -> rejected`` for ``version``. Audited."""

    # -- sending -------------------------------------------------------------------
    @abc.abstractmethod
    async def approved(self, pipeline: str | None = None) -> list[Draft]:
        """Drafts in ``approved`` (approved but the send was not begun)."""

    @abc.abstractmethod
    async def begin_send(self, draft_id: int, holder: str | None = None) -> Draft | None:
        """CAS ``approved -> sending``, committed before the send call, recording the
        sending process (``holder``, as in the locks table) in ``send_holder``."""

    @abc.abstractmethod
    async def mark_sent(self, draft_id: int, sent_id: str, now: float | None = None
                        ) -> Draft | None:
        """CAS ``sending|send_unknown -> sent``; audit row with the sent text's hash;
        the reply and its original kept as an example of the pipeline (same transaction)."""

    @abc.abstractmethod
    async def mark_send_failed(self, draft_id: int, reason: str) -> Draft | None:
        """CAS ``sending -> send_failed``."""

    @abc.abstractmethod
    async def mark_send_unknown(self, draft_id: int, reason: str) -> Draft | None:
        """CAS ``sending -> send_unknown``."""

    @abc.abstractmethod
    async def retry_send(self, draft_id: int, actor: str, now: float | None = None
                         ) -> Draft | None:
        """CAS ``send_failed|send_unknown -> approved`` by an operator. Audited."""

    @abc.abstractmethod
    async def send_unknown(self, pipeline: str | None = None) -> list[Draft]: ...

    # -- reading ---------------------------------------------------------------------
    @abc.abstractmethod
    async def get_draft(self, draft_id: int) -> Draft | None: ...

    @abc.abstractmethod
    async def pending(self, pipeline: str | None = None, limit: int | None = None) -> list[Draft]:
        """Drafts in PENDING_STATUSES, oldest first (the oldest ``limit``, if given)."""

    @abc.abstractmethod
    async def count_by_status(self, pipeline: str | None = None) -> dict[str, int]: ...

    @abc.abstractmethod
    async def recent(self, pipeline: str, statuses: Iterable[str], limit: int = 10) -> list[Draft]:
        """The newest ``limit`` drafts of ``pipeline`` in ``statuses``, newest first (what
        ``status`` lists with item ids and reasons, for ``replay``)."""

    @abc.abstractmethod
    async def count_by_pipeline(self, statuses: Iterable[str]) -> dict[str, int]:
        """How many drafts each pipeline has in ``statuses`` (pipelines with none are
        left out): finds work owned by pipelines that left the configuration."""

    @abc.abstractmethod
    async def seen_count(self, pipeline: str) -> int: ...

    @abc.abstractmethod
    async def draft_gauges(self) -> tuple[dict[tuple[str, str], int], dict[str, float]]:
        """For metrics, in one query: how many drafts each (pipeline, status) has, and
        each pipeline's oldest ``awaiting`` draft's ``created_at``."""

    @abc.abstractmethod
    async def ping(self) -> None:
        """A trivial query (``/readyz``): raises if the store does not answer."""

    # -- runs --------------------------------------------------------------------------
    @abc.abstractmethod
    async def start_run(self, pipeline: str, scheduled_for: float | None = None,
                        now: float | None = None) -> int: ...

    @abc.abstractmethod
    async def end_run(self, run_id: int, status: str, counts: dict[str, int],
                      error_text: str | None = None, now: float | None = None) -> None: ...

    @abc.abstractmethod
    async def recent_runs(self, pipeline: str, limit: int = 10) -> list[Run]:
        """Newest first."""

    @abc.abstractmethod
    async def last_run(self, pipeline: str, status: str | None = None) -> Run | None: ...

    # -- audit -------------------------------------------------------------------------
    @abc.abstractmethod
    async def audit(self, actor: str, action: str, draft_key: str | None = None,
                    text: str | None = None, detail: str | None = None,
                    now: float | None = None) -> None:
        """Append one audit row (sha256 of ``text`` when given)."""

    @abc.abstractmethod
    async def count_audit(self, action: str, key_prefix: str, since: float,
                          until: float) -> int:
        """Audit rows of ``action`` whose draft key starts with ``key_prefix``, written
        in ``[since, until)`` (the digest's sent and rejected counts)."""

    @abc.abstractmethod
    async def audit_log(self, draft_key: str | None = None, limit: int = 100
                        ) -> list[AuditEntry]:
        """Newest first."""

    @abc.abstractmethod
    async def verify_audit(self) -> Report:
        """Walk the audit chain in one snapshot: a :class:`bot.store.chain.Report` with the
        rows checked, or the first row changed, removed or inserted."""

    @abc.abstractmethod
    async def audit_export(self, since: float = 0.0, after_seq: int = 0,
                           limit: int = 1000) -> list[dict]:
        """Chained audit rows in chain order (``bot.store.chain.CHAIN_COLS`` as keys):
        after position ``after_seq``, or (``after_seq`` 0) from the first row written at
        or after ``since`` on, every later row (contiguous, so an export verifies)."""

    # -- operations --------------------------------------------------------------------
    @abc.abstractmethod
    async def replay(self, pipeline: str, item_id: str, actor: str,
                     now: float | None = None) -> ReplayResult:
        """A failed, rejected, skipped or expired draft of the item -> ``queued``
        (attempt 0, version + 1). An item only seen (no draft) loses its seen mark. A
        sent item or one still in flight is ``refused``. Always audited."""

    @abc.abstractmethod
    async def sweep(self, *, seen_ttl_days: float, max_attempts: int = 3,
                    approval_ttl_days: float | None = None, runs_keep_days: float = 30,
                    now: float | None = None) -> SweepResult:
        """Delete seen marks older than the TTL (only those with no live draft
        needed), return expired drafting leases to queued (attempt + 1; past
        ``max_attempts``, failed), expire ``awaiting`` drafts older than
        ``approval_ttl_days`` if given, prune runs older than ``runs_keep_days``."""

    @abc.abstractmethod
    async def requeue_expired(self, pipeline: str, *, max_attempts: int,
                              now: float | None = None) -> tuple[int, int]:
        """The lease part of ``sweep`` for one pipeline, cheap enough for every tick:
        expired ``drafting`` leases -> ``queued`` (attempt + 1, new fence) or, past
        ``max_attempts``, ``failed``. Returns (requeued, failed)."""

    @abc.abstractmethod
    async def set_paused(self, pipeline: str, paused: bool, actor: str) -> None: ...

    @abc.abstractmethod
    async def paused(self) -> set[str]: ...

    # -- leader / locks (several hosts) ---------------------------------------------------
    @abc.abstractmethod
    async def try_lock(self, name: str, holder: str, ttl_seconds: float,
                       now: float | None = None) -> bool:
        """Take or renew a named lease row (e.g. ``tick:support``) for ``holder``.
        True if ``holder`` now holds it. Used so ticks of one pipeline never overlap
        across processes."""

    @abc.abstractmethod
    async def unlock(self, name: str, holder: str) -> None: ...

    @abc.abstractmethod
    async def lock_holder(self, name: str) -> str | None:
        """Who holds the named lock (expired or not), or None."""

    # -- cards that need re-rendering ---------------------------------------------------
    @abc.abstractmethod
    async def mark_card_stale(self, draft_id: int, stale: bool) -> None:
        """Remember (or forget) that the draft's card shows an old state because its
        last edit failed; the channel re-renders such cards until an edit succeeds."""

    @abc.abstractmethod
    async def stale_cards(self, limit: int = 50) -> list[Draft]:
        """Drafts whose card is marked stale, oldest id first."""

    # -- truthful status (holds, the queue, integrity) -------------------------------------
    @abc.abstractmethod
    async def set_hold(self, pipeline: str, reason: str | None, until: float | None = None) -> None:
        """Record why the pipeline's drafting is held (a setup error, a model's
        Retry-After, a spent budget) and until when (None: until drafting works again);
        ``reason=None`` clears it. Kept in the store so ``status`` in any process sees it."""

    @abc.abstractmethod
    async def holds(self) -> dict[str, tuple[str, float | None]]:
        """Every recorded hold: pipeline -> (reason, until or None)."""

    @abc.abstractmethod
    async def waiting(self, pipeline: str | None = None, limit: int = 100) -> list[Draft]:
        """Drafts not drafted yet (``queued`` or ``drafting``), oldest first."""

    @abc.abstractmethod
    async def check(self) -> list[str]:
        """Read every table (SQLite: ``PRAGMA quick_check``); the problems found, or []."""

    # -- crashed sends -------------------------------------------------------------------
    @abc.abstractmethod
    async def sending_holders(self) -> list[str]:
        """The distinct ``send_holder`` values of rows in ``sending``."""

    @abc.abstractmethod
    async def recover_abandoned_sends(self, *, dead: Iterable[str] = (), alive: str | None = None,
                                      grace: float, now: float | None = None) -> int:
        """``sending`` rows whose sending process is gone -> ``send_unknown`` (error
        ``ABANDONED_SEND``): those of a holder in ``dead`` (the caller saw its pid gone on
        this machine), those whose holder's heartbeat row ``process:<holder>`` is missing
        or expired (never ``alive``'s, the caller's own), and rows with no holder (begun
        before holders were recorded) older than ``grace`` seconds. ``now`` None: the
        store's clock, which on a shared store is the database's."""
