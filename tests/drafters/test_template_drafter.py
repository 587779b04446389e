"""The offline template drafter: fields in, no injection from email text."""

from __future__ import annotations

from pathlib import Path

import pytest

from bot.config.load import ModelConfig, PipelineConfig, Settings, load_settings
from bot.drafters import template
from bot.errors import ConfigError, DrafterError, DrafterSetupError
from bot.models import DraftRequest, Message
from bot.stages import Drafter
from tests._stage import pipeline

REPO = Path(__file__).resolve().parents[2]
MODEL = ModelConfig("template", "template")


def _pipeline(base: Path, **drafter) -> PipelineConfig:
    return pipeline(source={"type": "maildir", "path": "inbox"},
                    drafter={"model": "template", **drafter},
                    sender={"type": "outbox", "path": "out", "from": "s@shop.example"},
                    base_dir=base)


def _settings(base: Path) -> Settings:
    return Settings(file="draftgate.yaml", base_dir=base, store="sqlite:///x.db", pipelines=[])


def _drafter(tmp_path: Path, text: str) -> template.TemplateDrafter:
    (tmp_path / "t.txt").write_text(text, encoding="utf-8")
    return template.create(MODEL, _pipeline(tmp_path, prompt="t.txt"), _settings(tmp_path))


ALICE = Message(from_name="Alice Buyer", from_addr="alice@customer.example",
                reply_to="alice@customer.example", subject="Where is my order #1234?",
                date="2026-11-29T10:02:00+00:00", body="Hi,\n\nwhere is my order #1234?\nIt was due Friday.")


async def test_fills_every_field(tmp_path):
    d = _drafter(tmp_path, "{from_name}|{first_name}|{from_addr}|{subject}|{date}|{excerpt}|{slot}|{instruction}")
    assert isinstance(d, Drafter)
    result = await d.draft(DraftRequest("support", ALICE, instruction="mention the tracking link"))
    assert result.body == ("Alice Buyer|Alice|alice@customer.example|Where is my order #1234?|"
                           "Sun 29 Nov 2026 10:02|Hi, where is my order #1234? It was due Friday.||"
                           "mention the tracking link\n")
    assert (result.tokens_in, result.tokens_out) == (0, 0)


@pytest.mark.parametrize("subject", ["{instruction}", "{0.__class__.__mro__}", "{from_addr!r:>99}",
                                     "{excerpt}{excerpt}", "}{", "{{subject}}"])
async def test_email_text_cannot_inject_fields(tmp_path, subject):
    """Whatever the sender writes is inserted verbatim, never expanded."""
    d = _drafter(tmp_path, "Re: {subject} / {instruction}")
    msg = Message(from_addr="x@evil.example", subject=subject, body="{from_addr}")
    result = await d.draft(DraftRequest("support", msg, instruction="SECRET"))
    assert result.body == f"Re: {subject} / SECRET\n"


async def test_template_cannot_reach_attributes_and_unknown_fields_stay_visible(tmp_path):
    d = _drafter(tmp_path, "{subject.__class__} {nope} {subject[0]} {{literal}} {")
    result = await d.draft(DraftRequest("support", ALICE))
    assert result.body == "{subject.__class__} {nope} {subject[0]} {literal} {\n"


@pytest.mark.parametrize("name,first", [("Alice Buyer", "Alice"), ("Buyer, Alice", "Alice"),
                                        ("", "there"), ('"山田 太郎"', "山田"), ("123", "there")])
def test_first_name(name, first):
    assert template.fields_for(Message(from_name=name, from_addr="a@b.example"))["first_name"] == first


def test_missing_subject_and_long_excerpt():
    f = template.fields_for(Message(from_addr="a@b.example", body="word " * 500))
    assert f["subject"] == "(no subject)" and f["from_name"] == "a@b.example"
    assert f["excerpt"].endswith(" …") and len(f["excerpt"]) <= template.EXCERPT_CHARS + 2


async def test_regenerate_instruction_becomes_a_note_when_template_has_no_field(tmp_path):
    d = _drafter(tmp_path, "Hi {first_name}")
    result = await d.draft(DraftRequest("support", ALICE, instruction="offer a refund"))
    assert result.body == "Hi Alice\n\n[Note: offer a refund]\n"


async def test_template_edits_apply_to_the_next_draft(tmp_path):
    d = _drafter(tmp_path, "one")
    assert (await d.draft(DraftRequest("support", ALICE))).body == "one\n"
    (tmp_path / "t.txt").write_text("two", encoding="utf-8")
    assert (await d.draft(DraftRequest("support", ALICE))).body == "two\n"


async def test_a_missing_template_file_is_a_setup_error_and_its_fix_needs_no_restart(tmp_path):
    """Every item would fail alike: the engine keeps them queued and tells the operators."""
    d = template.create(MODEL, _pipeline(tmp_path, prompt="gone.txt"), _settings(tmp_path))
    with pytest.raises(DrafterSetupError, match="pipelines/support.yaml: drafter.prompt: cannot "
                                                "read template .*gone.txt.*fix the file"):
        await d.draft(DraftRequest("support", ALICE))
    (tmp_path / "gone.txt").write_text("Hi {first_name}", encoding="utf-8")
    assert (await d.draft(DraftRequest("support", ALICE))).body == "Hi Alice\n"


