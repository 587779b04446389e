"""Shared test helpers (moved from test_drafter_llm.py, which other tests imported)."""

from __future__ import annotations

from pathlib import Path

PROVIDERS = ["openai", "anthropic"]


KEY_ENV = "DG_TEST_LLM_KEY"


def write_config(tmp: Path, provider: str, base_url: str, *, model: str = "",
                 drafter: str = "", lease: str = "10m") -> Path:
    """A deployment with one pipeline whose drafter is ``models.llm``."""
    (tmp / "pipelines").mkdir(exist_ok=True)
    (tmp / "prompts").mkdir(exist_ok=True)
    (tmp / "prompts" / "support.md").write_text("You are the support desk of Example Shop.\n")
    model = model or (f"    timeout: 2s\n    retries: 2\n    backoff: 10ms\n"
                      f"    api_key_env: {KEY_ENV}\n"
                      + ("    temperature: 0.2\n" if provider == "openai" else ""))
    (tmp / "draftgate.yaml").write_text(
        f"store: sqlite:///{tmp}/state.db\n"
        f"models:\n  llm:\n    provider: {provider}\n    base_url: {base_url}\n"
        f"    model: test-model\n{model}")
    drafter = drafter or ("  signature: \"-- Anna, Example Shop\"\n")
    (tmp / "pipelines" / "support.yaml").write_text(
        f"name: support\nschedule: 5m\nsource: {{type: maildir, path: inbox}}\n"
        f"sender: {{type: outbox, path: out, from: s@shop.example}}\nlease: {lease}\n"
        f"drafter:\n  model: llm\n  prompt: prompts/support.md\n{drafter}")
    return tmp / "draftgate.yaml"


