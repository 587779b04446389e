"""The stage interfaces. The engine drives these without knowing which source,
drafter, approval channel or sender sits behind them.

::

    Source.fetch -> Store.admit -> Store.claim -> Drafter.draft -> Store.finish_draft
      -> ApprovalChannel.post -> (operator) -> Decisions.approve -> Sender.send
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Awaitable, Callable, Protocol, runtime_checkable

from .models import (
    Draft,
    DraftRequest,
    DraftResult,
    FetchResult,
    Message,
    SendResult,
    TriageDecision,
)


@dataclass
class FetchContext:
    pipeline: str
    scope: str
    scheduled_for: float  # the slot time of this tick (never now())
    cursor: str | None  # what the last FetchResult.cursor stored
    unseen: Callable[[list[str]], Awaitable[set[str]]]  # ids not seen yet
    progress: Callable[[int, int], None] | None = None  # (done, total) for backfills
    # At most this many new items (oldest first); the cursor returned must then keep
    # the rest for the next fetch, and FetchResult.more says some wait. None: no bound.
    limit: int | None = None


@runtime_checkable
class Source(Protocol):
    scope: str  # e.g. "maildir:/path", "gmail:support", "slot"

    async def fetch(self, ctx: FetchContext) -> FetchResult:
        """Return new items (and the next cursor), at most ``ctx.limit`` of them, oldest
        first. Raise SourceError/AuthError on failure; the engine records the run as
        failed and nothing is admitted."""

    async def close(self) -> None: ...


@runtime_checkable
class Drafter(Protocol):
    name: str

    async def draft(self, request: DraftRequest) -> DraftResult:
        """Raise DrafterRetryable (timeout, 429, 5xx), DrafterError (definite) or
        BudgetExhausted. Must time out on its own."""

    async def close(self) -> None: ...


@runtime_checkable
class Triager(Protocol):
    name: str

    async def triage(self, message: Message) -> TriageDecision:
        """reply | notify | skip for ``message``; never raises for model trouble: any
        doubt is reply (see bot.drafters.triage)."""

    async def close(self) -> None: ...


@dataclass
class PostedRef:
    chat: str
    message_id: str


class Decisions(Protocol):
    """What an approval channel calls when an operator acts. Implemented by
    ``bot.desk.decisions.Decisions``, handed on by ``bot.engine.engine.Engine``. Each returns the
    draft after the transition, or ``None`` when the CAS did not match (double tap,
    old version, already decided)."""

    async def approve(self, draft_id: int, version: int, actor: str,
                      draft: Draft | None = None) -> Draft | None: ...
    async def edit(self, draft_id: int, version: int, body: str, actor: str) -> Draft | None: ...
    async def regenerate(self, draft_id: int, version: int, actor: str,
                         instruction: str = "") -> Draft | None: ...
    async def reject(self, draft_id: int, version: int, actor: str,
                     reason: str = "") -> Draft | None: ...
    async def retry_send(self, draft_id: int, actor: str) -> Draft | None: ...
    # An unknown send's card: ask the mailbox again (the draft, what to tell), or the
    # operator says it arrived.
    async def check_send(self, draft_id: int, actor: str) -> tuple[Draft | None, str]: ...
    async def mark_sent(self, draft_id: int, actor: str) -> Draft | None: ...
    # An FYI card (triage said notify): draft a reply after all, or dismiss it.
    async def draft_reply(self, draft_id: int, version: int, actor: str) -> Draft | None: ...
    async def dismiss(self, draft_id: int, version: int, actor: str) -> Draft | None: ...

    # What a channel reads and records goes through here too: it never touches the store.
    async def draft(self, draft_id: int) -> Draft | None: ...
    async def record_prompt(self, chat: int | str, message_id: int | str, record: str,
                            actor: str) -> None: ...
    async def prompt_record(self, chat: int | str, message_id: int | str) -> str | None: ...
    async def adopt_card(self, d: Draft, chat: str, message_id: str) -> Draft: ...
    async def card_stale(self, draft_id: int, stale: bool) -> None: ...
    async def stale_cards(self, limit: int = 50) -> list[Draft]: ...

    # The team desk: who may decide, the quorum's votes, drafts on demand.
    async def may_decide(self, d: Draft, actor: str, what: str) -> None: ...
    async def may_act(self, pipeline: str, actor: str, what: str,
                      key: str | None = None) -> None: ...
    def may_see(self, pipeline: str, actor: str) -> bool: ...
    async def votes(self, d: Draft) -> tuple[list[str], int]: ...
    async def pending_for(self, actor: str) -> tuple[list[Draft], int]: ...
    async def reply(self, pipeline: str, item_id: str, instruction: str, actor: str) -> str: ...
    async def emails(self, pipeline: str, n: int, actor: str) -> list[Draft]: ...


@runtime_checkable
class ApprovalChannel(Protocol):
    name: str

    async def start(self, decisions: Decisions) -> None: ...

    async def post(self, draft: Draft) -> PostedRef:
        """Show the card for ``draft`` (status ``ready``). If the draft already has
        an approval message (a new version after edit/regenerate), edit that card
        instead of posting a second one. Raise ApprovalError if unreachable."""

    async def update(self, draft: Draft) -> None:
        """Re-render the card after a decision or send outcome (sent, rejected,
        send_failed with Retry...). Best effort: failures are logged."""

    async def notify(self, text: str, *, retry_draft: Draft | None = None) -> None:
        """Tell the operators something (ops chat). ``retry_draft``: the draft it is
        about; offer what moves it on (Retry send, or Replay for a failed one)."""

    async def resync_cards(self) -> None:
        """Re-render cards whose last update failed (called at start and every tick).
        A channel that keeps no cards does nothing."""

    async def on_posted(self, draft: Draft) -> bool:
        """After ``draft``'s card is recorded as posted (a console may prompt here);
        True if the hook may have decided on the draft (the engine reads it again)."""

    async def discard(self, ref: PostedRef, draft: Draft) -> None:
        """Take away a second card of ``draft`` (``ref``) that a tap made redundant."""

    async def remind(self, draft: Draft, text: str) -> None:
        """Remind the operators of ``draft``'s undecided card."""

    async def stop(self) -> None: ...


class ApprovalChannelBase:
    """No-op defaults for an ApprovalChannel's optional hooks; channels subclass it."""

    def bind(self, decisions: Decisions) -> None:
        """Called by the engine before its crash recovery (which may update cards), so
        a channel can read and record through ``decisions`` before :meth:`start`."""

    async def on_posted(self, draft: Draft) -> bool:
        """Called by the engine after ``mark_posted`` recorded the card of ``draft``;
        True if it may have decided on it."""
        return False

    async def discard(self, ref: PostedRef, draft: Draft) -> None:
        """Take away ``ref``, a second card of ``draft`` (not its recorded card)."""

    async def resync_cards(self) -> None:
        """Re-render cards whose last update failed (a channel with no cards: nothing)."""

    async def remind(self, draft: Draft, text: str) -> None:
        """Remind the operators of ``draft``'s undecided card (a channel without cards
        has nothing to point at: nothing)."""


@runtime_checkable
class Sender(Protocol):
    name: str

    async def send(self, draft: Draft) -> SendResult:
        """Deliver the approved ``draft.body`` exactly once. Raise SendFailed when it
        certainly did not go out, SendUnknown when it may have. Never retry a send
        that may have reached the other side."""

    async def check(self, draft: Draft) -> str | None:
        """For ``send_unknown`` recovery: the sent id if the message is found on the
        other side, ``None`` if it certainly is not there. Raise SendUnknown if it
        cannot tell yet."""

    async def close(self) -> None: ...
