"""Taps on cards and notices: where an operator decides (replies to prompts are in
:mod:`.replies`).

One CallbackQueryHandler per action family (data ``<action>:<draft id>:<version>``)
and a last one for any other data; every query is answered. A tap acts only on the
draft whose card (or notice) was tapped, through the desk's compare-and-set
decisions. A prompt is known by its message id, recorded (through the desk) when
it is sent. The channel never touches the store: it reads, records and decides
through the operator desk (``ch.desk``), which checks who may act.
"""

from __future__ import annotations

import asyncio
import contextlib
import html
import io
from typing import Any, Awaitable, Callable, Coroutine

from telegram import ForceReply, InlineKeyboardButton, InlineKeyboardMarkup, Update
from telegram.constants import ParseMode
from telegram.error import TelegramError
from telegram.ext import (
    BaseHandler,
    CallbackQueryHandler,
    CommandHandler,
    MessageHandler,
    filters,
)

from ...desk import reports as ops
from ...desk.operator import Operator
from ...errors import (
    ApprovalError,
    ConfigError,
    DraftgateError,
    NeedsConfirmation,
    NotAllowed,
)
from ...mail.attachments import TELEGRAM_MAX
from ...models import REPLAYABLE_STATUSES, Draft, Status
from ...stages import PostedRef
from .. import cards
from . import notes
from .common import (
    ChannelView,
    Context,
    actor,
    already,
    answer,
    card_ref,
    channel_of,
    log,
)
from .replies import on_reply, skip

#: What a family decides once the tap is checked: (channel, query, callback, draft,
#: chat id) -> the answer shown to the operator.
Decide = Callable[[ChannelView, Any, cards.Callback, Draft, int], Awaitable[str]]


async def _answered(ch: ChannelView, query: Any, tap: Awaitable[str]) -> None:
    """Run ``tap`` and answer the query with its notice, whatever happens. A tap whose
    decision takes longer (a slow send) is answered after ``ch.answer_within`` seconds,
    so the operator's spinner ends; the card then shows the outcome."""
    task = asyncio.ensure_future(tap)
    try:
        notice = await asyncio.wait_for(asyncio.shield(task), ch.answer_within)
    except asyncio.TimeoutError:
        await answer(query, "Working on it; the card shows the outcome.")
        try:
            await task
        except Exception:
            # The tap is answered already: say it in the chat, then let the error
            # handler log it.
            if (message := query.message) is not None:
                with contextlib.suppress(TelegramError, ApprovalError):
                    await ch.bot.send_message(
                        message.chat.id, "⚠️ That tap did not go through (the error is "
                        "in the bot's log); the card shows where the draft stands.",
                        reply_to_message_id=message.message_id, allow_sending_without_reply=True)
            raise
        return
    except BaseException:
        task.cancel()  # cancelled (shutdown): so is the decision, as without a wait
        await answer(query, "Something went wrong; it is in the bot's log.")
        raise
    await answer(query, notice)


def _family(decide: Decide) -> Callable[[Update, Context], Coroutine[Any, Any, None]]:
    """The handler of one action family: check the tap, then ``decide``."""
    async def on_tap(update: Update, context: Context) -> None:
        ch = channel_of(context)
        await _answered(ch, update.callback_query, _tap(ch, update.callback_query, decide))
    return on_tap


async def _unknown(ch: ChannelView, query: Any, cb: cards.Callback, draft: Draft, chat_id: int) -> str:
    """Data of no family: ``_tap`` refuses it (not ours, not canonical, none) first."""
    return "Unknown action; use the latest card."


