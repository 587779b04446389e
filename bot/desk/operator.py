"""Who acts at the desk, and the one rule of who may act on which pipeline.

An :class:`Operator` is a Telegram user (``tg:42``) or the host's console (whoever has
the terminal, whatever ``$USER`` says: one identity, so two shell users never make a
quorum of two). :func:`refusal` is the authorization rule, checked by every method of
:class:`bot.desk.desk.OperatorDesk`, so no handler or command can forget it.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..config.load import Settings


@dataclass(frozen=True)
class Operator:
    """The acting operator: ``user_id`` for a Telegram user, None for the console."""

    user_id: int | None
    name: str = ""

    @property
    def id(self) -> str:
        """The stable identity a quorum counts: ``tg:42`` or ``console``."""
        return f"tg:{self.user_id}" if self.user_id is not None else self.name or "console"

    @property
    def actor(self) -> str:
        """How the audit and the card name this operator: ``tg:42 (Anna)``, ``console``."""
        if self.user_id is None:
            return self.id
        return f"{self.id} ({self.name})" if self.name else self.id

    @property
    def on_console(self) -> bool:
        return self.user_id is None


def telegram(user_id: int, first_name: str = "") -> Operator:
    return Operator(int(user_id), first_name)


#: The host's console: `draftgate review` and every CLI command.
CONSOLE = Operator(None, "console")
#: The console of `draftgate demo`, which approves every card itself.
DEMO = Operator(None, "demo-auto-approve")
#: draftgate itself (the sweep, recovery): never an operator's decision.
SYSTEM = Operator(None, "draftgate")


@dataclass(frozen=True)
class Refusal:
    """Why ``what`` is not allowed (``reason`` for the audit, ``text`` for the operator)."""

    reason: str
    text: str


def refusal(settings: Settings, op: Operator, pipeline: str | None, *,
            deciding: bool = False) -> Refusal | None:
    """None if ``op`` may act on ``pipeline`` (None: on no pipeline in particular), else
    why not. A Telegram user must be in ``telegram.operators`` and, for a pipeline, in
    its ``approval.operators`` (every action, reading included). The console may read
    and run everything, and decides (``deciding``) only where ``approval.console``."""
    known = pipeline is not None and settings.has_pipeline(pipeline)
    if op.user_id is not None:
        team = settings.telegram.operators if settings.telegram is not None else ()
        if op.user_id not in {int(u) for u in team}:
            return Refusal("not in telegram.operators", "Not allowed.")
        if known:
            assert pipeline is not None
            allowed = settings.pipeline(pipeline).approval.operators
            if allowed is not None and op.user_id not in allowed:
                return Refusal(f"not in approval.operators of {pipeline}",
                               f"Not yours to decide: {pipeline}'s cards are decided by its "
                               "approval.operators.")
        return None
    if deciding and known and op is not SYSTEM:
        assert pipeline is not None
        if not settings.pipeline(pipeline).approval.console:
            return Refusal(f"console decisions are off for {pipeline}",
                           f"Not decided here: {pipeline} is decided in Telegram by its "
                           "approval.operators (approval.console is off; it is off by "
                           "default with a quorum above 1 or approval.operators set).")
    return None
