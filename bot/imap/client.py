"""One IMAP connection to one account (aioimaplib), opened on first use and reused
across ticks; reconnected when the server or the network dropped it.

Every command runs under one lock (a connection carries one conversation at a time;
the source, a sender's check and thread context share it) and under the account's
timeout. TLS is verified against the system's CAs (or ``ca_file``); ``plain`` exists
only for a server on this machine (``allow_plain: true``). The password is read from
its environment variable when connecting and registered with :mod:`bot.redact`, so no
log line can show it; aioimaplib's own debug log of LOGIN is scrubbed by the library.
"""

from __future__ import annotations

import asyncio
import logging
import re
import ssl
from dataclasses import dataclass
from pathlib import Path

import aioimaplib

from ..config.imap import ImapAccount
from ..errors import AuthError, SourceError

log = logging.getLogger("draftgate.imap")

_UIDVALIDITY = re.compile(rb"\[UIDVALIDITY (\d+)\]")
_UIDNEXT = re.compile(rb"\[UIDNEXT (\d+)\]")
_EXISTS = re.compile(rb"^(\d+) EXISTS")
_FETCH_UID = re.compile(rb"\bUID (\d+)")
_INTERNALDATE = re.compile(rb'INTERNALDATE "([^"]+)"')
_LIST = re.compile(rb'^\((?P<flags>[^)]*)\) (?:"[^"]*"|NIL) (?P<name>.+)$')
_SPECIAL_NAMES = {"\\Sent": ("Sent", "Sent Items", "Sent Messages", "INBOX.Sent", "INBOX/Sent"),
                  "\\Drafts": ("Drafts", "INBOX.Drafts", "INBOX/Drafts")}


@dataclass(frozen=True)
class Selected:
    folder: str
    uidvalidity: int
    uidnext: int
    exists: int


def quote(name: str) -> str:
    """A mailbox name or search string as an IMAP quoted string."""
    return '"' + name.replace("\\", "\\\\").replace('"', '\\"') + '"'


def ssl_context(account: ImapAccount) -> ssl.SSLContext:
    """Verified TLS: the system's CAs, or the account's ``ca_file`` (a private CA)."""
    ctx = ssl.create_default_context(cafile=account.ca_file or None)
    return ctx


def password(account: ImapAccount, env_var: str | None = None) -> str:
    from ..config.load import env_secret

    var = env_var or account.password_env
    if not var and account.oauth2_token_file:
        token = Path(account.oauth2_token_file).expanduser().read_text().strip()
        from .. import redact

        redact.register(token, f"imap {account.name} oauth2 token")
        return token
    return env_secret(var, f"imap.accounts.{account.name}.password_env")


