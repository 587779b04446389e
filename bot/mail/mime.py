"""Raw RFC 5322 bytes -> :class:`bot.models.Message`. Shared by the maildir and Gmail
sources (Gmail is fetched in ``raw`` format and parsed here).

Never raises for a merely ugly message: bad or unknown charsets are decoded with
replacement, undeclared 8-bit text is tried as UTF-8 then Windows-1252, HTML-only mail
is turned into text, a missing Subject, Date or Message-ID is left empty, attachments
are listed by name and never decoded. Only a message with no usable sender, or one
whose parsing takes more than :data:`PARSE_CPU_LIMIT` seconds of CPU time, raises
:class:`UnparseableMessage`; the source records it as ``skipped`` with that reason.

Every string that leaves this module is clean: no CR/LF in header values (a Subject
such as ``"Hi\\r\\nBcc: evil@x"`` cannot add a header to a reply), no NUL or other
control characters, no lone surrogates (so it always encodes to UTF-8 and JSON).
"""

from __future__ import annotations

import codecs
import contextlib
import email
import email.header
import email.policy
import email.utils
import functools
import hashlib
import html
import re
import time
from email.message import EmailMessage
from email.message import Message as _RawMessage

from ..models import Message

DEFAULT_MAX_BODY = 200_000
_KEPT_HEADERS = ("List-Unsubscribe", "List-Id", "List-Post", "Precedence", "Auto-Submitted",
                 "X-Autoreply", "X-Autorespond", "X-Auto-Response-Suppress", "Return-Path")
_MAX_HEADER = 2000  # characters kept of any header value; longer is noise or an attack
_MAX_LIST = 100  # addresses kept from To / Cc, references kept
_LINEBREAKS = re.compile(r"[\r\n]+[ \t]*")
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
_SPACES = re.compile(r"[ \t]{2,}")
_ENCODED_WORD = re.compile(r"=\?[^?\s]*\?[bBqQ]\?[^?\s]*\?=")
# Deliberately simple: one @, no whitespace, no characters that end or split an
# address in a header. Anything else is not something we reply to.
_ADDR = re.compile(r"^[^\s@<>,;:\"()\[\]\\]+@[^\s@<>,;:\"()\[\]\\]+$")
# Labels that mail clients put on text that is really Windows-1252 (curly quotes, the
# euro sign; every browser decodes Latin-1 that way) or, quite often, UTF-8. Text with
# one of these labels is taken as UTF-8 when it is valid UTF-8, else as Windows-1252.
_WESTERN = {"iso-8859-1", "latin-1", "latin1", "iso_8859-1", "l1", "us-ascii", "ascii",
            "windows-1252", "cp1252", "unknown-8bit", "x-unknown", "x-user-defined"}
_CHARSET_ALIASES = {"utf8": "utf-8", "ks_c_5601-1987": "cp949", "gb2312": "gb18030",
                    "gbk": "gb18030"}


class UnparseableMessage(ValueError):
    """No usable sender: nobody to reply to. The text is the skip reason."""


#: Seconds of CPU time one message may take to parse. A normal message takes well
#: under one; a message that takes more is skipped with the reason rather than
#: holding up the rest of the tick. CPU time, not wall time: a busy machine does not
#: make a normal message look pathological.
PARSE_CPU_LIMIT = 5.0


class ParseTooSlow(UnparseableMessage):
    """Parsing used up :data:`PARSE_CPU_LIMIT`. The text is the skip reason."""


class _Deadline:
    """The CPU time this thread may still spend on one message."""

    def __init__(self, seconds: float):
        self.seconds = seconds
        self._until = time.thread_time() + seconds

    def check(self, doing: str) -> None:
        if time.thread_time() > self._until:
            raise ParseTooSlow(f"parsing took more than {self.seconds:g}s of CPU time "
                               f"({doing}); skipped so that the other mail goes on")


def stable_id(raw: bytes) -> str:
    """An id for a message without Message-ID: a hash of its bytes."""
    return "sha256:" + hashlib.sha256(raw).hexdigest()[:32]


# -- text helpers ------------------------------------------------------------------------


