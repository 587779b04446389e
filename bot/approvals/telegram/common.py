"""What the Telegram channel, its taps and its commands share: how an operator, a chat,
a card and a plain answer are named, and how a handler finds the channel and its desk
(typed PTB context: ``context.bot_data.channel``)."""

from __future__ import annotations

import logging
from typing import Any, Callable, Protocol

from telegram import Bot, LinkPreviewOptions, Message, Update, User
from telegram.constants import ParseMode
from telegram.error import TelegramError
from telegram.ext import CallbackContext, ContextTypes, ExtBot

from ...config import telegram as config_telegram
from ...config.load import Settings
from ...desk.desk import OperatorDesk
from ...desk.operator import Operator
from ...desk.operator import telegram as telegram_operator
from ...models import Draft, Status
from ...redact import scrub
from ...stages import PostedRef
from .. import cards

log = logging.getLogger("draftgate.telegram")  # one logger for the whole channel
NO_PREVIEW = LinkPreviewOptions(is_disabled=True)
_PLAIN_LIMIT = 4000


class ChannelView(Protocol):
    """What handlers use of the TelegramChannel that built the Application."""

    settings: Settings
    answer_within: float
    render_chart: Callable[[Any], bytes]  # /stats's PNG (chart.render)

    @property
    def desk(self) -> OperatorDesk: ...
    @property
    def bot(self) -> Bot: ...
    def chat_allowed(self, draft: Draft, chat: int | None, action: str) -> bool: ...
    def held_line(self) -> str: ...
    async def update(self, draft: Draft) -> bool: ...
    async def discard(self, ref: PostedRef, draft: Draft) -> None: ...
    async def later_menu(self, draft: Draft, show: bool,
                         buttons: list[list[cards.Button]] | None = None) -> None: ...
    attach_pages: dict[int, int]
    def timezone(self, draft: Draft) -> str: ...


class BotData:
    """``context.bot_data``: the channel, typed (PTB's ContextTypes)."""

    def __init__(self) -> None:
        self.channel: ChannelView | None = None


Context = CallbackContext[ExtBot[None], dict, dict, BotData]
#: The context types the Application is built with.
CONTEXT_TYPES = ContextTypes(bot_data=BotData)


def channel_of(context: Context) -> ChannelView:
    """The TelegramChannel that built the Application."""
    channel = context.bot_data.channel
    assert channel is not None, "the channel sets itself in bot_data when it builds the app"
    return channel


def chat_id(value: Any) -> int | None:
    """A chat id as the loader reads one; ValueError for a value set but not a chat id."""
    found = config_telegram.chat_id(value)
    if found is None and value is not None and not isinstance(value, bool):
        raise ValueError(value)
    return found


def actor(user: User) -> Operator:
    """The operator a Telegram user is, for the desk."""
    return telegram_operator(user.id, user.first_name)


def operator(update: Update) -> Operator:
    """The operator of an update a handler runs for: the gate lets only operators' pass."""
    user = update.effective_user
    assert user is not None, "the gate drops updates without a user"
    return actor(user)


def message_of(update: Update) -> Message:
    """The message a command or reply handler runs for (they match only messages)."""
    msg = update.effective_message
    assert msg is not None, "command and reply handlers get only updates with a message"
    return msg


def kind(update: Update) -> str:
    """What an update is, for the log (never its text)."""
    if update.callback_query is not None:
        return "callback_query"
    msg = update.effective_message
    if msg is not None:
        text = msg.text or ""
        return f"command {text.split()[0][:32]}" if text.startswith("/") else "message"
    return "update"


def plain(text: str) -> str:
    """``text`` cut to fit a plain message, counted as Telegram counts (UTF-16 units)."""
    text = scrub(text)  # notices and error replies quote errors: no secret leaves in one
    if cards.units(text) <= _PLAIN_LIMIT:
        return text
    budget, used, end = _PLAIN_LIMIT - 20, 0, len(text)
    for i, ch in enumerate(text):
        used += 2 if ord(ch) > 0xFFFF else 1
        if used > budget:
            end = i
            break
    return text[:end] + "\n… (cut)"


async def reply(update: Update, text: str, *, pre: bool = False) -> None:
    """Answer the operator's message, quoting it; ``pre``: as a fixed-width block."""
    msg = message_of(update)
    if pre:
        body, _ = cards.clip(text, cards.MAX_TEXT - 20, ellipsis="\n… (cut)")
        await msg.reply_text(do_quote=True, text=f"<pre>{body}</pre>", parse_mode=ParseMode.HTML)
    else:
        await msg.reply_text(do_quote=True, text=plain(text), link_preview_options=NO_PREVIEW)


async def answer(query: Any, text: str) -> None:
    """Answer a callback query (ends the operator's spinner)."""
    try:
        await query.answer(text[:200])
    except TelegramError as exc:
        # A replayed update's query is too old to answer; nothing else to do.
        log.info("could not answer a callback query: %s", exc)


def card_ref(draft: Draft) -> tuple[int, int] | None:
    """(chat, message id) of the draft's Telegram card; None if it has none here (never
    posted, or decided elsewhere, e.g. ``draftgate review`` in a terminal)."""
    try:
        chat, mid = chat_id(draft.approval_chat), int(draft.approval_message_id or "")
    except ValueError:
        return None
    return (chat, mid) if chat is not None else None


def already(draft: Draft) -> str:
    """Why a decision on ``draft`` did nothing: what it is now, and who decided."""
    who, s = cards.actor_name(draft.decided_by), draft.status
    if s in (Status.SENT, Status.REJECTED):
        return f"Already decided: {'sent' if s == Status.SENT else 'rejected'} by {who}."
    if s in (Status.APPROVED, Status.SENDING, Status.SEND_FAILED, Status.SEND_UNKNOWN):
        return f"Already approved by {who}; " + ("sending." if s in (Status.APPROVED, Status.SENDING) else
                                                 "the send needs attention (see the card).")
    if s in (Status.QUEUED, Status.DRAFTING):
        return ("Being regenerated; wait for the new version." if draft.body else
                "A reply is being drafted; the card turns into it.")
    if s == Status.NOTIFIED:
        return "This is an FYI card: tap ✍️ Draft a reply or 👋 Dismiss."
    if s == Status.DISMISSED:
        return f"Already dismissed by {who}."
    if s == Status.READY:
        return "A new version is being posted; use the updated card."
    return f"Nothing to do: the draft is {s}."
