"""A pipeline's ``approval:`` section: where cards go, who decides, how many must,
reminders, the undo window and the sending hours (issue 28), parsed once at load."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .. import scheduler
from .checker import Checker, kind_of, parse_duration
from .options import ApprovalOptions
from .telegram import chat_id as _chat_id

if TYPE_CHECKING:
    from .load import Settings

CHANNELS = ("console", "telegram")


def parse_approval(ck: Checker, raw: dict, settings: Settings) -> ApprovalOptions:
    ck.unknown(raw, {"channel", "chat", "quorum", "operators", "remind_after", "console",
                     "undo", "send_hours"}, "approval")
    channel = ck.get(raw, "channel", "approval", str, default=ApprovalOptions.channel,
                     choices=CHANNELS)
    chat = raw.get("chat")
    if chat is not None and _chat_id(chat) is None:
        ck.error("approval.chat", f"expected a numeric Telegram chat id (like 123456789, or "
                                  f"-1001234567890 for a group), got {kind_of(chat)} {chat!r}")
    if channel == "telegram":
        if settings.telegram is None:
            ck.error("approval.channel", f"telegram needs a telegram: section in {settings.file}")
        elif chat is None and settings.telegram.approvals_chat is None:
            ck.error("approval.chat", f"missing; set the chat id here, or "
                                      f"telegram.approvals_chat in {settings.file}")
    team = _team(ck, raw, settings, channel)
    quorum, operators = team[0], team[1]
    console = ck.get(raw, "console", "approval", bool, default=quorum == 1 and operators is None)
    if "console" in raw and console is False and channel != "telegram":
        ck.error("approval.console", "false needs approval.channel: telegram (a console "
                                     "approval is decided in the console)")
    undo = ck.convert(raw, "undo", "approval", parse_duration, default=0.0)
    if undo is not None and not 0 <= undo <= 600:
        ck.error("approval.undo", f"expected a duration from 0 (off) to 10m like 10s, got "
                                  f"{raw['undo']!r}")
    hours = ck.convert(raw, "send_hours", "approval", scheduler.parse_send_hours, default=None)
    return ApprovalOptions(channel or ApprovalOptions.channel, _chat_id(chat), *team,
                           console=bool(console) if console is not None else True,
                           undo=undo if undo and 0 < undo <= 600 else 0.0, send_hours=hours)


def _team(ck: Checker, raw: dict, settings: Settings, channel: str | None
          ) -> tuple[int, tuple[int, ...] | None, float | None]:
    """``approval.quorum``, ``approval.operators`` and ``approval.remind_after``."""
    quorum = ck.get(raw, "quorum", "approval", int, default=1)
    if quorum is not None and quorum < 1:
        ck.error("approval.quorum", f"expected a whole number of operators of at least 1, "
                                    f"got {quorum}")
        quorum = None
    everyone = settings.telegram.operators if settings.telegram is not None else []
    operators: tuple[int, ...] | None = None
    if "operators" in raw:
        listed = ck.get(raw, "operators", "approval", list, default=[]) or []
        operators = tuple(op for op in listed if isinstance(op, int) and not isinstance(op, bool))
        for i, op in enumerate(listed):
            if op not in operators:
                ck.error(f"approval.operators[{i}]", f"expected a numeric Telegram user id, "
                                                     f"got {op!r}")
            elif everyone and op not in everyone:
                ck.error(f"approval.operators[{i}]", f"{op} is not in telegram.operators of "
                         f"{settings.file}, so the bot drops their taps; add them there too")
        if raw["operators"] == []:
            ck.error("approval.operators", "expected at least one numeric user id; leave it "
                                           "out to let every telegram.operators entry decide")
    deciders = len(operators) if operators is not None else len(everyone)
    if quorum and quorum > 1 and deciders and quorum > deciders:
        ck.error("approval.quorum", f"{quorum} approvals needed but only {deciders} operator(s) "
                                    f"may decide this pipeline's cards; nothing could be sent")
    remind = ck.convert(raw, "remind_after", "approval", parse_duration, default=None)
    if remind is not None and remind < 1:
        ck.error("approval.remind_after", f"expected a duration of at least 1s like 4h, got "
                                          f"{raw['remind_after']!r}")
        remind = None
    if channel != "telegram":
        for key in ("operators", "remind_after") + (("quorum",) if (quorum or 1) > 1 else ()):
            if key in raw:
                ck.error(f"approval.{key}", "needs approval.channel: telegram (a console "
                                            "approval has one operator and no card)")
    return quorum or 1, operators, remind
