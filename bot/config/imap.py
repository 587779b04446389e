"""``imap.accounts`` in the deployment file, and the ``imap`` source and ``smtp_reply`` /
``imap_draft`` senders of a pipeline, parsed once into the frozen objects below.

::

    imap:
      accounts:
        shop:
          host: imap.example.net
          port: 993                 # 993 with security: tls (default), 143 with starttls
          security: tls             # tls | starttls | plain (plain needs allow_plain: true)
          username: support@shop.example
          password_env: SHOP_MAIL_PASSWORD
          folder: INBOX
          sent_folder: auto         # the \\Sent special-use folder, or a name
          smtp: {host: smtp.example.net, port: 465, security: tls}
          saves_sent: false

Passwords are named by environment variable and read when a connection is made; a
password written in the YAML is refused.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from . import mailbox
from .checker import Checker, parse_duration

_PROVIDER = ("IMAP", "imap")

SECURITY = ("tls", "starttls", "plain")
_IMAP_PORTS = {"tls": 993, "starttls": 143, "plain": 143}
_SMTP_PORTS = {"tls": 465, "starttls": 587, "plain": 25}


@dataclass(frozen=True)
class SmtpServer:
    host: str
    port: int
    security: str = "tls"
    username: str = ""  # default: the IMAP login
    password_env: str = ""  # default: the IMAP one


@dataclass(frozen=True)
class ImapAccount:
    name: str
    host: str
    username: str
    port: int = 993
    security: str = "tls"
    allow_plain: bool = False
    password_env: str = ""
    oauth2_token_file: str = ""  # XOAUTH2: a file holding the access token
    folder: str = "INBOX"
    sent_folder: str = "auto"
    drafts_folder: str = "auto"
    smtp: SmtpServer | None = None
    saves_sent: bool = False
    ca_file: str = ""  # a private CA for a self-hosted server (TLS is always verified)
    timeout: float = 30.0
    idle: bool = True  # use IDLE where the server has it
    address: str = ""  # the From of replies; default the username when it is an address


_ACCOUNT_KEYS = tuple(f.name for f in fields(ImapAccount) if f.name != "name")
_SMTP_KEYS = tuple(f.name for f in fields(SmtpServer))


def parse_accounts(ck: Checker, raw: Any, path: str = "imap") -> mailbox.Accounts:
    """``imap:`` -> account name -> :class:`ImapAccount` for the valid ones, and
    ``names``: every name written; each problem recorded in ``ck``."""
    return mailbox.parse_section(ck, raw, path, _account)


def _unknown(ck: Checker, data: dict, known: tuple[str, ...], path: str) -> None:
    mailbox.unknown_keys(ck, data, known, path, ("password", "pass"),
                         "a password does not belong in YAML; set password_env to the name "
                         "of an environment variable that holds it")


def _security(ck: Checker, data: dict, path: str, allow_plain: bool) -> str:
    security = ck.get(data, "security", path, str, default="tls", choices=SECURITY) or "tls"
    if security == "plain" and not allow_plain:
        ck.error(f"{path}.security", "plain sends the password unencrypted; use tls or "
                                     "starttls (allow_plain: true on the account permits it, "
                                     "for a server on this machine only)")
    return security


def _port(ck: Checker, data: dict, path: str, default: int) -> int:
    port = ck.get(data, "port", path, int, default=default)
    if port is None or not 0 < port < 65536:
        if port is not None:
            ck.error(f"{path}.port", f"expected a port number from 1 to 65535, got {port}")
        return default
    return port


def _account(ck: Checker, name: str, acc: dict, path: str) -> ImapAccount | None:
    before = len(ck.errors)
    _unknown(ck, acc, _ACCOUNT_KEYS, path)
    host = ck.get(acc, "host", path, str)
    username = ck.get(acc, "username", path, str)
    allow_plain = bool(ck.get(acc, "allow_plain", path, bool, default=False))
    security = _security(ck, acc, path, allow_plain)
    password_env = ck.env_name(acc, "password_env", path, default=None) or ""
    token_file = ck.get(acc, "oauth2_token_file", path, str, default="") or ""
    if not password_env and not token_file:
        ck.error(f"{path}.password_env", "missing; name the environment variable holding the "
                                         "(app) password, or set oauth2_token_file for XOAUTH2")
    timeout = ck.convert(acc, "timeout", path, parse_duration, default=30.0)
    if timeout is not None and timeout <= 0:
        ck.error(f"{path}.timeout", f"expected a duration above 0 like 30s, got {acc['timeout']!r}")
    address = ck.get(acc, "address", path, str, default="") or ""
    if address and "@" not in address:
        ck.error(f"{path}.address", f"expected an email address, got {address!r}")
    smtp = _smtp(ck, acc.get("smtp"), f"{path}.smtp", allow_plain)
    strings = {key: ck.get(acc, key, path, str, default=getattr(ImapAccount, key)) or
               getattr(ImapAccount, key) for key in ("folder", "sent_folder", "drafts_folder",
                                                     "ca_file")}
    if len(ck.errors) != before or host is None or username is None:
        return None
    return ImapAccount(
        name=name, host=host, username=username, port=_port(ck, acc, path, _IMAP_PORTS[security]),
        security=security, allow_plain=allow_plain, password_env=password_env,
        oauth2_token_file=token_file, smtp=smtp, timeout=timeout or 30.0,
        saves_sent=bool(ck.get(acc, "saves_sent", path, bool, default=False)),
        idle=bool(ck.get(acc, "idle", path, bool, default=True)),
        address=address or (username if "@" in username else ""), **strings)


def _smtp(ck: Checker, raw: Any, path: str, allow_plain: bool) -> SmtpServer | None:
    if raw is None:
        return None
    data = ck.mapping(raw, path)
    _unknown(ck, data, _SMTP_KEYS, path)
    host = ck.get(data, "host", path, str)
    security = _security(ck, data, path, allow_plain)
    return SmtpServer(host=host or "", port=_port(ck, data, path, _SMTP_PORTS[security]),
                      security=security,
                      username=ck.get(data, "username", path, str, default="") or "",
                      password_env=ck.env_name(data, "password_env", path, default=None) or "")


# -- pipeline stages ---------------------------------------------------------------------------

@dataclass(frozen=True)
class ImapSourceOptions(mailbox.SourceOptions):
    batch: int = 50  # messages per UID FETCH
    type: str = "imap"


def parse_source(ck: Checker, raw: dict, imap_accounts: Any, settings_file: str
                 ) -> ImapSourceOptions:
    return mailbox.parse_source(ImapSourceOptions, ck, raw, imap_accounts, settings_file,
                                _PROVIDER, max_backfill=None, max_batch=500,
                                batch_what="messages")


@dataclass(frozen=True)
class SmtpSenderOptions(mailbox.SenderOptions):
    type: str = "smtp_reply"  # or imap_draft


def parse_sender(ck: Checker, raw: dict, imap_accounts: Any, settings_file: str,
                 source_account: Any) -> SmtpSenderOptions:
    account = mailbox.sender_account(ck, raw, imap_accounts, settings_file, source_account,
                                     _PROVIDER)
    acc = imap_accounts.get(account) if hasattr(imap_accounts, "get") else None
    if raw["type"] == "smtp_reply" and acc is not None and acc.smtp is None:
        ck.error("sender.type", f"smtp_reply needs imap.accounts.{account}.smtp in "
                                f"{settings_file} (host, port, security)")
    return SmtpSenderOptions(account, raw["type"])
