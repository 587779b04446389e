"""An HTTP transport that sends each request at most once, for Gmail writes.

googleapiclient and google_auth_httplib2 drive an ``httplib2.Http``; stock httplib2
reconnects and re-sends a request whose connection dropped before the answer ("the
connection just went stale"), which for a POST to messages.send is a second email.
:class:`SingleShotHttp` offers the part of ``Http``'s interface they call (``request``,
``close``, ``timeout``, ``follow_redirects``) on the standard library's http.client,
public API only:

* one fresh connection per request, closed once the answer is read: no stale
  keep-alive connection, so nothing to retry;
* nothing is retried and no redirect is followed (a 3xx is returned as the answer);
* a failure to open the connection (refused, unknown host, TLS handshake, connect
  timeout) raises :class:`ConnectFailed`: nothing left this machine; any failure after
  that propagates as it is (the request may have arrived);
* ``accept-encoding: identity`` is asked for, so the body needs no decompression (a
  server that compresses anyway is still understood);
* ``target``/``issued``: set ``target`` to the write's URI and ``issued`` tells whether
  that request itself was handed to the transport (a token refresh before it goes to
  another URI).
"""

from __future__ import annotations

import gzip
import http.client
import socket
import ssl
import urllib.parse
import zlib
from typing import Any

import httplib2


class ConnectFailed(ConnectionError):
    """The connection could not be opened: nothing was sent."""


class SingleShotHttp:
    """A stand-in for ``httplib2.Http`` that never sends a request twice (see module)."""

    follow_redirects = False  # never: a redirected POST would be a second send

    def __init__(self, timeout: float | None = None) -> None:
        self.timeout = timeout  # seconds, for connecting and for each read; None: none
        self.target: str | None = None  # the write's own URI (not the token endpoint's)
        self.issued = False  # set once the write itself is handed to the transport
        self._conn: http.client.HTTPConnection | None = None

    def request(self, uri: str, method: str = "GET", body: Any = None, headers: dict | None = None,
                redirections: int = httplib2.DEFAULT_MAX_REDIRECTS,
                connection_type: Any = None) -> tuple[httplib2.Response, bytes]:
        """Send ``method uri`` once; ``(response, content)`` as ``httplib2.Http.request``
        returns them. ``redirections`` and ``connection_type`` are accepted for the
        interface and ignored: no redirect is followed, the scheme picks the connection."""
        uri = str(uri)
        if self.target is not None and uri == self.target:
            self.issued = True
        if isinstance(body, str):
            body = body.encode("utf-8")
        sent = {str(k).lower(): str(v) for k, v in (headers or {}).items()}
        sent["accept-encoding"] = "identity"
        if isinstance(body, (bytes, bytearray)):
            sent["content-length"] = str(len(body))
        conn, path = self._open(uri)
        try:
            conn.request(method, path, body, sent)
            answer = conn.getresponse()
            content = b"" if method == "HEAD" else answer.read()
        finally:
            self.close()
        response = httplib2.Response(answer)
        return response, _decoded(response, content)

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    def _open(self, uri: str) -> tuple[http.client.HTTPConnection, str]:
        parts = urllib.parse.urlsplit(uri)
        kwargs: dict[str, Any] = {} if self.timeout is None else {"timeout": self.timeout}
        if parts.scheme == "https":
            # The CA bundle httplib2 uses, so reads and writes trust the same roots.
            context = ssl.create_default_context(cafile=httplib2.CA_CERTS)
            conn: http.client.HTTPConnection = http.client.HTTPSConnection(
                parts.hostname or "", parts.port, context=context, **kwargs)
        elif parts.scheme == "http":
            conn = http.client.HTTPConnection(parts.hostname or "", parts.port, **kwargs)
        else:
            raise ConnectFailed(f"cannot connect: unsupported URL scheme {parts.scheme!r}")
        self.close()
        self._conn = conn
        try:
            conn.connect()
        except socket.timeout:
            self.close()
            raise ConnectFailed("timed out connecting") from None
        except OSError as exc:  # refused, unknown host, TLS handshake
            self.close()
            raise ConnectFailed(f"cannot connect: {exc}") from None
        path = parts.path or "/"
        return conn, path + (f"?{parts.query}" if parts.query else "")


def _decoded(response: httplib2.Response, content: bytes) -> bytes:
    """``content`` decompressed if the server compressed it although asked not to
    (the headers then read as httplib2 leaves them: ``-content-encoding``)."""
    encoding = response.get("content-encoding", "").strip().lower()
    if encoding in ("gzip", "x-gzip"):
        content = gzip.decompress(content)
    elif encoding == "deflate":
        try:
            content = zlib.decompress(content)
        except zlib.error:  # raw deflate, without the zlib header
            content = zlib.decompress(content, -zlib.MAX_WBITS)
    else:
        return content
    response["-content-encoding"] = response.pop("content-encoding")
    response["content-length"] = str(len(content))
    return content
