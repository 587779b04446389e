"""The attachments of a stored mail, whole (issue 28, 📎 Files): the same parts that
:func:`bot.mail.mime.parse_email` lists in ``Message.attachments``, in that order."""

from __future__ import annotations

import email
import email.policy

from . import mime

#: Telegram bots may send documents up to this size; a bigger one is named, not sent.
TELEGRAM_MAX = 50 * 1000 * 1000


def files_of(raw: bytes) -> list[tuple[str, bytes]]:
    """(name, content) of each attachment of the mail ``raw``."""
    msg = email.message_from_bytes(raw, policy=email.policy.compat32)
    out: list[tuple[str, bytes]] = []
    for part in mime._parts(msg):
        ctype = mime._content_type(part)
        disposition = str(part.get("Content-Disposition", "") or "").lower()
        name = mime._filename(part)
        if name or disposition.startswith("attachment") or ctype not in ("text/plain", "text/html"):
            data = part.get_payload(decode=True)
            out.append((name or ctype, data if isinstance(data, bytes) else b""))
    return out

