"""The Telegram approval channel: cards with buttons, operator commands, notifications.

Runs python-telegram-bot inside the engine's event loop (``initialize``/``start``/
``updater.start_polling``, never ``run_polling``). What an operator can do:

* tap a card's buttons (``ap|ed|rg|rj|rt|ft:<id>:<version>``); every decision goes to
  the engine, whose store transitions are compare-and-set, so a double tap, two
  operators or a replayed update send at most one email. A tap acts only on the draft
  whose card (or notice) was tapped: data that is not on the tapped message is refused;
* tap Retry send / Replay under a notice in the ops chat (``rt``, ``rp``);
* reply to an Edit / Regenerate / Reject prompt (or to the card) with text; each
  prompt's message id is recorded in the store (audit), so this survives restarts and
  no other message, whatever its text, can pass for a prompt;
* ``/status /pending /replay /sweep /pause /resume /run /help``.

One gate in handler group -1 drops every update whose user is not in
``telegram.operators`` before any other handler sees it.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import hashlib
import html
import io
import json
import logging
from typing import Any

from telegram import (BotCommand, ForceReply, InlineKeyboardButton, InlineKeyboardMarkup,
                      LinkPreviewOptions, Update, User)
from telegram.constants import ParseMode
from telegram.error import BadRequest, Forbidden, InvalidToken, RetryAfter, TelegramError
from telegram.ext import (AIORateLimiter, Application, ApplicationBuilder,
                          ApplicationHandlerStop, CallbackQueryHandler, CommandHandler,
                          ContextTypes, MessageHandler, TypeHandler, filters)

from .. import ops
from ..config import Settings, TelegramConfig, env_secret
from ..errors import ApprovalError, ConfigError, DrafterError, DraftgateError
from ..models import (AWAITING, READY, REJECTED, REPLAYABLE_STATUSES, SEND_FAILED,
                      SEND_UNKNOWN, SENT, TERMINAL_STATUSES, Draft)
from ..stages import Decisions, PostedRef
from ..redact import scrub
from . import cards

log = logging.getLogger("draftgate.telegram")

COMMANDS: list[tuple[str, str, str]] = [
    # (command, arguments, description) -- the description goes to setMyCommands.
    ("status", "[pipeline]", "health of every pipeline, or one pipeline's recent runs"),
    ("pending", "", "drafts waiting for a decision"),
    ("replay", "<pipeline> <item_id>", "draft a failed, rejected, skipped or expired item again"),
    ("sweep", "[days]", "delete old seen marks, requeue expired leases, prune runs"),
    ("pause", "<pipeline>", "stop ticking a pipeline"),
    ("resume", "<pipeline>", "tick a paused pipeline again"),
    ("run", "<pipeline>", "run one tick of a pipeline now"),
    ("help", "", "what each command does"),
]
_USAGE = {name: f"Usage: /{name} {args}".rstrip() for name, args, _ in COMMANDS}

# Telegram's flood limits: ~30 messages/s per bot, 20/min per group. One message per
# 1/29 s with no burst keeps every one-second window at or under 30.
_OVERALL_RATE = 29.0
_MAX_RETRIES = 3  # RetryAfter only: by Telegram's contract a 429 delivered nothing
_NO_PREVIEW = LinkPreviewOptions(is_disabled=True)
_PLAIN_LIMIT = 4000


_MAX_RETRY_WAIT = 60.0  # longer flood waits are not slept through: the card waits in ready


class FloodWait(TelegramError):
    """Telegram asked for a pause longer than :data:`_MAX_RETRY_WAIT`."""


class _Limiter(AIORateLimiter):
    """PTB's limiter, except that a long RetryAfter (a flood ban) fails at once instead
    of holding every request, and the engine's tick, for minutes or hours."""

    async def process_request(self, callback, args, kwargs, endpoint, data, rate_limit_args):
        async def capped(*a: Any, **kw: Any) -> Any:
            try:
                return await callback(*a, **kw)
            except RetryAfter as exc:
                wait = getattr(exc, "_retry_after", None)  # the public one warns in 22.x
                seconds = wait.total_seconds() if isinstance(wait, dt.timedelta) else 0.0
                if seconds > _MAX_RETRY_WAIT:
                    raise FloodWait(f"Telegram flood control: retry in {seconds:.0f} s") from exc
                raise

        return await super().process_request(capped, args, kwargs, endpoint, data,
                                             rate_limit_args)


def create(settings: Settings, store: Any) -> "TelegramChannel":
    """Build the channel from settings (no I/O). Raises ConfigError naming what to fix."""
    if settings.telegram is None:
        raise ConfigError(f"{settings.file}: telegram: missing; add a telegram: section with "
                          f"token_env, operators and approvals_chat")
    return TelegramChannel(settings.telegram, store, settings)


def _chat_id(value: Any) -> int | None:
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value.strip())
    raise ValueError(value)


def _actor(user: User) -> str:
    return f"tg:{user.id} ({user.first_name})"


def _kind(update: Update) -> str:
    if update.callback_query is not None:
        return "callback_query"
    msg = update.effective_message
    if msg is not None:
        text = msg.text or ""
        return f"command {text.split()[0][:32]}" if text.startswith("/") else "message"
    return "update"


def _markup(card: cards.Card) -> InlineKeyboardMarkup | None:
    if not card.buttons:
        return None
    return InlineKeyboardMarkup([[InlineKeyboardButton(label, callback_data=data)
                                  for label, data in row] for row in card.buttons])


