"""Thread context for an IMAP message: the messages its References / In-Reply-To name,
found by ``UID SEARCH HEADER Message-ID`` in the source folder and in the Sent folder.

Only messages the new mail's sender took part in are given (the one rule of
:mod:`bot.context.thread`): anyone can write ``References: <someone else's id>``, and
that must not pull another customer's mail into this draft.
"""

from __future__ import annotations

import asyncio

from ..config.imap import ImapAccount
from ..context.thread import Thread, participants_only
from ..errors import SourceError
from ..mail.mime import UnparseableMessage, parse_email
from ..models import Message
from .client import ImapClient

THREAD_MAX_BODY = 20_000
_MAX_REFS = 20  # the newest references looked up; older ones rarely add anything


async def thread(client: ImapClient, account: ImapAccount, folder: str, message: Message,
                 limit: int) -> Thread:
    """The earlier messages of ``message``'s thread the sender took part in, the newest
    ``limit``, oldest first (in References order)."""
    refs = [r for r in message.references if r and r != message.message_id][-_MAX_REFS:]
    if not refs or limit < 1:
        return Thread()
    try:
        sent = await client.special_folder("\\Sent", account.sent_folder)
    except SourceError:
        sent = None
    folders = [folder] + ([sent] if sent and sent != folder else [])
    own = {a.lower() for a in (account.address, account.username) if a and "@" in a}
    found: dict[str, Message] = {}
    for ref in reversed(refs):  # newest first, so the limit keeps the latest
        if len(found) >= limit:
            break
        for f in folders:
            uid = await client.find_message_id(f, ref)
            if uid is None:
                continue
            raw = (await client.fetch(f, [uid])).get(uid)
            if raw is None:
                continue
            try:
                m = await asyncio.to_thread(parse_email, raw, max_body=THREAD_MAX_BODY,
                                            source_id=f"{f}:{uid}")
            except UnparseableMessage:
                break
            found[ref] = m
            break
    order = {r: i for i, r in enumerate(refs)}
    ordered = sorted(found.items(), key=lambda rm: order[rm[0]])
    return participants_only(((m, m.from_addr.lower() in own) for _, m in ordered),
                             message.from_addr, f"imap {account.name}")
