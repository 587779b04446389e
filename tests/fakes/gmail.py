"""A fake Gmail API on 127.0.0.1 for tests and the bench.

It serves the REST paths the real googleapiclient calls (static discovery, so the
paths are the ones in ``gmail.v1.json``) under ``/gmail/v1/users/me/...`` plus an OAuth
``/token`` endpoint, keeps a small mailbox with a history log, records every call with
its quota units, and can be told to misbehave:

* ``fail(route, status, times=1, ...)``: answer an error (401, 429 + Retry-After, 403
  quota, 500...) for the next ``times`` calls of a route.
* ``drop_after_accept(route)`` / ``error_after_accept(route, 500)``: store the sent
  message or draft, then drop the connection without an answer, or answer an error.
* ``latency``: seconds added to every call (the bench uses 0.1).
* ``hold(route, skip=0)``: the next call of that route (after ``skip`` more) waits
  until the returned event is set; ``reached(route)`` is set when it arrives.
* ``add_message(..., search_lag=N)``: the message is in history and ``messages.get``
  at once, but the first N ``messages.list`` searches do not return it (Gmail's search
  index lagging behind).

Routes are names from Gmail's quota table: ``getProfile``, ``messages.list``,
``messages.get``, ``messages.send``, ``messages.modify``, ``history.list``,
``drafts.create``, ``drafts.list``, ``labels.list``, ``token``.
"""

from __future__ import annotations

import base64
import email
import email.policy
import json
import re
import socket
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from tests.fakes._common import send_json, take_fault

QUOTA = {"getProfile": 1, "messages.list": 5, "messages.get": 5, "messages.send": 100,
         "threads.get": 10,
         "messages.modify": 5, "history.list": 2, "drafts.create": 10, "drafts.list": 5,
         "labels.list": 1, "settings.sendAs.list": 1, "token": 0}

BATCH_PATH = "/batch/gmail/v1"

SYSTEM_LABELS = ["INBOX", "SENT", "DRAFT", "UNREAD", "SPAM", "TRASH", "IMPORTANT", "STARRED",
                 "CATEGORY_PERSONAL", "CATEGORY_PROMOTIONS", "CATEGORY_SOCIAL",
                 "CATEGORY_UPDATES", "CATEGORY_FORUMS"]

_ROUTES = [
    ("GET", re.compile(r"^/gmail/v1/users/me/profile$"), "getProfile"),
    ("GET", re.compile(r"^/gmail/v1/users/me/messages$"), "messages.list"),
    ("POST", re.compile(r"^/gmail/v1/users/me/messages/send$"), "messages.send"),
    ("POST", re.compile(r"^/upload/gmail/v1/users/me/messages/send$"), "messages.send"),
    ("POST", re.compile(r"^/gmail/v1/users/me/messages/(?P<id>[^/]+)/modify$"), "messages.modify"),
    ("GET", re.compile(r"^/gmail/v1/users/me/messages/(?P<id>[^/]+)$"), "messages.get"),
    ("GET", re.compile(r"^/gmail/v1/users/me/history$"), "history.list"),
    ("GET", re.compile(r"^/gmail/v1/users/me/threads/(?P<id>[^/]+)$"), "threads.get"),
    ("POST", re.compile(r"^/gmail/v1/users/me/drafts$"), "drafts.create"),
    ("GET", re.compile(r"^/gmail/v1/users/me/drafts$"), "drafts.list"),
    ("GET", re.compile(r"^/gmail/v1/users/me/labels$"), "labels.list"),
    ("GET", re.compile(r"^/gmail/v1/users/me/settings/sendAs$"), "settings.sendAs.list"),
    ("POST", re.compile(r"^/token$"), "token"),
]


@dataclass
class Call:
    method: str
    path: str
    route: str
    query: dict[str, list[str]]
    body: Any
    units: int
    status: int = 0
    batch: bool = False  # a part of a batch request (see FakeGmail._batch)


@dataclass
class StoredMessage:
    id: str
    thread_id: str
    raw: bytes
    labels: list[str]
    internal_date: int  # ms
    history_id: int
    message_id: str = ""  # the RFC Message-ID header, for rfc822msgid:
    search_lag: int = 0  # messages.list searches still to come that do not return it


@dataclass
class _Fault:
    status: int
    times: int
    headers: dict[str, str] = field(default_factory=dict)
    body: Any = None
    after_accept: bool = False  # do the work, then fail
    drop: bool = False  # close the connection without answering


