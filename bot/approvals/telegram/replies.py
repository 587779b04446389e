"""Replies to prompts and cards: the text of an Edit, the instruction of a Regenerate,
the reason of a Reject, or a card's new text. A prompt is known by its message id,
recorded (through the desk) when it was sent; what a message says is not enough."""

from __future__ import annotations

from typing import Any

from telegram import Update

from ...errors import ConfigError, DrafterError, NotAllowed
from ...models import Draft, Status
from .. import cards
from . import notes
from .common import (
    ChannelView,
    Context,
    already,
    card_ref,
    channel_of,
    message_of,
    operator,
    plain,
)


async def _target(update: Update, context: Context, not_to_bot: str = ""
                  ) -> tuple[str, Draft] | None:
    """(prompt kind, draft) that a reply answers, if it may still be applied; else the
    operator is told why (None). A message that is no reply to the bot gets
    ``not_to_bot`` (nothing if empty)."""
    ch, msg = channel_of(context), message_of(update)
    target = msg.reply_to_message
    if target is None or target.from_user is None or target.from_user.id != context.bot.id:
        if not_to_bot:
            await msg.reply_text(do_quote=True, text=not_to_bot)
        return None
    parsed = await _prompt_of(ch, msg.chat_id, target)
    kind, version, draft = parsed or ("", None, None)
    if parsed is None:
        problem = ("Nothing changed: that message is not a draft's card or prompt. Tap ✏️ "
                   "Edit on the card to change a draft.")
    elif draft is None or not ch.chat_allowed(draft, msg.chat_id, cards.EDIT):
        problem = "That draft does not belong to this chat."
    elif version != draft.version:
        problem = (f"Not applied: {cards.tag(draft)} is the current version, you answered "
                   f"for v{version}.")
    elif draft.status != Status.AWAITING:
        problem = f"Not applied: {already(draft)}"
    else:
        return kind, draft
    await msg.reply_text(do_quote=True, text=problem)
    return None


async def _prompt_of(ch: ChannelView, chat_id: int, target: Any) -> tuple[str, int, Draft | None] | None:
    """(kind, version, draft) of the bot message replied to: a prompt recorded when it
    was sent, or a draft's recorded card (kind ``card`` = edit). What a message says is
    not enough: a notice can quote outside text that looks alike."""
    record = await ch.desk.prompt_record(chat_id, target.message_id)
    if (parsed := cards.parse_prompt_record(record)) is not None:
        kind, draft_id, version = parsed
        return kind, version, await ch.desk.draft(draft_id)
    named = cards.parse_card_header(target.text)
    if named is None:
        return None
    draft = await ch.desk.draft(named[0])
    if draft is None or card_ref(draft) != (chat_id, target.message_id):
        return None
    return cards.PROMPT_CARD, named[1], draft


async def on_reply(update: Update, context: Context) -> None:
    """A reply to an Edit/Regenerate/Reject prompt, or to a card (= new text)."""
    if await notes.on_reply(update, context):  # a style notes Edit prompt's answer
        return
    if (found := await _target(update, context)) is not None:
        await _apply(update, context, *found, message_of(update).text or "")


async def skip(update: Update, context: Context) -> None:
    """/skip as the answer to a Regenerate or Reject prompt."""
    found = await _target(update, context, "Send /skip as a reply to a Regenerate or Reject "
                                           "prompt.")
    if found is None:
        return
    kind, draft = found
    if kind in (cards.PROMPT_EDIT, cards.PROMPT_CARD):
        await message_of(update).reply_text(
            do_quote=True, text=f"An edit needs the new text; {cards.tag(draft)} is unchanged.")
        return
    await _apply(update, context, kind, draft, "")


async def _apply(update: Update, context: Context, kind: str, draft: Draft, text: str) -> None:
    """Hand the answer to a prompt to the engine; tell the operator what came of it."""
    ch, msg, who = channel_of(context), message_of(update), operator(update)
    text = text.strip()
    editing = kind in (cards.PROMPT_EDIT, cards.PROMPT_CARD)
    if editing and not text:
        await msg.reply_text(do_quote=True, text="An empty text cannot replace a draft.")
        return
    try:
        if editing:
            after = await ch.desk.edit(who, draft.id, draft.version, text)
            done = f"✏️ {cards.tag(after)} is on the card." if after else ""
        elif kind == cards.PROMPT_REGENERATE:
            after = await ch.desk.regenerate(who, draft.id, draft.version, instruction=text)
            done = f"🔁 Regenerating as v{after.version}…" if after else ""
        else:
            after = await ch.desk.reject(who, draft.id, draft.version, reason=text)
            done = f"🗑 #{draft.id} rejected." if after else ""
    except (ConfigError, DrafterError, NotAllowed) as exc:  # pipeline gone; budget; not theirs
        text = str(exc)
        await msg.reply_text(do_quote=True, text=plain(
            text if text.startswith("Not ") else f"Not applied: {text}"))
        return
    if after is None:
        fresh = await ch.desk.draft(draft.id) or draft
        await msg.reply_text(do_quote=True, text=f"Not applied: {already(fresh)}")
        return
    await ch.update(after)
    await msg.reply_text(do_quote=True, text=done)


