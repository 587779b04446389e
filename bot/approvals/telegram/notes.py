"""The card of a style notes proposal (issue 25) and what an operator does with it:
Approve, Edit (a reply with the rules, one per line) or Reject, through the desk's
compare-and-set decisions, like a draft's card.

``callback_data`` is ``sna|sne|snr:<notes id>:<8 hex of the rules' sha256>`` (at most
31 bytes): a tap acts only on the rules the card showed; after an edit the old buttons
are refused with a notice. A tap is accepted only on the proposal's own card.
"""

from __future__ import annotations

import hashlib
import html
import re
from typing import Any

from telegram import ForceReply, InlineKeyboardButton, InlineKeyboardMarkup, Update
from telegram.constants import ParseMode
from telegram.error import BadRequest, TelegramError

from ...errors import ApprovalError, NotAllowed
from ...models import StyleNotes
from ...stages import PostedRef
from .common import Context, actor, answer, channel_of, log, message_of, operator

APPROVE, EDIT, REJECT = "sna", "sne", "snr"
PATTERN = r"^sn[aer]:"
_DATA = re.compile(r"(sna|sne|snr):([1-9][0-9]{0,17}):([0-9a-f]{8})")
_RECORD = re.compile(r"notes:([1-9][0-9]{0,17}):([0-9a-f]{8})")
MAX_RULES, MAX_RULE = 10, 200
_DONE = {"approved": "✅ Approved by {who}: this pipeline's drafts follow these rules.",
         "rejected": "🗑 Rejected by {who}: no draft is given them.",
         "superseded": "Superseded by a newer version."}


def digest(rules: list[str]) -> str:
    return hashlib.sha256("\n".join(rules).encode()).hexdigest()[:8]


def render(n: StyleNotes) -> tuple[str, InlineKeyboardMarkup | None]:
    lines = [f"📝 <b>{html.escape(n.pipeline)}</b>: style notes v{n.version}, learned from "
             f"the team's edits", ""]
    lines += [f"{i}. {html.escape(r)}" for i, r in enumerate(n.rules, 1)]
    lines.append("")
    if n.status != "proposed":
        lines.append(html.escape(_DONE.get(n.status, n.status).format(who=n.decided_by or "?")))
        return "\n".join(lines), None
    lines.append("Approve adds them to this pipeline's drafting instructions (in place of "
                 "any approved before); Edit: reply with the rules, one per line.")
    h = digest(n.rules)
    return "\n".join(lines), InlineKeyboardMarkup([[
        InlineKeyboardButton("✅ Approve", callback_data=f"{APPROVE}:{n.id}:{h}"),
        InlineKeyboardButton("✏️ Edit", callback_data=f"{EDIT}:{n.id}:{h}"),
        InlineKeyboardButton("🗑 Reject", callback_data=f"{REJECT}:{n.id}:{h}")]])


async def post(ch: Any, n: StyleNotes) -> PostedRef:
    text, markup = render(n)
    chat = ch.approvals_chat(n.pipeline)
    try:
        msg = await ch.bot.send_message(chat, text, parse_mode=ParseMode.HTML, reply_markup=markup)
    except TelegramError as exc:
        raise ApprovalError(f"Telegram refused the style notes card: {exc}") from exc
    return PostedRef(str(chat), str(msg.message_id))


async def update(ch: Any, n: StyleNotes) -> None:
    if not n.approval_chat or not n.approval_message_id:
        return
    text, markup = render(n)
    try:
        await ch.bot.edit_message_text(text, chat_id=int(n.approval_chat),
                                       message_id=int(n.approval_message_id),
                                       parse_mode=ParseMode.HTML, reply_markup=markup)
    except BadRequest as exc:
        if "not modified" not in str(exc).lower():
            log.warning("style notes v%d: card not updated: %s", n.version, exc)
    except (TelegramError, ApprovalError) as exc:
        log.warning("style notes v%d: card not updated: %s", n.version, exc)


async def on_tap(update_: Update, context: Context) -> None:
    query = update_.callback_query
    await answer(query, await _tap(channel_of(context), query))


async def _tap(ch: Any, query: Any) -> str:
    m = _DATA.fullmatch(query.data or "")
    if m is None:
        return "Unknown action; use the latest card."
    action, note_id, h = m.group(1), int(m.group(2)), m.group(3)
    n = await ch.desk.notes(note_id)
    message = query.message
    if n is None or message is None or (str(message.chat.id), str(message.message_id)) != (
            n.approval_chat, n.approval_message_id):
        return "This button does not belong to this card."
    if n.status != "proposed":
        return f"Already {n.status}" + (f" by {n.decided_by}." if n.decided_by else ".")
    if h != digest(n.rules):
        return "The rules changed since; the card shows the new ones."
    who = actor(query.from_user)
    try:
        if action == EDIT:
            await ch.desk.authorize(who, n.pipeline, f"style notes edit v{n.version}",
                                    key=n.key, deciding=True)
            prompt = await ch.bot.send_message(
                message.chat.id, f"✏️ Reply to this message with the style notes for "
                f"{n.pipeline} v{n.version}, one rule per line (at most {MAX_RULES}).",
                reply_markup=ForceReply(selective=True))
            await ch.desk.record_prompt(who, message.chat.id, prompt.message_id,
                                        f"notes:{n.id}:{h}")
            return "Reply to the prompt with the rules."
        after = await ch.desk.decide_notes(who, n.id, "approved" if action == APPROVE
                                           else "rejected")
    except NotAllowed as exc:
        return str(exc)
    if after is None:
        return "Already decided."
    await update(ch, after)
    return "Approved: drafts follow these rules now." if action == APPROVE else "Rejected."


def parse_rules(text: str) -> list[str]:
    """An operator's rules: one per line, a leading "-", "*" or "3." dropped."""
    rules: list[str] = []
    for line in text.splitlines():
        rule = " ".join(re.sub(r"^\s*(?:[-*•]|\d{1,2}[.)])\s*", "", line).split())[:MAX_RULE]
        if rule and rule not in rules:
            rules.append(rule)
    return rules


async def on_reply(update_: Update, context: Context) -> bool:
    """A reply to a style notes Edit prompt: the card's rules replaced (still to be
    approved). False when the reply is not one (the draft prompts' handler goes on)."""
    ch, msg = channel_of(context), message_of(update_)
    target = msg.reply_to_message
    if target is None or target.from_user is None or target.from_user.id != context.bot.id:
        return False
    m = _RECORD.fullmatch(await ch.desk.prompt_record(msg.chat_id, target.message_id) or "")
    if m is None:
        return False
    n = await ch.desk.notes(int(m.group(1)))
    rules = parse_rules(msg.text or "")
    if n is None or n.status != "proposed" or digest(n.rules) != m.group(2):
        problem = "Not applied: that proposal was decided or changed since."
    elif not rules or len(rules) > MAX_RULES:
        problem = f"Not applied: send 1 to {MAX_RULES} rules, one per line."
    else:
        try:
            after = await ch.desk.decide_notes(operator(update_), n.id, "proposed", rules)
        except NotAllowed as exc:
            problem = str(exc)
        else:
            if after is not None:
                await update(ch, after)
                await msg.reply_text(do_quote=True, text=f"✏️ v{n.version} now has "
                                     f"{len(rules)} rule(s); approve them on the card.")
                return True
            problem = "Not applied: that proposal was decided since."
    await msg.reply_text(do_quote=True, text=problem)
    return True