def _clean(text: str, *, multiline: bool = False) -> str:
    """Drop control characters and lone surrogates; for headers, also CR/LF."""
    if not isinstance(text, str):
        text = str(text)
    # Lone surrogates (from undecodable bytes) cannot be encoded as UTF-8 later.
    text = text.encode("utf-8", "replace").decode("utf-8")
    if multiline:
        text = text.replace("\r\n", "\n").replace("\r", "\n")
        return _CONTROL.sub("", text)
    text = _LINEBREAKS.sub(" ", text)
    text = _CONTROL.sub("", text)
    return _SPACES.sub(" ", text).strip()


def _decode_bytes(data: bytes, charset: str | None) -> str:
    """Decode with the declared charset; an unknown or lying one falls back to UTF-8
    (when the bytes are valid UTF-8) or Windows-1252 (which decodes anything)."""
    # Note: bytes that are valid UTF-8 are rarely meaningful Latin-1 ("Ã©"), so a
    # western label never wins over valid UTF-8.
    name = (charset or "").strip().strip('"').lower()
    name = _CHARSET_ALIASES.get(name, name)
    if name in _WESTERN:
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            return data.decode("cp1252", errors="replace")
    if name:
        with contextlib.suppress(Exception):  # LookupError, or a codec (idna, base64) unusable here
            return data.decode(name, errors="replace")
    # Mixed mail (UTF-8 text with a pasted Latin-1 line) keeps both readable.
    return data.decode("utf-8", errors="draftgate-cp1252")


def _cp1252_fallback(exc: UnicodeError) -> tuple[str, int]:
    if not isinstance(exc, UnicodeDecodeError):
        raise exc
    return exc.object[exc.start:exc.end].decode("cp1252", errors="replace"), exc.end


codecs.register_error("draftgate-cp1252", _cp1252_fallback)


def _raw_header_text(value: str) -> str:
    """A header value as parsed with compat32: raw 8-bit bytes arrive as surrogate
    escapes; decode them as UTF-8, else Windows-1252."""
    try:
        data = value.encode("ascii", "surrogateescape")
    except UnicodeEncodeError:
        return value
    return _decode_bytes(data, None)


def _decode_words(value: str) -> str:
    """Decode RFC 2047 encoded words (``=?utf-8?q?...?=``), tolerating bad ones."""
    if "=?" not in value:
        return value
    try:
        parts = email.header.decode_header(value)
    except Exception:  # HeaderParseError, binascii errors on broken base64
        return value
    out = []
    for text, charset in parts:
        out.append(_decode_bytes(text, charset) if isinstance(text, bytes) else text)
    return "".join(out)


class _Headers:
    """First value of each header, decoded and cleaned. Never raises."""

    def __init__(self, msg: _RawMessage):
        self._values: dict[str, str] = {}
        try:
            items = list(msg.raw_items())
        except Exception:
            items = []
        for name, value in items:
            key = str(name).strip().lower()
            if key not in self._values:
                self._values[key] = value if isinstance(value, str) else str(value)

    def raw(self, name: str) -> str:
        """Unfolded, 8-bit decoded, encoded words NOT decoded (for address parsing)."""
        value = self._values.get(name.lower(), "")
        return _clean(_raw_header_text(value))[:_MAX_HEADER * 4]

    def text(self, name: str) -> str:
        """Human text: encoded words decoded, then cleaned again (an encoded word can
        carry CR/LF)."""
        return _clean(_decode_words(self.raw(name)))[:_MAX_HEADER]


def _address(value: str) -> tuple[str, str]:
    """(display name, address) of the first address in ``value``; address is '' when
    it is not a plain ``local@domain``."""
    try:
        # Encoded words are blanked before finding the address: a display name such
        # as =?utf-8?q?x=0D=0ABcc:_evil@x?= must not be mistaken for one.
        _, addr = email.utils.parseaddr(_ENCODED_WORD.sub("x", value))
        name, same = email.utils.parseaddr(value)
    except Exception:
        return "", ""
    addr = addr.strip()
    if not _ADDR.match(addr) or len(addr) > 254:
        return "", ""
    if same.strip() != addr:
        name = value.rsplit("<", 1)[0].strip().strip('"') if "<" in value else ""
    return _clean(_decode_words(name))[:200], addr


def _address_list(value: str) -> list[str]:
    try:
        pairs = email.utils.getaddresses([_ENCODED_WORD.sub("x", value)])
    except Exception:
        return []
    return [a.strip() for _, a in pairs if _ADDR.match(a.strip() or "-")][:_MAX_LIST]


