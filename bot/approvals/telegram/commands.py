"""The operator commands /status /pending /replay /stats /sweep /audit /pause /resume /run /help: each
parses its arguments (a bad one gets a usage line), asks the operator desk (which checks
who may do it, audits a refusal, and is the only way to change state), and replies."""

from __future__ import annotations

import asyncio
import functools
import html
from typing import Any, Callable, Coroutine

from telegram import Update
from telegram.constants import ParseMode
from telegram.ext import BaseHandler, CommandHandler

from ...desk import reports as ops
from ...desk import stats as desk_stats
from ...errors import ConfigError, DrafterError, NotAllowed
from ...models import Draft
from .. import cards
from .common import NO_PREVIEW, Context, channel_of, message_of, operator, reply

COMMANDS: list[tuple[str, str, str]] = [
    # (command, arguments, description) -- the description goes to setMyCommands.
    ("status", "[pipeline]", "health of every pipeline, or one pipeline's recent runs"),
    ("pending", "", "drafts waiting for a decision"),
    ("replay", "<pipeline> <item_id>", "draft a failed, rejected, skipped, dismissed or expired item again"),
    ("reply", "<pipeline> <item_id> [instruction]",
     "draft a reply to any admitted item now (also a skipped one), with an instruction"),
    ("emails", "<pipeline> [n]", "the newest admitted items with their ids, status and subject"),
    ("stats", "[pipeline]", "the scoreboard of the last 30 days: a chart and a summary"),
    ("sweep", "[days]", "delete old seen marks, requeue expired leases, prune runs"),
    ("audit", "<pipeline> <item_id>", "one item's history: admitted, drafted, approved, sent"),
    ("pause", "<pipeline>", "stop ticking a pipeline"),
    ("resume", "<pipeline>", "tick a paused pipeline again"),
    ("run", "<pipeline>", "run one tick of a pipeline now"),
    ("help", "", "what each command does"),
]
_USAGE = {name: f"Usage: /{name} {args}".rstrip() for name, args, _ in COMMANDS}

def _unknown(context: Context, name: str) -> str | None:
    """None if ``name`` is a pipeline, else the message listing the known ones."""
    try:
        channel_of(context).settings.pipeline(name)
        return None
    except ConfigError as exc:
        return str(exc)


async def status(update: Update, context: Context) -> None:
    """/status [pipeline]"""
    ch, args = channel_of(context), context.args or []
    if len(args) > 1:
        return await reply(update, _USAGE["status"])
    if args:
        if (problem := _unknown(context, args[0])) is not None:
            return await reply(update, problem)
        detail = await ch.desk.status_of(operator(update), args[0])
        return await reply(update, ch.held_line() + ops.format_status_one(detail), pre=True)
    items = await ch.desk.status(operator(update))
    await reply(update, ch.held_line() + ops.format_status_all(items), pre=True)


async def pending(update: Update, context: Context) -> None:
    """/pending"""
    if context.args:
        return await reply(update, _USAGE["pending"])
    ch = channel_of(context)
    drafts, total = await ch.desk.pending(operator(update))
    if not drafts:
        return await reply(update, ops.format_pending(drafts))
    lines: list[str] = []
    used = 0
    for d in drafts:
        line = html.escape(ops.format_pending([d], ch.settings), quote=False)
        if link := card_link(d):
            line += f' · <a href="{link}">open card</a>'
        used += cards.units(line) + 1
        if used > cards.MAX_TEXT - 100:  # room for the line that says how many more
            break
        lines.append(line)
    if more := ops.more_line(len(lines), total):
        head, command, tail = html.escape(more, quote=False).split("`")
        lines.append(f"{head}<code>{command}</code>{tail}")
    await message_of(update).reply_text("\n".join(lines), parse_mode=ParseMode.HTML,
                                              do_quote=True, link_preview_options=NO_PREVIEW)


async def replay(update: Update, context: Context) -> None:
    """/replay <pipeline> <item_id> (the item id may contain spaces, e.g. a slot)"""
    if (found := _pipeline_and_item(update, context)) is None:
        return await reply(update, _USAGE["replay"])
    name, item_id = found
    if (problem := _unknown(context, name)) is not None:
        return await reply(update, problem)
    result = await channel_of(context).desk.replay(operator(update), name, item_id)
    await reply(update, ops.format_replay(name, item_id, result))


async def reply_cmd(update: Update, context: Context) -> None:
    """/reply <pipeline> <item_id> [instruction]"""
    parts = (message_of(update).text or "").split(None, 3)[1:]
    if len(parts) < 2:
        return await reply(update, _USAGE["reply"])
    name, item_id, instruction = parts[0], parts[1], (parts[2] if len(parts) > 2 else "")
    if (problem := _unknown(context, name)) is not None:
        return await reply(update, problem)
    try:
        text = await channel_of(context).desk.reply(operator(update), name, item_id,
                                                    instruction.strip())
    except DrafterError as exc:  # budget spent, model hold
        text = str(exc)
    await reply(update, text)


async def emails(update: Update, context: Context) -> None:
    """/emails <pipeline> [n]"""
    args = context.args or []
    n = args[1] if len(args) == 2 else "10"
    if not 1 <= len(args) <= 2 or not n.isdigit() or not 1 <= int(n) <= ops.MAX_EMAILS:
        return await reply(update, _USAGE["emails"] + f" (n: 1 to {ops.MAX_EMAILS})")
    if (problem := _unknown(context, args[0])) is not None:
        return await reply(update, problem)
    found = await channel_of(context).desk.emails(operator(update), args[0], int(n))
    await reply(update, ops.format_emails(args[0], found), pre=True)


