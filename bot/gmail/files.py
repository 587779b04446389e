"""A Gmail message's attachments, whole (issue 28, 📎 Files): the message is read again
as ``format=raw`` and its attachment parts taken as the parser lists them."""

from __future__ import annotations

import base64

from ..mail.attachments import files_of
from .client import GmailClient


async def attachment_files(client: GmailClient, gmail_id: str) -> list[tuple[str, bytes]]:
    r = await client.aread(lambda s: s.users().messages().get(
        userId="me", id=gmail_id, format="raw"), "messages.get")
    raw = str(r.get("raw") or "")
    return files_of(base64.urlsafe_b64decode(raw + "=" * (-len(raw) % 4)))
