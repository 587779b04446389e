"""Make text safe to show: in a log line, an error, a card, a notice or ``doctor`` output.

Two jobs, one module, so that every outgoing text passes the same rules:

* **Secrets out.** :func:`register` records each secret VALUE this process reads
  (the bot token, model API keys, webhook secrets, Gmail OAuth tokens and the client
  secret), and :func:`scrub` replaces it, also percent-encoded, by
  ``[redacted NAME]``. It also hides credentials that no registry knows: the
  password in any URL (``postgresql://user:pw@host``), URL query values named like
  a credential (``?password=``, ``?key=``), ``Bearer <x>`` and header or field
  values such as ``Authorization: ...`` or ``"refresh_token": "..."``.
* **Strangers' text defused.** :func:`escape_controls` writes C0/C1 control
  characters (ESC, CR, LF...) and Unicode format and bidi controls (U+202E...) as
  visible escapes, so no log line can carry a terminal escape or forge another line.
  :class:`LogFormatter` applies both to every log record, third-party loggers
  included (PTB, httpx, googleapiclient...), and keeps tracebacks readable.

Where text leaves, and passes here: the log handler (``__main__._setup_logging``);
``errors.describe_error`` and ``Engine.notify``; the stores' writes of error texts and
audit details; ``cards.status_line``; Telegram's plain messages (``_plain``); the
console channel; the CLI's error and ``doctor`` output. A new way out should too.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import traceback
import unicodedata
from urllib.parse import quote, quote_plus, unquote_plus, urlsplit

__all__ = ["redact_url", "register", "register_oauth", "scrub", "scrub_line", "escape_controls",
           "LogFormatter", "MIN_SECRET"]

HIDDEN = "***"
#: Query parameters whose value is a credential (``?password=``, ``?api_key=``...).
_SECRET_PARAM = re.compile(r"pass|pwd|secret|token|key|sig|auth|credential", re.I)
_USERINFO = re.compile(r"(//)[^/?#@]*@")


def redact_url(url: str, *, keep_user: bool = True) -> str:
    """``url`` with its password, and the values of query parameters named like a
    credential, replaced by ``***``. ``keep_user=False`` hides the user name too (a
    proxy may take a token there: ``https://TOKEN@proxy/v1``)."""
    try:
        parts = urlsplit(url)
        host = parts.netloc.rpartition("@")[2]
        netloc = parts.netloc
        if "@" in parts.netloc:
            if keep_user and parts.password is None:
                netloc = parts.netloc
            elif keep_user:
                netloc = f"{parts.username or ''}:{HIDDEN}@{host}"
            else:
                netloc = f"{HIDDEN}@{host}"
        query = "&".join(f"{k}={HIDDEN}" if eq and _SECRET_PARAM.search(unquote_plus(k))
                         else k + eq + v
                         for k, eq, v in (pair.partition("=") for pair in parts.query.split("&")))
        # Only the parts that changed are replaced, in the text as written: urlunsplit
        # would drop an empty authority (sqlite:///var/x.db -> sqlite:/var/x.db).
        head, hash_, fragment = url.partition("#")
        before, mark, after = head.partition("?")
        if netloc != parts.netloc:
            before = before.replace(f"//{parts.netloc}", f"//{netloc}", 1)
        return before + mark + (query if query != parts.query else after) + hash_ + fragment
    except ValueError:  # not parseable (e.g. a broken IPv6 host): hide any user info
        return _USERINFO.sub(rf"\g<1>{HIDDEN}@", url)


# -- the registry of secret values -------------------------------------------------------------

#: Shorter values are not registered: they are no real secret, and replacing them
#: everywhere would garble every line (README says so).
MIN_SECRET = 6
_lock = threading.Lock()
_secrets: dict[str, str] = {}  # a form of a secret value -> its name
_known: re.Pattern | None = None


def register(value: object, name: str) -> None:
    """Remember ``value`` (a secret this process read) so that :func:`scrub` hides it
    as ``[redacted name]``. Called where the secret is read: config and build time,
    a token file loaded, a token refreshed. Safe from any thread."""
    global _known
    if not isinstance(value, str):
        return
    value = value.strip()
    if len(value) < MIN_SECRET:
        return
    # As sent in a URL path or query, a form body or a JSON string.
    forms = {value, quote(value, safe=""), quote(value), quote_plus(value), json.dumps(value)[1:-1]}
    with _lock:
        added = [f for f in forms if f not in _secrets]
        for f in added:
            _secrets[f] = name
        if added:
            _known = None


def register_oauth(info: object, who: str) -> None:
    """The secrets among an OAuth token file's (or client secrets file's) fields:
    the access, refresh and id tokens and the client secret."""
    if isinstance(info, dict):
        for field in ("token", "access_token", "refresh_token", "id_token", "client_secret"):
            register(info.get(field), f"{who} {field.replace('_', ' ')}")


def _known_pattern() -> re.Pattern | None:
    global _known
    with _lock:
        if _known is None and _secrets:
            # Longest first: a secret that contains another is hidden whole.
            _known = re.compile("|".join(re.escape(s) for s in
                                         sorted(_secrets, key=len, reverse=True)))
        return _known


# -- credentials no registry knows ---------------------------------------------------------------

#: A URL is ``scheme://rest``; found from its ``://`` (see :func:`_hide_urls`).
_URL_REST = re.compile(r"""[^\s<>"'`]+""")
_LETTERS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
_SCHEME_CHARS = _LETTERS + "0123456789+.-"
_INNER_START = re.compile(r"[+.\-][a-zA-Z]")
#: ``Bearer <token>``: the scheme stays, the credential goes (a word of letters only
#: is a token when long: "bearer tokens" stays).
_TOKEN_CHARS = r"[A-Za-z0-9\-._~+/=%:]"
_BEARER = re.compile(rf"(?i)\b(bearer)(\s+)(?:{_TOKEN_CHARS}{{16,}}"
                     rf"|(?=[A-Za-z]*[0-9\-._~+/=%:]){_TOKEN_CHARS}{{6,}})")
#: A header or field whose value is a credential, in ``Name: value``, ``name=value``,
#: JSON (``"name": "value"``) or a Python repr (``'name': 'value'``).
_FIELD = re.compile(
    r"""(?ix)
    (["']?\b(?:proxy-authorization|authorization|x-api-key|x-goog-api-key|api-key
        |x-telegram-bot-api-secret-token|cookie|set-cookie
        |access_token|refresh_token|id_token|client_secret|password|passwd)\b["']?
     \s*[:=]\s*)
    ("(?:[^"\\\r\n]|\\.)*"|'[^'\r\n]*'
     |(?:(?:bearer|basic|digest|token)\s+)?(?:\[redacted[^\]\r\n]{0,200}\]|[^\s,;&}\]"']+))
    """)  # {0,200}: a "[redacted" with no "]" after it must not be read to the line's end


def _hide_url(url: str) -> str:
    if "@" not in url and "?" not in url:
        return url  # nothing to hide: leave it exactly as written
    # A web URL's user name can be a token (https://TOKEN@proxy/v1); a database
    # URL's is a user name worth reading (postgresql://draftgate:***@db/prod).
    return redact_url(url, keep_user=not url.lower().startswith(("http:", "https:")))


def _scheme_start(text: str, colon: int, floor: int) -> int | None:
    """Where the scheme of the ``://`` at ``colon`` begins: the leftmost letter at a
    word start in the run of scheme characters before it (what the pattern
    ``\\b[a-zA-Z][a-zA-Z0-9+.-]*://`` would find), or None. ``text[floor:colon]``
    holds no ``:``, so each character is read for one ``://`` only."""
    run = text[floor:colon]
    start = colon - (len(run) - len(run.rstrip(_SCHEME_CHARS)))
    if start == colon:
        return None
    before = text[start - 1] if start else " "
    if text[start] in _LETTERS and not (before.isalnum() or before == "_"):
        return start
    inner = _INNER_START.search(text, start, colon)  # after a '+', '.' or '-' in the run
    return inner.start() + 1 if inner else None


def _hide_urls(text: str) -> str:
    """Every ``scheme://...`` URL in ``text`` through :func:`_hide_url`.

    Walked from each ``://`` rather than matched by one pattern: a pattern that
    starts at every letter re-reads the whole run after it where no URL follows
    (``a.a.a.a… ://``), quadratic in the run's length (80k characters: 4 s). Here
    each character is read a bounded number of times."""
    out: list[str] = []
    done = pos = 0  # text[:done] is copied out; no URL starts before it
    floor = 0  # nor does a scheme before the last ':' looked at
    while (colon := text.find("://", pos)) >= 0:
        start = _scheme_start(text, colon, max(done, floor))
        rest = _URL_REST.match(text, colon + 3) if start is not None else None
        if start is None or rest is None:
            pos = floor = colon + 1
            continue
        out += [text[done:start], _hide_url(text[start:rest.end()])]
        done = pos = rest.end()
    return "".join(out) + text[done:] if out else text


def _hide_field(match: re.Match) -> str:
    value = match.group(2)
    if "[redacted" in value:
        return match.group()  # a registered secret, already hidden under its name
    quote_char = value[0] if value[:1] in "\"'" else ""
    return f"{match.group(1)}{quote_char}[redacted]{quote_char}"


def scrub(text):
    """``text`` with every registered secret and every recognisable credential hidden.
    ``None`` stays ``None``, so optional error texts can be wrapped as they are."""
    if text is None:
        return None
    if not isinstance(text, str):
        text = str(text)
    known = _known_pattern()
    if known is not None:
        text = known.sub(lambda m: f"[redacted {_secrets.get(m.group(), 'secret')}]", text)
    if "://" in text:
        text = _hide_urls(text)
    text = _FIELD.sub(_hide_field, text)
    return _BEARER.sub(r"\1\2[redacted]", text)


#: How much more than it keeps :func:`scrub_line` scrubs: a URL or a quoted field that
#: starts inside the kept part is scrubbed whole up to this far.
_MARGIN = 4096


def scrub_line(text: str, limit: int, *, mark: str = "…") -> str:
    """``text`` scrubbed, on one line (runs of white space as one space), and cut to
    ``limit`` characters, ``mark`` marking a cut.

    Cut BEFORE it is scrubbed, with a margin: the work is bounded whatever the text's
    length (an error page of megabytes), and a secret or URL that begins in the kept
    part is still seen whole. A word cut at the margin's end is dropped first (a
    secret cut in two would not be recognised) unless it began in the kept part."""
    window = limit + _MARGIN
    head = text[:window]
    if len(text) > window:
        space = max(head.rfind(" "), head.rfind("\n"), head.rfind("\t"))
        if space >= limit:  # (a word that began in the kept part is > _MARGIN long: no secret)
            head = head[:space]
    clean = " ".join(scrub(head).split())
    return clean[:limit] + mark if len(text) > window or len(clean) > limit else clean


# -- strangers' text in log lines -----------------------------------------------------------------

_CANDIDATE = re.compile(r"[^\x20-\x7e]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
_UNSAFE = {"Cc", "Cf", "Cs", "Zl", "Zp"}  # controls, format/bidi, lone surrogates, separators


def _escape_one(c: str) -> str:
    if c in _NAMED:
        return _NAMED[c]
    if unicodedata.category(c) not in _UNSAFE:
        return c  # printable letters of any script, emoji...
    o = ord(c)
    return f"\\x{o:02x}" if o < 0x100 else f"\\u{o:04x}" if o < 0x10000 else f"\\U{o:08x}"


def escape_controls(text: str, *, keep_newlines: bool = False) -> str:
    """``text`` with control characters (C0, DEL, C1: ESC, CR, LF...), Unicode
    format and bidi controls (U+200E/F, U+202A-U+202E, U+2066-U+2069, U+FEFF...),
    line separators and lone surrogates written as ``\\x1b``, ``\\u202e``, ``\\n``."""
    if keep_newlines:
        return "\n".join(_CANDIDATE.sub(lambda m: _escape_one(m.group()), line)
                         for line in text.split("\n"))
    return _CANDIDATE.sub(lambda m: _escape_one(m.group()), text)


def _clean(text: str) -> str:
    return escape_controls(scrub(text))


_CAUSE = "\nThe above exception was the direct cause of the following exception:\n\n"
_CONTEXT = "\nDuring handling of the above exception, another exception occurred:\n\n"


def _traceback_lines(te: traceback.TracebackException) -> list[str]:
    """Python's own traceback layout, except that each exception's message, which may
    carry a stranger's text, is one escaped line: it cannot forge a log line."""
    out: list[str] = []
    if te.__cause__ is not None:
        out += _traceback_lines(te.__cause__) + [_CAUSE]
    elif te.__context__ is not None and not te.__suppress_context__:
        out += _traceback_lines(te.__context__) + [_CONTEXT]
    if te.stack:
        out.append("Traceback (most recent call last):\n")
        out += [escape_controls(scrub(line), keep_newlines=True) for line in te.stack.format()]
    for chunk in te.format_exception_only():
        out.append(_clean(chunk.rstrip("\n")) + "\n")
    for sub in getattr(te, "exceptions", None) or ():  # an ExceptionGroup's members
        out += ["  " + line for line in "".join(_traceback_lines(sub)).splitlines(True)]
    return out


class LogFormatter(logging.Formatter):
    """Every record's message (with its args) and exception text scrubbed of secrets
    and escaped; the formatter's own line breaks (a traceback's) stay."""

    def format(self, record: logging.LogRecord) -> str:
        try:
            message = record.getMessage()
        except Exception:  # (logging's own report of this would print the args raw)
            message = f"{record.msg} [log arguments that do not fit: {record.args!r}]"
        shadow = logging.makeLogRecord(record.__dict__)
        shadow.msg, shadow.args = _clean(message), None
        shadow.exc_info = shadow.exc_text = shadow.stack_info = None
        text = super().format(shadow)
        if record.exc_info:
            # Formatted again, never taken from record.exc_text: another formatter may
            # have cached its unscrubbed text there.
            text += "\n" + self.formatException(record.exc_info)
        elif record.exc_text:
            text += "\n" + escape_controls(scrub(record.exc_text), keep_newlines=True)
        if record.stack_info:
            text += "\n" + escape_controls(scrub(self.formatStack(record.stack_info)),
                                           keep_newlines=True)
        return text

    def formatException(self, ei) -> str:  # noqa: N802 (logging's name)
        te = traceback.TracebackException(ei[0], ei[1], ei[2])
        return "".join(_traceback_lines(te)).rstrip("\n")
