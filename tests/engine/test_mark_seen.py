"""``mark_seen: on_success``: an item is marked seen only once it has reached an end
(drafted, skipped by a filter or by triage, failed for good), never at fetch.

The real engine, the real SQLite store and the real openai SDK against the fake
model server, on a Maildir pipeline with triage. What is asserted is what an operator
reads in ``status`` (the seen count) and what the next fetch takes again (an item
with no seen mark is listed again, and taken once its work is done).
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from bot.config.load import load_settings
from bot.store import create_store
from tests.fakes.llm import FakeLLM
from tests.support.desk import CONSOLE, started
from tests.support.engine_world import Cards, Clock


def _email(n: int, sender: str | None = None) -> bytes:
    sender = sender or f"c{n}@customer.example"
    return (f"From: Customer {n} <{sender}>\nTo: support@shop.example\n"
            f"Subject: Question {n}\nMessage-ID: <q{n}@customer.example>\n"
            f"Date: Sat, 29 Nov 2025 09:00:00 +0000\n\nWhere is my order {n}?\n").encode()


def _deploy(tmp: Path, fake: FakeLLM) -> Path:
    (tmp / "pipelines").mkdir()
    (tmp / "inbox").mkdir()
    (tmp / "prompt.md").write_text("You answer customer email for Example Shop.\n")
    (tmp / "draftgate.yaml").write_text(
        f"store: sqlite:///{tmp}/state.db\n"
        f"models:\n  llm:\n    provider: openai\n    base_url: {fake.openai_url}\n"
        f"    model: m\n    timeout: 10s\n    retries: 0\n")
    (tmp / "pipelines" / "support.yaml").write_text(textwrap.dedent("""\
        name: support
        schedule: 5m
        source: {type: maildir, path: inbox}
        filters: {skip_senders: ["noreply@*"]}
        drafter: {model: llm, prompt: prompt.md}
        sender: {type: outbox, path: out, from: 'Shop <support@shop.example>'}
        lease: 60s
        max_attempts: 2
        mark_seen: on_success
        triage:
          rules: Skip receipts.
        """))
    return tmp / "draftgate.yaml"


def _triage(action: str):
    return FakeLLM.reply(json.dumps({"action": action, "reason": "the rules say so"}))


class World:
    def __init__(self, tmp: Path, fake: FakeLLM):
        self.tmp, self.fake = tmp, fake
        self.settings = load_settings(_deploy(tmp, fake))

    async def start(self) -> "World":
        self.store = create_store(self.settings.store)
        await self.store.open()
        self.app = await started(self.settings, self.store, {"console": Cards()}, clock=Clock())
        return self

    async def deliver(self, n: int, *steps, sender: str | None = None):
        """Mail ``n`` arrives; the model answers ``steps`` in turn; one tick."""
        (self.tmp / "inbox" / f"{n}.eml").write_bytes(_email(n, sender))
        self.fake.script(*steps)
        counts = await self.app.engine.tick("support")
        [d] = await self.store.item_drafts("support", f"<q{n}@customer.example>")
        return d, counts

    async def seen(self) -> int:
        """The seen count ``status support`` shows."""
        return (await self.app.desk.status_of(CONSOLE, "support")).seen

    async def close(self) -> None:
        await self.app.close()
        await self.store.close()


@pytest.fixture
async def world(tmp_path):
    with FakeLLM() as fake:
        w = await World(tmp_path, fake).start()
        try:
            yield w
        finally:
            await w.close()


async def test_an_item_is_seen_only_once_it_reached_an_end(world):
    """Each way an item can end marks it seen at that moment; one still queued after
    a failed attempt is not seen (the next fetch lists it), and is once drafted."""
    # A filter skips it at admission: final, seen now.
    d, _ = await world.deliver(1, sender="noreply@shop.example")
    assert d.status == "skipped" and await world.seen() == 1
    # Triage says skip: final, seen.
    d, _ = await world.deliver(2, _triage("skip"))
    assert d.status == "skipped" and await world.seen() == 2
    # Triage says notify (an FYI card, up to an operator): seen.
    d, _ = await world.deliver(3, _triage("notify"))
    assert d.status == "notified" and await world.seen() == 3
    # Drafted: seen.
    d, _ = await world.deliver(4, _triage("reply"), FakeLLM.reply("Your order ships today."))
    assert d.status == "awaiting" and await world.seen() == 4
    # The model refuses the request for good (400): failed, seen.
    d, _ = await world.deliver(5, _triage("reply"), FakeLLM.error(400, "bad request"))
    assert d.status == "failed" and await world.seen() == 5
    # A 503: the item goes back to the queue for another attempt; not seen, so the
    # next fetch lists it again (and finds its queued draft, so nothing doubles).
    d, _ = await world.deliver(6, _triage("reply"), FakeLLM.error(503, "overloaded"))
    assert (d.status, d.attempt) == ("queued", 1) and await world.seen() == 5
    world.fake.script(FakeLLM.reply("Your order ships tomorrow."))
    await world.app.engine.tick("support")
    [d] = await world.store.item_drafts("support", "<q6@customer.example>")
    assert d.status == "awaiting" and await world.seen() == 6
    assert len(await world.store.item_drafts("support", "<q6@customer.example>")) == 1
