"""Grounded drafts (issue 24): a claim the draft makes that nothing the model was
given supports shows on the card, in `pending --json` and in the audit, for every
version; the draft's text is never changed by the check.

The real engine and store, the real maildir source and the real openai and anthropic
SDKs against the fake model server (see tests/test_context.py's Deployment)."""

from __future__ import annotations

import json

import pytest

from bot.approvals.cards import render_card
from tests.support.context_world import KNOWLEDGE, PROVIDERS, cli, eml
from tests.support.desk import op

DRAFT = ("Hi Alice, your refund reaches you within 5 business days. As a thank-you we "
         "take €25 off your next order, and refunds are paid within 14 days.")


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_an_unsupported_claim_shows_on_the_card_in_pending_and_in_the_audit(
        tmp_path, store_url, fake, deployments, capsys, provider):
    """The passage says 5 business days; "€25" and "14 days" are found nowhere."""
    (tmp_path / "knowledge").mkdir()
    (tmp_path / "knowledge" / "returns.md").write_text(KNOWLEDGE)
    w = await deployments(fake, provider, store_url, drafter="knowledge: [knowledge/*.md]")
    fake.script(fake.reply(DRAFT))
    d, _ = await w.draft("support", 1, eml(1, "Refund?", "When do I get my refund for the "
                                           "returned jacket?"))
    assert d.body == DRAFT  # informs, never changes
    card = render_card(d).text
    assert "⚠️ Not in the sources: €25 · 14 days" in card
    assert await cli(["pending", "-c", w.config, "--json"]) == 0
    [shown] = json.loads(capsys.readouterr().out)
    assert shown["unsupported"] == ["€25", "14 days"]
    assert "source_keys" not in shown["used"]
    [entry] = [a for a in await w.store.audit_log(d.key) if a.action == "draft"]
    assert "v1" in entry.detail and "not in the sources: €25 · 14 days" in entry.detail


async def test_an_edited_version_is_checked_against_the_same_sources(
        tmp_path, store_url, fake, deployments, capsys):
    """Removing the voucher clears its flag; a new wrong number is flagged."""
    (tmp_path / "knowledge").mkdir()
    (tmp_path / "knowledge" / "returns.md").write_text(KNOWLEDGE)
    w = await deployments(fake, "openai", store_url, drafter="knowledge: [knowledge/*.md]")
    fake.script(fake.reply(DRAFT))
    d, _ = await w.draft("support", 1, eml(1, "Refund?", "When do I get my refund?"))
    edited = await w.desk.edit(op("anna"), d.id, d.version, "Hi Alice, your refund reaches you "
                                 "within 5 business days, or 7 business days by card.")
    assert edited is not None and edited.version == 2
    assert "Not in the sources: 7 business days" in render_card(edited).text
    [entry] = [a for a in await w.store.audit_log(d.key) if a.action == "edit"]
    assert "v1 -> v2" in entry.detail and "not in the sources: 7 business days" in entry.detail


async def test_grounding_off_flags_nothing(tmp_path, store_url, fake, deployments, capsys):
    """`grounding: off` (a bare YAML off too) keeps cards as they were."""
    w = await deployments(fake, "openai", store_url, drafter="grounding: off")
    fake.script(fake.reply(DRAFT))
    d, _ = await w.draft("support", 1, eml(1, "Refund?", "When do I get my refund?"))
    assert "Not in the sources" not in render_card(d).text
    assert await cli(["pending", "-c", w.config, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["unsupported"] == []


async def test_the_email_the_prompt_and_the_signature_are_sources(
        tmp_path, store_url, fake, deployments):
    """What the customer wrote, the operator's prompt and the signature support claims."""
    (tmp_path / "prompt.md").write_text("Our hotline is 0800 555 0100, Mon-Fri 9:00-17:00.")
    w = await deployments(fake, "anthropic", store_url,
                          drafter="prompt: prompt.md, signature: 'Anna, shop.example'")
    fake.script(fake.reply("Hi Alice, about order #40017 of 29 November: call 0800 555 0100 "
                           "on Monday from 9 am. Anna, shop.example"))
    d, _ = await w.draft("support", 1, eml(1, "Order 40017", "Where is order 40017?"))
    assert "Not in the sources" not in render_card(d).text, d.used.get("unsupported")