async def _tap(ch: ChannelView, query: Any, decide: Decide) -> str:
    """Check that the tapped message carries this draft's current data, then decide."""
    try:
        cb = cards.parse_callback(query.data)  # canonical data only, byte for byte
    except cards.BadCallback as exc:
        log.info("ignored callback data from user %s: %s", query.from_user.id, exc)
        return str(exc)
    draft = await ch.desk.draft(cb.draft_id)
    message = query.message  # None: too old for Telegram to say which (no chat allows it)
    chat_id: int | None = message.chat.id if message is not None else None
    if draft is None or chat_id is None or not ch.chat_allowed(draft, chat_id, cb.action):
        # Same answer for both, so a tap cannot probe which ids exist elsewhere.
        return "This button does not belong to a draft of this chat."
    if cb.version != draft.version:  # (changes nothing, whichever message it came from)
        if cb.action == cards.REPLAY:
            return f"Already replayed: #{draft.id} is v{draft.version} now ({draft.status})."
        return f"Old version (v{cb.version}); the card now shows v{draft.version}."
    try:  # the desk checks again in each decision; a refusal here changes nothing
        await ch.desk.authorize(actor(query.from_user), draft.pipeline,
                                f"tap {cb.action} v{draft.version}", key=draft.key,
                                deciding=cb.action != cards.FULL_TEXT)
    except NotAllowed as exc:
        return str(exc)
    mid: int = message.message_id
    on_card = card_ref(draft) == (chat_id, mid)
    if not on_card and not _ours(query, cb):
        # A client can send any data. Data that is not on the tapped message (e.g.
        # another draft's id on this card) must not act, nor make this card look
        # like a lost copy of that draft's card and get it deleted.
        log.info("ignored callback data from user %s: not on message %s/%s",
                 query.from_user.id, chat_id, mid)
        return "This button does not belong to this message; use the draft's own card."
    if not on_card and cb.action not in _ON_NOTICES:
        draft = await _reconcile(ch, draft, chat_id, mid)
    try:
        return await decide(ch, query, cb, draft, chat_id)
    except ConfigError as exc:  # the draft's pipeline left the configuration
        return str(exc)


#: Actions whose button is on a message of ours other than the card: an ops notice's
#: Retry send and Replay, the question an Approve asks under grounding: confirm.
_ON_NOTICES = (cards.RETRY, cards.REPLAY, cards.CONFIRM, *cards.CONFIRM_LATER)


def _ours(query: Any, cb: cards.Callback) -> bool:
    """Is the tapped message (not the draft's recorded card) one we made for this
    draft: a notice carrying this button, or a card of this draft and version whose
    post looked failed? Telegram reports the message's keyboard itself, so forged
    data is not on it; a card must also name this draft in its header."""
    message = query.message
    rows = getattr(getattr(message, "reply_markup", None), "inline_keyboard", None) or ()
    if message is None or query.data not in {b.callback_data for row in rows for b in row}:
        return False
    if cb.action in _ON_NOTICES:
        return True
    return cards.parse_card_header(getattr(message, "text", None)) == (cb.draft_id, cb.version)


async def _reconcile(ch: ChannelView, draft: Draft, chat_id: int, mid: int) -> Draft:
    """A tap on a card of this draft and version that is not its recorded card.
    That card exists because Telegram delivered a sendMessage whose answer was lost
    (a timeout). If the draft is still waiting to be posted, that card becomes its
    card (so no second one is posted); if a second card was posted meanwhile, the
    tapped copy is removed. The tap then acts as on the recorded card. (``_tap``
    checked that the message carries this tap's data and names this draft and
    version in its header: it is a copy of this draft's card, never another's.)"""
    if draft.status == Status.READY or (draft.status == Status.NOTIFIED and draft.approval_message_id is None):
        # A card of exactly this version exists (the tap came from it) though the
        # draft still waits to be posted: that card is its card. An older card
        # recorded for an earlier version does not change that.
        adopted: Draft = await ch.desk.adopt_card(draft, str(chat_id), str(mid))
        return adopted
    ref = card_ref(draft)
    if draft.approval_message_id is None or ref is None or ref == (chat_id, mid):
        return draft  # its own card, or a record that is not a Telegram card
    await ch.discard(PostedRef(str(chat_id), str(mid)), draft)
    return draft


# -- the families --------------------------------------------------------------------------------