async def stats(update: Update, context: Context) -> None:
    """/stats [pipeline]: the chart (drawn in a worker thread: taps go on meanwhile) with
    the summary as its caption."""
    args = context.args or []
    if len(args) > 1:
        return await reply(update, _USAGE["stats"])
    if args and (problem := _unknown(context, args[0])) is not None:
        return await reply(update, problem)
    ch = channel_of(context)
    board = await ch.desk.stats(operator(update), args[0] if args else None)
    png = await asyncio.to_thread(ch.render_chart, board)
    await message_of(update).reply_photo(png, caption=desk_stats.summary(board)[:1024],
                                         do_quote=True)


def _pipeline_and_item(update: Update, context: Context) -> tuple[str, str] | None:
    """``<pipeline> <item_id>`` of /replay and /audit, split once on the raw text so an
    id with spaces (a slot) stays whole; None when either is missing."""
    if len(context.args or []) < 2:
        return None
    name, item_id = (message_of(update).text or "").split(None, 1)[1].split(None, 1)
    return name, item_id.strip()


async def audit(update: Update, context: Context) -> None:
    """/audit <pipeline> <item_id>"""
    if (found := _pipeline_and_item(update, context)) is None:
        return await reply(update, _USAGE["audit"])
    name, item_id = found
    if (problem := _unknown(context, name)) is not None:
        return await reply(update, problem)
    history = await channel_of(context).desk.history(operator(update), name, item_id)
    await reply(update, ops.format_history(history))


async def sweep(update: Update, context: Context) -> None:
    """/sweep [days]"""
    args, days = context.args or [], None
    if len(args) > 1:
        return await reply(update, _USAGE["sweep"])
    if args:
        try:
            days = float(args[0])
        except ValueError:
            days = -1.0
        if not 0 < days < 100_000:
            return await reply(update, _USAGE["sweep"] + " (days: a positive number)")
    result = await channel_of(context).desk.sweep(operator(update), days)  # clears expired cards
    await reply(update, ops.format_sweep(result))


async def _pipeline_arg(update: Update, context: Context, command: str) -> str | None:
    """The one argument of /pause /resume /run, a configured pipeline; else None
    (the operator has been told why)."""
    args = context.args or []
    if len(args) != 1:
        await reply(update, _USAGE[command])
        return None
    if (problem := _unknown(context, args[0])) is not None:
        await reply(update, problem)
        return None
    return args[0]


async def pause(update: Update, context: Context) -> None:
    """/pause <pipeline>"""
    if (name := await _pipeline_arg(update, context, "pause")) is None:
        return
    await channel_of(context).desk.pause(operator(update), name)
    await reply(update, f"⏸ {name} paused; /resume {name} starts it again.")


async def resume(update: Update, context: Context) -> None:
    """/resume <pipeline>"""
    if (name := await _pipeline_arg(update, context, "resume")) is None:
        return
    await channel_of(context).desk.resume(operator(update), name)
    await reply(update, f"▶️ {name} resumed.")


async def run(update: Update, context: Context) -> None:
    """/run <pipeline>"""
    if (name := await _pipeline_arg(update, context, "run")) is None:
        return
    desk = channel_of(context).desk
    await desk.authorize(operator(update), name, "run")  # refused before "running" is said
    await reply(update, f"▶️ running {name} now…")
    counts = (await desk.run_now(operator(update), name)).to_dict()
    await reply(update, f"{name}: " + " ".join(f"{k} {v}" for k, v in counts.items()))


async def help_(update: Update, context: Context) -> None:
    """/help (and /start)"""
    lines = ["draftgate: every draft arrives as a card; nothing is sent until an "
             "operator taps ✅ Approve & send. Reply to a card with new text to edit it.", ""]
    lines += [f"/{c} {a}".rstrip() + f" — {d}" for c, a, d in COMMANDS]
    await reply(update, "\n".join(lines))


def handlers() -> list[BaseHandler]:
    """One CommandHandler per command (/start is /help)."""
    table = {"status": status, "pending": pending, "replay": replay, "sweep": sweep,
             "reply": reply_cmd, "emails": emails, "audit": audit, "stats": stats,
             "pause": pause, "resume": resume, "run": run, "help": help_, "start": help_}
    return [CommandHandler(name, _refused(fn)) for name, fn in table.items()]


Handler = Callable[[Update, Context], Coroutine[Any, Any, None]]


def _refused(fn: Handler) -> Handler:
    """``fn``, answering a refusal of the desk (NotAllowed: audited there, nothing
    changed) with its reason."""
    @functools.wraps(fn)
    async def handler(update: Update, context: Context) -> None:
        try:
            await fn(update, context)
        except NotAllowed as exc:
            await reply(update, str(exc))
    return handler


def card_link(draft: Draft) -> str | None:
    """A t.me link to the card; only supergroup and channel messages have one."""
    chat = str(draft.approval_chat or "")
    if draft.approval_message_id and chat.startswith("-100") and chat[4:].isdigit():
        return f"https://t.me/c/{chat[4:]}/{draft.approval_message_id}"
    return None
