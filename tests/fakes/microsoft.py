"""A fake Microsoft Graph (v1.0) and Microsoft identity platform on 127.0.0.1, over
TLS with a test CA, for tests and the bench; written from Microsoft's documentation.

Identity (``/{tenant}/...``, what MSAL calls with ``instance_discovery=False``):
``v2.0/.well-known/openid-configuration``, ``oauth2/v2.0/devicecode`` and
``oauth2/v2.0/token`` (grant types device_code and refresh_token). A device code is
pending (``authorization_pending``) until :meth:`FakeGraph.approve` is given its user
code. Access tokens live ``token_lifetime`` seconds; Graph answers 401 after that.

Graph (``/v1.0/...``): ``me``, ``me/mailFolders/{f}``, ``.../messages/delta`` (pages of
``page_size`` with ``@odata.nextLink``, then ``@odata.deltaLink``; ``$filter=
receivedDateTime ge``; ``$select``), ``.../messages`` (``$filter`` internetMessageId /
conversationId eq, ``$orderby``, ``$top``), ``me/messages/{id}/$value`` (MIME),
``createReply`` (201, a draft in Drafts), ``PATCH me/messages/{id}`` (internetMessageId
writable while a draft), ``send`` (202, no body; the message moves to Sent Items) and
JSON ``$batch`` (a non-JSON body base64-encoded, as Graph does).

Faults: ``latency`` (seconds per call), :meth:`throttle` (429 / 503 with Retry-After
for the next N calls), :meth:`expire_delta` (every issued delta token answers 410
SyncStateNotFound), :meth:`drop_send_answer` (the send is carried out, the connection
closed without an answer), :meth:`hold_send` (the send waits on an event),
:meth:`fail_parts` (the next N batch parts answer 503).
"""

from __future__ import annotations

import base64
import email
import email.policy
import itertools
import json
import re
import ssl
import threading
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from email.message import EmailMessage
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote, unquote, urlsplit

FOLDERS = {"inbox": "Inbox", "sentitems": "Sent Items", "drafts": "Drafts"}


