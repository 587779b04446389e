"""The Telegram approval channel: connects, posts cards, keeps them true, notifies.

Runs python-telegram-bot inside the engine's event loop (``initialize``/``start``/
``updater.start_polling``, never ``run_polling``). Taps and replies are handled in
:mod:`.taps`, commands in :mod:`.commands`, behind one gate (handler group -1) that
drops every update whose user is not in ``telegram.operators``. Handlers act through
the operator desk (``self.desk``), never the store.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
from typing import Any, Callable

from telegram import BotCommand, InlineKeyboardButton, InlineKeyboardMarkup, Update
from telegram.constants import ParseMode
from telegram.error import BadRequest, Forbidden, InvalidToken, RetryAfter, TelegramError
from telegram.ext import (
    Application,
    ApplicationBuilder,
    ApplicationHandlerStop,
    TypeHandler,
)

from ...config.load import Settings, TelegramConfig, env_secret
from ...desk.desk import OperatorDesk
from ...errors import ApprovalError, ConfigError, DraftgateError, StoreUnavailable
from ...models import TERMINAL_STATUSES, Draft, StyleNotes
from ...service import metrics
from ...stages import PostedRef
from .. import cards
from ..base import DeskChannel
from . import chart, notes, webhook
from . import commands as tg_commands
from . import request as tg_request
from . import taps as tg_taps
from .commands import COMMANDS
from .common import CONTEXT_TYPES, NO_PREVIEW, Context, answer, card_ref, chat_id, kind, log, plain
from .limits import _MAX_RETRIES, _OVERALL_RATE, FloodWait, _Limiter
from .webhook import WebhookReceiver


def create(settings: Settings) -> "TelegramChannel":
    """Build the channel from settings (no I/O). Raises ConfigError naming what to fix."""
    if settings.telegram is None:
        raise ConfigError(f"{settings.file}: telegram: missing; add a telegram: section with "
                          f"token_env, operators and approvals_chat")
    return TelegramChannel(settings.telegram, settings)


def _markup(card: cards.Card) -> InlineKeyboardMarkup | None:
    if not card.buttons:
        return None
    return InlineKeyboardMarkup([[InlineKeyboardButton(label, callback_data=data)
                                  for label, data in row] for row in card.buttons])


def _fingerprint(text: str, markup: InlineKeyboardMarkup | None) -> bytes:
    """What a card shows, small enough to remember for every card."""
    keys = json.dumps(markup.to_dict() if markup is not None else None, sort_keys=True)
    return hashlib.sha256(f"{text}\0{keys}".encode()).digest()


class TelegramChannel(DeskChannel):
    """Approval channel ``telegram`` (see the module docstring)."""

    name = "telegram"

    def __init__(self, config: TelegramConfig, settings: Settings, *,
                 token: str | None = None, reconnect_delay: float = 1.0,
                 answer_within: float = 4.0, render_chart: Callable[[Any], bytes] | None = None):
        self.config = config
        self.render_chart = render_chart or chart.render  # /stats's PNG, in a worker thread
        # A tap whose decision takes longer (a slow send) is answered at this point, so
        # the operator's spinner ends; the card then shows the outcome.
        self.answer_within = answer_within
        self.settings = settings
        self._token = token or env_secret(config.token_env, "telegram.token_env")
        self._operators = frozenset(int(u) for u in config.operators)
        self._chats: dict[str, int] = {}
        problems = []
        for p in settings.pipelines:
            if p.approval.channel != "telegram":
                continue
            try:
                chat = chat_id(p.approval.chat) or config.approvals_chat
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
        self._app: Application | None = None
        self._connected = False
        self._connect_task: asyncio.Task | None = None
        self._webhook_watch: asyncio.Task | None = None
        self._receiver = (WebhookReceiver(config.webhook.path, self._webhook_secret)
                          if self._webhook_secret is not None else None)
        self._card_locks: dict[int, asyncio.Lock] = {}
        self.attach_pages: dict[int, int] = {}  # draft id -> the 📎 Attach page shown
        self._shown: dict[tuple[int, int], bytes] = {}  # fingerprint of each card's last edit

    # -- lifecycle -------------------------------------------------------------------
    def _build(self) -> Application:
        builder = (ApplicationBuilder().token(self._token)
                   .base_url(self.config.base_url).base_file_url(self.config.base_file_url)
                   .rate_limiter(_Limiter(overall_max_rate=1, overall_time_period=1 / _OVERALL_RATE,
                                          max_retries=_MAX_RETRIES))
                   .concurrent_updates(16).job_queue(None).context_types(CONTEXT_TYPES))
        request, get_updates = tg_request.requests(self.config.receive)  # counted for metrics
        builder = builder.request(request)
        if get_updates is not None:
            builder = builder.get_updates_request(get_updates)
        if self.config.receive != "polling":  # a webhook is received by our own server
            builder = builder.updater(None)
        app = builder.build()
        app.bot_data.channel = self  # how the handlers find the desk
        # The gate runs first for every update; ApplicationHandlerStop ends it there.
        app.add_handler(TypeHandler(Update, self._gate), group=-1)
        app.add_handlers(tg_taps.handlers() + tg_commands.handlers())
        app.add_error_handler(self._on_error)
        return app

    async def start(self, desk: OperatorDesk) -> None:
        """Connect and start receiving updates. If Telegram cannot be reached, keep
        trying in the background: drafts wait in ``ready`` meanwhile."""
        self.bind(desk)
        logging.getLogger("httpx").setLevel(max(logging.WARNING, logging.getLogger("httpx").level))
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
        if self.config.receive == "webhook" and metrics.installed() is not None:
            self._webhook_watch = asyncio.create_task(self._watch_webhook(),
                                                      name="telegram-webhook-watch")

    async def _watch_webhook(self) -> None:
        """``receive: webhook``, watched (/healthz, the systemd watchdog): every
        :data:`~bot.service.health.WEBHOOK_PROBE_EVERY` seconds, ask our own webhook server for
        an answer (a GET, which it refuses with 405: no update is made). An answer, or
        a reconnect still trying to reach Telegram, is the receiver's sign of life, as
        getUpdates' answers are when polling; a dead server makes /healthz fail."""
        def alive() -> bool:  # a reconnect still trying to reach Telegram
            trying = self._connect_task is not None and not self._connect_task.done()
            return trying and not self._connected

        await webhook.watch(self.config.webhook, alive)

    async def _connect(self) -> None:
        app = self._app
        assert app is not None
        # Each step is skipped when an earlier attempt got past it, so a retry after a
        # failure half-way resumes instead of tripping over "already running".
        await app.initialize()
        await app.bot.set_my_commands([BotCommand(c, d) for c, _, d in COMMANDS])
        if not app.running:
            await app.start()
        if self._receiver is not None:  # served before Telegram is told where to post
            wh = self.config.webhook
            await self._receiver.start(app, wh.listen, wh.port)
            await app.bot.set_webhook(str(wh.url), secret_token=self._webhook_secret,
                                      allowed_updates=["message", "callback_query"],
                                      drop_pending_updates=False)
        elif app.updater is not None and not app.updater.running:
            await app.updater.start_polling(
                timeout=int(self.config.poll_timeout), drop_pending_updates=False,
                allowed_updates=["message", "callback_query"],
                error_callback=lambda exc: log.warning("Telegram polling: %s", exc))
        self._connected = True
        log.info("Telegram connected as @%s (receive: %s)", app.bot.username, self.config.receive)

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
        for task in (self._connect_task, self._webhook_watch):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        app = self._app
        if app is None:
            return
        if app.updater is not None and app.updater.running:
            await app.updater.stop()
        if self._receiver is not None:
            await self._receiver.stop()
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
        """Where ``pipeline``'s cards go; every pipeline approved here got its chat when
        the channel was built (or the channel was refused with a ConfigError)."""
        if (chat := self._chats.get(pipeline)) is None:
            raise ApprovalError(f"no approvals chat for pipeline {pipeline!r}; set approval.chat "
                                f"or telegram.approvals_chat")
        return chat

    def chat_allowed(self, draft: Draft, chat: int | None, action: str) -> bool:
        """May a tap (``action``) or a reply in ``chat`` act on ``draft``? Its pipeline's
        chat and its card's; Retry send and Replay also from a notice in the ops chat."""
        if chat is None:
            return False
        allowed = {self._chats.get(draft.pipeline)}
        if (ref := card_ref(draft)) is not None:
            allowed.add(ref[0])
        if action in (cards.RETRY, cards.REPLAY):
            allowed.add(self._ops_chat)
        allowed.discard(None)
        return chat in allowed

    def _lock(self, draft_id: int) -> asyncio.Lock:
        return self._card_locks.setdefault(draft_id, asyncio.Lock())

    async def post(self, draft: Draft) -> PostedRef:
        """Send the card (or edit the existing card for a new version)."""
        chat = self.approvals_chat(draft.pipeline)
        bot = self.bot
        card = cards.render_card(draft, *await self.desk.votes(draft), attach=self.attach(draft))
        markup = _markup(card)
        async with self._lock(draft.id):
            try:
                if (ref := card_ref(draft)) is not None and ref[0] == chat:
                    if await self._edit(chat, ref[1], card.text, markup, missing_ok=True):
                        return PostedRef(str(chat), str(ref[1]))
                msg = await bot.send_message(chat, card.text, parse_mode=ParseMode.HTML,
                                             reply_markup=markup, link_preview_options=NO_PREVIEW)
            except (RetryAfter, FloodWait, Forbidden) as exc:
                raise ApprovalError(f"Telegram refused the card for #{draft.id}: {exc}") from exc
            except BadRequest as exc:
                raise ApprovalError(f"Telegram rejected the card for #{draft.id} in chat {chat}: "
                                    f"{exc}") from exc
            except TelegramError as exc:  # NetworkError, TimedOut, 5xx
                raise ApprovalError(f"Telegram unreachable: {exc}") from exc
            self._shown[(chat, msg.message_id)] = _fingerprint(card.text, markup)
            return PostedRef(str(chat), str(msg.message_id))

    async def post_notes(self, n: StyleNotes) -> PostedRef:
        """The card of a style notes proposal (bot.approvals.telegram.notes)."""
        return await notes.post(self, n)

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

    async def on_posted(self, draft: Draft) -> bool:
        """Called by the engine after ``mark_posted``: a status edit that raced the post
        is put right (no decision: False)."""
        await self.update(draft)
        return False

    async def _edit(self, chat: int, mid: int, text: str, markup: Any, *,
                    missing_ok: bool = False) -> bool:
        """Edit a card; False if it is gone and ``missing_ok`` (post a new one then)."""
        if self._shown.get((chat, mid)) == _fingerprint(text, markup):
            return True
        try:
            await self.bot.edit_message_text(text, chat_id=chat, message_id=mid,
                                             parse_mode=ParseMode.HTML, reply_markup=markup,
                                             link_preview_options=NO_PREVIEW)
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

    def timezone(self, draft: Draft) -> str:  # its pipeline's: the card's times are told by it
        return (self.settings.pipeline(draft.pipeline).timezone
                if self.settings.has_pipeline(draft.pipeline) else "UTC")

    def attach(self, draft: Draft) -> bool:  # 📎 Attach on its card: sender.attachments
        return self.desk.attachable_pipeline(draft.pipeline)

    async def later_menu(self, draft: Draft, show: bool,
                         buttons: list[list[cards.Button]] | None = None) -> None:
        """🕘 Later / 📎 Attach: the card's buttons become the send times (``show``) or
        ``buttons``, or the decision buttons again (⬅️ Back)."""
        if (ref := card_ref(draft)) is None:
            return
        card = cards.render_card(draft, *await self.desk.votes(draft), attach=self.attach(draft))
        if buttons is not None:
            card.buttons = buttons
        elif show:
            card.buttons = cards.later_buttons(draft)
        async with self._lock(draft.id):
            await self._edit(ref[0], ref[1], card.text, _markup(card))

    async def update(self, draft: Draft) -> bool:
        """Re-render a card from the draft's current state in the store, so edits that
        arrive out of order still end on the latest state. False if the edit failed: the
        card is then marked stale in the store, and :meth:`resync_cards` tries again."""
        async with self._lock(draft.id):
            fresh = await self.desk.draft(draft.id) or draft
            ref = card_ref(fresh)
            ok = True
            if ref is not None:
                card = cards.render_status(fresh, *await self.desk.votes(fresh),
                                           tz=self.timezone(fresh), attach=self.attach(fresh))
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
                    await self.desk.card_stale(fresh.id, not ok)
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
        for d in await self.desk.stale_cards(limit=50):
            if not await self.update(d):
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
                                        reply_markup=markup, link_preview_options=NO_PREVIEW)
        except TelegramError as exc:
            raise ApprovalError(f"could not notify the ops chat: {exc}") from exc

    async def remind(self, draft: Draft, text: str) -> None:
        """A reminder in the card's chat, as a reply to the card (Telegram links it)."""
        if (ref := card_ref(draft)) is None:
            return
        try:
            await self.bot.send_message(ref[0], text, reply_to_message_id=ref[1],
                                        allow_sending_without_reply=True)
        except TelegramError as exc:
            raise ApprovalError(f"could not send a reminder for #{draft.id}: {exc}") from exc

    # -- the gate ------------------------------------------------------------------------
    async def _gate(self, update: Update, context: Context) -> None:
        """Drop every update whose user is not an operator, before any handler."""
        user = update.effective_user
        if user is not None and not user.is_bot and user.id in self._operators:
            return
        chat = update.effective_chat
        # Never log the text: it is whatever a stranger chose to send.
        log.warning("dropped %s from user %s in chat %s: not in telegram.operators",
                    kind(update), user.id if user else None, chat.id if chat else None)
        if update.callback_query is not None:
            await answer(update.callback_query, "Not allowed.")
        raise ApplicationHandlerStop

    # -- errors --------------------------------------------------------------------------------
    async def _on_error(self, update: object, context: Context) -> None:
        """Log first, then tell the operator briefly (never the details)."""
        if isinstance(context.error, StoreUnavailable):
            return await self._held(update, context.error)
        log.error("handling %s failed", kind(update) if isinstance(update, Update)
                  else "no update", exc_info=context.error)
        if not isinstance(update, Update) or update.callback_query is not None:
            return  # taps were already answered
        user, chat = update.effective_user, update.effective_chat
        if chat is None or user is None or user.id not in self._operators:
            return
        what = str(context.error) if isinstance(context.error, DraftgateError) else \
            type(context.error).__name__
        try:
            await context.bot.send_message(chat.id, plain(f"⚠️ That failed ({what}); the "
                                                          f"details are in the bot's log."))
        except TelegramError:
            log.warning("could not tell the operator about the error")


    def held_line(self) -> str:
        """``⏸ held: store unreachable since …`` and a newline while the engine holds its
        ticks (bot.engine.outage), else empty: the first line of /status."""
        held = self.desk.held() if self._desk is not None else None
        return f"⏸ held: {held}\n" if held else ""

    async def _held(self, update: object, error: StoreUnavailable) -> None:
        """A command met an unreachable store (/status among them): one line in the log,
        and the operator is told it is held, since when (bot.engine.outage)."""
        held = self.desk.held() if self._desk is not None else None or f"store unreachable: {error}"
        log.info("handling %s: held: %s", kind(update) if isinstance(update, Update)
                 else "no update", held)
        if not isinstance(update, Update) or update.callback_query is not None:
            return  # taps were already answered
        chat, user = update.effective_chat, update.effective_user
        if chat is None or user is None or user.id not in self._operators:
            return
        try:
            await self.bot.send_message(chat.id, plain(
                f"⏸ held: {held}. draftgate retries by itself and nothing is lost; try "
                f"again when the store is back."))
        except TelegramError:
            log.warning("could not tell the operator that the store is unreachable")
