"""Senders ``microsoft_reply`` (the reply sent through Graph) and ``microsoft_draft``
(the reply saved in Drafts, sent later from Outlook).

::

    sender: {type: microsoft_reply, account: office}
    sender: {type: microsoft_draft, account: office}

Exactly once: Graph's ``send`` answers ``202 Accepted`` with no id and has no
idempotency key, so the reply is prepared first and sent by one call:

1. ``createReply`` on the original (Graph threads it: conversation, In-Reply-To,
   References, ``RE:`` subject) -- unless a draft carrying this reply's
   ``internetMessageId`` is already in Drafts (a try that stopped here), which is used;
2. ``PATCH`` the draft: the approved text, the recipient worked out by code from the
   original (never from model output), and ``internetMessageId`` set to the id derived
   from the draft key (writable while the message is a draft), so the outcome can be
   looked up later;
3. ``POST .../send`` once, never repeated by the client.

``202``: sent. A 4xx (or a connection that never opened): not sent, ``SendFailed``
(Retry sends the same draft). A 5xx, a timeout or a connection lost after the request
went out: ``SendUnknown``. :meth:`check` then looks for the id in Sent Items (found:
sent) and in Drafts (still a draft: certainly not sent); in neither, Graph may still be
moving it, and the card says so. Nothing is resent on its own.
"""

from __future__ import annotations

import logging
from urllib.parse import quote

import httpx

from ..config.load import PipelineConfig, Settings
from ..config.microsoft import MicrosoftAccount, MicrosoftSenderOptions
from ..config.options import expect
from ..errors import AuthError, SendFailed, SendUnknown, SourceError
from ..mail.reply import reply_message_id
from ..microsoft import client as graph
from ..microsoft.client import GraphClient, error_of
from ..models import Draft, SendResult

log = logging.getLogger("draftgate.senders.microsoft")


class MicrosoftSender:
    """See the module docstring."""

    def __init__(self, account: MicrosoftAccount, token_path: str, *, send: bool = True):
        self.account, self.token_path, self.sends = account, token_path, send
        self.name = "microsoft_reply" if send else "microsoft_draft"
        self._lease = graph.lease(account, token_path)

    @property
    def client(self) -> GraphClient:
        return self._lease.client

    def _text(self, draft: Draft) -> str:
        """The approved text, exactly as the operator saw it (line ends normalised)."""
        m = draft.message
        if m.kind == "slot" or not m.source_id:
            raise SendFailed("microsoft senders reply to a message read by a microsoft source")
        if not m.reply_to:
            raise SendFailed("cannot build the reply: the original message has no address to "
                             "reply to")
        return draft.body.replace("\r\n", "\n").replace("\r", "\n")

    async def _find(self, folder: str, mid: str) -> dict | None:
        quoted = mid.replace("'", "''")
        page = await self.client.get_json(
            f"me/mailFolders/{folder}/messages?$filter=internetMessageId eq '{quoted}'"
            f"&$select=id,isDraft,internetMessageId")
        return next(iter(page.get("value") or []), None)

    async def _prepare(self, draft: Draft) -> tuple[str, str]:
        """(the Graph id of the reply draft, its internetMessageId): steps 1 and 2."""
        text, mid = self._text(draft), reply_message_id(draft)
        try:
            existing = await self._find("drafts", mid)
            if existing is not None:
                draft_id = existing["id"]
            else:
                draft_id = await self._create_reply(draft)
            patch = {"body": {"contentType": "Text", "content": text},
                     "toRecipients": [{"emailAddress": {"address": draft.message.reply_to}}],
                     "internetMessageId": mid}
            resp = await self.client.read("PATCH", f"me/messages/{quote(draft_id, safe='')}",
                                          json=patch)
            if resp.status_code >= 300:
                raise SendFailed(f"Graph could not update the reply draft: {resp.status_code} "
                                 f"{' '.join(error_of(resp))}".strip())
        except (AuthError, SourceError, httpx.HTTPError) as exc:
            # Nothing was sent yet: a draft at most, found and reused by the next try.
            raise SendFailed(f"the reply could not be prepared: {exc}") from None
        return draft_id, mid

    async def _create_reply(self, draft: Draft) -> str:
        """createReply on the original; where Graph no longer knows its id (a person
        moved it to another folder, which gives a message a new id), on the message
        found by its internetMessageId."""
        original = draft.message.source_id
        for attempt in (1, 2):
            resp = await self.client.send_once(
                "POST", f"me/messages/{quote(original, safe='')}/createReply")
            if resp.status_code == 404 and attempt == 1 and draft.message.message_id:
                quoted = draft.message.message_id.replace("'", "''")
                page = await self.client.get_json(
                    f"me/messages?$filter=internetMessageId eq '{quoted}'&$select=id,isDraft")
                found = [m["id"] for m in page.get("value") or [] if not m.get("isDraft")]
                if found:
                    original = found[0]
                    continue
            if resp.status_code >= 300:
                raise SendFailed(f"Graph createReply: {resp.status_code} "
                                 f"{' '.join(error_of(resp))}".strip())
            return str(resp.json()["id"])
        raise AssertionError("unreachable")

    async def send(self, draft: Draft) -> SendResult:
        draft_id, mid = await self._prepare(draft)
        if not self.sends:
            return SendResult(sent_id=mid)
        path = f"me/messages/{quote(draft_id, safe='')}/send"
        try:
            resp = await self.client.send_once("POST", path)
        except (AuthError, httpx.ConnectError, httpx.ConnectTimeout) as exc:
            raise SendFailed(f"Graph send not made: {exc}") from None  # nothing went out
        except (httpx.HTTPError, OSError) as exc:
            raise SendUnknown(f"Graph send: the connection was lost before the answer "
                              f"({type(exc).__name__}: {exc})") from None
        if resp.status_code in (200, 202):
            return SendResult(sent_id=mid)
        code, message = error_of(resp)
        if resp.status_code >= 500:
            raise SendUnknown(f"Graph send answered {resp.status_code} {code} {message}".strip())
        raise SendFailed(f"Graph refused the send: {resp.status_code} {code} {message}".strip())

    async def check(self, draft: Draft) -> str | None:
        """The id when the reply is in Sent Items (or, for microsoft_draft, in Drafts);
        None when it is certainly not sent (still a draft, or no draft at all for
        microsoft_draft); SendUnknown when Graph cannot tell yet."""
        mid = reply_message_id(draft)
        try:
            if not self.sends:
                return mid if await self._find("drafts", mid) is not None else None
            if await self._find("sentitems", mid) is not None:
                return mid
            if await self._find("drafts", mid) is not None:
                return None  # the send would have moved it out of Drafts
        except (AuthError, SourceError) as exc:
            raise SendUnknown(f"cannot check the mailbox yet: {exc}") from None
        raise SendUnknown("the reply is neither in Sent Items nor in Drafts yet: Graph may "
                          "still be delivering it. Check again in a minute; Send again may "
                          "send it a second time")

    async def close(self) -> None:
        await self._lease.close()


def create(pipeline: PipelineConfig, settings: Settings) -> MicrosoftSender:
    """Build the sender from its checked ``sender:`` options (no I/O)."""
    o = expect(pipeline.sender, MicrosoftSenderOptions)
    account = settings.microsoft_accounts[o.account]
    return MicrosoftSender(account, str(settings.resolve(account.token_file)),
                           send=o.type == "microsoft_reply")
