"""Parts of the chaos soak (tests/_chaos.py): fakes that fail at random, finding the
process behind a connection, and read-only SQL on the store the hosts share."""

from __future__ import annotations

import asyncio
import base64
import collections
import contextlib
import email
import email.policy
import os
import random
import re
import sqlite3
import sys
import threading
import uuid
from pathlib import Path
from typing import Any, Callable

from tests.fakes.gmail import FakeGmail, _Fault
from tests.fakes.llm import Error, FakeLLM, Reply

# -- fakes that fail at random -------------------------------------------------------------

class ChaosLLM(FakeLLM):
    """The fake model; with ``rate`` > 0 a request fails at random (5xx, 429, 400)."""

    def __init__(self, seed: int):
        super().__init__()
        self.rng = random.Random(seed)
        self.rng_lock = threading.Lock()
        self.rate = 0.0
        self.injected: collections.Counter[str] = collections.Counter()

    def _next(self, req):
        step = super()._next(req)
        with self.rng_lock:
            if not (self.rate and isinstance(step, Reply) and self.rng.random() < self.rate):
                return step
            kind = self.rng.choice(["500", "503", "429", "429", "400"])
        self.injected[f"model {kind}"] += 1
        if kind == "429":
            return Error(429, "rate limited (chaos)", retry_after=1)
        if kind == "400":
            return Error(400, "this request was refused (chaos)")
        return Error(int(kind), "server trouble (chaos)")


class ChaosGmail(FakeGmail):
    """The fake Gmail; with ``read_rate``/``send_rate`` > 0 calls fail at random. A
    send may fail before it is accepted (500, 429) or after (the reply is stored, then
    the connection drops or a 500 comes back). ``kill_hook(client_port, key)`` is
    called once for the next send POST that gets that far; it returns whether the
    send is then accepted."""

    def __init__(self, seed: int):
        super().__init__()
        self.rng = random.Random(seed)
        self.read_rate = self.send_rate = 0.0
        self.injected: collections.Counter[str] = collections.Counter()
        self.kill_hook: Callable[[int, str], bool] | None = None
        self._port = threading.local()

    def handle(self, h, method):
        self._port.value = h.client_address[1]
        return super().handle(h, method)

    def _take_fault(self, route):  # called under self.lock
        fault = super()._take_fault(route)
        if fault is not None or route == "token":
            return fault
        rate = self.send_rate if route == "messages.send" else self.read_rate
        if not rate or self.rng.random() >= rate:
            return None
        if route == "messages.send":
            kind = self.rng.choice(["500 before", "429 before", "drop after", "500 after"])
        else:
            kind = self.rng.choice(["500", "503", "429"])
        self.injected[f"gmail {route} {kind}"] += 1
        if kind == "drop after":
            return _Fault(0, 1, after_accept=True, drop=True)
        status = int(kind[:3])
        body = {"error": {"code": status, "message": "chaos", "errors": []}}
        if kind == "500 after":
            return _Fault(500, 1, body=body, after_accept=True)
        headers = {"Retry-After": "1"} if status == 429 else {}
        return _Fault(status, 1, headers, body)

    def _r_messages_send(self, q, body, p):
        with self.lock:
            hook, self.kill_hook = self.kill_hook, None
        if hook is not None and not hook(getattr(self._port, "value", 0), _draft_key(body)):
            # Killed, and the send never happened: Gmail did not get it.
            return 503, {"error": {"code": 503, "message": "chaos: not accepted"}}
        return super()._r_messages_send(q, body, p)


def _draft_key(body: Any) -> str:
    try:
        raw = base64.urlsafe_b64decode(body["raw"] + "=" * (-len(body["raw"]) % 4))
        return str(email.message_from_bytes(raw, policy=email.policy.default)
                   .get("X-Draftgate-Key", ""))
    except Exception:
        return ""


def _quiet_resets(server) -> None:
    """A client SIGKILLed mid-request resets its connection: expected here, so the
    fake's server does not print a traceback for it (other errors still print)."""
    plain = server.handle_error

    def handle_error(request, client_address):
        if not isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):
            plain(request, client_address)
    server.handle_error = handle_error


def _pid_of_client(port: int, pids: list[int]) -> int | None:
    """The process (among ``pids``) whose TCP socket has local port ``port`` (Linux)."""
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                f = line.split()
                if len(f) > 9 and int(f[1].rsplit(":", 1)[1], 16) == port:
                    inodes.add(f[9])
    for pid in pids:
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    link = os.readlink(f"/proc/{pid}/fd/{fd}")
                    if link.startswith("socket:[") and link[8:-1] in inodes:
                        return pid
    return None


# -- the store, read from outside ------------------------------------------------------------

class StoreView:
    """Read-only SQL on the store the hosts share (SQLite file or PostgreSQL schema)."""

    def __init__(self, url: str):
        self.url = url
        self.con = None

    async def open(self) -> None:
        if self.url.startswith("postgres"):
            import asyncpg

            from bot.store.postgres import parse_pg_url
            dsn, schema = parse_pg_url(self.url)
            self.con = await asyncpg.connect(dsn, timeout=10,
                                             server_settings={"search_path": schema})

    async def close(self) -> None:
        if self.con is not None:
            await self.con.close()

    async def rows(self, sql: str) -> list[dict]:
        if self.con is not None:
            import asyncpg
            try:
                return [dict(r) for r in await self.con.fetch(sql)]
            except asyncpg.UndefinedTableError:
                return []  # no host has migrated the schema yet
        path = self.url.removeprefix("sqlite:///")

        def read() -> list[dict]:
            if not os.path.exists(path):
                return []
            con = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10)
            con.row_factory = sqlite3.Row
            try:
                return [dict(r) for r in con.execute(sql).fetchall()]
            except sqlite3.OperationalError as exc:
                if "no such table" in str(exc):
                    return []
                raise
            finally:
                con.close()
        return await asyncio.to_thread(read)

    async def drafts(self) -> list[dict]:
        return await self.rows("SELECT id, key, item_id, status, version, error,"
                               " approval_message_id, lease_until, updated_at"
                               " FROM drafts ORDER BY id")


async def _pg_admin(url: str, sql: str) -> None:
    import asyncpg

    from bot.store.postgres import parse_pg_url
    dsn, _ = parse_pg_url(url)
    con = await asyncpg.connect(dsn, timeout=10)
    try:
        await con.execute(sql)
    finally:
        await con.close()


def _fresh_pg_url(url: str) -> tuple[str, str]:
    """``url`` pointed at a new schema ``<its schema>_<random>`` (``chaos_<random>`` for
    public), which the run makes and drops: a soak never touches existing data."""
    from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

    from bot.store.postgres import parse_pg_url
    _, base = parse_pg_url(url)
    schema = f"{'chaos' if base == 'public' else base}_{uuid.uuid4().hex[:8]}"[-63:]
    parts = urlsplit(url)
    query = [(k, v) for k, v in parse_qsl(parts.query) if k != "schema"] + [("schema", schema)]
    return urlunsplit(parts._replace(query=urlencode(query))), schema


def _redacted(url: str) -> str:
    return re.sub(r"//[^@/]*@", "//…@", url) if "@" in url else url
