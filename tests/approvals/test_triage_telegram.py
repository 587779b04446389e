"""Triage's FYI card in Telegram (issue 13): the real python-telegram-bot against the
fake Bot API, the real openai SDK against the fake model server (triage and drafting),
the real engine and SQLite store. notify posts an FYI card with Draft a reply and
Dismiss; Draft a reply turns it into a normal card; Dismiss ends it. Both audited."""

from __future__ import annotations

import json

import pytest

from bot.desk import reports as ops
from bot.engine.build import build_drafter
from tests.support.telegram_world import (
    ANNA,
    BO,
    SUPPORT_CHAT,
    _buttons,
    start_world,
    write_config,
)
from tests.support.triage import is_triage

NOTIFY = json.dumps({"action": "notify", "reason": "An invoice <b>from</b> a supplier; "
                                                   "someone should look at it."})


@pytest.fixture
async def world(tmp_path, fake, llm, monkeypatch, worlds):
    cfg = write_config(tmp_path, fake)
    cfg.write_text(cfg.read_text() + f"models:\n  cheap:\n    provider: openai\n"
                   f"    base_url: {llm.openai_url}\n    model: m\n    timeout: 10s\n"
                   f"    retries: 0\n")
    support = tmp_path / "pipelines" / "support.yaml"
    support.write_text(support.read_text() + "drafter: {model: cheap}\n"
                       "triage:\n  model: cheap\n  rules: |\n"
                       "    Only notify for invoices. Reply to customers.\n")
    # Drafting too through the real openai SDK against the fake model server.
    return await start_world(tmp_path, fake, monkeypatch, worlds, cfg, drafter=lambda w:
                             build_drafter(w.settings.pipeline("support"), w.settings))


async def test_notify_posts_an_fyi_card_and_draft_a_reply_makes_a_normal_card(world, fake, llm):
    llm.script(llm.reply(NOTIFY))
    d = await world.deliver(1)
    assert (d.status, d.body, d.triage) == ("notified", "", "notify")
    assert [is_triage(r) for r in llm.requests] == [True]  # no draft was asked for
    card = world.card(d)
    assert card.text.startswith(f"📨 support · #{d.id} v1")
    assert "FYI, no reply drafted. Triage: An invoice <b>from</b> a supplier" in card.text
    assert "<b>from</b>" not in card.html  # the model's words are escaped
    assert _buttons(card.reply_markup) == [f"dr:{d.id}:1", f"dm:{d.id}:1"]
    pending = ops.format_pending(await ops.pending(world.store, world.settings))
    assert "FYI card, no draft (Draft a reply or Dismiss)" in pending
    assert await world.tap(d, "ap") == "This is an FYI card: tap ✍️ Draft a reply or 👋 Dismiss."

    assert await world.tap(d, "dr", user=BO, first_name="Bo") == \
        "✍️ Drafting a reply; this card turns into it."
    await world.engine.wait_idle()
    after = await world.draft(d)
    assert (after.status, after.version) == ("awaiting", 2)
    assert (after.approval_chat, after.approval_message_id) == (d.approval_chat,
                                                                d.approval_message_id)
    card = world.card(after)  # the same message, now the draft's card
    assert card.text.startswith(f"📨 support · #{d.id} v2")
    assert "Draft:\nThank you for your message. (fake draft" in card.text
    assert _buttons(card.reply_markup) == [f"{a}:{d.id}:2" for a in ("ap", "ed", "rg", "rj", "lt")]
    assert [is_triage(r) for r in llm.requests] == [True, False]  # never triaged again
    assert [e.actor for e in await world.store.audit_log(d.key)
            if e.action == "draft_reply"] == [f"tg:{BO} (Bo)"]
    assert len(fake.chat_messages(SUPPORT_CHAT)) == 1  # one card for the email, all along
    assert (await world.tap(d, "dr", version=1)).startswith("Old version (v1)")
    assert await world.tap(after, "ap") == "✅ Sent."


async def test_dismiss_ends_an_fyi_card_audited_and_replay_drafts_it(world, fake, llm):
    llm.script(llm.reply(NOTIFY))
    d = await world.deliver(1)
    assert await world.tap(d, "dm") == "👋 Dismissed."
    after = await world.draft(d)
    assert (after.status, after.decided_by) == ("dismissed", f"tg:{ANNA} (Anna)")
    card = world.card(d)
    assert card.text.startswith("👋 Dismissed by Anna at ") and card.reply_markup is None
    assert "FYI, no reply drafted" in card.text
    assert await world.tap(d, "dm") == "Already dismissed by Anna."
    assert [e.action for e in await world.store.audit_log(d.key)][:2] == ["dismiss", "triage"]
    detail = await ops.status_one(world.store, world.settings, "support")
    assert [(a["status"], a["item_id"]) for a in detail.attention] == [
        ("dismissed", d.item_id)]
    assert detail.pending == 0
    # Changed their mind: /replay drafts it (no triage), on the same card.
    assert "back in the queue" in await world.say(f"/replay support {d.item_id}")
    await world.engine.tick("support")
    again = await world.draft(d)
    assert (again.status, again.version) == ("awaiting", 2)
    assert [is_triage(r) for r in llm.requests] == [True, False]