class FakeGmail:
    """Start with ``with FakeGmail() as fake:``; ``fake.url`` is the api_endpoint."""

    def __init__(self, address: str = "support@example.com"):
        self.address = address
        self.signature = ""  # the account's signature (HTML), as settings.sendAs gives it
        self.lock = threading.Lock()
        self.messages: dict[str, StoredMessage] = {}
        self.drafts: dict[str, str] = {}  # draft id -> message id
        # (history id, type, message id, label ids): "messageAdded" (labels empty),
        # "labelAdded" / "labelRemoved" with the labels added or removed.
        self.history: list[tuple[int, str, str, tuple[str, ...]]] = []
        self.history_id = 1000
        self.history_floor = 0  # startHistoryId below this answers 404
        self.user_labels: dict[str, str] = {}  # id -> name
        self.calls: list[Call] = []
        self.received_raw: list[bytes] = []  # raw MIME of every send / draft accepted
        self.valid_tokens: set[str] = {"fake-access-token"}
        self.refresh_ok = True
        self.revoked_refresh_tokens: set[str] = set()
        self.history_snapshot_pages = False  # see _r_history_list
        self.reauthorised = 0
        self.grant_scope: str | None = None
        self.rewrite_message_id = False
        self.accepted = threading.Event()  # set whenever a send or draft is stored
        self.issued = 0
        self.latency = 0.0
        self._faults: dict[str, list[_Fault]] = {}
        self._holds: dict[str, tuple[threading.Event, threading.Event]] = {}
        self._hold_skips: dict[str, int] = {}
        self._part_faults: dict[str, list[_Fault]] = {}  # item id -> faults (batch parts)
        self._truncate: list[int] = []  # batch answers to cut off, at that part
        self._next_id = 0x18c0000000000000
        self._clock = int(time.time() * 1000) - 10_000_000
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle -----------------------------------------------------------------------
    def start(self) -> "FakeGmail":
        fake = self

        class Handler(_Handler):
            owner = fake

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,), daemon=True,
                                        name="fake-gmail")
        self._thread.start()
        return self

    def stop(self) -> None:
        for _, release in self._holds.values():
            release.set()
        if self._server:
            self._server.shutdown()
            self._server.server_close()
        if self._thread:
            self._thread.join(timeout=5)

    def __enter__(self) -> "FakeGmail":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}/"

    @property
    def token_uri(self) -> str:
        return self.url + "token"

    # -- mailbox -----------------------------------------------------------------------------
    def _new_id(self) -> str:
        self._next_id += 1
        return format(self._next_id, "x")

    def add_message(self, raw: bytes, labels: tuple[str, ...] | list[str] = ("INBOX", "UNREAD"),
                    thread_id: str | None = None, received: float | None = None,
                    search_lag: int = 0) -> str:
        """Deliver ``raw`` to the mailbox; returns its Gmail id. ``received`` (epoch
        seconds) backdates its internalDate, as for mail imported or moved back in.
        ``search_lag``: the next N ``messages.list`` calls leave it out (index lag)."""
        with self.lock:
            mid = self._add(raw, list(labels), thread_id, received)
            self.messages[mid].search_lag = max(0, search_lag)
            return mid

    def _add(self, raw: bytes, labels: list[str], thread_id: str | None,
             received: float | None = None) -> str:
        mid = self._new_id()
        self.history_id += 1
        # internalDate: when Gmail received it, as for real mail (never ahead of now).
        self._clock = max(self._clock, int(time.time() * 1000))
        date = self._clock if received is None else int(received * 1000)
        try:
            parsed = email.message_from_bytes(raw, policy=email.policy.compat32)
            msgid = str(parsed.get("Message-ID", "") or "").strip()
        except Exception:
            msgid = ""
        self.messages[mid] = StoredMessage(mid, thread_id or mid, raw, labels, date,
                                           self.history_id, msgid)
        self.history.append((self.history_id, "messageAdded", mid, ()))
        return mid

    def relabel(self, item_id: str, add: tuple[str, ...] | list[str] = (),
                remove: tuple[str, ...] | list[str] = ()) -> None:
        """Labels change as a user, a filter or a colleague changes them ("not spam":
        add INBOX, remove SPAM), recorded in history as Gmail does."""
        with self.lock:
            self._relabel(self.messages[item_id], list(add), list(remove))

    def _relabel(self, m: StoredMessage, add: list[str], remove: list[str]) -> None:
        removed = [lbl for lbl in remove if lbl in m.labels]
        added = [lbl for lbl in add if lbl not in m.labels and lbl not in removed]
        for lbl in removed:
            m.labels.remove(lbl)
        m.labels.extend(added)
        for kind, labels in (("labelRemoved", removed), ("labelAdded", added)):
            if labels:
                self.history_id += 1
                self.history.append((self.history_id, kind, m.id, tuple(labels)))

    def expire_history(self) -> None:
        """Every historyId handed out so far now answers 404 (Gmail keeps about a week)."""
        with self.lock:
            self.history_floor = self.history_id + 1
            self.history_id += 5

    def add_label(self, name: str) -> str:
        with self.lock:
            lid = f"Label_{len(self.user_labels) + 1}"
            self.user_labels[lid] = name
            return lid

    def sent(self) -> list[StoredMessage]:
        with self.lock:
            return [m for m in self.messages.values() if "SENT" in m.labels]

    def revoke(self) -> None:
        """Access tokens stop working and refresh answers invalid_grant."""
        with self.lock:
            self.valid_tokens.clear()
            self.refresh_ok = False

    def reauthorise(self) -> tuple[str, str]:
        """What `draftgate auth gmail` gets after a revoke: a new (access, refresh)
        token pair; refresh tokens handed out before stay revoked."""
        with self.lock:
            self.reauthorised += 1
            self.revoked_refresh_tokens.add("fake-refresh-token")
            self.revoked_refresh_tokens.update(
                f"fake-refresh-token-r{n}" for n in range(1, self.reauthorised))
            self.refresh_ok = True
            access = f"fake-access-token-r{self.reauthorised}"
            self.valid_tokens.add(access)
            return access, f"fake-refresh-token-r{self.reauthorised}"

    # -- recording -----------------------------------------------------------------------------
    def calls_to(self, route: str) -> list[Call]:
        with self.lock:
            return [c for c in self.calls if c.route == route]

    def units(self, since: int = 0) -> int:
        with self.lock:
            return sum(c.units for c in self.calls[since:])

    def mark(self) -> int:
        """Index to pass to ``units``/``api_calls`` to measure from now on."""
        with self.lock:
            return len(self.calls)

    def api_calls(self, since: int = 0) -> list[Call]:
        with self.lock:
            return [c for c in self.calls[since:] if c.route not in ("token", "batch")]

    # -- misbehaviour ----------------------------------------------------------------------------
    def fail(self, route: str, status: int, *, times: int = 1, headers: dict | None = None,
             reason: str | None = None, message: str = "fake failure") -> None:
        errors = [{"reason": reason, "message": message, "domain": "usageLimits"}] if reason else []
        body = {"error": {"code": status, "message": message, "errors": errors}}
        with self.lock:
            self._faults.setdefault(route, []).append(
                _Fault(status, times, dict(headers or {}), body))

    def drop_after_accept(self, route: str = "messages.send", times: int = 1) -> None:
        with self.lock:
            self._faults.setdefault(route, []).append(
                _Fault(0, times, after_accept=True, drop=True))

    def error_after_accept(self, route: str = "messages.send", status: int = 500,
                           times: int = 1) -> None:
        body = {"error": {"code": status, "message": "backend error", "errors": []}}
        with self.lock:
            self._faults.setdefault(route, []).append(
                _Fault(status, times, body=body, after_accept=True))

    def hold(self, route: str, *, skip: int = 0) -> threading.Event:
        """The next call of ``route`` (after ``skip`` more) waits until the returned
        event is set."""
        release = threading.Event()
        with self.lock:
            self._holds[route] = (threading.Event(), release)
            self._hold_skips[route] = skip
        return release

    def reached(self, route: str) -> threading.Event:
        with self.lock:
            return self._holds[route][0]

    def _take_fault(self, route: str) -> _Fault | None:
        return take_fault(self._faults, route)

    # -- query language (the subset draftgate uses) ---------------------------------------------
    def _matches(self, m: StoredMessage, q: str) -> bool:
        q = q.replace("(", " ").replace(")", " ")
        for term in q.split():
            neg = term.startswith("-")
            term = term[1:] if neg else term
            key, _, value = term.partition(":")
            key, value = key.lower(), value.strip('"')
            if key == "in":
                v = value.lower()
                ok = True if v == "anywhere" else (
                    {"inbox": "INBOX", "sent": "SENT", "drafts": "DRAFT", "draft": "DRAFT",
                     "spam": "SPAM", "trash": "TRASH"}.get(v, v.upper()) in m.labels)
            elif key == "is":
                ok = value.upper() in m.labels
            elif key == "category":
                ok = f"CATEGORY_{value.upper()}" in m.labels
            elif key == "label":
                ids = [i for i, n in self.user_labels.items() if n.lower() == value.lower()]
                ok = any(i in m.labels for i in ids) or value.upper() in m.labels
            elif key == "rfc822msgid":
                ok = m.message_id.strip("<>") == value.strip("<>")
            elif key == "after":
                ok = m.internal_date // 1000 > int(value)
            elif key == "newer_than":
                ok = True  # every fake message is new
            elif key == "from":
                ok = value.lower() in _header(m.raw, "From").lower()
            else:
                raise ValueError(f"fake Gmail does not understand query term {term!r}")
            if ok == neg:
                return False
        if "in:anywhere" not in q and "rfc822msgid:" not in q:
            if ("SPAM" in m.labels or "TRASH" in m.labels) and "in:spam" not in q \
                    and "in:trash" not in q:
                return False
        return True

    def _resource(self, m: StoredMessage, fmt: str, headers: list[str] | None = None) -> dict:
        out = {"id": m.id, "threadId": m.thread_id, "labelIds": list(m.labels),
               "snippet": "", "historyId": str(m.history_id),
               "internalDate": str(m.internal_date), "sizeEstimate": len(m.raw)}
        if fmt == "raw":
            out["raw"] = base64.urlsafe_b64encode(m.raw).decode("ascii")
        elif fmt in ("metadata", "full"):
            names = headers or ["From", "Subject", "Message-ID"]
            out["payload"] = {"headers": [{"name": k, "value": _header(m.raw, k)}
                                          for k in names if _header(m.raw, k)]}
        return out

    # -- request handling ---------------------------------------------------------------------------
    def handle(self, h: "_Handler", method: str) -> None:
        parts = urlsplit(h.path)
        query = parse_qs(parts.query)
        length = int(h.headers.get("Content-Length") or 0)
        raw_body = h.rfile.read(length) if length else b""
        if parts.path.startswith("/_fake/"):
            return self._control(h, parts.path, query, raw_body)
        if method == "POST" and parts.path == BATCH_PATH:
            return self._batch(h, raw_body)
        route, params = "unknown", {}
        for m, pattern, name in _ROUTES:
            match = pattern.match(parts.path)
            if m == method and match:
                route, params = name, match.groupdict()
                break
        body: Any = raw_body
        if raw_body and route != "token":
            try:
                body = json.loads(raw_body)
            except ValueError:
                body = raw_body
        elif route == "token":
            body = parse_qs(raw_body.decode())
        call = Call(method, parts.path, route, query, body, QUOTA.get(route, 0))
        with self.lock:
            self.calls.append(call)
            if self._hold_skips.get(route, 0) > 0:
                self._hold_skips[route] -= 1
                hold = None
            else:
                hold = self._holds.pop(route, None)
        if hold:
            hold[0].set()
            hold[1].wait(30)
        if self.latency:
            time.sleep(self.latency)
        if route == "unknown":
            return self._answer(h, call, 404, {"error": {"code": 404, "message": "no such path"}})
        if route != "token":
            token = (h.headers.get("Authorization") or "").removeprefix("Bearer ").strip()
            with self.lock:
                authorised = token in self.valid_tokens
            if not authorised:
                return self._answer(h, call, 401, {"error": {
                    "code": 401, "message": "Request had invalid authentication credentials.",
                    "status": "UNAUTHENTICATED"}})
        with self.lock:
            fault = self._take_fault(route)
        if fault and not fault.after_accept:
            return self._answer(h, call, fault.status, fault.body, fault.headers)
        try:
            status, payload = getattr(self, "_r_" + route.replace(".", "_"))(query, body, params)
        except ValueError as exc:
            status, payload = 400, {"error": {"code": 400, "message": str(exc)}}
        if fault and fault.drop:
            call.status = -1
            h.close_connection = True
            try:
                h.connection.shutdown(2)
            except OSError:
                pass
            return None
        if fault:
            return self._answer(h, call, fault.status, fault.body, fault.headers)
        return self._answer(h, call, status, payload)

    def _control(self, h: "_Handler", path: str, query: dict, body: bytes) -> None:
        """Out-of-process use (``python -m tests.fakes.gmail``): drive the fake over HTTP
        so a benchmark measures only draftgate's process. Not recorded as calls."""
        call = Call("POST", path, "control", query, None, 0)
        if path == "/_fake/add":
            labels = query.get("labels", ["INBOX,UNREAD"])[0].split(",")
            mid = self.add_message(body, labels, thread_id=query.get("thread", [None])[0])
            return self._answer(h, call, 200, {"id": mid, "threadId": self.messages[mid].thread_id})
        if path == "/_fake/latency":
            self.latency = float(query["seconds"][0])
            return self._answer(h, call, 200, {})
        if path == "/_fake/calls":
            with self.lock:
                calls = [{"route": c.route, "units": c.units, "batch": c.batch}
                         for c in self.calls]
            return self._answer(h, call, 200, calls)
        return self._answer(h, call, 404, {"error": "unknown control path"})

    def _answer(self, h: "_Handler", call: Call, status: int, payload: Any,
                headers: dict | None = None) -> None:
        call.status = status
        try:
            send_json(h, status, payload, headers, "application/json; charset=UTF-8")
        except OSError:  # the client gave up (timeout test): nobody to answer
            h.close_connection = True

    # -- routes --------------------------------------------------------------------------------------
    def _r_getProfile(self, q, body, p):
        with self.lock:
            return 200, {"emailAddress": self.address, "messagesTotal": len(self.messages),
                         "threadsTotal": len(self.messages), "historyId": str(self.history_id)}

    def _r_messages_list(self, q, body, p):
        query = " ".join(q.get("q", []))
        labels = q.get("labelIds", [])
        include_spam = q.get("includeSpamTrash", ["false"])[0] == "true"
        with self.lock:
            lagging = {m.id for m in self.messages.values() if m.search_lag > 0}
            for mid in lagging:  # each search counts, whatever it asks for
                self.messages[mid].search_lag -= 1
            found = [m for m in self.messages.values()
                     if m.id not in lagging and all(lbl in m.labels for lbl in labels)
                     and self._matches(m, query + (" in:anywhere" if include_spam else ""))]
        found.sort(key=lambda m: (m.internal_date, m.id), reverse=True)
        return 200, _page(found, q, "messages",
                          lambda m: {"id": m.id, "threadId": m.thread_id})

    def _r_messages_get(self, q, body, p):
        with self.lock:
            m = self.messages.get(p["id"])
        if m is None:
            return 404, {"error": {"code": 404, "message": "Requested entity was not found."}}
        return 200, self._resource(m, q.get("format", ["full"])[0])

    def _r_threads_get(self, q, body, p):
        with self.lock:
            found = sorted((m for m in self.messages.values() if m.thread_id == p["id"]),
                           key=lambda m: m.internal_date)
        if not found:
            return 404, {"error": {"code": 404, "message": "Requested entity was not found."}}
        fmt = q.get("format", ["full"])[0]
        return 200, {"id": p["id"], "messages": [
            self._resource(m, fmt, q.get("metadataHeaders")) for m in found]}

    def _accept(self, body: dict, labels: list[str]) -> StoredMessage:
        raw = base64.urlsafe_b64decode(body["raw"] + "=" * (-len(body["raw"]) % 4))
        with self.lock:
            self.received_raw.append(raw)
            if self.rewrite_message_id:
                # What Gmail may do: store the message under a Message-ID of its own.
                raw = re.sub(rb"(?im)^Message-ID:.*\r?\n",
                             f"Message-ID: <gmail-{len(self.messages)}@mail.gmail.com>\r\n"
                             .encode(), raw, count=1)
            thread = body.get("threadId")
            if thread and not any(m.thread_id == thread for m in self.messages.values()):
                raise ValueError(f"Invalid thread_id value {thread}")
            mid = self._add(raw, labels, thread)
            self.accepted.set()
            return self.messages[mid]

    def _r_messages_send(self, q, body, p):
        m = self._accept(body, ["SENT"])
        return 200, {"id": m.id, "threadId": m.thread_id, "labelIds": ["SENT"]}

    def _r_drafts_create(self, q, body, p):
        m = self._accept(body["message"], ["DRAFT"])
        with self.lock:
            did = "r-" + m.id
            self.drafts[did] = m.id
        return 200, {"id": did, "message": {"id": m.id, "threadId": m.thread_id,
                                            "labelIds": ["DRAFT"]}}

    def _r_drafts_list(self, q, body, p):
        query = " ".join(q.get("q", []))
        with self.lock:
            found = [(d, self.messages[mid]) for d, mid in self.drafts.items()
                     if self._matches(self.messages[mid], query)]
        return 200, _page(found, q, "drafts", lambda dm: {
            "id": dm[0], "message": {"id": dm[1].id, "threadId": dm[1].thread_id}})

    def _r_messages_modify(self, q, body, p):
        with self.lock:
            m = self.messages.get(p["id"])
            if m is None:
                return 404, {"error": {"code": 404, "message": "Requested entity was not found."}}
            self._relabel(m, list(body.get("addLabelIds", [])),
                          list(body.get("removeLabelIds", [])))
            return 200, {"id": m.id, "threadId": m.thread_id, "labelIds": list(m.labels)}

    def _r_settings_sendAs_list(self, q, body, p):
        """The account's send-as addresses: the primary one, default, with
        :attr:`signature` (HTML, as Gmail keeps it)."""
        with self.lock:
            return 200, {"sendAs": [{"sendAsEmail": self.address, "displayName": "Support",
                                     "isPrimary": True, "isDefault": True,
                                     "signature": self.signature}]}

    def _r_labels_list(self, q, body, p):
        with self.lock:
            labels = [{"id": x, "name": x, "type": "system"} for x in SYSTEM_LABELS]
            labels += [{"id": i, "name": n, "type": "user"} for i, n in self.user_labels.items()]
        return 200, {"labels": labels}

    def _r_history_list(self, q, body, p):
        """As documented for users.history.list: records after ``startHistoryId`` of
        the ``historyTypes`` asked for (all four when none is given), for messages that
        have ``labelId``; each lists the message (id, threadId, its labels now) under
        ``messagesAdded``, or under ``labelsAdded``/``labelsRemoved`` with the label ids
        that changed."""
        start = int(q["startHistoryId"][0])
        label = q.get("labelId", [None])[0]
        types = set(q.get("historyTypes", [])) or set(_HISTORY_FIELDS)
        if types - set(_HISTORY_FIELDS):
            raise ValueError(f"Invalid value for historyTypes: {sorted(types - set(_HISTORY_FIELDS))}")
        # With history_snapshot_pages, later pages list only records up to the history
        # id current at the first page (page tokens are opaque; Gmail does not say
        # whether records added while paging show up on later pages).
        token = q.get("pageToken", [""])[0]
        offset, _, upto = token.partition("@")
        with self.lock:
            if start < self.history_floor:
                return 404, {"error": {"code": 404, "message": "Requested entity was not found."}}
            snapshot = int(upto) if upto else self.history_id
            entries = []
            for hid, kind, mid, changed in self.history:
                m = self.messages[mid]
                if hid > start and kind in types and (label is None or label in m.labels) and \
                        (not self.history_snapshot_pages or hid <= snapshot):
                    ref: dict[str, Any] = {"message": {"id": m.id, "threadId": m.thread_id,
                                                       "labelIds": list(m.labels)}}
                    if changed:
                        ref["labelIds"] = list(changed)
                    entries.append({"id": str(hid), "messages": [{"id": m.id, "threadId": m.thread_id}],
                                    _HISTORY_FIELDS[kind]: [ref]})
            current = str(self.history_id)
        out = _page(entries, {**q, "pageToken": [offset or "0"]}, "history", lambda e: e)
        if self.history_snapshot_pages and "nextPageToken" in out:
            out["nextPageToken"] += f"@{snapshot}"
        out["historyId"] = current
        return 200, out

    def _r_token(self, q, body, p):
        with self.lock:
            if not self.refresh_ok or \
                    set(body.get("refresh_token", [])) & self.revoked_refresh_tokens:
                return 400, {"error": "invalid_grant", "error_description": "Token has been expired or revoked."}
            self.issued += 1
            token = f"fake-access-token-{self.issued}"
            self.valid_tokens.add(token)
        out = {"access_token": token, "expires_in": 3599, "token_type": "Bearer"}
        if self.grant_scope is not None:  # what the user ticked on the consent screen
            out["scope"] = self.grant_scope
        if body.get("grant_type") == ["authorization_code"]:
            out["refresh_token"] = "fake-refresh-token"
        return 200, out


    # -- batch endpoint (multipart/mixed in and out, as Google documents it) -------------------
    def fail_part(self, item_id: str, status: int, *, times: int = 1,
                  headers: dict | None = None) -> None:
        """The next ``times`` batch parts that ask for ``item_id`` (messages.get,
        threads.get) answer ``status``; the other parts of the batch answer normally."""
        body = {"error": {"code": status, "message": "fake part failure", "errors": []}}
        with self.lock:
            self._part_faults.setdefault(item_id, []).append(
                _Fault(status, times, dict(headers or {}), body))

    def answer_part(self, item_id: str, payload: Any, *, times: int = 1) -> None:
        """The next ``times`` batch parts that ask for ``item_id`` answer 200 with
        ``payload``: a resource that is not the one asked for (no ``id``, another id),
        as a misbehaving server or proxy might."""
        with self.lock:
            self._part_faults.setdefault(item_id, []).append(_Fault(200, times, {}, payload))

    def resource_of(self, item_id: str, fmt: str = "raw") -> dict:
        """The resource ``messages.get`` answers for ``item_id`` (to build a wrong one)."""
        with self.lock:
            return self._resource(self.messages[item_id], fmt)

    def truncate_batch(self, part: int) -> None:
        """The next batch answer is cut off in the middle of the body of its part number
        ``part`` (0-based; the parts before it are whole), then the connection closes."""
        with self.lock:
            self._truncate.append(part)

    def batches(self) -> list[Call]:
        """Every batch request: the envelopes, whose ``body`` lists the path of each of
        their parts (the parts themselves are calls with batch=True)."""
        return self.calls_to("batch")

    def batch_count(self, since: int = 0) -> int:
        """How many batch requests (HTTP round trips carrying parts) since ``since``."""
        with self.lock:
            return sum(c.route == "batch" for c in self.calls[since:])

    def _batch(self, h: "_Handler", raw: bytes) -> None:
        envelope = Call("POST", BATCH_PATH, "batch", {}, None, 0)
        with self.lock:
            self.calls.append(envelope)
            cut = self._truncate.pop(0) if self._truncate else None
            hold = None if self._hold_skips.get("batch", 0) > 0 else self._holds.pop("batch", None)
            if self._hold_skips.get("batch", 0) > 0:
                self._hold_skips["batch"] -= 1
        if hold:  # hold("batch") holds the next batch request, as hold(route) a call
            hold[0].set()
            hold[1].wait(30)
        if self.latency:
            time.sleep(self.latency)
        ctype = h.headers.get("Content-Type") or ""
        msg = email.message_from_bytes(f"Content-Type: {ctype}\r\n\r\n".encode() + raw,
                                       policy=email.policy.compat32)
        if not msg.is_multipart():
            return self._answer(h, envelope, 400, {"error": {
                "code": 400, "message": "batch body must be multipart/mixed"}})
        boundary = "batch_fake_" + format(len(self.calls), "x")
        out, cut_at = [], None
        envelope.body = []  # the path of each part, in order
        # The batch request's Authorization applies to every part that has none.
        auth = h.headers.get("Authorization") or ""
        for n, part in enumerate(msg.get_payload()):
            status, payload, headers = self._batch_part(str(part.get_payload()), envelope.body,
                                                        auth)
            cid = str(part.get("Content-ID", "")).strip()
            data = json.dumps(payload)
            head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
            out.append(f"--{boundary}\r\nContent-Type: application/http\r\n"
                       f"Content-ID: <response-{cid.strip('<>')}>\r\n\r\n"
                       f"HTTP/1.1 {status} {_phrase(status)}\r\n"
                       f"Content-Type: application/json; charset=UTF-8\r\n{head}"
                       f"Content-Length: {len(data)}\r\n\r\n{data}\r\n")
            if n == cut:
                cut_at = len("".join(out)) - len(data) // 2 - 2
        body = ("".join(out) + f"--{boundary}--\r\n").encode()
        envelope.status = 200
        try:
            h.send_response(200)
            h.send_header("Content-Type", f"multipart/mixed; boundary={boundary}")
            h.send_header("Content-Length", str(cut_at if cut_at is not None else len(body)))
            h.end_headers()
            h.wfile.write(body[:cut_at] if cut_at is not None else body)
        except OSError:
            pass
        if cut_at is not None:
            h.close_connection = True

    def _batch_part(self, inner: str, paths: list[str], auth: str) -> tuple[int, Any, dict]:
        """One part of a batch: an HTTP request as text; (status, payload, headers).
        Its path is appended to ``paths`` (the envelope's record)."""
        head, _, raw_body = inner.replace("\r\n", "\n").partition("\n\n")
        lines = head.split("\n")
        method, target = lines[0].split(" ")[:2]
        headers = {k.strip().lower(): v.strip() for k, _, v in
                   (line.partition(":") for line in lines[1:] if ":" in line)}
        parts = urlsplit(target)
        paths.append(parts.path)
        route, params = "unknown", {}
        for m, pattern, name in _ROUTES:
            match = pattern.match(parts.path)
            if m == method and match:
                route, params = name, match.groupdict()
                break
        query = parse_qs(parts.query)
        body: Any = json.loads(raw_body) if raw_body.strip() else b""
        call = Call(method, parts.path, route, query, body, QUOTA.get(route, 0), batch=True)
        token = headers.get("authorization", auth).removeprefix("Bearer ").strip()
        with self.lock:
            self.calls.append(call)
            faults = self._part_faults.get(params.get("id", ""))
            fault = faults[0] if faults else self._take_fault(route)
            if faults:
                faults[0].times -= 1
                if faults[0].times <= 0:
                    faults.pop(0)
            authorised = token in self.valid_tokens
        if route == "unknown":
            status, payload, extra = 404, {"error": {"code": 404, "message": "no such path"}}, {}
        elif not authorised:
            status, payload, extra = 401, {"error": {"code": 401, "message": "Invalid Credentials",
                                                     "status": "UNAUTHENTICATED"}}, {}
        elif fault is not None:
            status, payload, extra = fault.status, fault.body, fault.headers
        else:
            try:
                status, payload = getattr(self, "_r_" + route.replace(".", "_"))(query, body, params)
            except ValueError as exc:
                status, payload = 400, {"error": {"code": 400, "message": str(exc)}}
            extra = {}
        call.status = status
        return status, payload, extra


