"""The fixture the drafter tests share: ``fake``, a fake LLM server (OpenAI and Anthropic
APIs) on 127.0.0.1."""

from __future__ import annotations

from tests.support.fixtures import fake_llm as fake  # noqa: F401
