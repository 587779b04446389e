"""Shared test helpers (moved from test_telegram_channel.py, which other tests imported)."""

from __future__ import annotations

import textwrap
import time
from pathlib import Path

from bot.app import App
from bot.approvals.telegram.channel import TelegramChannel
from bot.config.load import load_settings
from bot.errors import SendUnknown
from bot.models import SendResult
from bot.store import create_store
from tests.fakes.telegram import FakeTelegram

ANNA, BO, EVE = 42, 43, 666


NAMES = {ANNA: "Anna", BO: "Bo", EVE: "Eve"}


SUPPORT_CHAT, SALES_CHAT, OPS_CHAT = 1001, 2002, 3003


TOKEN_ENV = "DG_TEST_TELEGRAM_TOKEN"


class EchoDrafter:
    """Drafts "Hi <name>, re: <the whole email>", plus the operator's instruction."""

    name = "echo"

    def __init__(self) -> None:
        self.requests = []
        self.fail_next: Exception | None = None

    async def draft(self, request):
        from bot.models import DraftResult

        self.requests.append(request)
        if self.fail_next is not None:
            exc, self.fail_next = self.fail_next, None
            raise exc
        body = f"Hi {request.message.from_name}, re: {request.message.body.strip()}"
        if request.instruction:
            body += f"\n[{request.instruction}]"
        return DraftResult(body=body, tokens_in=10, tokens_out=20)

    async def close(self):
        pass


class RecordingSender:
    """Counts every send; can be told to answer SendUnknown once."""

    name = "recording"

    def __init__(self) -> None:
        self.sent: list[tuple[int, int, str]] = []
        self.unknown_once = False
        self.check_answer: str | Exception | None = None  # what check() says

    async def send(self, draft):
        self.sent.append((draft.id, draft.version, draft.body))
        if self.unknown_once:
            self.unknown_once = False
            raise SendUnknown("connection reset while sending")
        return SendResult(sent_id=f"msg-{draft.id}")

    async def check(self, draft):
        if isinstance(self.check_answer, Exception):
            raise self.check_answer
        return self.check_answer

    async def close(self):
        pass


def eml(n: int, body: str = "Where is my order? It was due Friday.",
        name: str = "Alice Buyer") -> bytes:
    return (f"From: \"{name}\" <alice{n}@customer.example>\r\nTo: support@acme.example\r\n"
            f"Subject: Order {n}\r\nMessage-ID: <order-{n}@customer.example>\r\n"
            f"Date: Sun, 29 Nov 2026 10:02:00 +0000\r\n"
            f"Content-Type: text/plain; charset=utf-8\r\n\r\n{body}\r\n").encode()


def write_config(tmp_path: Path, fake: FakeTelegram, receive: str = "polling",
                 webhook: str = "") -> Path:
    for d in ("mail-support", "mail-sales", "pipelines"):
        (tmp_path / d).mkdir(exist_ok=True)
    (tmp_path / "draftgate.yaml").write_text(
        "store: sqlite:///state.db\npipelines: pipelines/*.yaml\n"
        + fake.config_yaml(TOKEN_ENV, [ANNA, BO], SUPPORT_CHAT,
                           extra=f"  ops_chat: {OPS_CHAT}\n  receive: {receive}\n") + webhook)
    for name, chat in (("support", SUPPORT_CHAT), ("sales", SALES_CHAT)):
        (tmp_path / "pipelines" / f"{name}.yaml").write_text(textwrap.dedent(f"""\
            name: {name}
            schedule: 1h
            source: {{type: maildir, path: mail-{name}}}
            approval: {{channel: telegram, chat: {chat}}}
            sender: {{type: outbox, path: outbox, from: "Acme <support@acme.example>"}}
            """))
    return tmp_path / "draftgate.yaml"