# users.history.list: each historyTypes value and the History field that carries it.
_HISTORY_FIELDS = {"messageAdded": "messagesAdded", "messageDeleted": "messagesDeleted",
                   "labelAdded": "labelsAdded", "labelRemoved": "labelsRemoved"}


def _page(items: list, q: dict, key: str, render) -> dict:
    size = int(q.get("maxResults", ["100"])[0])
    start = int(q.get("pageToken", ["0"])[0])
    chunk = items[start:start + size]
    out: dict[str, Any] = {"resultSizeEstimate": len(items)}
    if chunk:
        out[key] = [render(x) for x in chunk]
    if start + size < len(items):
        out["nextPageToken"] = str(start + size)
    return out


def _phrase(status: int) -> str:
    import http

    try:
        return http.HTTPStatus(status).phrase
    except ValueError:
        return "Error"


def _header(raw: bytes, name: str) -> str:
    try:
        return str(email.message_from_bytes(raw, policy=email.policy.compat32).get(name, "") or "")
    except Exception:
        return ""


class _Handler(BaseHTTPRequestHandler):
    owner: FakeGmail
    protocol_version = "HTTP/1.1"

    def setup(self):
        super().setup()
        # Headers and body go out in separate writes; without this, Nagle plus the
        # client's delayed ACK adds ~40 ms to every keep-alive answer.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def do_GET(self):  # noqa: N802 (http.server names)
        self.owner.handle(self, "GET")

    def do_POST(self):  # noqa: N802
        self.owner.handle(self, "POST")

    def log_message(self, *args):
        pass