async def _approve(ch: ChannelView, query: Any, cb: cards.Callback, draft: Draft, chat_id: int) -> str:
    """Approve & send, and ⚠️ Send anyway on the question Approve asks when the
    version's claims are not in its sources (``grounding: confirm``)."""
    if draft.status != Status.AWAITING:
        return already(draft)
    confirmed = cb.action in (cards.CONFIRM, *cards.CONFIRM_LATER)
    # A 🕘 Later choice is an approval with its send time; so is Send anyway after one.
    later = cards.later_of(cb.action)
    try:  # the draft read to check the tap goes with it: the decision does not read it again
        after = await ch.desk.approve(actor(query.from_user), draft.id, cb.version, draft,
                                      later=later, confirmed=confirmed)
    except NeedsConfirmation as exc:
        await _ask_confirmation(ch, query, draft, chat_id, exc.claims, later)
        return "⚠️ Not approved yet: some claims are not in the sources. Send anyway? " \
               "See the question under the card."
    if confirmed and query.message is not None:  # the question is answered: its button goes
        with contextlib.suppress(TelegramError):
            await ch.bot.edit_message_reply_markup(chat_id, query.message.message_id,
                                                   reply_markup=None)
    if after is not None and after.status == Status.AWAITING:  # the quorum is not met yet
        await ch.update(after)
        votes, quorum = await ch.desk.votes(after)
        return f"✅ Your approval counts ({len(votes)}/{quorum}); it sends at {quorum}."
    if (why := await _sent(ch, draft, after)) is not None or after is None:
        return why or ""
    if after.status == Status.APPROVED and after.send_after is not None:
        return f"✅ Approved. {cards.deferred_line(after, ch.timezone(after))} on the card stops it."
    return {Status.SENT: "✅ Sent.", Status.SEND_FAILED: "❌ Send failed; see the card.",
            Status.SEND_UNKNOWN: "❓ Send outcome unknown; see the card."}.get(
        Status(after.status), f"Approved ({after.status}).")


async def _ask_confirmation(ch: ChannelView, query: Any, draft: Draft, chat_id: int,
                            claims: list[str], later: str | None) -> None:
    """The question, as a reply to the tapped card, with its one button (which carries
    the 🕘 Later choice ``later`` that asked, if one did)."""
    question = cards.confirm_question(draft, claims, later)
    label, data = question.buttons[0][0]
    message = query.message
    await ch.bot.send_message(
        chat_id, question.text, parse_mode=ParseMode.HTML,
        reply_markup=InlineKeyboardMarkup([[InlineKeyboardButton(label, callback_data=data)]]),
        reply_to_message_id=message.message_id if message is not None else None,
        allow_sending_without_reply=True)


async def _sent(ch: ChannelView, draft: Draft, after: Draft | None) -> str | None:
    """After Approve or Retry send: why nothing happened (None: it did). A send's
    outcome is on the card already (the engine shows it); any other state is shown."""
    if after is None:
        return already(await ch.desk.draft(draft.id) or draft)
    # Status.SENDING: another host's send holds it and shows its outcome on the card; an edit
    # from here ("sending…") could reach Telegram after that one and hide it.
    if after.status not in (Status.SENT, Status.SEND_FAILED, Status.SEND_UNKNOWN, Status.SENDING):
        await ch.update(after)
    return None


async def _undo(ch: ChannelView, query: Any, cb: cards.Callback, draft: Draft, chat_id: int) -> str:
    """Undo a send that waits (the undo window): back to a decision, if not begun."""
    if draft.status != Status.APPROVED or draft.send_after is None:
        return already(draft)
    after = await ch.desk.undo(actor(query.from_user), draft.id, cb.version)
    if after is None:
        return "Too late: it is being sent." if (
            fresh := await ch.desk.draft(draft.id) or draft).status != Status.AWAITING \
            else already(fresh)
    done = "Cancelled" if cards.scheduled(draft) else "Undone"
    return f"↩️ {done}: nothing was sent; the card waits for a decision again."


async def _later(ch: ChannelView, query: Any, cb: cards.Callback, draft: Draft, chat_id: int) -> str:
    """🕘 Later: show the send times (or hide them again); a time approves with it."""
    if draft.status != Status.AWAITING:
        return already(draft)
    if cb.action in (cards.LATER, cards.LATER_BACK):
        await ch.later_menu(draft, cb.action == cards.LATER)
        return "🕘 When should it be sent?" if cb.action == cards.LATER else "Back to the card."
    return await _approve(ch, query, cb, draft, chat_id)


