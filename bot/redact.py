"""Make URLs safe to show: in an error, a log line, a notice or ``doctor`` output.

A store URL (``postgresql://user:pw@host/db``) or a model's ``base_url``
(``http://user:pw@proxy/v1``) can carry credentials; what the operator reads must
not.
"""

from __future__ import annotations

import re
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

__all__ = ["redact_url"]

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
        query = parts.query
        if query:
            pairs = parse_qsl(query, keep_blank_values=True)
            if any(_SECRET_PARAM.search(k) for k, _ in pairs):
                query = urlencode([(k, HIDDEN if _SECRET_PARAM.search(k) else v) for k, v in pairs],
                                  safe="*")
        return urlunsplit(parts._replace(netloc=netloc, query=query))
    except ValueError:  # not parseable (e.g. a broken IPv6 host): hide any user info
        return _USERINFO.sub(rf"\g<1>{HIDDEN}@", url)