# -- HTML --------------------------------------------------------------------------------
#
# HTML in mail is untrusted input, so it is not given to html.parser, which scans an
# unclosed tag again from its start whenever more input arrives (``"<a " * 20000``,
# 60 kB, took 55 s; 1.5 MB would take hours). One regular expression finds the markup;
# its repetitions are possessive or atomic, and its two lazy scans (for the end of a
# comment and of a script) test a short fixed tail at each step: no backtracking, so
# each character is looked at a bounded number of times whatever the markup, and the whole
# document is cut in one ``re.split``, not in a Python loop over tokens. It follows the
# browser's rules where they change what a reader sees: a quote opens a value only
# after ``=``, so ``>`` inside a quoted value does not end the tag; a comment ends at
# the first ``-->`` (``<!-->`` too) or runs to the end; ``<!...>``, ``<?...>`` and
# ``</ ...>`` are comments up to the next ``>``; the contents of script, style, title
# and the like are never text; a tag still open at the end of the document is dropped
# with what follows it, and a "<" that opens nothing (a < b) is text.

_RAW_NAMES = "script|style|title|iframe|noembed|noframes"  # contents: not text
_BLOCK = ("p div br tr li h1 h2 h3 h4 h5 h6 blockquote table hr ul ol dl dt dd pre section "
          "article header footer address form fieldset center main nav aside figure "
          "figcaption caption").split()
# What a tag adds to the text: a line break for a block, a space for a table cell.
_TAG_TEXT = {**{name: "\n" for name in _BLOCK}, "td": " ", "th": " "}
_TAG_TEXT.update({name.upper(): text for name, text in _TAG_TEXT.items()})
# Attributes up to the tag's ">": anything but "=" and ">", or "=" and a value (a
# quoted one may hold ">"; an unclosed quote runs to the end of the document).
_ATTRS = r"""(?>[^>=]++|=\s*+(?>"[^"]*+"?|'[^']*+'?|[^\s>]*+))*+"""
_MARKUP = re.compile(
    r"<(?:"
    # 1: a raw-text element's name; its contents up to its end tag go with it
    rf"((?i:{_RAW_NAMES}))(?=[\s/>]){_ATTRS}(?:>(?:.*?(?=</(?i:\1)[\s/>])|.*+))?"
    rf"|/?([A-Za-z][^\s/>]*+){_ATTRS}>?"  # 2: any other tag's name
    r"|!--(?>-?>|.*?--!?>|.*+)"  # a comment
    r"|[!?/][^>]*+>?)",  # <!DOCTYPE>, <![if mso]>, <?xml?>, </ x>, </>
    re.S)
# html.unescape's own pattern; split on it so that a reference costs a cache lookup,
# not a Python call ("&a" * 750000 took 0.6 s through html.unescape).
_CHARREF = re.compile(r"&(#[0-9]+;?|#[xX][0-9a-fA-F]+;?|[^\t\n\f <&#;]{1,32};?)")
#: Characters of markup read from one HTML part at most (about a third of a second
#: whatever the markup). The text of a part cut there ends with a line saying so.
MAX_HTML = 2_000_000


def _tag_text(name: str | None) -> str:
    # Not cached: tag names are the sender's, of any length and number.
    if name is None:
        return ""
    text = _TAG_TEXT.get(name)
    return text if text is not None else _TAG_TEXT.get(name.lower(), "")


@functools.lru_cache(maxsize=2048)
def _charref(ref: str) -> str:
    return html.unescape("&" + ref)


def _unescape(text: str) -> str:
    if "&" not in text:
        return text
    parts = _CHARREF.split(text)
    parts[1::2] = map(_charref, parts[1::2])
    return "".join(parts)


