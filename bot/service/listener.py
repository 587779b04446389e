"""The listener under ``observability.listen`` (and ``telegram.receive: webhook``): a
tiny HTTP/1.1 server (one request per connection) that no crowd of strangers can starve.

A connection that never finishes its head would otherwise hold a descriptor until its
timeout; about 1,100 of them used up a process's 1,024 descriptors, and then the sends,
the fetches and the store failed with "Too many open files" while asyncio logged every
refused accept (91,360 lines in 45 s). Here:

* at most ``cap`` connections are open (128 for ``/metrics``, 64 for the webhook), and
  never more than a quarter of RLIMIT_NOFILE; at the cap the oldest one still waiting for
  its head is dropped (a scraper's request arrives at once, so it is the idle ones
  that go);
* a head must arrive within ``head_timeout`` and fit in 64 KiB;
* when accepting fails (the process is out of descriptors anyway), one WARNING says
  so and one INFO says when it accepts again; in between it retries once a second.
"""

from __future__ import annotations

import asyncio
import logging
import resource
import socket
from typing import Awaitable, Callable

log = logging.getLogger("draftgate.observe")

_HEAD_LIMIT = 64 * 1024
_RETRY = 1.0  # seconds between accepts while they fail


def bind(host: str, port: int) -> list[socket.socket]:
    """Listening sockets for every address ``host`` names (as asyncio.start_server
    binds them). Raises OSError."""
    socks: list[socket.socket] = []
    try:
        for family, kind, proto, _, addr in socket.getaddrinfo(
                host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE):
            sock = socket.socket(family, kind, proto)
            socks.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind(addr)
            sock.listen(128)
            sock.setblocking(False)
    except OSError:
        for sock in socks:
            sock.close()
        raise
    return socks


def connection_cap(wanted: int) -> int:
    """``wanted``, but at most a quarter of the descriptors this process may open."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return max(4, min(wanted, soft // 4)) if soft != resource.RLIM_INFINITY else wanted


#: ``answer(head, read)``: the response to a request whose head is ``head``; ``read(n)``
#: reads up to ``n`` bytes of its body (fewer only when the client stops sending).
Answer = Callable[[bytes, Callable[[int], Awaitable[bytes]]], Awaitable[bytes]]


class Listener:
    """Accepts on ``socks`` and answers each request with ``answer(head, read)``: the
    body is read only if ``answer`` asks for it."""

    def __init__(self, socks: list[socket.socket], answer: Answer, *, cap: int,
                 head_timeout: float, name: str = "observability"):
        self._socks, self._answer, self.name = socks, answer, name
        self.cap, self._head_timeout = connection_cap(cap), head_timeout
        self._open: set[asyncio.Task] = set()
        self._waiting: dict[asyncio.Task, None] = {}  # still reading the head, oldest first
        self._full = False  # said that the cap was reached, until it eases
        self._accepting = [asyncio.create_task(self._accept(s), name=f"{name}-accept")
                           for s in socks]

    async def close(self) -> None:
        tasks = [*self._accepting, *self._open]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for sock in self._socks:
            sock.close()

    async def _accept(self, sock: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        refused = 0
        while True:
            try:
                conn, _ = await loop.sock_accept(sock)
            except ConnectionAbortedError:
                continue  # the client left before it was accepted
            except OSError as exc:  # EMFILE, ENFILE, ENOBUFS...: the whole process is short
                if not refused:
                    log.warning("%s: cannot accept connections (%s); retrying every %gs, "
                                "and saying here when it accepts again", self.name,
                                exc.strerror or exc, _RETRY)
                refused += 1
                await asyncio.sleep(_RETRY)
                continue
            if refused:
                log.info("%s: accepting connections again (%d attempts refused)", self.name,
                         refused)
                refused = 0
            self._admit(conn)
            await asyncio.sleep(0)  # let a dropped connection's task close its descriptor

    def _admit(self, conn: socket.socket) -> None:
        if len(self._open) >= self.cap:
            if not self._full:
                log.warning("%s: %d connections open at once; dropping the oldest idle "
                            "ones", self.name, self.cap)
                self._full = True
            if not self._waiting:  # every one is being answered: this one waits its turn
                conn.close()
                return
            oldest = next(iter(self._waiting))
            self._open.discard(oldest)
            del self._waiting[oldest]
            oldest.cancel()
        elif self._full and len(self._open) < self.cap // 2:
            self._full = False
        conn.setblocking(False)
        task = asyncio.create_task(self._serve(conn))
        self._open.add(task)
        self._waiting[task] = None
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task) -> None:
        self._open.discard(task)
        self._waiting.pop(task, None)

    async def _serve(self, conn: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        try:
            head, rest = await asyncio.wait_for(_read_head(loop, conn), self._head_timeout)
            task = asyncio.current_task()
            self._waiting.pop(task, None)  # type: ignore[arg-type]

            async def read(n: int) -> bytes:
                nonlocal rest
                data, rest = bytearray(rest[:n]), rest[n:]
                while len(data) < n and (chunk := await loop.sock_recv(conn, min(n - len(data),
                                                                                  65536))):
                    data += chunk
                return bytes(data)

            if head is not None:
                reply = await self._answer(head, read)
                await asyncio.wait_for(loop.sock_sendall(conn, reply), self._head_timeout)
        except (asyncio.TimeoutError, ConnectionError):
            pass  # a client that sent no whole request, or left: nothing to answer
        except Exception:
            log.exception("%s: answering a request failed", self.name)
        finally:
            conn.close()


async def _read_head(loop: asyncio.AbstractEventLoop,
                     conn: socket.socket) -> tuple[bytes | None, bytes]:
    """The request up to its blank line, and what came after it; None when the client
    stops first or sends more than 64 KiB of head."""
    data = b""
    while True:
        chunk = await loop.sock_recv(conn, 4096)
        if not chunk:
            return None, b""
        end = (data + chunk).find(b"\r\n\r\n", max(0, len(data) - 3))
        data += chunk
        if end >= 0:
            return data[:end + 4], data[end + 4:]
        if len(data) > _HEAD_LIMIT:
            return None, b""
