"""Plumbing for the multi-host tests: several real ``python -m bot run`` processes on
one PostgreSQL schema, against the fake Gmail, Telegram Bot API and model servers.

The fakes run in the test process (threads); each bot is a subprocess with its own log
file. Waits are on the fakes' events or on store state, always with a deadline.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Awaitable, Callable

import asyncpg

from bot.store.postgres import parse_pg_url
from tests.fakes.gmail import FakeGmail
from tests.fakes.llm import FakeLLM
from tests.fakes.telegram import FakeTelegram
from tests.support.gmail_telegram import gmail_telegram_deployment

ROOT = Path(__file__).resolve().parent.parent
TOKEN_ENV = "DG_MULTIHOST_TELEGRAM_TOKEN"
ANNA = 42  # the allow-listed operator
CHAT = 5001  # approvals chat (private: PTB's 20/min group limit would stall 200 cards)
OPS_CHAT = 5002  # notifications go elsewhere, so the approvals chat holds only cards
_CARD_DATA = re.compile(r"^ap:(\d+):(\d+)$")
_TICKET = re.compile(r"ticket T(\d{4})")


def ticket_email(n: int) -> bytes:
    """Customer email number ``n``; its body names ``ticket Tnnnn`` so a model request
    can be traced back to the email it drafts."""
    return (f"From: Customer {n} <c{n}@customer.example>\r\nTo: support@example.com\r\n"
            f"Subject: Order question {n}\r\nDate: Sun, 29 Nov 2026 10:02:00 +0000\r\n"
            f"Message-ID: <ticket-{n}@customer.example>\r\n"
            f"Content-Type: text/plain; charset=utf-8\r\n\r\n"
            f"Hello, about ticket T{n:04d}: where is my order?\r\n").encode()


def tickets_of(llm: FakeLLM) -> list[int]:
    """For every request the model server got, the ticket number it was drafting."""
    out = []
    for req in list(llm.requests):
        m = _TICKET.search(req.texts()[1])
        out.append(int(m.group(1)) if m else -1)
    return out


def card_posts(tg: FakeTelegram) -> dict[int, int]:
    """draft id -> number of successful sendMessage calls that posted its card."""
    counts: dict[int, int] = {}
    for c in tg.calls_of("sendMessage", ok=True):
        for row in (c.params.get("reply_markup") or {}).get("inline_keyboard", []):
            for button in row:
                m = _CARD_DATA.match(str(button.get("callback_data", "")))
                if m:
                    counts[int(m.group(1))] = counts.get(int(m.group(1)), 0) + 1
    return counts


def write_deployment(tmp: Path, *, store: str, gmail: FakeGmail, tg: FakeTelegram,
                     llm: FakeLLM, lease: str, model_timeout: str,
                     max_in_flight: int | None = None) -> Path:
    """draftgate.yaml and pipelines/support.yaml: Gmail in, openai-compatible model,
    Telegram approvals, Gmail reply out, ticking every second. ``max_in_flight``:
    drafts in flight per process (default: draftgate's)."""
    cfg = gmail_telegram_deployment(tmp, f"""\
        name: support
        schedule: 1s
        source: {{type: gmail, account: support, query: "in:inbox"}}
        drafter: {{model: local, prompt: prompt.md}}
        approval: {{channel: telegram}}
        sender: {{type: gmail_reply, account: support}}
        lease: {lease}
        max_attempts: 3
        """, store=store, tg=tg, gmail=gmail, llm=llm, token_env=TOKEN_ENV, operators=[ANNA],
        chat=CHAT, ops_chat=OPS_CHAT, model={"timeout": model_timeout})
    if max_in_flight is not None:
        cfg.write_text(cfg.read_text() + f"max_in_flight: {max_in_flight}\n")
    return cfg


class Host:
    """One ``python -m bot run`` process (a "host"), its output in ``log``."""

    def __init__(self, name: str, cfg: Path, tg: FakeTelegram, *, receive: str,
                 env: dict[str, str] | None = None, home: str | None = None,
                 clock_offset: float = 0.0):
        """``env`` adds variables; ``home`` runs it as if on another machine,
        ``clock_offset`` with a clock that is off (tests/support/as_host.py)."""
        self.name = name
        self.log = cfg.parent / f"{name}.log"
        env = {**{k: v for k, v in os.environ.items() if not k.startswith("OPENAI")},
               **(env or {})}
        env[TOKEN_ENV] = tg.token
        with self.log.open("ab") as out:  # the child keeps its own copy of the descriptor
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tests.support.as_host",
                 *(["--home", home] if home else []),
                 *(["--clock-offset", str(clock_offset)] if clock_offset else []),
                 "--", "run", "-c", str(cfg), "--telegram-receive", receive],
                cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=out,
                stderr=subprocess.STDOUT)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def kill(self) -> int:
        self.proc.send_signal(signal.SIGKILL)
        return self.proc.wait(10)

    def terminate(self) -> int:
        """SIGTERM and wait; the exit code (0 is a clean stop)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
            return -999

    def ensure_dead(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


def logs(hosts: list[Host]) -> str:
    """Every host's log, for an assertion message."""
    return "\n".join(f"--- {h.name} (pid {h.pid}) ---\n{h.text()[-6000:]}" for h in hosts)


class Db:
    """Read-only looks at the store's tables, straight through asyncpg."""

    def __init__(self, url: str):
        self.dsn, self.schema = parse_pg_url(url)
        self.con: asyncpg.Connection | None = None

    async def open(self) -> "Db":
        self.con = await asyncpg.connect(self.dsn, timeout=10,
                                         server_settings={"search_path": self.schema})
        return self

    async def close(self) -> None:
        if self.con is not None:
            await self.con.close()

    async def fetch(self, sql: str, *args: Any) -> list[asyncpg.Record]:
        assert self.con is not None
        try:
            return await self.con.fetch(sql, *args)
        except asyncpg.UndefinedTableError:
            return []  # no host has migrated the schema yet

    async def statuses(self) -> dict[str, int]:
        rows = await self.fetch("SELECT status, count(*) AS n FROM drafts GROUP BY status")
        return {r["status"]: r["n"] for r in rows}

    async def cursor_recorded(self) -> bool:
        return bool(await self.fetch("SELECT 1 FROM cursors WHERE pipeline='support'"))

    async def draft_rows(self) -> list[asyncpg.Record]:
        return await self.fetch("SELECT id, version, status, send_holder, approval_message_id"
                                " FROM drafts ORDER BY id")

    async def finished_runs(self) -> int:
        rows = await self.fetch("SELECT count(*) AS n FROM pipeline_runs"
                                " WHERE pipeline='support' AND ended_at IS NOT NULL")
        return rows[0]["n"] if rows else 0


async def until(check: Callable[[], Awaitable[Any]], timeout: float, what: str,
                hosts: list[Host] = ()) -> Any:
    """Poll ``check`` until it returns something truthy; fail after ``timeout`` seconds
    naming ``what`` (with the hosts' logs), or at once if a host died."""
    deadline = time.monotonic() + timeout
    while True:
        value = await check()
        if value:
            return value
        dead = [h for h in hosts if h.proc.poll() is not None]
        if dead:
            raise AssertionError(f"while waiting for {what}: {dead[0].name} exited with "
                                 f"{dead[0].proc.returncode}\n{logs(list(hosts))}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}\n"
                                 f"{logs(list(hosts))}")
        await asyncio.sleep(0.05)
