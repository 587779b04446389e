"""Shared test helpers (moved from test_context.py, which other tests imported)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from bot.cli.main import main
from bot.config.load import load_settings
from bot.engine.engine import Engine
from bot.store import create_store
from tests.fakes.llm import FakeLLM
from tests.support.desk import started
from tests.support.engine_world import Cards, Clock

PROVIDERS = ["openai", "anthropic"]


async def cli(argv: list[str]) -> int:
    """The real CLI (it runs its own event loop, so in a thread)."""
    return await asyncio.to_thread(main, argv)


def eml(n: int | str, subject: str, body: str, *, sender: str = "Alice Buyer <alice@customer.example>",
        refs: str = "", date: str = "Sun, 29 Nov 2026 10:02:00 +0000") -> bytes:
    head = f"References: {refs}\nIn-Reply-To: {refs.split()[-1]}\n" if refs else ""
    return (f"From: {sender}\nTo: support@shop.example\nSubject: {subject}\n"
            f"Message-ID: <m{n}@customer.example>\nDate: {date}\n{head}\n{body}\n").encode()


class Deployment:
    """A deployment on tmp_path: pipelines `support` and `sales` (maildir, outbox) on
    one model and one store; the engine with a recording channel."""

    def __init__(self, tmp: Path, fake: FakeLLM, provider: str, store_url: str,
                 drafter: str = "", source: str = "{type: maildir, path: inbox}",
                 extra_yaml: str = "", model: str = "llm"):
        self.tmp, self.fake = tmp, fake
        for folder in ("pipelines", "inbox", "sales-inbox"):
            (tmp / folder).mkdir(exist_ok=True)
        url = fake.openai_url if provider == "openai" else fake.url
        (tmp / "draftgate.yaml").write_text(
            f"store: {store_url}\nmodels:\n  llm:\n    provider: {provider}\n"
            f"    base_url: {url}\n    model: m\n    timeout: 10s\n    retries: 0\n{extra_yaml}")
        for name, inbox in (("support", source), ("sales", "{type: maildir, path: sales-inbox}")):
            (tmp / "pipelines" / f"{name}.yaml").write_text(
                f"name: {name}\nschedule: 5m\nsource: {inbox}\n"
                f"drafter: {{model: {model}{', ' + drafter if drafter else ''}}}\n"
                f"sender: {{type: outbox, path: out-{name}, from: 'Shop <support@shop.example>'}}\n"
                "lease: 60s\n")
        self.config = str(tmp / "draftgate.yaml")
        self.engine: Engine | None = None

    async def open(self) -> "Deployment":
        self.settings = load_settings(self.config)
        self.store = create_store(self.settings.store)
        await self.store.open()
        self.cards = Cards()
        app = await started(self.settings, self.store, {"console": self.cards}, clock=Clock())
        self.app, self.engine, self.desk = app, app.engine, app.desk
        return self

    async def close(self) -> None:
        if self.engine is not None:
            engine, self.engine = self.engine, None
            await engine.stop()
            await self.store.close()

    async def draft(self, pipeline: str, n: int | str, raw: bytes):
        """Deliver ``raw`` to the pipeline's inbox, tick, return (draft, model request)."""
        folder = "inbox" if pipeline == "support" else "sales-inbox"
        (self.tmp / folder / f"{n}.eml").write_bytes(raw)
        before = len(self.fake.requests)
        await self.engine.tick(pipeline)
        [d] = [d for d in await self.store.pending(pipeline) if d.item_id == f"<m{n}@customer.example>"]
        if self.settings.models[self.settings.pipeline(pipeline).drafter.model].provider == "template":
            return d, None
        assert len(self.fake.requests) == before + 1, "one model call for the new email"
        return d, self.fake.requests[-1]


KNOWLEDGE = """# Shop facts

## Refunds

Refunds are paid back to the card within 5 business days of the parcel arriving.

## Opening hours

The shop in Leipzig opens Monday to Saturday, 10:00 to 19:00.
"""