class ImapClient:
    """See the module docstring."""

    def __init__(self, account: ImapAccount):
        self.account = account
        self._imap: aioimaplib.IMAP4 | None = None
        self._selected: str | None = None
        self._selection: Selected | None = None
        self.lock = asyncio.Lock()
        self.capabilities: set[str] = set()
        self._special: dict[str, str] = {}
        self.commands = 0  # commands sent (the bench reads it)

    # -- connection ---------------------------------------------------------------------

    async def _connect(self) -> aioimaplib.IMAP4:
        a = self.account
        try:
            if a.security == "tls":
                imap: aioimaplib.IMAP4 = aioimaplib.IMAP4_SSL(
                    a.host, a.port, timeout=a.timeout, ssl_context=ssl_context(a))
            else:
                imap = aioimaplib.IMAP4(a.host, a.port, timeout=a.timeout)
            await imap.wait_hello_from_server()
            if a.security == "starttls":
                await _starttls(imap, a)
        except (OSError, asyncio.TimeoutError, aioimaplib.AioImapException, ssl.SSLError) as exc:
            raise SourceError(f"imap {a.name}: cannot connect to {a.host}:{a.port} "
                              f"({a.security}): {type(exc).__name__}: {exc}") from None
        secret = password(a)
        if a.oauth2_token_file and not a.password_env:
            resp = await imap.xoauth2(a.username, secret.encode())
        else:
            resp = await imap.login(a.username, secret)
        if resp.result != "OK":
            text = b" ".join(bytes(x) for x in resp.lines).decode(errors="replace")
            raise AuthError(f"imap {a.name}: login as {a.username} refused: {text.strip()}; "
                            f"check {a.password_env or a.oauth2_token_file} (an app password "
                            f"for Fastmail, iCloud, Yahoo)")
        self.capabilities = set(imap.protocol.capabilities)
        if not any(c.startswith("IMAP4") for c in self.capabilities) or "IDLE" not in \
                self.capabilities:
            await imap.protocol.capability()  # servers send more after login
            self.capabilities = set(imap.protocol.capabilities)
        return imap

    async def _ready(self) -> aioimaplib.IMAP4:
        imap = self._imap
        if imap is None or imap.get_state() in ("LOGOUT", "STARTED", "CONNECTED") or \
                imap.protocol.transport is None or imap.protocol.transport.is_closing():
            self._selected = None
            self._imap = imap = await self._connect()
        return imap

    async def _run(self, what: str, make):
        """``make(imap)`` under the lock, connected; a lost connection is retried once
        on a fresh one (reads only: callers of writes use :meth:`once`)."""
        async with self.lock:
            for attempt in (1, 2):
                imap = await self._ready()
                try:
                    self.commands += 1
                    return await make(imap)
                except (OSError, asyncio.TimeoutError, aioimaplib.AioImapException) as exc:
                    self._drop()
                    if attempt == 2:
                        raise SourceError(f"imap {self.account.name}: {what} failed: "
                                          f"{type(exc).__name__}: {exc}") from None

    async def once(self, what: str, make):
        """``make(imap)`` under the lock, never repeated: for APPEND (a second one
        would file the message twice). Errors propagate as they are."""
        async with self.lock:
            imap = await self._ready()
            self.commands += 1
            try:
                return await make(imap)
            except BaseException:
                self._drop()
                raise

    def _drop(self) -> None:
        imap, self._imap, self._selected = self._imap, None, None
        if imap is not None and imap.protocol.transport is not None:
            imap.protocol.transport.close()

    async def close(self) -> None:
        async with self.lock:
            imap, self._imap = self._imap, None
            if imap is not None and imap.get_state() not in ("LOGOUT", "STARTED"):
                try:
                    await asyncio.wait_for(imap.logout(), 5)
                except (OSError, asyncio.TimeoutError, aioimaplib.AioImapException):
                    pass
            if imap is not None and imap.protocol.transport is not None:
                imap.protocol.transport.close()

    # -- commands --------------------------------------------------------------------------

    async def _select(self, imap: aioimaplib.IMAP4, folder: str, fresh: bool = False
                      ) -> Selected:
        """SELECT ``folder``, unless this connection has it selected already (the server
        keeps a selected folder current: new mail shows in the next SEARCH)."""
        if not fresh and self._selected == folder and self._selection is not None:
            return self._selection
        self.commands += 1
        resp = await imap.select(quote(folder))
        if resp.result != "OK":
            self._selected = None
            raise SourceError(f"imap {self.account.name}: cannot open folder {folder!r}: "
                              f"{_text(resp)}")
        v = n = e = 0
        for line in resp.lines:
            line = bytes(line)
            if m := _UIDVALIDITY.search(line):
                v = int(m.group(1))
            if m := _UIDNEXT.search(line):
                n = int(m.group(1))
            if m := _EXISTS.match(line):
                e = int(m.group(1))
        self._selected, self._selection = folder, Selected(folder, v, n, e)
        return self._selection

    async def select(self, folder: str) -> Selected:
        """A fresh SELECT: the folder's UIDVALIDITY, UIDNEXT and size now."""
        self.commands -= 1  # _run counts the command, _select counts the SELECT
        return await self._run(f"SELECT {folder}",
                               lambda imap: self._select(imap, folder, fresh=True))

    async def search(self, folder: str, *criteria: str) -> list[int]:
        """UIDs in ``folder`` matching ``criteria``, ascending."""
        async def make(imap):
            await self._select(imap, folder)
            resp = await imap.uid_search(*criteria, charset=None)
            if resp.result != "OK":
                raise SourceError(f"imap {self.account.name}: UID SEARCH {' '.join(criteria)} "
                                  f"in {folder!r}: {_text(resp)}")
            # aioimaplib strips "* SEARCH"; the last line is the tagged OK's text.
            uids = [int(x) for line in resp.lines[:-1] for x in bytes(line).split()
                    if x.isdigit()]
            return sorted(set(uids))
        return await self._run("UID SEARCH", make)

    async def fetch(self, folder: str, uids: list[int], part: str = "BODY.PEEK[]",
                    uidvalidity: int | None = None) -> dict[int, bytes]:
        """uid -> the ``part`` of each message (one UID FETCH for all of ``uids``).
        ``BODY.PEEK`` never sets \\Seen. With ``uidvalidity``, a folder that changed
        it meanwhile raises SourceError (the UIDs would name other messages)."""
        if not uids:
            return {}

        async def make(imap):
            sel = await self._select(imap, folder)
            if uidvalidity is not None and sel.uidvalidity != uidvalidity:
                raise SourceError(f"imap {self.account.name}: {folder!r} changed UIDVALIDITY "
                                  f"during the fetch; the next tick scans it again")
            resp = await imap.uid("fetch", _uid_set(uids), f"(UID {part})")
            if resp.result != "OK":
                raise SourceError(f"imap {self.account.name}: UID FETCH in {folder!r}: "
                                  f"{_text(resp)}")
            return _fetched(resp.lines)
        return await self._run("UID FETCH", make)

    async def heads(self, folder: str, uids: list[int], uidvalidity: int
                    ) -> dict[int, tuple[float, bytes]]:
        """uid -> (INTERNALDATE as a timestamp, the Message-ID header line)."""
        if not uids:
            return {}

        async def make(imap):
            sel = await self._select(imap, folder)
            if sel.uidvalidity != uidvalidity:
                raise SourceError(f"imap {self.account.name}: {folder!r} changed UIDVALIDITY "
                                  f"during the fetch; the next tick scans it again")
            resp = await imap.uid("fetch", _uid_set(uids),
                                  "(UID INTERNALDATE BODY.PEEK[HEADER.FIELDS (MESSAGE-ID)])")
            if resp.result != "OK":
                raise SourceError(f"imap {self.account.name}: UID FETCH in {folder!r}: "
                                  f"{_text(resp)}")
            return _fetched(resp.lines, dates=True)
        return await self._run("UID FETCH", make)

    async def append(self, folder: str, raw: bytes, flags: str = "") -> None:
        """APPEND ``raw`` to ``folder`` once; raises whatever the attempt raised."""
        async def make(imap):
            resp = await imap.append(raw, mailbox=quote(folder), flags=flags or None)
            if resp.result != "OK":
                raise SourceError(f"imap {self.account.name}: APPEND to {folder!r} refused: "
                                  f"{_text(resp)}")
        await self.once(f"APPEND {folder}", make)

    async def find_message_id(self, folder: str, message_id: str) -> int | None:
        """The UID of a message in ``folder`` whose Message-ID is ``message_id``."""
        uids = await self.search(folder, "HEADER", "Message-ID", quote(message_id))
        return uids[-1] if uids else None

    async def special_folder(self, use: str, configured: str) -> str:
        """The folder of special use ``use`` (``\\Sent``, ``\\Drafts``): ``configured``
        unless it is ``auto``, else the one the server flags (RFC 6154), else a usual
        name that exists."""
        if configured and configured != "auto":
            return configured
        if use in self._special:
            return self._special[use]

        async def make(imap):
            resp = await imap.list('""', '"*"')
            return [bytes(x) for x in resp.lines] if resp.result == "OK" else []
        names: list[tuple[str, str]] = []
        for line in await self._run("LIST", make):
            if m := _LIST.match(line):
                name = m.group("name").decode("utf-8", "replace").strip()
                if name.startswith('"') and name.endswith('"'):
                    name = name[1:-1].replace('\\"', '"').replace("\\\\", "\\")
                names.append((m.group("flags").decode(), name))
        found = next((n for f, n in names if use.lower() in f.lower().split()), None) or \
            next((n for n in _SPECIAL_NAMES.get(use, ()) if n in {x for _, x in names}), None)
        if found is None:
            raise SourceError(f"imap {self.account.name}: no {use} folder on the server; set "
                              f"imap.accounts.{self.account.name}."
                              f"{'sent' if use == chr(92) + 'Sent' else 'drafts'}_folder")
        self._special[use] = found
        return found


