"""The store contract: :class:`bot.store.Store` (``sql.py`` and ``sql_ops.py``, written
once in SQL) on :class:`Backend` (what each backend, SQLite and PostgreSQL, writes
itself). ``tests/test_store_contract.py`` runs the same tests against each backend.

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
import time
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Self, Sequence, TypeVar

from ..errors import StoreError
from ..models import Draft, Item
from .chain import Record, Report
from .rows import Db, Tokens, audit_row, select_drafts

T = TypeVar("T")


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


class Backend(abc.ABC):
    """What each backend writes itself (its connection, and the statements its SQL
    writes differently), and the primitives the shared SQL is written on."""

    url: str
    #: SQL giving a draft a fence token no earlier claim of it had.
    NEXT_FENCE: str = "fence + 1"
    #: The drafts table read through the index named by ``{}`` (the scoreboard's reads).
    #: SQLite is told (``INDEXED BY``): its planner, without fresh statistics, takes a
    #: status or pipeline index and walks a year of drafts.
    DRAFTS_BY: str = "drafts"
    #: What a read that precedes a write in the same transaction appends to lock its
    #: rows (SQLite's BEGIN IMMEDIATE already holds the only write lock).
    FOR_UPDATE: str = ""

    # -- lifecycle ---------------------------------------------------------------
    @abc.abstractmethod
    async def open(self, *, create: bool = True) -> None:
        """Connect and run pending numbered migrations. With ``create=False`` (read-only
        commands) a store that does not exist yet raises :class:`StoreMissing` and
        nothing (no file, folder, schema or table) is created."""

    @abc.abstractmethod
    async def close(self) -> None: ...

    async def __aenter__(self) -> Self:
        await self.open()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    # -- fetch side, claims, the audit walk, the integrity check ---------------------
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
    async def claim(self, pipeline: str, lease_seconds: float, *, limit: int = 1,
                    now: float | None = None) -> list[Draft]:
        """CAS up to ``limit`` ``queued`` drafts of ``pipeline`` (oldest first) to
        ``drafting`` with ``lease_until = now + lease_seconds`` and a NEW fence token
        each. Safe from many processes at once: each draft is returned to exactly one
        caller."""

    @abc.abstractmethod
    async def verify_audit(self) -> Report:
        """Walk the audit chain in one snapshot: a :class:`bot.store.chain.Report` with the
        rows checked, or the first row changed, removed or inserted."""

    @abc.abstractmethod
    async def check(self) -> list[str]:
        """Read every table (SQLite: ``PRAGMA quick_check``); the problems found, or []."""

    # -- the primitives --------------------------------------------------------------
    @abc.abstractmethod
    async def _run(self, fn: Callable[[Db], Awaitable[T]], *, tx: bool = True) -> T:
        """``fn`` on one connection: inside one transaction, or (``tx`` False: one
        statement, atomic on its own) without one."""

    def _now(self, now: float | None) -> float:
        return time.time() if now is None else float(now)

    def _clean(self, text: str | None) -> str | None:
        """Text as the database can hold it (PostgreSQL: no NUL)."""
        return text

    def _db_clock(self, now: float | None) -> tuple[str, Any]:
        """SQL for "now" where leases and send ages are decided, and its argument."""
        return "?", self._now(now)

    async def _query(self, sql: str, args: tuple = ()) -> list[Any]:
        return await self._run(lambda db: db.rows(sql, args), tx=False)

    async def _execute(self, sql: str, args: tuple = ()) -> int:
        return await self._run(lambda db: db.run(sql, args), tx=False)

    async def _script(self, statements: list[tuple[str, tuple]],
                      records: Sequence[Record] = ()) -> None:
        """``statements``, then ``records`` appended to the audit chain, in one transaction."""
        async def tx(db: Db) -> None:
            for sql, args in statements:
                await db.run(sql, args)
            await self._append(db, records)

        await self._run(tx)

    @abc.abstractmethod
    async def _append(self, db: Db, records: Sequence[Record], tokens: Tokens | None = None) -> None:
        """Append ``records`` to the audit chain inside ``db``'s transaction (each
        backend in as few round trips as it can), and add ``tokens`` to the day's usage
        after them: a pipeline's usage is one row that every draft updates, so it is
        locked last, under the chain's head, where no other writer waits on it."""

    async def _select_drafts(self, where: str, args: tuple, tail: str = "ORDER BY id"
                             ) -> list[Draft]:
        return await self._run(lambda db: select_drafts(db, where, args, tail), tx=False)

    def _audit_row(self, t: float, actor: str, action: str, key: str | None,
                   text: str | None, detail: str | None) -> Record:
        return audit_row(t, actor, action, key, text, detail, self._clean)
