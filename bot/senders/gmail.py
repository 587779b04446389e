"""Senders ``gmail_reply`` and ``gmail_draft``: the approved text as a threaded reply.

::

    sender: {type: gmail_reply, account: support, mark_read: false, label: Answered}
    sender: {type: gmail_draft, account: support}

Exactly once (DESIGN.md): the reply carries a Message-ID derived from the draft key;
messages.send (or drafts.create) is issued once through a transport that never
re-sends; a connection lost before the answer, a timeout or a 5xx is ``SendUnknown``
and :meth:`check` later asks Gmail for ``rfc822msgid:<that id>`` instead of sending
again, counting only a message labelled SENT (or a draft) in the original's thread. A 4xx is ``SendFailed``. Marking the original read or labelling it happens
after a successful send and can never turn a sent reply into an unsent one.
"""

from __future__ import annotations

import base64
import logging
import os
from typing import Any, Callable

from ..config.load import PipelineConfig, Settings
from ..config.options import GmailSenderOptions, expect
from ..errors import AuthError, SendFailed, SendUnknown, SourceError
from ..gmail.client import GmailClient
from ..gmail.errors import MaybeSent, NotSent
from ..mail.reply import build_reply, reply_message_id
from ..models import Draft, SendResult

log = logging.getLogger("draftgate.senders.gmail")


class _GmailSender:
    name = "gmail"

    def __init__(self, client: GmailClient, *, account: str, mark_read: bool = False,
                 label: str | None = None):
        self.client = client
        self.account = account
        self.mark_read = mark_read
        self.label = label
        self._label_id: str | None = None

    async def _from(self) -> str:
        """The account's address: configured, else asked once from Gmail."""
        if not self.client.address:
            try:
                profile = await self.client.aread(
                    lambda s: s.users().getProfile(userId="me"), "getProfile")
            except (SourceError, AuthError) as exc:
                raise SendFailed(f"cannot learn the account's address (set "
                                 f"gmail.accounts.{self.account}.address): {exc}") from None
            self.client.address = str(profile.get("emailAddress") or "")
        return self.client.address

    async def _raw(self, draft: Draft) -> dict:
        try:
            mime = build_reply(draft, await self._from())
        except ValueError as exc:
            raise SendFailed(f"cannot build the reply: {exc}") from None
        raw = base64.urlsafe_b64encode(bytes(mime)).decode("ascii")
        body: dict[str, Any] = {"raw": raw}
        if draft.message.thread_id:
            body["threadId"] = draft.message.thread_id
        return body

    async def _send(self, draft: Draft, make: Callable[[Any, dict], Any], what: str) -> SendResult:
        """Issue ``make(service, raw reply)`` once, then mark the original."""
        body = await self._raw(draft)
        try:
            resp = await self.client.awrite_once(lambda s: make(s, body), what)
        except NotSent as exc:
            raise SendFailed(str(exc)) from None
        except MaybeSent as exc:
            raise SendUnknown(str(exc)) from None
        except AuthError as exc:
            # A 401 or a failed refresh happens before Gmail accepts anything.
            raise SendFailed(str(exc)) from None
        await self._after_send(draft)
        return SendResult(sent_id=str(resp.get("id", "")))

    async def _after_send(self, draft: Draft) -> None:
        if not (self.mark_read or self.label) or not draft.message.source_id:
            return
        try:
            add: list[str] = []
            if self.label:
                if self._label_id is None:
                    resp = await self.client.aread(
                        lambda s: s.users().labels().list(userId="me"), "labels.list")
                    for lbl in resp.get("labels", []):
                        if self.label in (lbl.get("id"), lbl.get("name")):
                            self._label_id = lbl["id"]
                if self._label_id is None:
                    raise SourceError(f"no label {self.label!r} in the mailbox")
                add = [self._label_id]
            body = {"addLabelIds": add, "removeLabelIds": ["UNREAD"] if self.mark_read else []}
            gid = draft.message.source_id
            await self.client.aread(
                lambda s: s.users().messages().modify(userId="me", id=gid, body=body),
                "messages.modify")
        except Exception as exc:  # logged; the reply went out regardless
            log.warning("gmail %s: reply for %s sent, but updating the original failed: %s",
                        self.account, draft.key, exc)

    async def _search(self, draft: Draft, *, drafts: bool) -> str | None:
        """Gmail id of our reply (a SENT message, or for gmail_draft a draft) with this
        draft's Message-ID in the original's thread. Anyone can mail us a message
        carrying that Message-ID (it lands in the inbox, spam or trash); counting it
        would mark an unsent reply sent, so only Gmail's own SENT label or a draft in
        the same thread counts."""
        q = f"rfc822msgid:{reply_message_id(draft).strip('<>')}"
        try:
            if drafts:
                resp = await self.client.aread(
                    lambda s: s.users().drafts().list(userId="me", q=q, maxResults=5),
                    "drafts.list")
                found = [(d.get("id"), d.get("message") or {}) for d in resp.get("drafts") or []]
            else:
                # A sent reply the operator trashed afterwards still went out: spam and
                # trash are searched, but only messages labelled SENT are listed.
                resp = await self.client.aread(
                    lambda s: s.users().messages().list(userId="me", q=q, maxResults=5,
                                                        labelIds=["SENT"], includeSpamTrash=True),
                    "messages.list")
                found = [(m.get("id"), m) for m in resp.get("messages") or []]
        except SourceError as exc:
            raise SendUnknown(f"cannot check Gmail yet: {exc}") from None
        thread = draft.message.thread_id
        for gid, msg in found:
            if gid and (not thread or msg.get("threadId") == thread):
                return str(gid)
        return None

    async def close(self) -> None:
        await self.client.aclose()


