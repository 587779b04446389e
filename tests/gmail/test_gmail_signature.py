"""``drafter.signature: gmail`` (issue 28): the account's own signature from Gmail's
settings.sendAs (the fake Gmail API), given to the model as the signature to end with;
fetched once, and again after a day."""

from __future__ import annotations

import io

import pytest

from bot.approvals.console import ConsoleChannel
from bot.config.load import load_settings
from bot.errors import ConfigError
from bot.store import create_store
from tests.fakes.gmail import GmailWorld, simple_message
from tests.fakes.llm import FakeLLM
from tests.support.clock import Clock
from tests.support.desk import started

T0 = 1796396400.0




@pytest.fixture
def llm():
    fake = FakeLLM().start()
    yield fake
    fake.stop()


def _deploy(tmp_path, llm) -> GmailWorld:
    w = GmailWorld(tmp_path)
    cfg = tmp_path / "draftgate.yaml"
    cfg.write_text(cfg.read_text() + f"models:\n  llm:\n    provider: openai\n    base_url: "
                   f"{llm.openai_url}\n    model: m\n    timeout: 10s\n    retries: 1\n"
                   f"    backoff: 10ms\n")
    pipeline = tmp_path / "pipelines" / "support.yaml"
    pipeline.write_text(pipeline.read_text().replace(
        "drafter: {model: template, prompt: reply.txt}",
        "drafter: {model: llm, prompt: reply.txt, signature: gmail, grounding: off}"))
    return w


def _signature_rule(llm, n: int) -> str:
    system, _ = llm.requests[n].texts()
    return system.split("End with exactly this signature:\n", 1)[1].split("\n\n")[0] \
        if "End with exactly this signature:" in system else ""


async def test_the_accounts_signature_is_given_to_the_model_and_fetched_once_a_day(tmp_path, llm):
    w = _deploy(tmp_path, llm)
    w.fake.signature = "<div>Dana Support<br>Acme &amp; Co</div>"
    w.settings = load_settings(w.config)
    w.store = create_store(w.settings.store)
    await w.store.open()
    clock = Clock(T0)
    w.app = await started(w.settings, w.store, {"console": ConsoleChannel(
        interactive=False, out=io.StringIO())}, send_check_delay=0.0, clock=clock)
    w.engine = w.app.engine
    try:
        await w.tick()  # the cursor
        w.fake.add_message(simple_message(1))
        await w.tick()
        assert _signature_rule(llm, 0).startswith("Dana Support\nAcme & Co")
        w.fake.signature = "<div>New signature</div>"
        w.fake.add_message(simple_message(2))
        clock.t = T0 + 3600
        await w.tick()
        assert _signature_rule(llm, 1).startswith("Dana Support")  # fetched once a day
        assert len(w.fake.calls_to("settings.sendAs.list")) == 1
        clock.t = T0 + 86400 + 1
        w.fake.add_message(simple_message(3))
        await w.tick()
        assert _signature_rule(llm, 2).startswith("New signature")
        assert len(w.fake.calls_to("settings.sendAs.list")) == 2
    finally:
        await w.close()


def test_signature_gmail_without_a_gmail_account_is_refused_at_load(tmp_path):
    (tmp_path / "inbox").mkdir()
    (tmp_path / "draftgate.yaml").write_text("store: sqlite:///s.db\npipelines: p.yaml\n")
    (tmp_path / "p.yaml").write_text(
        "name: support\nsource: {type: maildir, path: inbox}\n"
        "drafter: {signature: gmail}\nsender: {type: outbox, path: out, from: a@b.example}\n")
    with pytest.raises(ConfigError, match="drafter.signature.*gmail source or a gmail_reply"):
        load_settings(tmp_path / "draftgate.yaml")