class World:
    """A running bot: engine + Telegram channel + store, restartable."""

    def __init__(self, tmp_path: Path, fake: FakeTelegram, cfg: Path,
                 reconnect_delay: float = 1.0) -> None:
        self.tmp_path, self.fake, self.cfg = tmp_path, fake, cfg
        self.reconnect_delay = reconnect_delay
        self.answer_within = 10.0
        self.settings = load_settings(cfg)
        self.drafter = EchoDrafter()
        self.sender = RecordingSender()
        self.store = None
        self.engine = None
        self.desk = None
        self.channel = None
        self.skew = 0.0  # seconds the engine's clock is ahead of ``now``
        self.now = time.time  # a test's clock replaces it (reminders, the digest)

    def clock(self) -> float:
        """The engine's clock (it reads this at every call, across restarts)."""
        return self.now() + self.skew

    async def start(self) -> "World":
        self.store = create_store(self.settings.store)
        await self.store.open()
        self.channel = TelegramChannel(self.settings.telegram, self.settings,
                                       answer_within=self.answer_within,
                                       reconnect_delay=self.reconnect_delay)
        app = App(self.settings, {"telegram": self.channel}, store=self.store, clock=self.clock,
                  drafters={"support": self.drafter, "sales": self.drafter},
                  senders={"support": self.sender, "sales": self.sender},
                  send_check_delay=0.05)
        self.app, self.engine, self.desk = app, app.engine, app.desk
        await app.start()
        await self.engine.post_unposted()
        return self

    async def stop(self) -> None:
        if self.engine is not None:
            await self.app.close()
            await self.store.close()
            self.engine = None

    async def restart(self) -> None:
        await self.stop()
        await self.start()

    async def deliver(self, n: int, pipeline: str = "support", **kw):
        """An email arrives and a tick drafts it and posts its card; returns the draft."""
        (self.tmp_path / f"mail-{pipeline}" / f"{n}.eml").write_bytes(eml(n, **kw))
        await self.engine.tick(pipeline)
        drafts = await self.store.item_drafts(pipeline, f"<order-{n}@customer.example>")
        assert len(drafts) == 1, drafts
        return drafts[0]

    async def draft(self, d):
        return await self.store.get_draft(d.id)

    def card(self, d):
        return self.fake.message(int(d.approval_chat), int(d.approval_message_id))

    async def tap(self, d, action: str, user: int = ANNA, version: int | None = None,
                  chat: int | None = None, first_name: str = "Anna"):
        """Tap a button of ``d``'s card and wait for the answer; returns it."""
        data = f"{action}:{d.id}:{d.version if version is None else version}"
        u = self.fake.tap(user, chat or int(d.approval_chat), int(d.approval_message_id), data,
                          first_name)
        return (await self.fake.answered(u))["text"]

    async def say(self, text: str, user: int = ANNA, chat: int = SUPPORT_CHAT,
                  reply_to: int | None = None, answers: int = 1):
        """Send a message and wait for the bot's ``answers`` replies in that chat;
        returns the text of the last."""
        before = len(self.fake.chat_messages(chat))
        self.fake.say(user, chat, text, reply_to=reply_to, first_name=NAMES[user])
        msgs = await self.fake.await_for(
            lambda: len(self.fake.chat_messages(chat)[before:]) >= answers
            and self.fake.chat_messages(chat)[before:], 10)
        return msgs[-1].text


async def start_world(tmp_path: Path, fake: FakeTelegram, monkeypatch, worlds: list,
                      cfg: Path, now=None, drafter=None) -> World:
    """Start a :class:`World` of ``cfg`` (its token in the environment, its clock ``now``
    and its drafter ``drafter(world)`` when given) and add it to ``worlds`` (the fixture
    that stops them)."""
    monkeypatch.setenv(TOKEN_ENV, fake.token)
    w = World(tmp_path, fake, cfg)
    if now is not None:
        w.now = now
    if drafter is not None:
        w.drafter = drafter(w)
    await w.start()
    worlds.append(w)
    return w


def _buttons(markup) -> list[str]:
    return [b["callback_data"] for row in (markup or {}).get("inline_keyboard", []) for b in row]


