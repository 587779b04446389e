"""SingleShotHttp, the transport of Gmail writes: a request reaches the server at most
once, whatever happens to the connection, and a connection that never opened is told
apart from one that failed after the request left."""

from __future__ import annotations

import gzip
import http.client
import json
import socket
import threading
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import google_auth_httplib2
import httplib2
import pytest
from google.oauth2.credentials import Credentials

from bot.gmail.transport import ConnectFailed, SingleShotHttp

_LOST = (http.client.HTTPException, ConnectionError)  # the answer never came


class _Server:
    """A local HTTP/1.1 server; ``mode`` picks the answer to the next requests."""

    def __init__(self) -> None:
        self.mode = "ok"
        self.requests: list[tuple[str, str, dict[str, str], bytes]] = []
        self.release = threading.Event()
        self.ended = threading.Event()  # a connection was closed by the client
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self):  # noqa: N802 (http.server names)
                owner.handle(self)

            do_GET = do_POST  # noqa: N815

            def finish(self):
                super().finish()
                owner.ended.set()

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.02,),
                                       daemon=True)
        self.thread.start()

    def handle(self, h: BaseHTTPRequestHandler) -> None:
        body = h.rfile.read(int(h.headers.get("content-length") or 0))
        self.requests.append((h.command, h.path, {k.lower(): v for k, v in h.headers.items()},
                              body))
        if self.mode == "drop":  # the request arrived; the answer never leaves
            h.close_connection = True
            h.connection.shutdown(socket.SHUT_RDWR)
            return
        if self.mode == "hold":
            self.release.wait(10)
        data, extra = json.dumps({"id": "m1", "text": "héllo"}).encode(), {}
        if self.mode in ("gzip", "deflate", "raw-deflate"):  # compressed, though not asked
            data = {"gzip": gzip.compress, "deflate": zlib.compress,
                    "raw-deflate": lambda d: zlib.compress(d, wbits=-15)}[self.mode](data)
            extra["Content-Encoding"] = "deflate" if "deflate" in self.mode else "gzip"
        status = 308 if self.mode == "redirect" else 201
        if status == 308:
            extra["Location"] = self.url + "/elsewhere"
        try:
            h.send_response(status, "Created" if status == 201 else None)
            h.send_header("Content-Type", "application/json; charset=UTF-8")
            h.send_header("Content-Length", str(len(data)))
            h.send_header("X-Mixed-Case", "yes")
            for k, v in extra.items():
                h.send_header(k, v)
            h.end_headers()
            h.wfile.write(data)
        except OSError:  # the client gave up (timeout test)
            h.close_connection = True

    def close(self) -> None:
        self.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server():
    s = _Server()
    try:
        yield s
    finally:
        s.close()


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_request_goes_out_as_given_and_the_answer_comes_back_as_httplib2s(server):
    """Headers and body as googleapiclient passes them (gzip asked for, a str body), the
    answer as an httplib2.Response: status, reason, lower-case headers, the raw bytes."""
    transport = SingleShotHttp(timeout=5)
    response, content = transport.request(
        server.url + "/gmail/v1/users/me/messages/send?alt=json", "POST",
        body='{"raw": "é"}', headers={"Accept-Encoding": "gzip, deflate", "X-Goog": "1"})
    assert isinstance(response, httplib2.Response)
    assert response.status == 201 and response.reason == "Created"
    assert response["status"] == "201" and response["x-mixed-case"] == "yes"
    assert json.loads(content) == {"id": "m1", "text": "héllo"}
    ((method, path, headers, body),) = server.requests
    assert (method, path) == ("POST", "/gmail/v1/users/me/messages/send?alt=json")
    assert headers["accept-encoding"] == "identity" and headers["x-goog"] == "1"
    assert body == '{"raw": "é"}'.encode() and headers["content-length"] == str(len(body))
    assert server.ended.wait(5), "the connection stays open after the answer"


@pytest.mark.parametrize("mode", ["gzip", "deflate", "raw-deflate"])
def test_an_answer_compressed_anyway_is_decoded(server, mode):
    server.mode = mode
    response, content = SingleShotHttp(timeout=5).request(server.url + "/x")
    assert json.loads(content)["text"] == "héllo"
    assert "content-encoding" not in response and response["content-length"] == str(len(content))


def test_a_connection_dropped_after_the_request_is_raised_never_resent(server):
    """The server read the request and closed without answering: the error reaches the
    caller and the server saw one request. Control: stock httplib2 sends it again."""
    server.mode = "drop"
    transport = SingleShotHttp(timeout=5)
    transport.target = server.url + "/send"
    with pytest.raises(_LOST) as exc:
        transport.request(transport.target, "POST", body=b"{}")
    assert not isinstance(exc.value, ConnectFailed) and transport.issued
    assert len(server.requests) == 1
    stock = httplib2.Http(timeout=5)
    try:
        with pytest.raises(_LOST):
            stock.request(server.url + "/send", "POST", body=b"{}")
    finally:
        stock.close()
    assert len(server.requests) == 3


def test_a_connection_that_never_opened_is_connect_failed(server):
    """Refused: ConnectFailed, so the caller knows nothing left; ``issued`` tells the
    write apart from the token refresh before it."""
    transport = SingleShotHttp(timeout=5)
    transport.target = server.url + "/send"
    with pytest.raises(ConnectFailed, match="cannot connect"):
        transport.request(f"http://127.0.0.1:{_closed_port()}/token", "POST", body=b"x")
    assert not transport.issued
    transport.target = f"http://127.0.0.1:{_closed_port()}/send"
    with pytest.raises(ConnectFailed):
        transport.request(transport.target, "POST", body=b"{}")
    assert transport.issued and server.requests == []


def test_https_is_tls_and_a_failed_handshake_is_connect_failed(server):
    """https:// speaks TLS (here to a plain HTTP server, so the handshake fails): that
    is a connection that never opened, and no request reached the server."""
    transport = SingleShotHttp(timeout=5)
    transport.target = server.url.replace("http:", "https:") + "/send"
    with pytest.raises(ConnectFailed, match="cannot connect"):
        transport.request(transport.target, "POST", body=b"{}")
    assert transport.issued and server.requests == []


def test_a_redirect_is_answered_not_followed(server):
    """A 308 on a POST: httplib2 would POST again to the Location; here it is the answer."""
    server.mode = "redirect"
    response, _ = SingleShotHttp(timeout=5).request(server.url + "/send", "POST", body=b"{}")
    assert response.status == 308 and response["location"].endswith("/elsewhere")
    assert [r[1] for r in server.requests] == ["/send"]


def test_the_timeout_bounds_the_wait_for_an_answer(server):
    server.mode = "hold"
    transport = SingleShotHttp(timeout=0.3)
    with pytest.raises(TimeoutError):
        transport.request(server.url + "/send", "POST", body=b"{}")
    server.release.set()
    assert len(server.requests) == 1


def test_authorized_http_drives_it_with_the_bearer_token(server):
    """google_auth_httplib2.AuthorizedHttp (what googleapiclient calls) works on top."""
    authed = google_auth_httplib2.AuthorizedHttp(Credentials(token="tok"),
                                                 http=SingleShotHttp(timeout=5))
    response, content = authed.request(server.url + "/send", "POST", body=b"{}",
                                       headers={"content-type": "application/json"})
    assert response.status == 201 and json.loads(content)["id"] == "m1"
    assert server.requests[0][2]["authorization"] == "Bearer tok"
    authed.close()
