"""Thread context for a Graph message: the earlier messages of its ``conversationId``
(in any folder, so our own replies in Sent Items too), read as MIME through the same
parser. Only messages the new mail's sender took part in are given (the participant
rule of :mod:`bot.context.thread`): a conversation id is the server's, but a
message can join a conversation by its References, and another customer's mail must
not reach this draft."""

from __future__ import annotations

import asyncio
import logging

from ..config.microsoft import MicrosoftAccount
from ..context.thread import Thread, participants_only
from ..mail.mime import UnparseableMessage, parse_email
from ..models import Message
from .client import GraphClient

log = logging.getLogger("draftgate.microsoft")

THREAD_MAX_BODY = 20_000
_MAX_LISTED = 50


async def thread(client: GraphClient, account: MicrosoftAccount, message: Message,
                 limit: int) -> Thread:
    """The newest ``limit`` earlier messages of the conversation the sender took part
    in, oldest first."""
    cid = message.thread_id
    if not cid or limit < 1:
        return Thread()
    quoted = cid.replace("'", "''")
    page = await client.get_json(
        f"me/messages?$filter=conversationId eq '{quoted}'&$select=id,internetMessageId,"
        f"receivedDateTime&$top={_MAX_LISTED}")
    earlier = sorted((e for e in page.get("value") or []
                      if e.get("id") and e.get("id") != message.source_id
                      and e.get("internetMessageId") != message.message_id),
                     key=lambda e: str(e.get("receivedDateTime") or ""))
    raws = await client.mime([e["id"] for e in earlier])
    parsed: list[Message] = []
    for e in earlier:
        raw = raws.get(e["id"])
        if raw is None:
            continue
        try:
            parsed.append(await asyncio.to_thread(parse_email, raw, max_body=THREAD_MAX_BODY,
                                                  source_id=e["id"]))
        except UnparseableMessage:
            continue
    own = {account.address.lower()} if account.address else set()
    found = participants_only(((m, m.from_addr.lower() in own) for m in parsed),
                              message.from_addr, f"microsoft {account.name}")
    return Thread(found.messages[-limit:], found.left_out)
