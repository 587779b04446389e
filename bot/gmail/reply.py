"""The threaded reply to a stored original (used until/unless ``bot.reply`` provides it).

The recipient comes from ``draft.message.reply_to`` (worked out by bot.mime from the
original's Reply-To or From), never from the draft body. The Message-ID is derived from
the draft key, so after an ambiguous send Gmail can be asked whether it exists.
"""

from __future__ import annotations

import email.policy
import email.utils
import hashlib
import re
from email.message import EmailMessage

from ..models import Draft

_ADDR = re.compile(r"^[^\s@<>,;:\"()\[\]\\]+@[^\s@<>,;:\"()\[\]\\]+$")
_MAX_REFERENCES = 20


def reply_message_id(key: str) -> str:
    """Message-ID of the reply for draft ``key``: the same key always gives the same id."""
    return f"<draftgate.{hashlib.sha256(key.encode('utf-8')).hexdigest()[:40]}@draftgate.local>"


def _one_line(value: str) -> str:
    return " ".join(str(value or "").split())


def reply_subject(subject: str) -> str:
    subject = _one_line(subject)
    if re.match(r"^(re|aw|sv|antw)\s*:", subject, re.I):
        return subject
    return f"Re: {subject}" if subject else "Re: your message"


def build_reply(draft: Draft, from_addr: str = "") -> EmailMessage:
    """The RFC 5322 reply to ``draft.message`` carrying ``draft.body``. Raises
    ValueError when the original has no address to reply to."""
    original = draft.message
    to = (original.reply_to or original.from_addr or "").strip()
    if not _ADDR.match(to):
        raise ValueError("the original message has no usable Reply-To or From address")
    msg = EmailMessage(policy=email.policy.SMTP)
    if from_addr:
        msg["From"] = from_addr
    msg["To"] = to
    msg["Subject"] = reply_subject(original.subject)
    msg["Date"] = email.utils.formatdate(usegmt=True)
    msg["Message-ID"] = reply_message_id(draft.key)
    parent = _one_line(original.message_id)
    refs = [r for r in (_one_line(x) for x in original.references) if r.startswith("<")]
    if parent.startswith("<"):
        msg["In-Reply-To"] = parent
        if parent not in refs:
            refs.append(parent)
    if refs:
        msg["References"] = " ".join(refs[-_MAX_REFERENCES:])
    msg.set_content(draft.body, charset="utf-8")
    return msg