def _fingerprint(text: str, markup: InlineKeyboardMarkup | None) -> bytes:
    """What a card shows, small enough to remember for every card."""
    keys = json.dumps(markup.to_dict() if markup is not None else None, sort_keys=True)
    return hashlib.sha256(f"{text}\0{keys}".encode()).digest()


def _plain(text: str) -> str:
    """``text`` cut to fit a plain message, counted as Telegram counts (UTF-16 units)."""
    text = scrub(text)  # notices and error replies quote errors: no secret leaves in one
    if cards.units(text) <= _PLAIN_LIMIT:
        return text
    budget, used, end = _PLAIN_LIMIT - 20, 0, 0
    for end, ch in enumerate(text):
        used += 2 if ord(ch) > 0xFFFF else 1
        if used > budget:
            break
    return text[:end] + "\n… (cut)"


def _buttons_of(message: Any) -> set[str]:
    """The callback data on ``message``'s inline keyboard (as Telegram reports it)."""
    markup = getattr(message, "reply_markup", None)
    rows = getattr(markup, "inline_keyboard", None) or ()
    return {b.callback_data for row in rows for b in row if isinstance(b.callback_data, str)}


def _prompt_key(chat_id: int, message_id: int) -> str:
    """The audit key under which a prompt message's draft and version are recorded."""
    return f"prompt|{chat_id}|{message_id}"


def _card_ref(draft: Draft) -> tuple[int, int] | None:
    """(chat, message id) of the draft's Telegram card; None if it has none here (never
    posted, or decided elsewhere, e.g. ``draftgate review`` in a terminal)."""
    try:
        chat, mid = _chat_id(draft.approval_chat), int(draft.approval_message_id or "")
    except ValueError:
        return None
    return (chat, mid) if chat is not None else None