def html_to_text(markup: str, *, cut: bool = False) -> str:
    """Readable plain text from an HTML body: block elements start new lines, table
    cells are kept apart, entities are decoded, scripts, styles, titles and comments
    are dropped. Time is linear in the input whatever the markup, and at most
    :data:`MAX_HTML` characters of it are read; when the markup was cut (there, or
    before: ``cut``), the text ends with a line saying so."""
    if len(markup) > MAX_HTML:
        markup, cut = markup[:MAX_HTML], True
    parts = _MARKUP.split(markup)  # text, raw-text name, tag name, text, ...
    del parts[1::3]
    parts[1::2] = map(_tag_text, parts[1::2])
    text = _unescape("".join(parts))
    text = re.sub(r"[ \t\xa0]+", " ", text)  # runs of spaces first, so the next is linear
    text = re.sub(r" ?\n ?", "\n", text)
    text = re.sub(r"\n{3,}", "\n\n", text).strip()
    if cut:
        text += f"\n\n[HTML cut: only the first {len(markup):,} characters of markup were read]"
    return text


# -- body --------------------------------------------------------------------------------


def _parts(msg: _RawMessage, depth: int = 0):
    """Leaf parts in order. Does not descend into attached messages (message/rfc822:
    a forwarded mail is an attachment, not this sender's words) and stops at a silly
    nesting depth."""
    if depth > 20:
        return
    if msg.is_multipart() and _content_type(msg) != "message/rfc822":
        payload = msg.get_payload()
        for sub in payload if isinstance(payload, list) else []:
            if isinstance(sub, _RawMessage):
                yield from _parts(sub, depth + 1)
    else:
        yield msg


def _filename(part: _RawMessage) -> str | None:
    try:
        name = part.get_filename()
    except Exception:
        name = None
    if name is None:
        return None
    return _clean(_decode_words(_raw_header_text(str(name))))[:200] or "unnamed"


def _decode_part(part: _RawMessage, limit: int) -> tuple[str, bool]:
    """The part's text, decoded, and whether it was cut at ``limit`` bytes first (so a
    5 MB body is not decoded and converted whole)."""
    try:
        payload = part.get_payload(decode=True)
    except Exception:
        payload = None
    if not isinstance(payload, bytes):  # None: a multipart (decode=True gives bytes or None)
        inner = part.get_payload()
        payload = inner.encode("ascii", "surrogateescape") if isinstance(inner, str) else b""
    cut = len(payload) > limit
    if cut:
        payload = payload[:limit]
    try:
        charset = part.get_content_charset()
    except Exception:
        charset = None
    return _decode_bytes(payload, charset), cut


def _content_type(part: _RawMessage) -> str:
    try:
        return part.get_content_type()
    except Exception:
        return "text/plain"


def _size(part: _RawMessage) -> int:
    """About how many bytes the part holds (its encoded length, less base64's overhead)."""
    payload = part.get_payload()
    if not isinstance(payload, str):
        return 0
    n = len(payload) - payload.count("\n") - payload.count("\r")
    if str(part.get("Content-Transfer-Encoding", "")).lower().strip() != "base64":
        return n
    tail = payload.rstrip()
    return (n - (len(tail) - len(tail.rstrip("=")))) * 3 // 4


def _body(msg: _RawMessage, max_body: int, deadline: _Deadline
          ) -> tuple[str, bool, list[tuple[str, int]]]:
    plain: list[str] = []
    htmls: list[tuple[str, bool]] = []
    attachments: list[tuple[str, int]] = []
    cut_any = False
    # Bytes decoded per part: enough for max_body characters in any charset, and for
    # HTML whose markup is much longer than its text.
    byte_limit = max(max_body, 1) * 8 + 1024
    for part in _parts(msg):
        deadline.check("reading its parts")
        ctype = _content_type(part)
        disposition = str(part.get("Content-Disposition", "") or "").lower()
        filename = _filename(part)
        if filename or disposition.startswith("attachment") or not ctype.startswith("text/"):
            attachments.append((filename or ctype, _size(part)))
            continue
        if ctype == "text/plain":
            text, cut = _decode_part(part, byte_limit)
            plain.append(text)
            cut_any |= cut
        elif ctype == "text/html":
            text, cut = _decode_part(part, min(byte_limit, MAX_HTML))
            htmls.append((text, cut))
            cut_any |= cut
        else:  # text/calendar, text/csv...: listed, not read
            attachments.append((filename or ctype, _size(part)))
    body = "\n\n".join(t for t in (_clean(p, multiline=True).strip() for p in plain) if t)
    if not body and htmls:
        # HTML-only mail, or an empty text/plain alternative beside the real HTML.
        texts = []
        for markup, cut in htmls:
            texts.append(html_to_text(_clean(markup, multiline=True), cut=cut))
            deadline.check("turning HTML into text")
        body = "\n\n".join(t for t in texts if t)
    return body, cut_any, attachments[:_MAX_LIST]


