"""The thread context of a ``gmail`` source's message: the earlier messages of its
Gmail thread (Gmail threads by References and subject), only those the new mail's
sender took part in (:mod:`bot.context.thread`), oldest first; ours: sent."""

from __future__ import annotations

import base64
import threading

from ..context.thread import Thread, participants_only
from ..gmail.client import GmailClient
from ..mail.mime import UnparseableMessage, parse_email
from ..models import Message

THREAD_MAX_BODY = 20_000  # characters of an earlier message of a thread read for context


async def read(client: GmailClient, own: set[str], message: Message, limit: int) -> Thread:
    """See the module docstring; ``own``: our addresses (lower case)."""
    if not message.thread_id or limit < 1:
        return Thread()
    resources = await client.run(_thread_resources, client, message.thread_id,
                                 message.source_id, limit)
    found = []
    for r in resources:
        try:
            raw = base64.urlsafe_b64decode(padded(r.get("raw") or ""))
            m = parse_email(raw, max_body=THREAD_MAX_BODY, source_id=str(r.get("id")))
        except (ValueError, TypeError, UnparseableMessage):
            continue  # an unreadable old message is left out, not the draft
        found.append((m, "SENT" in (r.get("labelIds") or ()) or m.from_addr.lower() in own))
    return participants_only(found, message.from_addr, f"gmail {client.name}")


def padded(data: str) -> str:
    """base64url as Gmail sends it (unpadded), padded for the decoder."""
    return data + "=" * (-len(data) % 4)


def _thread_resources(client: GmailClient, thread_id: str, before: str, limit: int,
                      cancel: threading.Event | None = None) -> list[dict]:
    """The messages of Gmail thread ``thread_id`` that came before message
    ``before`` (all of them if it is not in the thread), the newest ``limit``, oldest
    first, as ``messages.get(format=raw)`` resources: one ``threads.get`` (which has
    no raw format, so ``minimal``: ids, labels, dates), then the messages in batches.
    Drafts, spam and trash are left out; our own sent replies are kept."""
    listing = client.read(lambda s: s.users().threads().get(
        userId="me", id=thread_id, format="minimal"), "threads.get", cancel)
    found = sorted((m for m in listing.get("messages") or []
                    if not set(m.get("labelIds") or ()) & {"DRAFT", "SPAM", "TRASH"}),
                   key=lambda m: int(m.get("internalDate") or 0))
    ids = [str(m["id"]) for m in found if m.get("id")]  # one without an id is not a message
    if before in ids:
        ids = ids[:ids.index(before)]
    ids = ids[-limit:] if limit > 0 else []
    got = client.get_many("messages", ids, cancel, format="raw")
    return [got[gid] for gid in ids if gid in got]
