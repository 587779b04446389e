"""A deployment on the fake servers: Gmail in, an openai-compatible model drafts with
``prompt.md``, Telegram approvals (one ``support`` pipeline, its YAML given)."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import yaml

from tests.fakes.gmail import write_token_file


def gmail_telegram_deployment(tmp: Path, pipeline: str, *, store: str, tg: Any, gmail: Any,
                              llm: Any, token_env: str, operators: list[int], chat: int,
                              ops_chat: int, token: dict | None = None,
                              account: dict | None = None, model: dict | None = None) -> Path:
    """Writes ``support-token.json`` (``token``: more arguments of ``write_token_file``),
    ``prompt.md``, ``pipelines/support.yaml`` (``pipeline``, dedented) and
    ``draftgate.yaml`` on ``store``; ``account`` and ``model`` add keys to the Gmail
    account ``support`` and the model ``local``. Returns the config path."""
    (tmp / "pipelines").mkdir()
    write_token_file(tmp / "support-token.json", gmail, **(token or {}))
    (tmp / "prompt.md").write_text("You answer customer email for Example Shop.\n")
    (tmp / "pipelines" / "support.yaml").write_text(textwrap.dedent(pipeline))
    config = {
        "store": store,
        "pipelines": "pipelines/*.yaml",
        "telegram": {"token_env": token_env, "base_url": tg.base_url,
                     "base_file_url": tg.base_file_url, "operators": operators,
                     "approvals_chat": chat, "ops_chat": ops_chat, "poll_timeout": "2s"},
        "gmail": {"accounts": {"support": {
            "token_file": "support-token.json", "api_endpoint": gmail.url,
            "address": gmail.address, "backoff": 0.01, **(account or {})}}},
        "models": {"local": {"provider": "openai", "base_url": llm.openai_url,
                             "model": "fake-model", "retries": 0, **(model or {})}},
    }
    cfg = tmp / "draftgate.yaml"
    cfg.write_text(yaml.safe_dump(config, sort_keys=False))
    return cfg