async def _starttls(imap: aioimaplib.IMAP4, account: ImapAccount) -> None:
    """STARTTLS (RFC 3501 6.2.1), which aioimaplib lists but does not implement: the
    command, then the same connection upgraded to verified TLS."""
    proto = imap.protocol
    if "STARTTLS" not in proto.capabilities:
        raise SourceError(f"imap {account.name}: {account.host} offers no STARTTLS; use "
                          f"security: tls (port 993)")
    resp = await proto.execute(aioimaplib.Command("STARTTLS", proto.new_tag(), loop=proto.loop))
    if resp.result != "OK":
        raise SourceError(f"imap {account.name}: STARTTLS refused: {_text(resp)}")
    loop = asyncio.get_running_loop()
    transport = await loop.start_tls(proto.transport, proto, ssl_context(account),
                                     server_hostname=account.host)
    proto.transport = transport
    await proto.capability()


def _uid_set(uids: list[int]) -> str:
    """``1,2,3,7`` -> ``1:3,7``."""
    out, run = [], [uids[0], uids[0]]
    for u in sorted(uids)[1:]:
        if u == run[1] + 1:
            run[1] = u
        else:
            out.append(run)
            run = [u, u]
    out.append(run)
    return ",".join(f"{a}:{b}" if a != b else str(a) for a, b in out)


def _fetched(lines: list, dates: bool = False) -> dict:
    """aioimaplib's FETCH lines -> uid -> literal (with ``dates``: uid -> (INTERNALDATE,
    literal)). Each message comes as a line ``N FETCH (UID u ... BODY[] {size}``, then
    the literal (a bytearray), then ``)``."""
    out: dict = {}
    uid: int | None = None
    when = 0.0
    for line in lines:
        if isinstance(line, bytearray):
            if uid is not None:
                out[uid] = (when, bytes(line)) if dates else bytes(line)
            uid = None
        elif b" FETCH " in line:
            m = _FETCH_UID.search(line)
            uid = int(m.group(1)) if m else None
            d = _INTERNALDATE.search(line)
            when = _internaldate(d.group(1).decode()) if d else 0.0
    return out


def _internaldate(text: str) -> float:
    from datetime import datetime

    try:
        return datetime.strptime(text.strip(), "%d-%b-%Y %H:%M:%S %z").timestamp()
    except ValueError:
        return 0.0


def _text(resp) -> str:
    return b" ".join(bytes(x) for x in resp.lines[-1:]).decode(errors="replace").strip()