def iso(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _b64url(data: dict) -> str:
    return base64.urlsafe_b64encode(json.dumps(data).encode()).rstrip(b"=").decode()


@dataclass
class Msg:
    id: str
    folder: str
    internet_id: str
    conversation: str
    received: float
    raw: bytes = b""  # MIME of a received message; drafts are rendered from the fields
    is_draft: bool = False
    subject: str = ""
    to: list[str] = field(default_factory=list)
    body: str = ""
    in_reply_to: str = ""
    references: str = ""
    sender: str = ""

    def mime(self) -> bytes:
        if self.raw:
            return self.raw
        m = EmailMessage(policy=email.policy.SMTP)
        m["From"] = self.sender
        m["To"] = ", ".join(self.to)
        m["Subject"] = self.subject
        m["Message-ID"] = self.internet_id
        m["Date"] = email.utils.formatdate(self.received, usegmt=True)
        if self.in_reply_to:
            m["In-Reply-To"] = self.in_reply_to
            m["References"] = self.references
        m.set_content(self.body)
        return bytes(m)


@dataclass
class Call:
    route: str
    method: str
    path: str
    status: int = 0


class FakeGraph:
    def __init__(self, folder: Path, address: str = "support@contoso.test", *,
                 client_id: str = "11111111-2222-3333-4444-555555555555"):
        self.address, self.client_id = address, client_id
        self.folder = folder
        self.messages: dict[str, Msg] = {}
        self.changes: list[tuple[int, str]] = []  # (seq, message id): the change log
        self._seq = itertools.count(1)
        self._ids = itertools.count(1)
        self.calls: list[Call] = []
        self.lock = threading.RLock()
        self.latency = 0.0
        self.page_size = 10  # Graph's default; Prefer: odata.maxpagesize=N asks for more
        self.token_lifetime = 3600
        self.tokens: dict[str, float] = {}  # access token -> expiry
        self.refresh_tokens: set[str] = set()
        self.device: dict[str, dict] = {}  # device code -> {user_code, approved, scope}
        self.delta_tokens: dict[str, tuple] = {}
        self.dead_tokens: set[str] = set()
        self._throttle: list[tuple[int, str | None, int, float]] = []
        self._fail_parts = 0
        self._drop_send = 0
        self.send_error: int | None = None  # the next send answers this, not carried out
        self.outbox_next = False  # the next send waits in the Outbox (neither folder) until
        # deliver_outbox(); its answer is dropped
        self._send_hold: threading.Event | None = None
        self.send_reached = threading.Event()
        self.sends = 0
        self.auto_approve = False  # a device code is approved at once (fixtures)
        self._server: ThreadingHTTPServer | None = None

    # -- lifecycle ------------------------------------------------------------------
    def start(self) -> "FakeGraph":
        from tests._dovecot import _certificates

        _certificates(self.folder)
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.load_cert_chain(self.folder / "server.pem", self.folder / "server.key")
        fake = self

        class Handler(_Handler):
            graph = fake

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._server.socket = ctx.wrap_socket(self._server.socket, server_side=True)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._send_hold is not None:
            self._send_hold.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    @property
    def ca_file(self) -> str:
        return str(self.folder / "ca.pem")

    @property
    def base(self) -> str:
        assert self._server is not None
        return f"https://127.0.0.1:{self._server.server_address[1]}/"

    @property
    def graph_endpoint(self) -> str:
        return self.base + "v1.0/"

    # -- mailbox --------------------------------------------------------------------
    def _change(self, mid: str) -> None:
        self.changes.append((next(self._seq), mid))

    def deliver(self, raw: bytes, folder: str = "inbox", received: float | None = None) -> Msg:
        """A message arrives (its conversation found by In-Reply-To / References)."""
        parsed = email.message_from_bytes(raw, policy=email.policy.default)
        internet_id = str(parsed.get("Message-ID") or f"<fake{next(self._ids)}@contoso.test>")
        refs = f"{parsed.get('References') or ''} {parsed.get('In-Reply-To') or ''}".split()
        with self.lock:
            conv = next((m.conversation for m in self.messages.values()
                         if m.internet_id in refs), f"conv-{uuid.uuid4().hex[:12]}")
            m = Msg(id=f"AAMk{next(self._ids):06d}", folder=folder, internet_id=internet_id,
                    conversation=conv, received=received or time.time(), raw=raw,
                    subject=str(parsed.get("Subject") or ""))
            self.messages[m.id] = m
            self._change(m.id)
        return m

    def move(self, mid: str, folder: str) -> Msg:
        """A person moves the message: Exchange gives it a new id (without ImmutableId)."""
        with self.lock:
            m = self.messages.pop(mid)
            m.id, m.folder = f"AAMk{next(self._ids):06d}", folder
            self.messages[m.id] = m
            self._change(m.id)
            return m

    def touch(self, mid: str) -> None:
        """A change that is not new mail (read, flagged): delta lists it again."""
        with self.lock:
            self._change(mid)

    def in_folder(self, folder: str) -> list[Msg]:
        with self.lock:
            return [m for m in self.messages.values() if m.folder == folder]

    @property
    def sent(self) -> list[Msg]:
        return self.in_folder("sentitems")

    def routes(self, since: int = 0) -> list[str]:
        with self.lock:
            return [c.route for c in self.calls[since:]]

    def mark(self) -> int:
        with self.lock:
            return len(self.calls)

    # -- faults ---------------------------------------------------------------------
    def throttle(self, times: int, *, route: str | None = None, status: int = 429,
                 retry_after: float = 1) -> None:
        with self.lock:
            self._throttle.append((times, route, status, retry_after))

    def expire_delta(self) -> None:
        with self.lock:
            self.dead_tokens |= set(self.delta_tokens)

    def drop_send_answer(self, times: int = 1) -> None:
        self._drop_send = times

    def hold_send(self) -> threading.Event:
        self._send_hold = threading.Event()
        return self._send_hold

    def deliver_outbox(self) -> None:
        with self.lock:
            for m in self.in_folder("outbox"):
                m.folder = "sentitems"
                self._change(m.id)

    def fail_parts(self, times: int) -> None:
        self._fail_parts = times

    def approve(self, user_code: str) -> None:
        with self.lock:
            for d in self.device.values():
                if d["user_code"] == user_code:
                    d["approved"] = True
                    return
        raise KeyError(user_code)

    def expire_tokens(self) -> None:
        with self.lock:
            self.tokens = {t: 0.0 for t in self.tokens}

    def _throttled(self, route: str) -> tuple[int, float] | None:
        with self.lock:
            for i, (times, only, status, after) in enumerate(self._throttle):
                if only is None or only == route:
                    if times <= 1:
                        self._throttle.pop(i)
                    else:
                        self._throttle[i] = (times - 1, only, status, after)
                    return status, after
        return None

    # -- identity -------------------------------------------------------------------
    def identity(self, h: "_Handler", method: str, tenant: str, rest: str, form: dict) -> None:
        root = f"{self.base}{tenant}"
        if rest == "v2.0/.well-known/openid-configuration":
            return h.reply(200, {
                "issuer": f"{root}/v2.0", "authorization_endpoint": f"{root}/oauth2/v2.0/authorize",
                "token_endpoint": f"{root}/oauth2/v2.0/token",
                "device_authorization_endpoint": f"{root}/oauth2/v2.0/devicecode"})
        if rest == "oauth2/v2.0/devicecode" and method == "POST":
            code, user = uuid.uuid4().hex, f"FAKE{next(self._ids):05d}"
            self.device[code] = {"user_code": user, "approved": self.auto_approve,
                                 "scope": form.get("scope")}
            return h.reply(200, {
                "device_code": code, "user_code": user, "expires_in": 900, "interval": 1,
                "verification_uri": "https://microsoft.com/devicelogin",
                "message": f"To sign in, use a web browser to open the page "
                           f"https://microsoft.com/devicelogin and enter the code {user} to "
                           f"authenticate."})
        if rest == "oauth2/v2.0/token" and method == "POST":
            return self._token(h, tenant, form)
        h.reply(404, {"error": "not_found"})

    def _token(self, h: "_Handler", tenant: str, form: dict) -> None:
        grant = form.get("grant_type", "")
        self.calls.append(Call("token", "POST", grant))
        scope = form.get("scope", "")
        if grant.endswith("device_code"):
            d = self.device.get(form.get("device_code", ""))
            if d is None:
                return h.reply(400, {"error": "expired_token"})
            if not d["approved"]:
                return h.reply(400, {"error": "authorization_pending",
                                     "error_description": "AADSTS70016: pending"})
            scope = d["scope"] or scope
        elif grant == "refresh_token":
            if form.get("refresh_token") not in self.refresh_tokens:
                return h.reply(400, {"error": "invalid_grant",
                                     "error_description": "AADSTS70008: the refresh token expired"})
        else:
            return h.reply(400, {"error": "unsupported_grant_type"})
        at, rt = f"at-{uuid.uuid4().hex}", f"rt-{uuid.uuid4().hex}"
        with self.lock:
            self.tokens[at] = time.time() + self.token_lifetime
            self.refresh_tokens.add(rt)
        now = int(time.time())
        claims = {"iss": f"{self.base}{tenant}/v2.0", "aud": self.client_id, "iat": now,
                  "nbf": now, "exp": now + 3600, "oid": "oid-1", "tid": "tid-1", "sub": "s",
                  "preferred_username": self.address, "name": "Support"}
        id_token = f"{_b64url({'alg': 'none', 'typ': 'JWT'})}.{_b64url(claims)}.sig"
        granted = " ".join(s for s in scope.split() if s not in ("openid", "profile"))
        h.reply(200, {"token_type": "Bearer", "scope": granted, "expires_in": self.token_lifetime,
                      "ext_expires_in": self.token_lifetime, "access_token": at,
                      "refresh_token": rt, "id_token": id_token,
                      "client_info": _b64url({"uid": "oid-1", "utid": "tid-1"})})

    # -- graph ----------------------------------------------------------------------
    def graph(self, h: "_Handler", method: str, path: str, query: dict, body: Any,
              auth: str) -> tuple[int, Any, dict]:
        """(status, payload, headers) of one Graph request (also a $batch part)."""
        route = _route(method, path)
        with self.lock:
            self.calls.append(Call(route, method, path))
        token = auth.removeprefix("Bearer ")
        if self.tokens.get(token, 0) < time.time():
            return 401, {"error": {"code": "InvalidAuthenticationToken",
                                   "message": "Access token has expired or is not yet valid."}}, {}
        throttled = self._throttled(route)
        if throttled:
            status, after = throttled
            return status, {"error": {"code": "TooManyRequests" if status == 429 else
                                      "ServiceUnavailable", "message": "Please retry later"}}, \
                {"Retry-After": str(int(after))}
        handler = getattr(self, "_r_" + route.replace(".", "_"), None)
        if handler is None:
            return 400, {"error": {"code": "BadRequest", "message": f"no route {path}"}}, {}
        return handler(h, path, query, body)

    def _r_me(self, h, path, q, body):
        return 200, {"mail": self.address, "userPrincipalName": self.address}, {}

    def _r_folder(self, h, path, q, body):
        f = path.split("/")[2]
        if f not in FOLDERS:
            return 404, {"error": {"code": "ErrorInvalidIdMalformed", "message": "no folder"}}, {}
        return 200, {"id": f, "displayName": FOLDERS[f],
                     "totalItemCount": len(self.in_folder(f))}, {}

    def _render(self, m: Msg, select: str | None) -> dict:
        full = {"id": m.id, "internetMessageId": m.internet_id, "conversationId": m.conversation,
                "receivedDateTime": iso(m.received), "isDraft": m.is_draft,
                "subject": m.subject, "parentFolderId": m.folder}
        if not select:
            return full
        keep = {s.strip() for s in select.split(",")} | {"id"}
        return {k: v for k, v in full.items() if k in keep}

    def _r_delta(self, h, path, q, body):
        folder = path.split("/")[2]
        with self.lock:
            if "$skiptoken" in q:
                state = self.delta_tokens.get(q["$skiptoken"])
                if state is None:
                    return 410, {"error": {"code": "SyncStateNotFound", "message": "gone"}}, {}
                _, remaining, seq, since, select = state
            else:
                if "$deltatoken" in q:
                    tok = q["$deltatoken"]
                    if tok in self.dead_tokens or tok not in self.delta_tokens:
                        return 410, {"error": {"code": "SyncStateNotFound", "message":
                                               "The sync state generation is not found."}}, {}
                    _, _, start, since, select = self.delta_tokens[tok]
                else:
                    start, select = 0, q.get("$select")
                    since = _since(q.get("$filter", ""))
                seq = self.changes[-1][0] if self.changes else 0
                ids = list(dict.fromkeys(mid for s, mid in self.changes if s > start))
                remaining = [i for i in ids if i in self.messages
                             and self.messages[i].folder == folder
                             and self.messages[i].received >= since]
            size = min(getattr(h, "page_wanted", 0) or self.page_size, 1000)
            page, rest = remaining[:size], remaining[size:]
            value = [self._render(self.messages[i], select) for i in page]
            tok = uuid.uuid4().hex
            self.delta_tokens[tok] = (folder, rest, seq, since, select)
        link = f"{self.graph_endpoint}me/mailFolders/{folder}/messages/delta?"
        key = "@odata.nextLink" if rest else "@odata.deltaLink"
        link += ("$skiptoken=" if rest else "$deltatoken=") + tok
        return 200, {"value": value, key: link}, {}

    def _r_messages_list(self, h, path, q, body):
        parts = path.split("/")
        folder = parts[2] if len(parts) > 3 else None
        flt = q.get("$filter", "")
        with self.lock:
            found = [m for m in self.messages.values() if folder is None or m.folder == folder]
            for key, attr in (("internetMessageId", "internet_id"),
                              ("conversationId", "conversation")):
                match = re.search(rf"{key} eq '((?:[^']|'')*)'", flt)
                if match:
                    want = match.group(1).replace("''", "'")
                    found = [m for m in found if getattr(m, attr) == want]
            found.sort(key=lambda m: m.received, reverse="desc" in q.get("$orderby", ""))
            found = found[:int(q.get("$top", 10))]
            return 200, {"value": [self._render(m, q.get("$select")) for m in found]}, {}

    def _r_value(self, h, path, q, body):
        m = self.messages.get(unquote(path.split("/")[2]))
        if m is None:
            return 404, {"error": {"code": "ErrorItemNotFound", "message": "not found"}}, {}
        return 200, m.mime(), {"Content-Type": "message/rfc822"}

    def _r_createReply(self, h, path, q, body):
        with self.lock:
            o = self.messages.get(unquote(path.split("/")[2]))
            if o is None:
                return 404, {"error": {"code": "ErrorItemNotFound", "message": "not found"}}, {}
            parsed = email.message_from_bytes(o.mime(), policy=email.policy.default)
            d = Msg(id=f"AAMk{next(self._ids):06d}", folder="drafts",
                    internet_id=f"<draft{next(self._ids)}@contoso.test>",
                    conversation=o.conversation, received=time.time(), is_draft=True,
                    subject="RE: " + o.subject, sender=self.address,
                    to=[email.utils.parseaddr(str(parsed.get("Reply-To") or parsed.get("From")))[1]],
                    in_reply_to=o.internet_id,
                    references=f"{parsed.get('References') or ''} {o.internet_id}".strip())
            self.messages[d.id] = d
            self._change(d.id)
            return 201, self._render(d, None), {}

    def _r_update(self, h, path, q, body):
        with self.lock:
            m = self.messages.get(unquote(path.split("/")[2]))
            if m is None:
                return 404, {"error": {"code": "ErrorItemNotFound", "message": "not found"}}, {}
            if "internetMessageId" in body:
                if not m.is_draft:
                    return 400, {"error": {"code": "ErrorInvalidPropertyUpdateSentMessage",
                                           "message": "only a draft"}}, {}
                m.internet_id = body["internetMessageId"]
            if "body" in body:
                m.body = body["body"]["content"]
            if "toRecipients" in body:
                m.to = [r["emailAddress"]["address"] for r in body["toRecipients"]]
            return 200, self._render(m, None), {}

    def _r_send(self, h, path, q, body):
        self.send_reached.set()
        if self._send_hold is not None:
            self._send_hold.wait(60)
        if self.send_error is not None:
            status, self.send_error = self.send_error, None
            return status, {"error": {"code": "ErrorInternalServerError", "message": "x"}}, {}
        with self.lock:
            m = self.messages.get(unquote(path.split("/")[2]))
            if m is None or not m.is_draft:
                return 404, {"error": {"code": "ErrorItemNotFound", "message": "not found"}}, {}
            m.is_draft, m.folder, m.received = False, "sentitems", time.time()
            self.sends += 1
            self._change(m.id)
            if self.outbox_next:
                self.outbox_next = False
                m.folder = "outbox"
                return -1, None, {}
            if self._drop_send:
                self._drop_send -= 1
                return -1, None, {}  # carried out; the answer is lost
        return 202, None, {}

    def batch(self, h: "_Handler", body: dict, auth: str) -> tuple[int, Any, dict]:
        with self.lock:
            self.calls.append(Call("batch", "POST", "$batch"))
        throttled = self._throttled("batch")
        if throttled:
            return throttled[0], {"error": {"code": "TooManyRequests", "message": "later"}}, \
                {"Retry-After": str(int(throttled[1]))}
        out = []
        for part in body.get("requests", [])[:20]:
            url = urlsplit(part["url"])
            if self._fail_parts > 0:
                self._fail_parts -= 1
                out.append({"id": part["id"], "status": 503, "headers": {"Retry-After": "1"},
                            "body": {"error": {"code": "ServiceUnavailable", "message": "x"}}})
                continue
            q = {k: v[0] for k, v in parse_qs(url.query).items()}
            status, payload, headers = self.graph(h, part["method"], url.path.lstrip("/"), q,
                                                  part.get("body"), auth)
            if isinstance(payload, bytes):
                payload = base64.b64encode(payload).decode()
            out.append({"id": part["id"], "status": status, "headers": headers, "body": payload})
        return 200, {"responses": out}, {}


def _max_page(prefer: str) -> int:
    match = re.search(r"odata\.maxpagesize=(\d+)", prefer)
    return int(match.group(1)) if match else 0


def _since(flt: str) -> float:
    match = re.search(r"receivedDateTime ge (\S+)", flt)
    if not match:
        return 0.0
    return datetime.strptime(match.group(1), "%Y-%m-%dT%H:%M:%SZ").replace(
        tzinfo=timezone.utc).timestamp()


_ROUTES = [
    ("GET", r"^me$", "me"),
    ("GET", r"^me/mailFolders/[^/]+$", "folder"),
    ("GET", r"^me/mailFolders/[^/]+/messages/delta$", "delta"),
    ("GET", r"^me/mailFolders/[^/]+/messages$", "messages.list"),
    ("GET", r"^me/messages$", "messages.list"),
    ("GET", r"^me/messages/[^/]+/\$value$", "value"),
    ("POST", r"^me/messages/[^/]+/createReply$", "createReply"),
    ("PATCH", r"^me/messages/[^/]+$", "update"),
    ("POST", r"^me/messages/[^/]+/send$", "send"),
]


def _route(method: str, path: str) -> str:
    for m, pattern, name in _ROUTES:
        if m == method and re.match(pattern, path):
            return name
    return "unknown"


class _Handler(BaseHTTPRequestHandler):
    graph: FakeGraph
    page_wanted = 0
    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:
        pass

    def reply(self, status: int, payload: Any, headers: dict | None = None) -> None:
        data = payload if isinstance(payload, bytes) else (
            b"" if payload is None else json.dumps(payload).encode())
        self.send_response(status)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        if not isinstance(payload, bytes) and payload is not None:
            self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _go(self, method: str) -> None:
        url = urlsplit(self.path)
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        parts = url.path.lstrip("/").split("/", 1)
        if parts[0] != "v1.0":
            form = {k: v[0] for k, v in parse_qs(raw.decode()).items()}
            return self.graph.identity(self, method, parts[0], parts[1] if len(parts) > 1
                                       else "", form)
        path = unquote(parts[1]) if len(parts) > 1 else ""
        query = {k: v[0] for k, v in parse_qs(url.query).items()}
        body = json.loads(raw) if raw else {}
        auth = self.headers.get("Authorization", "")
        self.page_wanted = _max_page(self.headers.get("Prefer", ""))
        if self.graph.latency:  # per HTTP request: a $batch costs one round trip
            time.sleep(self.graph.latency)
        if path == "$batch":
            status, payload, headers = self.graph.batch(self, body, auth)
        else:
            status, payload, headers = self.graph.graph(self, method, path, query, body, auth)
        if status == -1:
            self.close_connection = True
            self.connection.shutdown(2)
            return
        self.reply(status, payload, headers)

    def do_GET(self) -> None:  # noqa: N802
        self._go("GET")

    def do_POST(self) -> None:  # noqa: N802
        self._go("POST")

    def do_PATCH(self) -> None:  # noqa: N802
        self._go("PATCH")


__all__ = ["FakeGraph", "Msg", "quote"]
