"""Senders ``smtp_reply`` (the reply over SMTP, then filed in Sent) and ``imap_draft``
(the reply saved in the Drafts folder, sent later from the team's own mail client).

::

    sender: {type: smtp_reply, account: shop}
    sender: {type: imap_draft, account: shop}

Exactly once: SMTP has no idempotency key, so the reply carries a Message-ID derived
from the draft key and the message is handed over once (aiosmtplib never resends; a
new connection per send, no retry). Who took the message is read from the SMTP
replies (RFC 5321 6.1: a server takes responsibility with the 250 after the final dot,
and only then):

* 250: sent; then appended to the Sent folder (``\\Seen``) unless the provider files
  SMTP mail itself (``saves_sent: true``). A failed append is logged; the reply went out.
* a 5xx or 4xx reply at any step: ``SendFailed`` with the server's own words (it did
  not take the message; Retry sends it).
* the connection lost or timed out after DATA began: ``SendUnknown``. :meth:`check`
  then searches the Sent folder for the Message-ID (``UID SEARCH HEADER Message-ID``):
  found means sent. Not found means not sent only where the provider files every
  message it takes (``saves_sent``); elsewhere nothing can tell, and the card says so.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

import aiosmtplib

from ..config.imap import ImapAccount
from ..config.load import PipelineConfig, Settings
from ..config.options import SmtpSenderOptions, expect
from ..errors import AuthError, ConfigError, SendFailed, SendUnknown, SourceError
from ..imap import pool
from ..imap.client import ImapClient, password, ssl_context
from ..mail.reply import build_reply, reply_message_id
from ..models import Draft, SendResult

log = logging.getLogger("draftgate.senders.smtp")

SENT, DRAFTS = "\\Sent", "\\Drafts"


class _ImapSender:
    name = "imap"

    def __init__(self, account: ImapAccount):
        self.account = account
        self._lease = pool.lease(account)

    @property
    def client(self) -> ImapClient:
        return self._lease.client

    def _raw(self, draft: Draft) -> bytes:
        a = self.account
        try:
            return bytes(build_reply(draft, a.address or a.username))
        except ValueError as exc:
            raise SendFailed(f"cannot build the reply: {exc}") from None

    async def _find(self, use: str, configured: str, draft: Draft) -> str | None:
        """This draft's Message-ID if a message carrying it is in the ``use`` folder."""
        mid = reply_message_id(draft)
        try:
            folder = await self.client.special_folder(use, configured)
            uid = await self.client.find_message_id(folder, mid)
        except (SourceError, AuthError) as exc:
            raise SendUnknown(f"cannot check the mailbox yet: {exc}") from None
        return mid if uid is not None else None

    async def close(self) -> None:
        await self._lease.close()


