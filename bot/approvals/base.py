"""What every approval channel shares: the operator desk it acts through, and no-op
defaults for the optional hooks of :class:`bot.stages.ApprovalChannel`."""

from __future__ import annotations

from ..desk.desk import OperatorDesk
from ..models import Draft
from ..stages import PostedRef


class DeskChannel:
    """An approval channel bound to an :class:`OperatorDesk`: every decision and every
    read of a draft goes through the desk (never the store)."""

    _desk: OperatorDesk | None = None

    @property
    def desk(self) -> OperatorDesk:
        if self._desk is None:
            raise RuntimeError(f"{type(self).__name__} is not bound to a desk yet")
        return self._desk

    def bind(self, desk: OperatorDesk) -> None:
        """Called before the engine's crash recovery (which may update cards), so the
        channel can read and record through ``desk`` before :meth:`start`."""
        self._desk = desk

    async def start(self, desk: OperatorDesk) -> None:
        self.bind(desk)

    async def stop(self) -> None:
        """Stop (a channel with nothing running: nothing)."""

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