def _message_id(h: _Headers) -> str:
    value = h.raw("Message-ID")
    return value.split(" ")[0][:_MAX_HEADER] if value else ""


def message_id_of(msg: _RawMessage) -> str:
    """The cleaned Message-ID of an already parsed message (or header block), exactly
    as :func:`parse_email` reports it; '' when there is none."""
    return _message_id(_Headers(msg))


def item_id(raw: bytes) -> str:
    """The id a source uses for a raw message: its Message-ID, else :func:`stable_id`."""
    try:
        msg = email.message_from_bytes(bytes(raw), policy=email.policy.compat32)
        mid = message_id_of(msg)
    except Exception:
        mid = ""
    return mid or stable_id(raw)


# -- entry point -------------------------------------------------------------------------


def parse_email(raw: bytes, *, max_body: int = DEFAULT_MAX_BODY, source_id: str = "",
                cpu_limit: float | None = None) -> Message:
    """Parse one message. ``body`` is cut to ``max_body`` characters
    (``body_truncated`` says so); ``size`` is the raw size in bytes.

    Raises only :class:`UnparseableMessage`: when neither From nor Reply-To holds a
    usable address, or (:class:`ParseTooSlow`) when parsing takes more than
    ``cpu_limit`` seconds of CPU time (default :data:`PARSE_CPU_LIMIT`).
    """
    deadline = _Deadline(PARSE_CPU_LIMIT if cpu_limit is None else cpu_limit)
    if isinstance(raw, str):
        raw = raw.encode("utf-8", "surrogateescape")
    try:
        msg = email.message_from_bytes(bytes(raw), policy=email.policy.compat32)
    except Exception as exc:  # compat32 is very tolerant; this is defence in depth
        raise UnparseableMessage(f"not an email message: {type(exc).__name__}") from exc
    deadline.check("reading its MIME structure")
    h = _Headers(msg)
    from_raw = h.raw("From")
    from_name, from_addr = _address(from_raw)
    _, reply_addr = _address(h.raw("Reply-To"))
    if not from_addr and not reply_addr:
        shown = _clean(_decode_words(from_raw))[:80]
        what = f"From: {shown!r}" if shown else "no From or Reply-To header"
        raise UnparseableMessage(f"no usable sender address ({what}); nobody to reply to")

    date = ""
    date_raw = h.raw("Date")
    if date_raw:
        try:
            parsed = email.utils.parsedate_to_datetime(date_raw)
            date = parsed.isoformat() if parsed else ""
        except Exception:  # TypeError, ValueError, IndexError, OverflowError...
            date = ""

    try:
        body, cut, attachments = _body(msg, max_body, deadline)
    except ParseTooSlow:
        raise
    except Exception:  # a structure the email package chokes on: keep the headers
        body, cut, attachments = "", True, []
    truncated = cut or len(body) > max_body
    body = body[:max_body]

    message_id = _message_id(h)
    refs = [r for r in h.raw("References").split() if r.startswith("<")][-_MAX_LIST:]
    in_reply_to = h.raw("In-Reply-To").split()
    if not refs and in_reply_to and in_reply_to[0].startswith("<"):
        # RFC 5322 3.6.4: without References, the parent's In-Reply-To stands in.
        refs = [in_reply_to[0]]
    return Message(
        kind="email", message_id=message_id, from_name=from_name, from_addr=from_addr,
        reply_to=reply_addr or from_addr, to=_address_list(h.raw("To")),
        cc=_address_list(h.raw("Cc")), subject=h.text("Subject"), date=date, body=body,
        body_truncated=truncated, references=refs,
        headers={name: h.text(name) for name in _KEPT_HEADERS if h.text(name)},
        size=len(raw), attachments=[a[0] for a in attachments],
        attachment_sizes=[a[1] for a in attachments], source_id=_clean(source_id))


__all__ = ["parse_email", "html_to_text", "stable_id", "item_id", "message_id_of", "UnparseableMessage", "EmailMessage",
           "DEFAULT_MAX_BODY", "MAX_HTML", "PARSE_CPU_LIMIT", "ParseTooSlow"]