def test_prompt_is_required(tmp_path):
    with pytest.raises(ConfigError, match=r"pipelines/support.yaml: drafter.prompt: missing; the "
                                          r"template drafter needs a template file"):
        template.create(MODEL, _pipeline(tmp_path), _settings(tmp_path))


def test_unknown_model_option(tmp_path):
    """A key the template drafter has no use for is refused when the file loads."""
    (tmp_path / "draftgate.yaml").write_text(
        "store: sqlite:///state.db\npipelines: pipelines/*.yaml\n"
        "models:\n  offline:\n    provider: template\n    model: gpt\n")
    (tmp_path / "pipelines").mkdir()
    with pytest.raises(ConfigError, match=r"draftgate.yaml: models.offline.model: unknown key"):
        load_settings(tmp_path / "draftgate.yaml")


async def test_demo_template_renders_without_leftover_fields():
    d = template.create(MODEL, _pipeline(REPO, prompt="demo/templates/reply.txt"), _settings(REPO))
    body = (await d.draft(DraftRequest("support", ALICE))).body
    assert body.startswith("Hi Alice,\n")
    assert "\n> Hi, where is my order #1234? It was due Friday.\n" in body
    assert "{" not in body and "}" not in body


def test_quote_wraps_and_prefixes_every_line():
    q = template.fields_for(Message(from_addr="a@b.example", body="word " * 40))["quote"]
    assert all(line.startswith("> ") and len(line) <= 72 for line in q.splitlines())
    assert len(q.splitlines()) > 1


@pytest.mark.parametrize("text", ["", "   \n\n", "\u200b\n", "\u2800 \u2800"])
async def test_a_template_without_text_is_a_setup_error_naming_the_file(tmp_path, text):
    d = _drafter(tmp_path, text)
    with pytest.raises(DrafterSetupError) as err:
        await d.draft(DraftRequest("support", ALICE, instruction="shorter"))
    assert str(err.value).startswith("pipelines/support.yaml: drafter.prompt: the template ")
    assert str(tmp_path / "t.txt") in str(err.value) and "every reply would be empty" in str(err.value)


async def test_a_template_whose_fields_are_empty_for_this_message_fails_only_this_item(tmp_path):
    d = _drafter(tmp_path, "{slot}\n")  # a slot template used for an email
    with pytest.raises(DrafterError) as err:
        await d.draft(DraftRequest("support", ALICE))
    assert not isinstance(err.value, DrafterSetupError)
    assert "t.txt gives an empty reply for this message" in str(err.value)
    slot = Message(kind="slot", slot="2026-11-29T09:00")
    assert (await d.draft(DraftRequest("support", slot))).body == "2026-11-29T09:00\n"


async def test_a_blank_template_puts_no_empty_card_in_front_of_the_operator(tmp_path):
    """What the operator sees: no card to approve (an empty email could be sent), the
    item waits in the queue, and one notice names the template file."""
    from tests.support.engine_world import Clock, World, email

    (tmp_path / "pipelines").mkdir()
    (tmp_path / "inbox").mkdir()
    (tmp_path / "inbox" / "1.eml").write_bytes(email(1))
    (tmp_path / "t.txt").write_text("\n")
    (tmp_path / "draftgate.yaml").write_text(f"store: sqlite:///{tmp_path}/state.db\n")
    (tmp_path / "pipelines" / "support.yaml").write_text(
        "name: support\nschedule: 5m\nsource: {type: maildir, path: inbox}\n"
        "drafter: {model: template, prompt: t.txt}\n"
        "sender: {type: outbox, path: out, from: 'Shop <support@shop.example>'}\n")
    w = World(tmp_path / "draftgate.yaml", Clock())
    try:
        engine, cards = await w.engine()
        await engine.tick("support")
        by_status = await w.store.count_by_status("support")
    finally:
        await w.close()
    assert cards.cards == [] and by_status == {"queued": 1}
    [note] = cards.notes
    assert "t.txt has no text" in note


def test_a_drafter_key_typo_is_refused_and_model_drafter_keys_are_allowed(tmp_path):
    """A typo used to pass validate; a model drafter's keys stay allowed, so switching a
    pipeline to `model: template` for a test does not break its file."""
    with pytest.raises(ConfigError) as err:
        template.create(MODEL, _pipeline(tmp_path, prompt="t.txt", signatur="Kind regards"),
                        _settings(tmp_path))
    assert "pipelines/support.yaml: drafter.signatur: unknown key" in str(err.value)
    template.create(MODEL, _pipeline(tmp_path, prompt="t.txt", max_input=1000,
                                     signature="Kind regards"), _settings(tmp_path))