class GmailReplySender(_GmailSender):
    """``gmail_reply``: messages.send in the original's thread."""

    name = "gmail_reply"

    async def send(self, draft: Draft) -> SendResult:
        return await self._send(
            draft, lambda s, raw: s.users().messages().send(userId="me", body=raw), "messages.send")

    async def check(self, draft: Draft) -> str | None:
        """Gmail id of the reply with this draft's Message-ID, or None if absent.

        Search first (cheap); then, in case Gmail stored the message under a Message-ID
        of its own or its search index lags, read the thread itself and look for our
        Message-ID or the ``X-Draftgate-Key`` header among the sent messages."""
        found = await self._search(draft, drafts=False)
        if found or not draft.message.thread_id:
            return found
        thread_id = draft.message.thread_id
        mid = reply_message_id(draft)
        try:
            thread = await self.client.aread(
                lambda s: s.users().threads().get(
                    userId="me", id=thread_id, format="metadata",
                    metadataHeaders=["Message-ID", "X-Draftgate-Key"]),
                "threads.get")
        except SourceError as exc:
            raise SendUnknown(f"cannot check Gmail yet: {exc}") from None
        for m in thread.get("messages") or []:
            if "SENT" not in (m.get("labelIds") or []):
                continue
            headers = {str(h.get("name", "")).lower(): str(h.get("value", "")).strip()
                       for h in (m.get("payload") or {}).get("headers") or []}
            if headers.get("message-id") == mid or headers.get("x-draftgate-key") == draft.key:
                return str(m["id"])
        return None


class GmailDraftSender(_GmailSender):
    """``gmail_draft``: the reply is saved as a Gmail draft in the thread."""

    name = "gmail_draft"

    async def send(self, draft: Draft) -> SendResult:
        return await self._send(
            draft, lambda s, raw: s.users().drafts().create(userId="me", body={"message": raw}),
            "drafts.create")

    async def check(self, draft: Draft) -> str | None:
        """Gmail draft id holding this draft's Message-ID, or None if absent."""
        return await self._search(draft, drafts=True)


def create(pipeline: PipelineConfig, settings: Settings) -> _GmailSender:
    """Build the sender from its checked ``sender:`` options (no I/O)."""
    o = expect(pipeline.sender, GmailSenderOptions)
    cls = GmailDraftSender if o.type == "gmail_draft" else GmailReplySender
    client = GmailClient(o.account, settings.gmail_accounts[o.account], base_dir=settings.base_dir,
                         workers=2, config_file=os.path.abspath(settings.file))
    return cls(client, account=o.account, mark_read=o.mark_read, label=o.label)