class TelegramChannel:
    """Approval channel ``telegram`` (see the module docstring)."""

    name = "telegram"

    def __init__(self, config: TelegramConfig, store: Any, settings: Settings, *,
                 token: str | None = None, reconnect_delay: float = 1.0,
                 answer_within: float = 4.0):
        self.config = config
        # A tap whose decision takes longer (a slow send) is answered at this point, so
        # the operator's spinner ends; the card then shows the outcome.
        self._answer_within = answer_within
        self.store = store
        self.settings = settings
        self._token = token or env_secret(config.token_env, "telegram.token_env")
        self._operators = frozenset(int(u) for u in config.operators)
        self._chats: dict[str, int] = {}
        problems = []
        for p in settings.pipelines:
            if p.approval.channel != "telegram":
                continue
            try:
                chat = _chat_id(p.approval.chat) or config.approvals_chat
            except ValueError:
                problems.append(f"{p.file}: approval.chat: expected a numeric Telegram chat id, "
                                f"got {p.approval.chat!r}")
                continue
            if chat is None:
                problems.append(f"{p.file}: approval.chat: missing; set it, or telegram."
                                f"approvals_chat in {settings.file}")
                continue
            self._chats[p.name] = chat
        if not self._operators:
            problems.append(f"{settings.file}: telegram.operators: expected at least one "
                            f"numeric user id; nobody could approve anything")
        if config.receive == "webhook":
            for key in ("url", "secret_env"):
                if not getattr(config.webhook, key):
                    problems.append(f"{settings.file}: telegram.webhook.{key}: required when "
                                    f"telegram.receive is webhook")
        if problems:
            raise ConfigError(problems)
        self._webhook_secret = (env_secret(str(config.webhook.secret_env),
                                           "telegram.webhook.secret_env")
                                if config.receive == "webhook" else None)
        self._ops_chat = config.ops_chat or config.approvals_chat
        self._reconnect_delay = reconnect_delay
        self._decisions: Decisions | None = None
        self._app: Application | None = None
        self._connected = False
        self._connect_task: asyncio.Task | None = None
        self._card_locks: dict[int, asyncio.Lock] = {}
        self._shown: dict[tuple[int, int], bytes] = {}  # fingerprint of each card's last edit

    # -- lifecycle -------------------------------------------------------------------
    def _build(self) -> Application:
        builder = (ApplicationBuilder().token(self._token)
                   .base_url(self.config.base_url).base_file_url(self.config.base_file_url)
                   .rate_limiter(_Limiter(overall_max_rate=1,
                                          overall_time_period=1 / _OVERALL_RATE,
                                          max_retries=_MAX_RETRIES))
                   .concurrent_updates(16).job_queue(None)
                   .connect_timeout(10).read_timeout(30).write_timeout(30).pool_timeout(30)
                   .get_updates_read_timeout(10))
        if self.config.receive == "off":
            builder = builder.updater(None)
        app = builder.build()
        # The gate runs first for every update; ApplicationHandlerStop ends it there.
        app.add_handler(TypeHandler(Update, self._gate), group=-1)
        app.add_handler(CallbackQueryHandler(self._on_callback))
        handlers = {"status": self._cmd_status, "pending": self._cmd_pending,
                    "replay": self._cmd_replay, "sweep": self._cmd_sweep,
                    "pause": self._cmd_pause, "resume": self._cmd_resume,
                    "run": self._cmd_run, "help": self._cmd_help, "start": self._cmd_help,
                    "skip": self._cmd_skip}
        for name, fn in handlers.items():
            app.add_handler(CommandHandler(name, fn))
        app.add_handler(MessageHandler(filters.REPLY & filters.TEXT & ~filters.COMMAND,
                                       self._on_reply))
        app.add_error_handler(self._on_error)
        return app

    async def start(self, decisions: Decisions) -> None:
        """Connect and start receiving updates. If Telegram cannot be reached, keep
        trying in the background: drafts wait in ``ready`` meanwhile."""
        self._decisions = decisions
        logging.getLogger("httpx").setLevel(max(logging.WARNING,
                                                logging.getLogger("httpx").level))
        self._app = self._build()
        try:
            await self._connect()
        except InvalidToken:
            # Retrying cannot help; say which variable holds the bad token. (PTB's own
            # message quotes the token, so it is never passed on.)
            await self._app.bot.shutdown()
            raise ConfigError(f"Telegram rejected the bot token in ${self.config.token_env}; "
                              f"check it with @BotFather (/token) and telegram.base_url") from None
        except TelegramError as exc:
            log.warning("Telegram is not reachable (%s); retrying in the background, "
                        "cards wait until then", exc)
            self._connect_task = asyncio.create_task(self._reconnect(), name="telegram-connect")

    async def _connect(self) -> None:
        app = self._app
        assert app is not None
        # Each step is skipped when an earlier attempt got past it, so a retry after a
        # failure half-way resumes instead of tripping over "already running".
        await app.initialize()
        await app.bot.set_my_commands([BotCommand(c, d) for c, _, d in COMMANDS])
        if not app.running:
            await app.start()
        if app.updater is None or app.updater.running:
            pass
        elif self.config.receive == "polling":
            await app.updater.start_polling(
                timeout=int(self.config.poll_timeout), drop_pending_updates=False,
                allowed_updates=["message", "callback_query"],
                error_callback=lambda exc: log.warning("Telegram polling: %s", exc))
        elif self.config.receive == "webhook":
            wh = self.config.webhook
            await app.updater.start_webhook(
                listen=wh.listen, port=wh.port, url_path=wh.path, webhook_url=str(wh.url),
                secret_token=self._webhook_secret,
                allowed_updates=["message", "callback_query"], drop_pending_updates=False)
        self._connected = True
        log.info("Telegram connected as @%s (receive: %s)", app.bot.username,
                 self.config.receive)

    async def _reconnect(self) -> None:
        delay = self._reconnect_delay
        while True:
            await asyncio.sleep(delay)
            try:
                await self._connect()
                return
            except InvalidToken:
                log.error("Telegram rejected the bot token in $%s; cards cannot be posted "
                          "until it is fixed and draftgate restarted", self.config.token_env)
                return
            except TelegramError as exc:
                delay = min(delay * 2, 60.0)
                log.warning("Telegram still not reachable (%s); next try in %.0fs", exc, delay)

    async def stop(self) -> None:
        """Stop receiving, let in-flight handlers finish their transitions, disconnect."""
        if self._connect_task is not None:
            self._connect_task.cancel()
            await asyncio.gather(self._connect_task, return_exceptions=True)
        app = self._app
        if app is None:
            return
        if app.updater is not None and app.updater.running:
            await app.updater.stop()
        if app.running:
            await app.stop()
        await app.shutdown()
        await app.bot.shutdown()  # closes HTTP clients of a bot that never got initialised
        self._connected = False

    @property
    def bot(self) -> Any:
        """The connected bot; ApprovalError while Telegram has not been reached."""
        if self._app is None or not self._connected:
            raise ApprovalError("Telegram is not connected yet; the draft waits in ready")
        return self._app.bot

    # -- ApprovalChannel ---------------------------------------------------------------
    def approvals_chat(self, pipeline: str) -> int:
        chat = self._chats.get(pipeline)
        if chat is None:
            try:
                p = self.settings.pipeline(pipeline)
                chat = _chat_id(p.approval.chat) or self.config.approvals_chat
            except (ConfigError, ValueError):
                chat = None
        if chat is None:
            raise ApprovalError(f"no approvals chat for pipeline {pipeline!r}; set approval.chat "
                                f"or telegram.approvals_chat")
        return chat

    def _lock(self, draft_id: int) -> asyncio.Lock:
        return self._card_locks.setdefault(draft_id, asyncio.Lock())

    async def post(self, draft: Draft) -> PostedRef:
        """Send the card (or edit the existing card for a new version)."""
        chat = self.approvals_chat(draft.pipeline)
        bot = self.bot
        card = cards.render_card(draft)
        markup = _markup(card)
        async with self._lock(draft.id):
            try:
                if draft.approval_message_id and _same_chat(draft.approval_chat, chat):
                    mid = int(draft.approval_message_id)
                    if await self._edit(chat, mid, card.text, markup, missing_ok=True):
                        return PostedRef(str(chat), str(mid))
                msg = await bot.send_message(chat, card.text, parse_mode=ParseMode.HTML,
                                             reply_markup=markup,
                                             link_preview_options=_NO_PREVIEW)
            except (RetryAfter, FloodWait, Forbidden) as exc:
                raise ApprovalError(f"Telegram refused the card for #{draft.id}: {exc}") from exc
            except BadRequest as exc:
                raise ApprovalError(f"Telegram rejected the card for #{draft.id} in chat {chat}: "
                                    f"{exc}") from exc
            except TelegramError as exc:  # NetworkError, TimedOut, 5xx
                raise ApprovalError(f"Telegram unreachable: {exc}") from exc
            self._shown[(chat, msg.message_id)] = _fingerprint(card.text, markup)
            return PostedRef(str(chat), str(msg.message_id))

    async def _reconcile(self, draft: Draft, chat_id: int, mid: int) -> Draft:
        """A tap on a card of this draft and version that is not its recorded card.
        That card exists because Telegram delivered a sendMessage whose answer was lost
        (a timeout). If the draft is still waiting to be posted, that card becomes its
        card (so no second one is posted); if a second card was posted meanwhile, the
        tapped copy is removed. The tap then acts as on the recorded card. (``_tap``
        checked that the message carries this tap's data and names this draft and
        version in its header: it is a copy of this draft's card, never another's.)"""
        if draft.status == READY:
            # A card of exactly this version exists (the tap came from it) though the
            # draft still waits to be posted: that card is its card. An older card
            # recorded for an earlier version does not change that.
            adopted = await self.store.mark_posted(draft.id, draft.version, str(chat_id),
                                                   str(mid))
            if adopted is None:
                return await self.store.get_draft(draft.id) or draft
            log.info("#%d: adopted card %s/%s, whose post had looked failed", draft.id,
                     chat_id, mid)
            return adopted
        if draft.approval_message_id is None:
            return draft
        ref = _card_ref(draft)
        if ref is None or ref == (chat_id, mid):
            return draft  # its own card, or a record that is not a Telegram card
        await self.discard(PostedRef(str(chat_id), str(mid)), draft)
        return draft

    async def discard(self, ref: PostedRef, draft: Draft) -> None:
        """Remove a second card of ``draft`` (``ref`` is not its recorded card): delete
        it, or, where Telegram no longer allows that (older than 48 hours), strip its
        buttons and say where the card is."""
        chat, mid = int(ref.chat), int(ref.message_id)
        try:
            await self.bot.delete_message(chat, mid)
            log.info("#%d: deleted a duplicate card %s/%s", draft.id, chat, mid)
            return
        except (TelegramError, ApprovalError) as exc:
            log.info("#%d: could not delete duplicate card %s/%s (%s); marking it", draft.id,
                     chat, mid, exc)
        try:
            await self._edit(chat, mid, f"Duplicate of the card of #{draft.id} (Telegram lost "
                             "the answer to the first post); use the other card.", None)
        except (TelegramError, ApprovalError) as exc:
            log.warning("#%d: could not mark duplicate card %s/%s: %s", draft.id, chat, mid, exc)

    async def on_posted(self, draft: Draft) -> None:
        """Called by the engine after ``mark_posted``: a status edit that raced the post
        is put right."""
        await self.update(draft)

    async def _edit(self, chat: int, mid: int, text: str, markup: Any, *,
                    missing_ok: bool = False) -> bool:
        """Edit a card; False if it is gone and ``missing_ok`` (post a new one then)."""
        if self._shown.get((chat, mid)) == _fingerprint(text, markup):
            return True
        try:
            await self.bot.edit_message_text(text, chat_id=chat, message_id=mid,
                                             parse_mode=ParseMode.HTML, reply_markup=markup,
                                             link_preview_options=_NO_PREVIEW)
        except BadRequest as exc:
            msg = str(exc).lower()
            if "not modified" in msg:
                pass
            elif missing_ok and ("not found" in msg or "can't be edited" in msg):
                log.info("card %s/%s is gone (%s); posting a new one", chat, mid, exc)
                return False
            else:
                raise
        self._shown[(chat, mid)] = _fingerprint(text, markup)
        return True

    async def update(self, draft: Draft) -> None:
        """Re-render a card from the draft's current state in the store, so edits that
        arrive out of order still end on the latest state. A failed edit marks the card
        stale in the store; :meth:`resync_cards` tries again on every tick."""
        await self._sync(draft)

    async def _sync(self, draft: Draft) -> bool:
        """:meth:`update`; False if the edit failed (the card is then marked stale)."""
        async with self._lock(draft.id):
            fresh = await self.store.get_draft(draft.id) or draft
            ref = _card_ref(fresh)
            ok = True
            if ref is not None:
                card = cards.render_status(fresh)
                chat, mid = ref
                try:
                    await self._edit(chat, mid, card.text, _markup(card))
                except BadRequest as exc:
                    text = str(exc).lower()
                    # A card that is gone cannot be put right by trying again.
                    if "not found" not in text and "can't be edited" not in text:
                        ok = False
                    log.warning("could not update the card of #%d: %s", draft.id, exc)
                except (TelegramError, ApprovalError) as exc:  # flood wait, network, 5xx
                    ok = False
                    log.warning("could not update the card of #%d (tried again on the next "
                                "tick): %s", draft.id, exc)
            if fresh.card_stale == ok:  # the flag changes: stale now, or put right
                try:
                    await self.store.mark_card_stale(fresh.id, not ok)
                except Exception as exc:
                    log.warning("could not record the card state of #%d: %s", draft.id, exc)
            if ok and fresh.status in TERMINAL_STATUSES:
                # Nothing moves this card any more; keep memory flat over months.
                self._card_locks.pop(draft.id, None)
            return ok

    async def resync_cards(self) -> None:
        """Re-render cards whose last edit failed (a long flood wait, a network error),
        so a decided draft does not keep its buttons. Called by the engine at start and
        on every tick; stops at the first failure, since Telegram is still in trouble."""
        if not self._connected:
            return
        for d in await self.store.stale_cards(limit=50):
            if not await self._sync(d):
                return

    async def notify(self, text: str, *, retry_draft: Draft | None = None) -> None:
        """A message to the ops chat. ``retry_draft`` is the draft the notice is about;
        a button moves it on: Retry send for a send that failed or whose outcome is
        unknown, Replay (as /replay) for a failed, rejected, skipped or expired draft."""
        chat = self._ops_chat
        if chat is None:
            log.warning("no telegram.ops_chat or approvals_chat; not sent: %s", text)
            return
        markup = None
        if retry_draft is not None and (button := cards.notice_button(retry_draft)) is not None:
            markup = InlineKeyboardMarkup([[InlineKeyboardButton(button[0],
                                                                 callback_data=button[1])]])
        try:
            await self.bot.send_message(chat, cards.notice_html(text), parse_mode=ParseMode.HTML,
                                        reply_markup=markup, link_preview_options=_NO_PREVIEW)
        except TelegramError as exc:
            raise ApprovalError(f"could not notify the ops chat: {exc}") from exc

    # -- the gate ------------------------------------------------------------------------
    async def _gate(self, update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
        """Drop every update whose user is not an operator, before any handler."""
        user = update.effective_user
        if user is not None and not user.is_bot and user.id in self._operators:
            return
        chat = update.effective_chat
        # Never log the text: it is whatever a stranger chose to send.
        log.warning("dropped %s from user %s in chat %s: not in telegram.operators",
                    _kind(update), user.id if user else None, chat.id if chat else None)
        if update.callback_query is not None:
            await self._answer(update.callback_query, "Not allowed.")
        raise ApplicationHandlerStop

    # -- buttons ---------------------------------------------------------------------------
    async def _answer(self, query: Any, text: str) -> None:
        try:
            await query.answer(text[:200])
        except TelegramError as exc:
            # A replayed update's query is too old to answer; nothing else to do.
            log.info("could not answer a callback query: %s", exc)

    async def _on_callback(self, update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
        """Every tap is answered, whatever happens."""
        query = update.callback_query
        task = asyncio.ensure_future(self._tap(query))
        try:
            notice = await asyncio.wait_for(asyncio.shield(task), self._answer_within)
        except asyncio.TimeoutError:
            await self._answer(query, "Working on it; the card shows the outcome.")
            try:
                await task
            except Exception:
                # The tap is answered already: say it in the chat, then let the error
                # handler log it.
                message = query.message
                if message is not None:
                    with contextlib.suppress(TelegramError, ApprovalError):
                        await self.bot.send_message(
                            message.chat.id, "⚠️ That tap did not go through (the error is "
                            "in the bot's log); the card shows where the draft stands.",
                            reply_to_message_id=message.message_id,
                            allow_sending_without_reply=True)
                raise
            return
        except BaseException:
            task.cancel()  # cancelled (shutdown): so is the decision, as without a wait
            await self._answer(query, "Something went wrong; it is in the bot's log.")
            raise
        await self._answer(query, notice)

    def _chat_allowed(self, draft: Draft, chat_id: int | None, action: str) -> bool:
        if chat_id is None:
            return False
        allowed = {self._chats.get(draft.pipeline)}
        if (ref := _card_ref(draft)) is not None:
            allowed.add(ref[0])
        if action in (cards.RETRY, cards.REPLAY):  # also from a notice in the ops chat
            allowed.add(self._ops_chat)
        allowed.discard(None)
        return chat_id in allowed

    async def _tap(self, query: Any) -> str:
        try:
            cb = cards.parse_callback(query.data)
        except cards.BadCallback as exc:
            log.info("ignored callback data from user %s: %s", query.from_user.id, exc)
            return str(exc)
        draft = await self.store.get_draft(cb.draft_id)
        message = query.message
        chat_id = message.chat.id if message is not None else None
        if draft is None or not self._chat_allowed(draft, chat_id, cb.action):
            # Same answer for both, so a tap cannot probe which ids exist elsewhere.
            return "This button does not belong to a draft of this chat."
        if cb.version != draft.version:  # (changes nothing, whichever message it came from)
            if cb.action == cards.REPLAY:
                return f"Already replayed: #{draft.id} is v{draft.version} now ({draft.status})."
            return f"Old version (v{cb.version}); the card now shows v{draft.version}."
        mid = message.message_id if message is not None else None
        on_card = _card_ref(draft) == (chat_id, mid)
        if not on_card and not self._ours(query, cb):
            # A client can send any data. Data that is not on the tapped message (e.g.
            # another draft's id on this card) must not act, nor make this card look
            # like a lost copy of that draft's card and get it deleted.
            log.info("ignored callback data from user %s: not on message %s/%s",
                     query.from_user.id, chat_id, mid)
            return "This button does not belong to this message; use the draft's own card."
        if not on_card and cb.action not in (cards.RETRY, cards.REPLAY):
            draft = await self._reconcile(draft, chat_id, mid)
        try:
            return await self._decide(query, cb, draft, chat_id)
        except ConfigError as exc:  # the draft's pipeline left the configuration
            return str(exc)

    @staticmethod
    def _ours(query: Any, cb: cards.Callback) -> bool:
        """Is the tapped message (not the draft's recorded card) one we made for this
        draft: a notice carrying this button, or a card of this draft and version whose
        post looked failed? Telegram reports the message's keyboard itself, so forged
        data is not on it; a card must also name this draft in its header."""
        message = query.message
        if message is None or query.data not in _buttons_of(message):
            return False
        if cb.action in (cards.RETRY, cards.REPLAY):
            return True
        return cards.parse_card_header(getattr(message, "text", None)) == (cb.draft_id,
                                                                            cb.version)

    async def _decide(self, query: Any, cb: cards.Callback, draft: Draft,
                      chat_id: int | None) -> str:
        message = query.message
        actor = _actor(query.from_user)
        decisions = self._decisions
        assert decisions is not None
        if cb.action == cards.APPROVE:
            if draft.status != AWAITING:
                return _already(draft)
            after = await decisions.approve(draft.id, cb.version, actor)
            if after is None:
                return _already(await self.store.get_draft(draft.id) or draft)
            await self.update(after)
            return {SENT: "✅ Sent.", SEND_FAILED: "❌ Send failed; see the card.",
                    SEND_UNKNOWN: "❓ Send outcome unknown; see the card."}.get(
                        after.status, f"Approved ({after.status}).")
        if cb.action in (cards.EDIT, cards.REGENERATE, cards.REJECT):
            if draft.status != AWAITING:
                return _already(draft)
            kind = {cards.EDIT: cards.PROMPT_EDIT, cards.REGENERATE: cards.PROMPT_REGENERATE,
                    cards.REJECT: cards.PROMPT_REJECT}[cb.action]
            who = f'<a href="tg://user?id={query.from_user.id}">' \
                  f'{html.escape(query.from_user.first_name, quote=False)}</a>'
            prompt = await self.bot.send_message(
                chat_id, cards.prompt_text(kind, draft, who), parse_mode=ParseMode.HTML,
                reply_markup=ForceReply(selective=True),
                reply_to_message_id=message.message_id if message is not None else None,
                allow_sending_without_reply=True)
            # The prompt is known by its message id from now on (and after a restart);
            # its text is never read back.
            await self.store.audit(actor, "prompt", draft_key=_prompt_key(chat_id,
                                                                          prompt.message_id),
                                   detail=cards.prompt_record(kind, draft.id, draft.version))
            return {cards.EDIT: "Reply to the prompt with the new text.",
                    cards.REGENERATE: "Reply with an instruction, or /skip.",
                    cards.REJECT: "Reply with a reason, or /skip."}[cb.action]
        if cb.action == cards.RETRY:
            if draft.status not in (SEND_FAILED, SEND_UNKNOWN):
                return _already(draft)
            after = await decisions.retry_send(draft.id, actor)
            if after is None:
                return _already(await self.store.get_draft(draft.id) or draft)
            await self.update(after)
            return {SENT: "✅ Sent."}.get(after.status, f"Retried: {after.status}.")
        if cb.action == cards.REPLAY:
            if draft.status not in REPLAYABLE_STATUSES:
                return _already(draft)
            result = await ops.replay(self.store, draft.pipeline, draft.item_id, actor,
                                      settings=self.settings)
            if result.outcome != "requeued":
                return ops.format_replay(draft.pipeline, draft.item_id, result)
            if message is not None:  # its job is done: the button goes
                with contextlib.suppress(TelegramError):
                    await self.bot.edit_message_reply_markup(chat_id, message.message_id,
                                                             reply_markup=None)
            return f"♻️ #{draft.id} is back in the queue; the next tick drafts it."
        if cb.action == cards.FULL_TEXT:
            content = cards.full_text(draft).encode("utf-8")
            await self.bot.send_document(
                chat_id, io.BytesIO(content), filename=f"draft-{draft.id}-v{draft.version}.txt",
                caption=f"Full text of {cards.tag(draft)}",
                reply_to_message_id=message.message_id if message is not None else None,
                allow_sending_without_reply=True)
            return "Full text sent as a file."
        return "Unknown action; use the latest card."

    # -- replies to prompts and cards ------------------------------------------------------
    async def _target(self, update: Update, context: ContextTypes.DEFAULT_TYPE
                      ) -> tuple[str, Draft] | None:
        msg = update.effective_message
        target = msg.reply_to_message if msg is not None else None
        if target is None or target.from_user is None or target.from_user.id != context.bot.id:
            return None
        parsed = await self._prompt_of(msg.chat_id, target)
        if parsed is None:
            await msg.reply_text(do_quote=True, text="Nothing changed: that message is not a "
                                 "draft's card or prompt. Tap ✏️ Edit on the card to change "
                                 "a draft.")
            return None
        kind, draft_id, version = parsed
        draft = await self.store.get_draft(draft_id)
        if draft is None or not self._chat_allowed(draft, msg.chat_id, cards.EDIT):
            await msg.reply_text(do_quote=True, text="That draft does not belong to this chat.")
            return None
        if version != draft.version:
            await msg.reply_text(do_quote=True, text=f"Not applied: {cards.tag(draft)} is the "
                                                     f"current version, you answered for "
                                                     f"v{version}.")
            return None
        if draft.status != AWAITING:
            await msg.reply_text(do_quote=True, text=f"Not applied: {_already(draft)}")
            return None
        return kind, draft

    async def _prompt_of(self, chat_id: int, target: Any) -> tuple[str, int, int] | None:
        """(kind, draft id, version) of the bot message replied to: a prompt recorded
        when it was sent, or a draft's recorded card (kind ``card`` = edit). What a
        message says is not enough: a notice can quote outside text that looks alike."""
        entries = await self.store.audit_log(draft_key=_prompt_key(chat_id, target.message_id),
                                             limit=1)
        if entries and (parsed := cards.parse_prompt_record(entries[0].detail)) is not None:
            return parsed
        named = cards.parse_card_header(target.text)
        if named is None:
            return None
        draft = await self.store.get_draft(named[0])
        if draft is None or _card_ref(draft) != (chat_id, target.message_id):
            return None
        return cards.PROMPT_CARD, named[0], named[1]

    async def _on_reply(self, update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
        """A reply to an Edit/Regenerate/Reject prompt, or to a card (= new text)."""
        found = await self._target(update, context)
        if found is None:
            return
        kind, draft = found
        await self._apply(update, kind, draft, update.effective_message.text or "")

    async def _cmd_skip(self, update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
        """/skip as the answer to a Regenerate or Reject prompt."""
        found = await self._target(update, context)
        if found is None:
            target = update.effective_message.reply_to_message
            if target is None or target.from_user is None or \
                    target.from_user.id != context.bot.id:  # else _target has answered
                await update.effective_message.reply_text(
                    do_quote=True, text="Send /skip as a reply to a Regenerate or Reject prompt.")
            return
        kind, draft = found
        if kind in (cards.PROMPT_EDIT, cards.PROMPT_CARD):
            await update.effective_message.reply_text(
                do_quote=True, text=f"An edit needs the new text; {cards.tag(draft)} is unchanged.")
            return
        await self._apply(update, kind, draft, "")

    async def _apply(self, update: Update, kind: str, draft: Draft, text: str) -> None:
        msg = update.effective_message
        actor = _actor(update.effective_user)
        decisions = self._decisions
        assert decisions is not None
        text = text.strip()
        editing = kind in (cards.PROMPT_EDIT, cards.PROMPT_CARD)
        if editing and not text:
            await msg.reply_text(do_quote=True, text="An empty text cannot replace a draft.")
            return
        try:
            if editing:
                after = await decisions.edit(draft.id, draft.version, text, actor)
                done = f"✏️ {cards.tag(after)} is on the card." if after else None
            elif kind == cards.PROMPT_REGENERATE:
                after = await decisions.regenerate(draft.id, draft.version, actor,
                                                   instruction=text)
                done = f"🔁 Regenerating as v{after.version}…" if after else None
            else:
                after = await decisions.reject(draft.id, draft.version, actor, reason=text)
                done = f"🗑 #{draft.id} rejected." if after else None
        except (ConfigError, DrafterError) as exc:  # pipeline gone; budget spent; model hold
            text = str(exc)
            await msg.reply_text(do_quote=True, text=_plain(
                text if text.startswith("Not ") else f"Not applied: {text}"))
            return
        if after is None:
            fresh = await self.store.get_draft(draft.id) or draft
            await msg.reply_text(do_quote=True, text=f"Not applied: {_already(fresh)}")
            return
        await self.update(after)
        await msg.reply_text(do_quote=True, text=done)

    # -- commands ----------------------------------------------------------------------------
    @property
    def _engine(self) -> Any:
        """The engine's operator controls (pause/resume/run_now), beyond Decisions."""
        return self._decisions

    async def _reply(self, update: Update, text: str, *, pre: bool = False) -> None:
        msg = update.effective_message
        if pre:
            body, _ = cards.clip(text, cards.MAX_TEXT - 20, ellipsis="\n… (cut)")
            await msg.reply_text(do_quote=True, text=f"<pre>{body}</pre>",
                                 parse_mode=ParseMode.HTML)
        else:
            await msg.reply_text(do_quote=True, text=_plain(text),
                                 link_preview_options=_NO_PREVIEW)

    def _known(self, name: str) -> str | None:
        """None if ``name`` is a pipeline, else the message listing the known ones."""
        try:
            self.settings.pipeline(name)
            return None
        except ConfigError as exc:
            return str(exc)

    async def _cmd_status(self, update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
        """/status [pipeline]"""
        args = context.args or []
        if len(args) > 1:
            return await self._reply(update, _USAGE["status"])
        if args:
            if (problem := self._known(args[0])) is not None:
                return await self._reply(update, problem)
            detail = await ops.status_one(self.store, self.settings, args[0])
            return await self._reply(update, ops.format_status_one(detail), pre=True)
        items = await ops.status_all(self.store, self.settings)
        await self._reply(update, ops.format_status_all(items), pre=True)

    async def _cmd_pending(self, update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
        """/pending"""
        if context.args:
            return await self._reply(update, _USAGE["pending"])
        drafts = await ops.pending(self.store, self.settings)
        if not drafts:
            return await self._reply(update, ops.format_pending(drafts))
        lines, used = [], 0
        for d in drafts:
            line = html.escape(ops.format_pending([d], self.settings), quote=False)
            link = _card_link(d)
            if link:
                line += f' · <a href="{link}">open card</a>'
            used += cards.units(line) + 1
            if used > cards.MAX_TEXT - 60:
                lines.append(f"… and {len(drafts) - len(lines)} more")
                break
            lines.append(line)
        await update.effective_message.reply_text(
            "\n".join(lines), parse_mode=ParseMode.HTML, do_quote=True,
            link_preview_options=_NO_PREVIEW)

    async def _cmd_replay(self, update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
        """/replay <pipeline> <item_id> (the item id may contain spaces, e.g. a slot)"""
        args = context.args or []
        if len(args) < 2:
            return await self._reply(update, _USAGE["replay"])
        # Split once on the raw text, so an id with spaces stays whole.
        text = (update.effective_message.text or "").split(None, 1)[1]
        name, item_id = text.split(None, 1)
        item_id = item_id.strip()
        if (problem := self._known(name)) is not None:
            return await self._reply(update, problem)
        result = await ops.replay(self.store, name, item_id, _actor(update.effective_user),
                                  settings=self.settings)
        await self._reply(update, ops.format_replay(name, item_id, result))

    async def _cmd_sweep(self, update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
        """/sweep [days]"""
        args = context.args or []
        days: float | None = None
        if len(args) > 1:
            return await self._reply(update, _USAGE["sweep"])
        if args:
            try:
                days = float(args[0])
            except ValueError:
                days = -1.0
            if not 0 < days < 100_000:
                return await self._reply(update, _USAGE["sweep"] + " (days: a positive number)")
        result = await self._engine.sweep(days)  # the engine also clears expired cards
        await self._reply(update, ops.format_sweep(result))

    async def _control(self, update: Update, context: ContextTypes.DEFAULT_TYPE,
                       command: str) -> str | None:
        args = context.args or []
        if len(args) != 1:
            await self._reply(update, _USAGE[command])
            return None
        if (problem := self._known(args[0])) is not None:
            await self._reply(update, problem)
            return None
        return args[0]

    async def _cmd_pause(self, update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
        """/pause <pipeline>"""
        if (name := await self._control(update, context, "pause")) is None:
            return
        await self._engine.pause(name, _actor(update.effective_user))
        await self._reply(update, f"⏸ {name} paused; /resume {name} starts it again.")

    async def _cmd_resume(self, update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
        """/resume <pipeline>"""
        if (name := await self._control(update, context, "resume")) is None:
            return
        await self._engine.resume(name, _actor(update.effective_user))
        await self._reply(update, f"▶️ {name} resumed.")

    async def _cmd_run(self, update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
        """/run <pipeline>"""
        if (name := await self._control(update, context, "run")) is None:
            return
        await self._reply(update, f"▶️ running {name} now…")
        counts = await self._engine.run_now(name)
        c = counts.to_dict()
        await self._reply(update, f"{name}: " + " ".join(f"{k} {v}" for k, v in c.items()))

    async def _cmd_help(self, update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
        """/help"""
        lines = ["draftgate: every draft arrives as a card; nothing is sent until an "
                 "operator taps ✅ Approve & send. Reply to a card with new text to edit it.", ""]
        lines += [f"/{c} {a}".rstrip() + f" — {d}" for c, a, d in COMMANDS]
        await self._reply(update, "\n".join(lines))

    # -- errors --------------------------------------------------------------------------------
    async def _on_error(self, update: object, context: ContextTypes.DEFAULT_TYPE) -> None:
        """Log first, then tell the operator briefly (never the details)."""
        kind = _kind(update) if isinstance(update, Update) else "no update"
        log.error("handling %s failed", kind, exc_info=context.error)
        if not isinstance(update, Update) or update.callback_query is not None:
            return  # taps were already answered
        user, chat = update.effective_user, update.effective_chat
        if chat is None or user is None or user.id not in self._operators:
            return
        what = str(context.error) if isinstance(context.error, DraftgateError) else \
            type(context.error).__name__
        try:
            await context.bot.send_message(chat.id, _plain(f"⚠️ That failed ({what}); the "
                                                           f"details are in the bot's log."))
        except TelegramError:
            log.warning("could not tell the operator about the error")


def _card_link(draft: Draft) -> str | None:
    """A t.me link to the card; only supergroup and channel messages have one."""
    chat = str(draft.approval_chat or "")
    if draft.approval_message_id and chat.startswith("-100") and chat[4:].isdigit():
        return f"https://t.me/c/{chat[4:]}/{draft.approval_message_id}"
    return None


def _same_chat(a: Any, b: int) -> bool:
    try:
        return a is not None and int(a) == int(b)
    except (TypeError, ValueError):
        return False


def _already(draft: Draft) -> str:
    who = cards.actor_name(draft.decided_by)
    s = draft.status
    if s == SENT:
        return f"Already decided: sent by {who}."
    if s == REJECTED:
        return f"Already decided: rejected by {who}."
    if s in ("approved", "sending"):
        return f"Already approved by {who}; sending."
    if s in (SEND_FAILED, SEND_UNKNOWN):
        return f"Already approved by {who}; the send needs attention (see the card)."
    if s in ("queued", "drafting"):
        return "Being regenerated; wait for the new version."
    if s == "ready":
        return "A new version is being posted; use the updated card."
    return f"Nothing to do: the draft is {s}."


async def doctor(settings: Settings) -> list[tuple[str, bool, str]]:
    """For ``draftgate doctor``: the token is set and the bot answers getMe."""
    if settings.telegram is None:
        return []
    from telegram import Bot

    cfg = settings.telegram
    try:
        token = env_secret(cfg.token_env, "telegram.token_env")
    except ConfigError as exc:
        return [("telegram", False, str(exc))]
    bot = Bot(token, base_url=cfg.base_url, base_file_url=cfg.base_file_url)
    try:
        await bot.initialize()
        me = bot.bot
    except InvalidToken:  # its message quotes the token: never shown
        return [("telegram", False, f"Telegram rejected the token in ${cfg.token_env}; check "
                                    f"it with @BotFather")]
    except TelegramError as exc:
        return [("telegram", False, f"getMe failed: {exc} (check telegram.base_url and the "
                                    f"network)")]
    finally:
        await bot.shutdown()
    return [("telegram", True, f"@{me.username}, operators {len(cfg.operators)}")]