async def _prompt(ch: ChannelView, query: Any, cb: cards.Callback, draft: Draft, chat_id: int) -> str:
    """Edit / Regenerate / Reject: ask for the text (a reply to the prompt)."""
    if draft.status != Status.AWAITING:
        return already(draft)
    kind = {cards.EDIT: cards.PROMPT_EDIT, cards.REGENERATE: cards.PROMPT_REGENERATE,
            cards.REJECT: cards.PROMPT_REJECT}[cb.action]
    user, message = query.from_user, query.message
    who = f'<a href="tg://user?id={user.id}">{html.escape(user.first_name, quote=False)}</a>'
    prompt = await ch.bot.send_message(
        chat_id, cards.prompt_text(kind, draft, who), parse_mode=ParseMode.HTML,
        reply_markup=ForceReply(selective=True),
        reply_to_message_id=message.message_id if message is not None else None,
        allow_sending_without_reply=True)
    # The prompt is known by its message id from now on (and after a restart); its
    # text is never read back.
    await ch.desk.record_prompt(actor(user), chat_id, prompt.message_id,
                                cards.prompt_record(kind, draft.id, draft.version))
    return {cards.EDIT: "Reply to the prompt with the new text.",
            cards.REGENERATE: "Reply with an instruction, or /skip.",
            cards.REJECT: "Reply with a reason, or /skip."}[cb.action]


async def _retry(ch: ChannelView, query: Any, cb: cards.Callback, draft: Draft, chat_id: int) -> str:
    if draft.status not in (Status.SEND_FAILED, Status.SEND_UNKNOWN):
        return already(draft)
    after = await ch.desk.retry_send(actor(query.from_user), draft.id)
    if (why := await _sent(ch, draft, after)) is not None or after is None:
        return why or ""
    return "✅ Sent." if after.status == Status.SENT else f"Retried: {after.status}."


async def _unknown_send(ch: ChannelView, query: Any, cb: cards.Callback, draft: Draft,
                        chat_id: int) -> str:
    """Check again / Mark as sent on a card whose send's outcome is unknown."""
    if draft.status != Status.SEND_UNKNOWN:
        return already(draft)
    if cb.action == cards.MARK_SENT:
        after = await ch.desk.mark_sent(actor(query.from_user), draft.id)
        return "✅ Marked as sent." if after is not None else already(draft)
    found, note = await ch.desk.check_send(actor(query.from_user), draft.id)
    return note or already(found or draft)


async def _replay(ch: ChannelView, query: Any, cb: cards.Callback, draft: Draft, chat_id: int) -> str:
    if draft.status not in REPLAYABLE_STATUSES:
        return already(draft)
    result = await ch.desk.replay(actor(query.from_user), draft.pipeline, draft.item_id)
    if result.outcome != "requeued":
        return ops.format_replay(draft.pipeline, draft.item_id, result)
    if query.message is not None:  # its job is done: the button goes
        with contextlib.suppress(TelegramError):
            await ch.bot.edit_message_reply_markup(chat_id, query.message.message_id,
                                                   reply_markup=None)
    return f"♻️ #{draft.id} is back in the queue; the next tick drafts it."


async def _fyi(ch: ChannelView, query: Any, cb: cards.Callback, draft: Draft, chat_id: int) -> str:
    """Draft a reply / Dismiss on an FYI card (triage said notify)."""
    if draft.status != Status.NOTIFIED:
        return already(draft)
    who: Operator = actor(query.from_user)
    try:
        if cb.action == cards.DISMISS:
            after = await ch.desk.dismiss(who, draft.id, cb.version)
        else:
            after = await ch.desk.draft_reply(who, draft.id, cb.version)
    except DraftgateError as exc:  # budget spent, model hold: refused with the reason
        return str(exc).replace("Not regenerated", "Not drafted")
    if after is None:
        return already(await ch.desk.draft(draft.id) or draft)
    if cb.action == cards.DISMISS:
        return "👋 Dismissed."
    await ch.update(after)
    return "✍️ Drafting a reply; this card turns into it."


