"""Raw RFC 5322 bytes -> :class:`bot.models.Message`. Shared by the maildir and Gmail
sources (Gmail is fetched in ``raw`` format and parsed here).

Never raises for a merely ugly message: bad charsets are decoded with replacement,
HTML-only mail is turned into text, a missing Subject or Date is left empty. Only a
message with no usable sender raises :class:`UnparseableMessage`; the source records
it as ``skipped`` with that reason.
"""

from __future__ import annotations

import email
import email.policy
import email.utils
import hashlib
import html
import re
from email.message import EmailMessage, Message as _RawMessage
from html.parser import HTMLParser

from .models import Message

DEFAULT_MAX_BODY = 200_000
_KEPT_HEADERS = ("List-Unsubscribe", "List-Id", "Precedence", "Auto-Submitted",
                 "X-Autoreply", "X-Auto-Response-Suppress", "Return-Path")
_CTRL = re.compile(r"[\r\n\x00]+")


class UnparseableMessage(ValueError):
    pass


def stable_id(raw: bytes) -> str:
    """An id for a message without Message-ID: a hash of its bytes."""
    return "sha256:" + hashlib.sha256(raw).hexdigest()[:32]


def _header(msg: _RawMessage, name: str) -> str:
    try:
        value = msg.get(name)
    except Exception:  # a malformed header: email raises various errors here
        value = None
    if value is None:
        return ""
    try:
        text = str(value)
    except Exception:
        text = msg.get_all(name, failobj=[""])[0] if hasattr(msg, "get_all") else ""
        text = str(text)
    # Header injection: never let CR/LF through into anything we echo into a reply.
    return _CTRL.sub(" ", text).strip()


class _TextFromHTML(HTMLParser):
    _BLOCK = {"p", "div", "br", "tr", "li", "h1", "h2", "h3", "h4", "h5", "h6",
              "blockquote", "table", "hr"}

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self._skip = 0

    def handle_starttag(self, tag, attrs):
        if tag in ("script", "style", "head"):
            self._skip += 1
        elif tag in self._BLOCK:
            self.parts.append("\n")

    def handle_endtag(self, tag):
        if tag in ("script", "style", "head") and self._skip:
            self._skip -= 1
        elif tag in self._BLOCK:
            self.parts.append("\n")

    def handle_data(self, data):
        if not self._skip:
            self.parts.append(data)


def html_to_text(markup: str) -> str:
    parser = _TextFromHTML()
    try:
        parser.feed(markup)
        parser.close()
    except Exception:
        return html.unescape(re.sub(r"<[^>]+>", " ", markup))
    text = "".join(parser.parts)
    text = re.sub(r"[ \t\xa0]+", " ", text)
    return re.sub(r"\n\s*\n\s*\n+", "\n\n", text).strip()


def _decode_part(part: _RawMessage) -> str:
    payload = part.get_payload(decode=True)
    if payload is None:
        inner = part.get_payload()
        return inner if isinstance(inner, str) else ""
    charset = part.get_content_charset() or "utf-8"
    try:
        return payload.decode(charset, errors="replace")
    except LookupError:  # unknown charset name
        return payload.decode("utf-8", errors="replace")


def _body(msg: _RawMessage) -> tuple[str, list[str]]:
    plain: list[str] = []
    htmls: list[str] = []
    attachments: list[str] = []
    for part in msg.walk() if msg.is_multipart() else [msg]:
        if part.is_multipart():
            continue
        ctype = part.get_content_type()
        disposition = (part.get("Content-Disposition") or "").lower()
        filename = part.get_filename()
        if filename or disposition.startswith("attachment"):
            attachments.append(_CTRL.sub(" ", str(filename or ctype)))
            continue
        if ctype == "text/plain":
            plain.append(_decode_part(part))
        elif ctype == "text/html":
            htmls.append(_decode_part(part))
    if plain:
        return "\n\n".join(p.strip() for p in plain), attachments
    if htmls:
        return "\n\n".join(html_to_text(h) for h in htmls), attachments
    return "", attachments


def parse_email(raw: bytes, *, max_body: int = DEFAULT_MAX_BODY, source_id: str = "") -> Message:
    """Parse one message. ``body`` is cut to ``max_body`` characters
    (``body_truncated`` says so)."""
    try:
        msg = email.message_from_bytes(raw, policy=email.policy.compat32)
    except Exception as exc:  # pragma: no cover - compat32 is very tolerant
        raise UnparseableMessage(f"not an email message: {exc}") from exc
    from_header = _header(msg, "From")
    from_name, from_addr = email.utils.parseaddr(from_header)
    reply_name, reply_addr = email.utils.parseaddr(_header(msg, "Reply-To"))
    if not from_addr or "@" not in from_addr:
        if not (reply_addr and "@" in reply_addr):
            raise UnparseableMessage(
                f"no usable sender address (From: {from_header[:80]!r}); nobody to reply to")
    subject = _decode_words(_header(msg, "Subject"))
    date = ""
    try:
        parsed = email.utils.parsedate_to_datetime(_header(msg, "Date"))
        date = parsed.isoformat() if parsed else ""
    except (TypeError, ValueError, IndexError):
        date = ""
    body, attachments = _body(msg)
    truncated = len(body) > max_body
    if truncated:
        body = body[:max_body]
    refs = _header(msg, "References").split()
    message_id = _header(msg, "Message-ID").split(" ")[0] if _header(msg, "Message-ID") else ""
    return Message(
        kind="email",
        message_id=message_id,
        from_name=_decode_words(from_name),
        from_addr=from_addr.strip(),
        reply_to=(reply_addr if reply_addr and "@" in reply_addr else from_addr).strip(),
        to=[a for _, a in email.utils.getaddresses([_header(msg, "To")]) if a],
        cc=[a for _, a in email.utils.getaddresses([_header(msg, "Cc")]) if a],
        subject=subject,
        date=date,
        body=body,
        body_truncated=truncated,
        references=refs,
        headers={h: _header(msg, h) for h in _KEPT_HEADERS if _header(msg, h)},
        size=len(raw),
        attachments=attachments,
        source_id=source_id,
    )


def _decode_words(value: str) -> str:
    """Decode RFC 2047 encoded words (``=?utf-8?q?...?=``), tolerating bad ones."""
    if "=?" not in value:
        return value
    try:
        parts = email.header.decode_header(value)
    except Exception:
        return value
    out = []
    for text, charset in parts:
        if isinstance(text, bytes):
            try:
                out.append(text.decode(charset or "utf-8", errors="replace"))
            except LookupError:
                out.append(text.decode("utf-8", errors="replace"))
        else:
            out.append(text)
    return _CTRL.sub(" ", "".join(out)).strip()


import email.header  # noqa: E402  (used by _decode_words)

__all__ = ["parse_email", "html_to_text", "stable_id", "UnparseableMessage", "EmailMessage"]
