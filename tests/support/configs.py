"""Shared test helpers (moved from test_config.py, which other tests imported)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bot.config.load import load_settings
from bot.errors import ConfigError

GOOD = """\
name: {name}
schedule: 5m
source: {{type: maildir, path: inbox}}
sender: {{type: outbox, path: out, from: s@shop.example}}
"""


def write(tmp_path: Path, pipelines: dict[str, str], top: str = "") -> Path:
    return write_raw(tmp_path, pipelines,
                     f"store: sqlite:///{tmp_path}/s.db\npipelines: pipelines/*.yaml\n" + top)


def write_raw(tmp_path: Path, pipelines: dict[str, str], config: str) -> Path:
    """pipelines/NAME holding TEXT for each NAME: TEXT of ``pipelines``, and draftgate.yaml
    holding ``config``: its path."""
    (tmp_path / "pipelines").mkdir(exist_ok=True)
    for fname, text in pipelines.items():
        (tmp_path / "pipelines" / fname).write_text(text)
    cfg = tmp_path / "draftgate.yaml"
    cfg.write_text(config)
    return cfg


def errors_of(cfg: Path) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load_settings(cfg)
    return info.value.errors


