"""Shared test helpers (moved from test_team_desk.py, which other tests imported)."""

from __future__ import annotations

import textwrap
from pathlib import Path

from tests.fakes.telegram import FakeTelegram
from tests.support.telegram_world import (
    ANNA,
    BO,
    SUPPORT_CHAT,
    write_config,
)

CY = 44  # a third operator


def team_config(tmp_path: Path, fake: FakeTelegram, approval: str, extra: str = "",
                digest: str = "") -> Path:
    """write_config's deployment with three operators, and support's approval: set."""
    cfg = write_config(tmp_path, fake)
    text = cfg.read_text().replace(f"operators: [{ANNA}, {BO}]", f"operators: [{ANNA}, {BO}, {CY}]")
    cfg.write_text(text + (f'  digest: "{digest}"\n' if digest else ""))
    (tmp_path / "pipelines" / "support.yaml").write_text(textwrap.dedent(f"""\
        name: support
        schedule: 1h
        source: {{type: maildir, path: mail-support}}
        approval: {{channel: telegram, chat: {SUPPORT_CHAT}, {approval}}}
        sender: {{type: outbox, path: outbox, from: "Acme <support@acme.example>"}}
        """) + extra)
    return cfg


