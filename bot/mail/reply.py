"""The reply as an RFC 5322 message, shared by the outbox and Gmail senders.

The recipient comes from the original message (``Message.reply_to``, worked out by
:mod:`bot.mail.mime` from Reply-To or From), never from the draft's text. The Message-ID
is derived from the draft key, so a sender can later ask "is this one out there?"
(Gmail ``rfc822msgid:``, a file in the outbox) instead of sending it again.
"""

from __future__ import annotations

import email.policy
import email.utils
import hashlib
import mimetypes
import re
import time
from email.headerregistry import Address
from email.message import EmailMessage
from pathlib import Path

from ..models import Draft

_CRLF = re.compile(r"[\r\n\x00]+")
_RE = re.compile(r"^\s*(re|aw|sv|antw|vs|r)\s*(\[\d+\])?\s*:", re.IGNORECASE)
_MSG_ID = re.compile(r"^<[\x21-\x3b\x3d\x3f-\x7e]{1,900}>$")
_BARE_ID = re.compile(r"^[\x21-\x3b\x3d\x3f-\x7e]{1,450}@[\x21-\x3b\x3d\x3f-\x7e]{1,450}$")
_MAX_REFERENCES = 20  # keep the header bounded on very long threads


def reply_message_id(draft: Draft) -> str:
    """The Message-ID of ``draft``'s reply: the same draft, the same id, for every
    attempt and check of its send. Nobody outside can work it out in advance: it
    holds the random part drawn when the draft first moved to ``sending``
    (``Draft.reply_nonce``); only a row already sending before that part existed
    keeps the id derived from its key alone (its send is checked with that id)."""
    if draft.reply_nonce:
        mark = hashlib.sha256(f"{draft.key}\0{draft.reply_nonce}".encode("utf-8")).hexdigest()
        return f"<dg.{mark[:32]}@draftgate.local>"
    return legacy_message_id(draft.key)


def legacy_message_id(key: str) -> str:
    """The id before it had a random part: sha256 of the key, which anyone who knows
    the key (pipeline, item, recipe) could compute and plant in a References header."""
    return f"<dg.{hashlib.sha256(key.encode('utf-8')).hexdigest()[:24]}@draftgate.local>"


def reply_subject(subject: str) -> str:
    """``Re: <subject>``, without doubling an existing Re: (or AW:, SV: ...)."""
    subject = _one_line(subject)
    if not subject:
        return "Re: (no subject)"
    return subject if _RE.match(subject) else f"Re: {subject}"


def parse_from(value: str) -> Address:
    """``"Support <support@example.com>"`` -> Address. Raises ValueError with the reason."""
    pairs = email.utils.getaddresses([_one_line(value)])
    if len(pairs) != 1 or "@" not in pairs[0][1]:
        raise ValueError(f"expected one address like 'Support <support@example.com>', got {value!r}")
    try:
        return _address(*pairs[0])
    except ValueError:
        raise ValueError(f"expected one address like 'Support <support@example.com>', "
                         f"got {value!r}") from None


def build_reply(draft: Draft, from_addr: str | Address) -> EmailMessage:
    """The reply to ``draft.message`` with ``draft.body`` as its text.

    Raises ValueError when the original has no valid address to reply to. For a
    schedule slot (a post, not a reply) there is no recipient and no threading.
    """
    m = draft.message
    msg = EmailMessage(policy=email.policy.SMTP)
    msg["From"] = from_addr if isinstance(from_addr, Address) else parse_from(from_addr)
    if m.kind == "slot":
        msg["Subject"] = _one_line(m.subject or "Post") + (f" ({m.slot})" if m.slot else "")
    else:
        if not m.reply_to:
            raise ValueError("the original message has no address to reply to")
        name = m.from_name if m.reply_to == m.from_addr else ""
        msg["To"] = _address(name, m.reply_to)
        msg["Subject"] = reply_subject(m.subject)
        original = _msg_id(m.message_id)
        if original:
            msg["In-Reply-To"] = original
            refs = [r for r in map(_msg_id, m.references) if r and r != original]
            msg["References"] = " ".join([*refs[-(_MAX_REFERENCES - 1):], original])
    msg["Date"] = email.utils.formatdate(draft.decided_at or time.time(), usegmt=True)
    msg["Message-ID"] = reply_message_id(draft)
    msg["X-Draftgate-Key"] = _one_line(draft.key)[:900]
    msg["Auto-Submitted"] = "no"  # a person approved it; it is not an auto-reply
    msg.set_content(draft.body.replace("\r\n", "\n").replace("\r", "\n"), charset="utf-8")
    for path in draft.attached:  # 📎 Attach: files an operator chose, approved with it
        kind = (mimetypes.guess_type(path)[0] or "application/octet-stream").split("/")
        msg.add_attachment(Path(path).read_bytes(), maintype=kind[0], subtype=kind[1],
                           filename=Path(path).name)
    return msg


def _address(name: str, addr: str) -> Address:
    addr = _one_line(addr).strip()
    if addr.count("@") != 1 or any(c.isspace() or c in '<>,;"' for c in addr):
        raise ValueError(f"not a usable email address: {addr!r}")
    local, domain = addr.split("@")
    try:
        return Address(display_name=_one_line(name), username=local, domain=domain)
    except (ValueError, TypeError, IndexError) as exc:
        raise ValueError(f"not a usable email address: {addr!r}") from exc


def _msg_id(value: str) -> str | None:
    """A msg-id fit for threading headers, or None. Malformed ids (spaces, non-ASCII,
    absurd length) are dropped rather than encoded into something no client matches."""
    value = _one_line(value)
    if _MSG_ID.match(value):
        return value
    if _BARE_ID.match(value):
        return f"<{value}>"
    return None


def _one_line(value: str) -> str:
    """Header injection: no CR, LF or NUL ever reaches a header."""
    return " ".join(_CRLF.sub(" ", str(value or "")).split())