def simple_message(n: int = 0, *, sender: str = "Alice Buyer <alice@customer.example>",
                   subject: str | None = None, body: str | None = None,
                   extra_headers: str = "") -> bytes:
    """A plain, well-formed customer email."""
    subject = subject if subject is not None else f"Where is my order #{1000 + n}?"
    body = body if body is not None else f"Hi, where is my order #{1000 + n}? It was due Friday.\n"
    return (f"From: {sender}\r\nTo: support@example.com\r\nSubject: {subject}\r\n"
            f"Date: Sun, 29 Nov 2026 10:02:00 +0000\r\n"
            f"Message-ID: <order-{n}@customer.example>\r\n{extra_headers}"
            f"Content-Type: text/plain; charset=utf-8\r\n\r\n{body}").encode()


# -- test deployment helpers -----------------------------------------------------------------

READONLY = "https://www.googleapis.com/auth/gmail.readonly"
SEND = "https://www.googleapis.com/auth/gmail.send"


def write_token_file(path, fake: FakeGmail, *, scopes=(READONLY, SEND), expired: bool = False,
                     token: str = "fake-access-token",
                     refresh_token: str = "fake-refresh-token") -> str:
    """A token file like ``draftgate auth gmail`` writes, with a fake access token
    (valid for an hour, or already expired) and token_uri pointing at the fake."""
    import datetime
    import os

    delta = datetime.timedelta(hours=-1 if expired else 1)
    expiry = (datetime.datetime.now(datetime.timezone.utc) + delta).strftime("%Y-%m-%dT%H:%M:%SZ")
    data = {"token": token, "refresh_token": refresh_token, "client_id": "cid",
            "client_secret": "csecret", "token_uri": fake.token_uri, "scopes": list(scopes),
            "expiry": expiry}
    fd = os.open(str(path), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(data, f)
    return str(path)


def write_deployment(tmp_path, fake: FakeGmail, *, source: str | None = None,
                     sender: str = "{type: gmail_reply, account: support}",
                     template: str = "Hi {first_name},\n\nthanks for writing about {subject}.\n",
                     scopes=(READONLY, SEND), account_extra: str = "backoff: 0.01") -> str:
    """draftgate.yaml + pipelines/support.yaml for a Gmail pipeline against ``fake``;
    returns the config path."""
    source = source or '{type: gmail, account: support, query: "in:inbox -category:promotions"}'
    (tmp_path / "pipelines").mkdir(exist_ok=True)
    write_token_file(tmp_path / "support-token.json", fake, scopes=scopes)
    (tmp_path / "reply.txt").write_text(template)
    (tmp_path / "draftgate.yaml").write_text(
        f"store: sqlite:///{tmp_path}/state.db\npipelines: pipelines/*.yaml\n"
        f"gmail:\n  accounts:\n    support:\n      token_file: support-token.json\n"
        f"      api_endpoint: {fake.url}\n      address: {fake.address}\n"
        f"      {account_extra}\n")
    (tmp_path / "pipelines" / "support.yaml").write_text(
        f"name: support\nschedule: 5m\nsource: {source}\n"
        f"drafter: {{model: template, prompt: reply.txt}}\napproval: {{channel: console}}\n"
        f"sender: {sender}\n")
    return str(tmp_path / "draftgate.yaml")


class GmailWorld:
    """A fake Gmail, a deployment pointing at it, the real SQLite store and the real
    Engine with the template drafter and a console channel (auto-approving or not)."""

    def __init__(self, tmp_path, *, auto_approve: bool = False, fake=None, **deployment):
        self.tmp_path = tmp_path
        self.fake = fake or FakeGmail().start()
        self.config = write_deployment(tmp_path, self.fake, **deployment)
        self.auto_approve = auto_approve
        self.out = None
        self.engine = None
        self.store = None

    async def open(self) -> "GmailWorld":
        from tests.support.desk import open_console_world

        await open_console_world(self)
        return self

    async def close(self) -> None:
        from tests.support.desk import close_console_world

        try:
            await close_console_world(self)
        finally:
            self.fake.stop()

    async def tick(self):
        return await self.engine.tick("support")

    async def drafts(self):
        """Every draft of every message the fake mailbox holds."""
        out = []
        for gid in list(self.fake.messages):
            out.extend(await self.store.item_drafts("support", gid))
        return out


class RemoteFakeGmail:
    """A FakeGmail in a child process (``python -m tests.fakes.gmail``), driven over its
    control API; the same small surface the bench needs (add_message, latency, mark,
    api_calls, units)."""

    def __init__(self):
        import subprocess
        import sys
        from pathlib import Path

        root = Path(__file__).resolve().parents[2]
        self.proc = subprocess.Popen([sys.executable, "-m", "tests.fakes.gmail"], cwd=root,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline().split()
        self.url, self.address = line[0], line[1]
        self._threads: dict[str, str] = {}
        self.token_uri = self.url + "token"

    def _post(self, path: str, data: bytes = b"") -> Any:
        import urllib.request

        with urllib.request.urlopen(urllib.request.Request(self.url + path.lstrip("/"),
                                                           data=data, method="POST")) as r:
            return json.loads(r.read())

    def add_message(self, raw: bytes, labels=("INBOX", "UNREAD"), thread_id: str = "") -> str:
        """Deliver ``raw``; its Gmail id (:meth:`thread_of` tells its thread)."""
        answer = self._post(f"/_fake/add?labels={','.join(labels)}"
                            + (f"&thread={thread_id}" if thread_id else ""), raw)
        self._threads[answer["id"]] = answer["threadId"]
        return answer["id"]

    def thread_of(self, gmail_id: str) -> str:
        return self._threads[gmail_id]

    @property
    def latency(self) -> float:
        return self._latency

    @latency.setter
    def latency(self, seconds: float) -> None:
        self._latency = seconds
        self._post(f"/_fake/latency?seconds={seconds}")

    def _calls(self) -> list[dict]:
        return self._post("/_fake/calls")

    def mark(self) -> int:
        return len(self._calls())

    def api_calls(self, since: int = 0) -> list[Call]:
        return [Call("", "", c["route"], {}, None, c["units"], batch=c.get("batch", False))
                for c in self._calls()[since:] if c["route"] not in ("token", "batch")]

    def batch_count(self, since: int = 0) -> int:
        """How many batch requests (HTTP round trips carrying parts) since ``since``."""
        return sum(c["route"] == "batch" for c in self._calls()[since:])

    def units(self, since: int = 0) -> int:
        return sum(c["units"] for c in self._calls()[since:])

    def stop(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(10)
        self.proc.stdout.close()


if __name__ == "__main__":
    import sys

    with FakeGmail() as _fake:
        print(_fake.url, _fake.address, flush=True)
        sys.stdin.read()  # serve until the parent closes our stdin
