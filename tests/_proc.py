"""Shared plumbing for tests that run the real CLI in a subprocess and kill it."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

ORDER_EMAIL = b"""From: Alice Buyer <alice@customer.example>
To: support@acme.example
Subject: Where is my order #1234?
Message-ID: <order-1234@customer.example>
Date: Sun, 29 Nov 2026 10:02:00 +0000

Hi, where is my order #1234? It was due Friday.
"""


def telegram_maildir_config(tmp_path: Path, fake: Any, operator: int, chat: int, *,
                            approval: str = "{channel: telegram}") -> Path:
    """A deployment in ``tmp_path``: one maildir pipeline holding ``ORDER_EMAIL``, a
    template drafter, ``approval`` on the Telegram channel of ``fake`` (token in
    ``DG_CRASH_TELEGRAM_TOKEN``) and an outbox sender; returns the config path."""
    (tmp_path / "inbox").mkdir()
    (tmp_path / "inbox" / "1.eml").write_bytes(ORDER_EMAIL)
    (tmp_path / "reply.txt").write_text("Hi {first_name},\n\nthanks for writing about {subject}.\n")
    (tmp_path / "pipelines").mkdir()
    (tmp_path / "pipelines" / "support.yaml").write_text(textwrap.dedent(f"""\
        name: support
        schedule: 1h
        source: {{type: maildir, path: inbox}}
        drafter: {{model: template, prompt: reply.txt}}
        approval: {approval}
        sender: {{type: outbox, path: outbox, from: "Acme <support@acme.example>"}}
        """))
    cfg = tmp_path / "draftgate.yaml"
    cfg.write_text(f"store: sqlite:///{tmp_path}/state.db\npipelines: pipelines/*.yaml\n"
                   + fake.config_yaml("DG_CRASH_TELEGRAM_TOKEN", [operator], chat, "2s"))
    return cfg


def console_model_config(tmp: Path, *, pipeline: str, lease: str, model: str, model_yaml: str,
                         email: bytes = ORDER_EMAIL, prompt_for: str = "Acme",
                         sender: str = "Acme <support@acme.example>") -> Path:
    """A deployment in ``tmp``: one pipeline ``pipeline`` (schedule 1s, ``lease``, 3
    attempts) reading ``email`` from the maildir inbox/, drafted by the model ``model``
    (``model_yaml``: its lines under ``models:``, indented four) with a prompt saying it
    answers for ``prompt_for``, approved on the console and sent from ``sender`` to
    outbox/; the store is state.db. Returns the config path."""
    (tmp / "inbox").mkdir()
    (tmp / "inbox" / "1.eml").write_bytes(email)
    (tmp / "prompt.md").write_text(f"You answer customer email for {prompt_for}.\n")
    (tmp / "pipelines").mkdir()
    (tmp / "pipelines" / f"{pipeline}.yaml").write_text(
        f"name: {pipeline}\nschedule: 1s\nsource: {{type: maildir, path: inbox}}\n"
        f"drafter: {{model: {model}, prompt: prompt.md}}\napproval: {{channel: console}}\n"
        f"sender: {{type: outbox, path: outbox, from: '{sender}'}}\n"
        f"lease: {lease}\nmax_attempts: 3\n")
    cfg = tmp / "draftgate.yaml"
    cfg.write_text(f"store: sqlite:///{tmp}/state.db\npipelines: pipelines/*.yaml\n"
                   f"models:\n  {model}:\n{model_yaml}")
    return cfg


def template_console_config(tmp: Path, name: str, top: str, pipeline: str) -> str:
    """A deployment in ``tmp``: draftgate.yaml (store s.db, then ``top``) and one pipeline
    ``name`` (every 5m; ``pipeline``: its source and sender lines), drafted by the template
    reply.txt, approved on the console. Returns the config path, as a string."""
    (tmp / "pipelines").mkdir(exist_ok=True)
    (tmp / "draftgate.yaml").write_text(
        f"store: sqlite:///{tmp}/s.db\npipelines: pipelines/*.yaml\n{top}")
    (tmp / "reply.txt").write_text("Hi {first_name}\n")
    (tmp / "pipelines" / f"{name}.yaml").write_text(
        f"name: {name}\nschedule: 5m\n{pipeline}drafter: {{model: template, prompt: reply.txt}}\n"
        "approval: {channel: console}\n")
    return str(tmp / "draftgate.yaml")


def run_cli(*args: str, env: dict[str, str] | None = None,
            timeout: float = 60) -> subprocess.CompletedProcess:
    """``python -m bot *args`` in the repository, its output captured as text."""
    return subprocess.run([sys.executable, "-m", "bot", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout, env=env or dict(os.environ))


def two_new_mails(cli, cfg, deliver, mail) -> subprocess.CompletedProcess:
    """``run --once`` (the first run records the cursor), then ``mail(1)`` and ``mail(2)``
    delivered and ``run --once`` again, which shows both: its result. ``cli`` runs the
    CLI (as :func:`run_cli`), ``deliver`` puts a raw message in the mailbox."""
    assert cli("run", "--once", "-c", str(cfg)).returncode == 0  # first run: the cursor
    deliver(mail(1))
    deliver(mail(2))
    r = cli("run", "--once", "-c", str(cfg))
    assert r.returncode == 0, r.stderr
    assert "Where is my order #1?" in r.stdout and "Where is my order #2?" in r.stdout
    return r


def gmail_every_second(tmp_path: Path, gmail: Any) -> Path:
    """The fake-Gmail deployment of ``tests.fakes.gmail`` with its pipeline ticking every
    second; returns the config path."""
    from tests.fakes.gmail import write_deployment

    cfg = Path(write_deployment(tmp_path, gmail))
    pipe = tmp_path / "pipelines" / "support.yaml"
    pipe.write_text(pipe.read_text().replace("schedule: 5m", "schedule: 1s"))
    return cfg


def rows_once_migrated(db: Path, sql: str) -> list[tuple]:
    """:func:`sqlite_rows`, or no rows while the store is not created or migrated yet."""
    try:
        return sqlite_rows(db, sql)
    except sqlite3.OperationalError:
        return []


def start_bot(cfg: Path, log: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    """``python -m bot run -c cfg`` with no stdin, output appended to ``log``."""
    with log.open("ab") as out:  # the child keeps its own copy of the descriptor
        return subprocess.Popen([sys.executable, "-m", "bot", "run", "-c", str(cfg)],
                                cwd=ROOT, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, env=env or dict(os.environ))


def reap(proc: subprocess.Popen) -> None:
    """Kill ``proc`` if it still runs, and wait for it (no zombie, no warning)."""
    if proc.poll() is None:
        proc.kill()
        proc.wait(10)


def sqlite_rows(db: Path, sql: str) -> list[tuple]:
    con = sqlite3.connect(db, timeout=10)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()
