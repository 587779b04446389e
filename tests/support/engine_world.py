"""Shared test helpers (moved from test_drafter_engine.py, which other tests imported)."""

from __future__ import annotations

from pathlib import Path

from bot.approvals.base import DeskChannel
from bot.config.load import load_settings
from bot.engine.engine import Engine
from bot.stages import PostedRef
from bot.store import create_store
from tests.fakes.llm import FakeLLM
from tests.support.clock import Clock as ManualClock
from tests.support.desk import started

T0 = 1_764_410_400.0  # 2025-11-29T10:00:00Z, on the hour


class Clock(ManualClock):
    def __init__(self, t: float = T0) -> None:
        super().__init__(t)


class Cards(DeskChannel):
    """An approval channel that records cards and notifications."""

    name = "console"

    def __init__(self):
        self.cards: list[int] = []  # draft ids that got a NEW card
        self.edits: list[tuple[int, int]] = []
        self.notes: list[str] = []

    async def start(self, decisions):
        pass

    async def post(self, draft):
        if draft.approval_message_id:
            self.edits.append((draft.id, draft.version))
            return PostedRef("chat", draft.approval_message_id)
        self.cards.append(draft.id)
        return PostedRef("chat", f"card-{draft.id}")

    async def update(self, draft):
        pass

    async def notify(self, text, *, retry_draft=None):
        self.notes.append(text)

    async def stop(self):
        pass


def email(n: int) -> bytes:
    return (f"From: Customer {n} <c{n}@customer.example>\nTo: support@shop.example\n"
            f"Subject: Question {n}\nMessage-ID: <q{n}@customer.example>\n"
            f"Date: Sat, 29 Nov 2025 09:0{n % 10}:00 +0000\n\nWhere is order #{n}?\n").encode()


def shop_folders(tmp: Path) -> None:
    """The Example Shop's folders in ``tmp``: pipelines/, inbox/ and its prompt.md."""
    (tmp / "pipelines").mkdir()
    (tmp / "inbox").mkdir()
    (tmp / "prompt.md").write_text("You answer customer email for Example Shop.\n")


def llm_yaml(fake: FakeLLM, provider: str) -> str:
    """draftgate.yaml's ``models:`` with ``llm``, the ``provider`` API of ``fake``."""
    url = fake.openai_url if provider == "openai" else fake.url
    return (f"models:\n  llm:\n    provider: {provider}\n    base_url: {url}\n    model: m\n"
            f"    timeout: 10s\n    retries: 1\n    backoff: 10ms\n")


def deploy(tmp: Path, fake: FakeLLM, *, provider: str = "openai", budget: int | None = None,
           in_flight: int = 4, emails: int = 0) -> Path:
    shop_folders(tmp)
    for n in range(1, emails + 1):
        (tmp / "inbox" / f"{n}.eml").write_bytes(email(n))
    (tmp / "draftgate.yaml").write_text(
        f"store: sqlite:///{tmp}/state.db\nmax_in_flight: {in_flight}\n" + llm_yaml(fake, provider))
    (tmp / "pipelines" / "support.yaml").write_text(
        "name: support\nschedule: 5m\nsource: {type: maildir, path: inbox}\n"
        "drafter: {model: llm, prompt: prompt.md, signature: '-- Shop'}\n"
        "sender: {type: outbox, path: out, from: 'Shop <support@shop.example>'}\n"
        "lease: 60s\nmax_attempts: 2\n"
        + (f"daily_token_budget: {budget}\n" if budget else ""))
    (tmp / "pipelines" / "posts.yaml").write_text(
        "name: posts\nschedule: 1h\nsource: {type: schedule, topic: Weekly product tip}\n"
        "catchup: {policy: all, max: 24}\ndrafter: {model: llm, prompt: prompt.md}\n"
        "sender: {type: outbox, path: posts-out, from: s@shop.example}\nlease: 60s\n")
    return tmp / "draftgate.yaml"


class World:
    def __init__(self, cfg: Path, clock: Clock):
        self.cfg, self.clock = cfg, clock
        self.settings = load_settings(cfg)
        self.engines: list[Engine] = []
        self.store = None
        self.desk = None

    async def engine(self) -> tuple[Engine, Cards]:
        """A new engine (as after a restart) on the same store, with its own stages."""
        if self.store is None:
            self.store = create_store(self.settings.store)
            await self.store.open()
        cards = Cards()
        app = await started(self.settings, self.store, {"console": cards}, clock=self.clock)
        self.engines.append(app.engine)
        self.desk = app.desk  # the newest engine's
        return app.engine, cards

    async def close(self):
        for e in self.engines:
            await e.stop()
        if self.store is not None:
            await self.store.close()