class SmtpReplySender(_ImapSender):
    """``smtp_reply``: see the module docstring."""

    name = "smtp_reply"

    def __init__(self, account: ImapAccount, smtp_factory: Callable[..., Any] = aiosmtplib.SMTP):
        super().__init__(account)
        self._smtp_factory = smtp_factory

    def _smtp(self) -> Any:
        a, s = self.account, self.account.smtp
        assert s is not None, "the loader refuses smtp_reply without imap.accounts.NAME.smtp"
        return self._smtp_factory(
            hostname=s.host, port=s.port, timeout=a.timeout, use_tls=s.security == "tls",
            start_tls=True if s.security == "starttls" else False,
            tls_context=ssl_context(a) if s.security != "plain" else None,
            username=s.username or a.username,
            password=password(a, s.password_env or None))

    async def send(self, draft: Draft) -> SendResult:
        raw = self._raw(draft)
        to = draft.message.reply_to
        sender = self.account.address or self.account.username
        try:
            smtp = self._smtp()
            await smtp.connect()  # and login: nothing handed over yet
        except ConfigError as exc:  # the password's variable is not set
            raise SendFailed(str(exc)) from None
        except aiosmtplib.SMTPException as exc:
            raise SendFailed(f"SMTP {self.account.smtp.host}: {_words(exc)}") from None  # type: ignore[union-attr]
        except OSError as exc:
            raise SendFailed(f"SMTP {self.account.smtp.host}: cannot connect: {exc}") from None  # type: ignore[union-attr]
        try:
            # Once: aiosmtplib sends MAIL, RCPT, DATA and the message, and never again.
            await smtp.sendmail(sender, [to], raw)
        except aiosmtplib.SMTPRecipientsRefused as exc:
            raise SendFailed("SMTP refused the recipient: " + "; ".join(
                _words(e) for e in exc.recipients)) from None
        except aiosmtplib.SMTPResponseException as exc:
            # A reply the server chose: it did not take the message (4xx: for now).
            raise SendFailed(f"SMTP refused the message: {_words(exc)}") from None
        except (aiosmtplib.SMTPException, OSError, TimeoutError) as exc:
            raise SendUnknown(f"SMTP connection lost before the server's answer "
                              f"({type(exc).__name__}: {exc})") from None
        finally:
            await _quit(smtp)
        await self._file_in_sent(draft, raw)
        return SendResult(sent_id=reply_message_id(draft))

    async def _file_in_sent(self, draft: Draft, raw: bytes) -> None:
        if self.account.saves_sent:
            return
        try:
            folder = await self.client.special_folder(SENT, self.account.sent_folder)
            await self.client.append(folder, raw, "(\\Seen)")
        except Exception as exc:  # logged; the reply went out regardless
            log.warning("imap %s: reply for %s sent, but filing it in Sent failed: %s",
                        self.account.name, draft.key, exc)

    async def check(self, draft: Draft) -> str | None:
        """The Message-ID when the reply is in Sent; None when it is certainly not
        sent; SendUnknown when nothing can tell (see the module docstring)."""
        found = await self._find(SENT, self.account.sent_folder, draft)
        if found or self.account.saves_sent:
            return found
        raise SendUnknown(
            "the SMTP server may have taken it: the connection was lost before its answer, "
            "and this provider does not file SMTP mail in Sent (saves_sent: false), so "
            "nothing can tell. Look in the recipient's thread or your mail client; Retry "
            "may send it a second time")


class ImapDraftSender(_ImapSender):
    """``imap_draft``: the reply appended to the Drafts folder with ``\\Draft``."""

    name = "imap_draft"

    async def send(self, draft: Draft) -> SendResult:
        raw = self._raw(draft)
        try:
            folder = await self.client.special_folder(DRAFTS, self.account.drafts_folder)
        except (SourceError, AuthError) as exc:
            raise SendFailed(str(exc)) from None
        try:
            await self.client.append(folder, raw, "(\\Draft \\Seen)")
        except SourceError as exc:  # the server answered NO / BAD: not saved
            raise SendFailed(str(exc)) from None
        except Exception as exc:  # lost before the answer: check() looks for it
            raise SendUnknown(f"IMAP APPEND to {folder} cut off: {type(exc).__name__}: "
                              f"{exc}") from None
        return SendResult(sent_id=reply_message_id(draft))

    async def check(self, draft: Draft) -> str | None:
        """The Message-ID when the draft is in Drafts, else None (an APPEND either
        stored it or did not; the folder says which)."""
        return await self._find(DRAFTS, self.account.drafts_folder, draft)


def _words(exc: Any) -> str:
    code, message = getattr(exc, "code", None), getattr(exc, "message", str(exc))
    return f"{code} {message}".strip() if code else str(message)


async def _quit(smtp: Any) -> None:
    try:
        if smtp.is_connected:
            await smtp.quit()
    except Exception:  # the message's fate is settled; the goodbye does not matter
        smtp.close()


def create(pipeline: PipelineConfig, settings: Settings) -> _ImapSender:
    """Build the sender from its checked ``sender:`` options (no I/O)."""
    o = expect(pipeline.sender, SmtpSenderOptions)
    account = settings.imap_accounts[o.account]
    return ImapDraftSender(account) if o.type == "imap_draft" else SmtpReplySender(account)