async def _files(ch: ChannelView, query: Any, cb: cards.Callback, draft: Draft, chat_id: int) -> str:
    """📎 Files: the mail's attachments as documents; one over Telegram's limit is named."""
    try:
        _, found = await ch.desk.files(actor(query.from_user), draft.id)
    except DraftgateError as exc:
        return f"📎 Not sent: {exc}"[:190]
    big = [f"{name} {cards.size_text(len(data))}" for name, data in found if len(data) > TELEGRAM_MAX]
    message = query.message
    for name, data in found:
        if len(data) <= TELEGRAM_MAX:
            await ch.bot.send_document(
                chat_id, io.BytesIO(data), filename=name, caption=f"📎 {cards.tag(draft)}",
                reply_to_message_id=message.message_id if message is not None else None,
                allow_sending_without_reply=True)
    sent = len(found) - len(big)
    note = f"📎 {sent} file{'s' if sent != 1 else ''} sent."
    if big:
        note += f" Over Telegram's 50 MB, not sent: {', '.join(big)}"
    return note[:190]


async def _attach(ch: ChannelView, query: Any, cb: cards.Callback, draft: Draft, chat_id: int) -> str:
    """📎 Attach: pages of the pipeline's files; a pick attaches it as a new version."""
    if draft.status != Status.AWAITING:
        return already(draft)
    names = ch.desk.attachable(draft.pipeline)
    if cb.action == cards.ATTACH_BACK:
        ch.attach_pages.pop(draft.id, None)
        await ch.later_menu(draft, False)
        return "Back to the card."
    if cb.action in (cards.ATTACH, cards.ATTACH_NEXT):
        page = ch.attach_pages.get(draft.id, -1) + 1 if cb.action == cards.ATTACH_NEXT else 0
        page = page if page * cards.ATTACH_PAGE < len(names) else 0
        ch.attach_pages[draft.id] = page
        await ch.later_menu(draft, True, cards.attach_buttons(draft, names, page))
        return "📎 Which file goes with the reply?" if names else "📎 The attachments folder is empty."
    index = ch.attach_pages.get(draft.id, 0) * cards.ATTACH_PAGE + cards.ATTACH_PICKS.index(cb.action)
    if index >= len(names):
        return "That file is not in the folder any more; tap 📎 Attach again."
    after = await ch.desk.attach(actor(query.from_user), draft.id, cb.version, names[index])
    ch.attach_pages.pop(draft.id, None)
    if after is None:
        return already(await ch.desk.draft(draft.id) or draft)
    return f"📎 {names[index]} attached: v{after.version} needs its own approval."[:190]


async def _full_text(ch: ChannelView, query: Any, cb: cards.Callback, draft: Draft, chat_id: int) -> str:
    message = query.message
    await ch.bot.send_document(
        chat_id, io.BytesIO(cards.full_text(draft).encode("utf-8")),
        filename=f"draft-{draft.id}-v{draft.version}.txt",
        caption=f"Full text of {cards.tag(draft)}",
        reply_to_message_id=message.message_id if message is not None else None,
        allow_sending_without_reply=True)
    return "Full text sent as a file."


_FAMILIES: list[tuple[tuple[str, ...], Decide]] = [
    ((cards.APPROVE, cards.CONFIRM, *cards.CONFIRM_LATER), _approve),
    ((cards.EDIT, cards.REGENERATE, cards.REJECT), _prompt),
    ((cards.RETRY,), _retry), ((cards.REPLAY,), _replay), ((cards.FULL_TEXT,), _full_text),
    ((cards.DRAFT_REPLY, cards.DISMISS), _fyi), ((cards.CHECK_SEND, cards.MARK_SENT), _unknown_send),
    ((cards.UNDO,), _undo), ((cards.LATER, cards.LATER_BACK, *cards.LATER_CHOICES), _later),
    ((cards.FILES,), _files),
    ((cards.ATTACH, cards.ATTACH_NEXT, cards.ATTACH_BACK, *cards.ATTACH_PICKS), _attach)]


def handlers() -> list[BaseHandler]:
    """One CallbackQueryHandler per action family, the catch-all for other data last;
    /skip and replies to prompts and cards."""
    taps: list[BaseHandler] = [
        CallbackQueryHandler(_family(decide), pattern=rf"^(?:{'|'.join(actions)}):")
        for actions, decide in _FAMILIES]
    taps.append(CallbackQueryHandler(notes.on_tap, pattern=notes.PATTERN))
    return taps + [CallbackQueryHandler(_family(_unknown)), CommandHandler("skip", skip),
                   MessageHandler(filters.REPLY & filters.TEXT & ~filters.COMMAND, on_reply)]
