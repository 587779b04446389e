"""systemd's notify protocol (``Type=notify``, ``WatchdogSec=``), with the standard library.

A message is one datagram of ``KEY=VALUE`` lines to the AF_UNIX socket named by
``$NOTIFY_SOCKET`` (a leading ``@`` names a Linux abstract socket). ``WATCHDOG_USEC``
is the watchdog interval systemd enforces (for the process ``WATCHDOG_PID`` when set):
draftgate pings at half of it while its loops are healthy and stops when they are
not, so systemd restarts a wedged process. Without ``$NOTIFY_SOCKET`` (not under
systemd) every call does nothing.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from typing import Callable

log = logging.getLogger("draftgate.systemd")


class Notifier:
    def __init__(self, environ: dict[str, str] | None = None):
        env = os.environ if environ is None else environ
        address = env.get("NOTIFY_SOCKET", "")
        if address.startswith("@"):
            address = "\0" + address[1:]
        self.address = address if address.startswith(("/", "\0")) else ""
        self.watchdog: float | None = None  # seconds between pings
        pid = env.get("WATCHDOG_PID", "")
        usec = env.get("WATCHDOG_USEC", "")
        if self.address and usec.isdigit() and int(usec) > 0 and pid in ("", str(os.getpid())):
            self.watchdog = int(usec) / 2e6
        self._sock: socket.socket | None = None

    def send(self, message: str) -> None:
        if not self.address:
            return
        try:
            if self._sock is None:
                self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
                # Never block the event loop on a manager that does not read: a ping
                # that finds the queue full is dropped (the next one follows).
                self._sock.setblocking(False)
            self._sock.sendto(message.encode(), self.address)
        except BlockingIOError:
            log.debug("systemd's notify socket is full; dropped %s", message.split("\n")[0])
        except OSError as exc:  # systemd gone or the socket not ours: nothing to tell
            log.warning("could not notify systemd at $NOTIFY_SOCKET: %s", exc)

    async def watch(self, stuck: Callable[[], dict[str, str]]) -> None:
        """Ping the watchdog while nothing is stuck; while something is, say what in
        ``STATUS=`` instead (no ping), until cancelled."""
        if self.watchdog is None:
            return
        unhealthy = False
        while True:
            if problems := stuck():
                unhealthy = True
                self.send("STATUS=unhealthy: " + "; ".join(f"{k}: {v}" for k, v in problems.items()))
            else:
                self.send("WATCHDOG=1\nSTATUS=running" if unhealthy else "WATCHDOG=1")
                unhealthy = False
            await asyncio.sleep(self.watchdog)

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
