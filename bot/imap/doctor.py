"""``draftgate doctor`` for IMAP accounts: login, the folders the pipelines use (the
inbox folder, Sent, Drafts), IDLE, and the SMTP login. No mail is sent or stored."""

from __future__ import annotations

from typing import Any

import aiosmtplib

from ..config.imap import ImapAccount
from ..errors import DraftgateError
from .client import ImapClient, password, ssl_context


async def check(settings: Any) -> list[tuple[str, bool, str]]:
    """One ``(name, ok, detail)`` per check, for every account in imap.accounts."""
    results: list[tuple[str, bool, str]] = []
    for name, account in sorted(settings.imap_accounts.items()):
        results += await _imap(name, account)
        if account.smtp is not None:
            results.append(await _smtp(name, account))
    return results


async def _imap(name: str, account: ImapAccount) -> list[tuple[str, bool, str]]:
    client = ImapClient(account)
    out: list[tuple[str, bool, str]] = []
    try:
        try:
            sel = await client.select(account.folder)
        except DraftgateError as exc:
            return [(f"imap:{name} login", False, str(exc))]
        out.append((f"imap:{name} login", True, f"{account.username} at {account.host}:"
                    f"{account.port} ({account.security}); {account.folder}: {sel.exists} "
                    f"message(s)"))
        for use, configured in (("\\Sent", account.sent_folder),
                                ("\\Drafts", account.drafts_folder)):
            label = f"imap:{name} {use[1:].lower()} folder"
            try:
                folder = await client.special_folder(use, configured)
                await client.select(folder)
                out.append((label, True, folder))
            except DraftgateError as exc:
                out.append((label, False, str(exc)))
        idle = "IDLE" in client.capabilities
        out.append((f"imap:{name} idle", True, "IDLE: new mail starts a tick at once" if idle
                    else "no IDLE on this server: mail is read on the schedule"))
    finally:
        await client.close()
    return out


async def _smtp(name: str, account: ImapAccount) -> tuple[str, bool, str]:
    s = account.smtp
    assert s is not None
    try:
        smtp = aiosmtplib.SMTP(hostname=s.host, port=s.port, timeout=account.timeout,
                               use_tls=s.security == "tls",
                               start_tls=True if s.security == "starttls" else False,
                               tls_context=ssl_context(account) if s.security != "plain" else None,
                               username=s.username or account.username,
                               password=password(account, s.password_env or None))
        await smtp.connect()  # EHLO, STARTTLS and the login; no MAIL command
        await smtp.quit()
    except (aiosmtplib.SMTPException, OSError, DraftgateError) as exc:
        return f"smtp:{name} login", False, f"{s.host}:{s.port}: {exc}"
    return f"smtp:{name} login", True, f"{s.username or account.username} at {s.host}:{s.port} " \
                                       f"({s.security}); nothing sent"
