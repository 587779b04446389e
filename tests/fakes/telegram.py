"""A fake Telegram Bot API server on 127.0.0.1 for tests and the bench.

The real python-telegram-bot talks HTTP to it (``base_url=fake.base_url``). It keeps
per-chat message ids, validates HTML the way Telegram does (supported tags only,
balanced, known entities, at most 4096 visible characters), answers errors with
Telegram's real status codes and descriptions, records every call, and lets a test
inject updates (messages, commands, callback queries) that ``getUpdates`` hands out
with long polling and offset confirmation.

Synchronise on :meth:`FakeTelegram.wait_for` (or its async twin), never on sleeps.
"""

from __future__ import annotations

import asyncio
import email.parser
import email.policy
import itertools
import json
import re
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable
from urllib.parse import parse_qsl

from tests.fakes._common import send_json, take_fault

MAX_TEXT = 4096
_ALLOWED_TAGS = {"b", "strong", "i", "em", "u", "ins", "s", "strike", "del", "span",
                 "tg-spoiler", "a", "code", "pre", "blockquote", "tg-emoji"}
_TAG = re.compile(r"<(/?)([a-zA-Z][a-zA-Z0-9-]*)((?:\s+[^<>]*)?)>")
_ENTITY = re.compile(r"&(lt|gt|amp|quot|#[0-9]{1,7}|#x[0-9a-fA-F]{1,6});")
_NAMED = {"lt": "<", "gt": ">", "amp": "&", "quot": '"'}
# Values PTB sends as plain strings; everything else arrives JSON encoded.
_STRING_PARAMS = {"text", "caption", "parse_mode", "callback_query_id", "url", "secret_token",
                  "inline_message_id", "callback_data", "filename"}


class ParseError(ValueError):
    pass


def _utf16_len(text: str) -> int:
    return len(text.encode("utf-16-le")) // 2


def parse_html(text: str) -> str:
    """The visible text of a Telegram HTML message; ParseError like Telegram's."""
    out: list[str] = []
    stack: list[str] = []
    i = 0
    while i < len(text):
        c = text[i]
        if c == "<":
            m = _TAG.match(text, i)
            offset = len(text[:i].encode("utf-8"))
            if not m:
                raise ParseError(f"Can't parse entities: unexpected end of name token at byte "
                                 f"offset {offset}")
            closing, name = m.group(1), m.group(2).lower()
            if name not in _ALLOWED_TAGS:
                kind = "end" if closing else "start"
                raise ParseError(f'Can\'t parse entities: unsupported {kind} tag "{name}" at '
                                 f"byte offset {offset}")
            if closing:
                if not stack or stack[-1] != name:
                    raise ParseError(f'Can\'t parse entities: can\'t find end tag corresponding '
                                     f'to start tag "{stack[-1] if stack else name}"')
                stack.pop()
            else:
                stack.append(name)
            i = m.end()
        elif c == "&":
            m = _ENTITY.match(text, i)
            if not m:
                offset = len(text[:i].encode("utf-8"))
                raise ParseError(f"Can't parse entities: unsupported entity at byte offset "
                                 f"{offset}")
            ent = m.group(1)
            if ent.startswith("#x"):
                out.append(chr(int(ent[2:], 16)))
            elif ent.startswith("#"):
                out.append(chr(int(ent[1:])))
            else:
                out.append(_NAMED[ent])
            i = m.end()
        elif c == ">":
            # Telegram tolerates a bare '>' but escaping is the contract; be strict.
            raise ParseError("Can't parse entities: unexpected '>' (escape it as &gt;)")
        else:
            out.append(c)
            i += 1
    if stack:
        raise ParseError(f'Can\'t parse entities: can\'t find end tag corresponding to start '
                         f'tag "{stack[-1]}"')
    return "".join(out)


@dataclass
class Call:
    method: str
    params: dict[str, Any]
    status: int
    at: float
    response: Any = None


@dataclass
class StoredMessage:
    chat_id: int
    message_id: int
    text: str  # visible text
    html: str  # what was sent
    reply_markup: dict | None
    reply_to: int | None
    kind: str = "text"  # text | document | photo
    document: bytes | None = None
    filename: str | None = None
    edits: int = 0


@dataclass
class _Failure:
    status: int
    description: str
    retry_after: int | None
    times: int
    drop: bool = False  # close the connection without answering
    lose_reply: bool = False  # do the call, then close the connection without answering


@dataclass
class _Bucket:
    rate: float
    tokens: float
    last: float = field(default_factory=time.monotonic)


class FakeTelegram:
    """The fake server. Use as a context manager or call start()/stop()."""

    def __init__(self, token: str = "123456:TEST-TOKEN", bot_id: int = 123456,
                 username: str = "draftgate_test_bot") -> None:
        self.token = token
        self.bot = {"id": bot_id, "is_bot": True, "first_name": "draftgate",
                    "username": username}
        self.cond = threading.Condition()
        self.calls: list[Call] = []
        self.messages: dict[tuple[int, int], StoredMessage] = {}
        self.commands: list[dict] = []
        self.webhook: dict[str, Any] = {}
        self.answers: dict[str, dict] = {}  # callback_query_id -> answer params
        self.rate_limited = 0  # number of 429s answered by the rate limit
        self.down = False  # drop every connection (Telegram unreachable)
        self._updates: list[dict] = []
        self._update_ids = itertools.count(1)
        self._poll_gen = 0
        self._cq_ids = itertools.count(1)
        self._next_mid: dict[int, int] = {}
        self._failures: dict[str, list[_Failure]] = {}
        self._bucket: _Bucket | None = None
        self._hold: dict[str, threading.Event] = {}
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle -----------------------------------------------------------------
    def start(self) -> "FakeTelegram":
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            # Headers and body go out in two writes; without this, Nagle plus the
            # client's delayed ACK adds ~40 ms to every call.
            disable_nagle_algorithm = True

            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802
                fake._handle(self)

            do_GET = do_POST  # noqa: N815

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,),
                                        daemon=True, name="fake-telegram")
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server:
            with self.cond:
                self.down = False
                for ev in self._hold.values():
                    ev.set()
                self.cond.notify_all()
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> "FakeTelegram":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    @property
    def port(self) -> int:
        assert self._server is not None
        return self._server.server_address[1]

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/bot"

    @property
    def base_file_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/file/bot"

    def config_yaml(self, token_env: str, operators: list[int], approvals_chat: int,
                    poll_timeout: str = "5s", extra: str = "") -> str:
        """draftgate.yaml's ``telegram:`` section on this fake (its token in ``token_env``),
        then ``extra`` (more keys of it, indented two)."""
        return (f"telegram:\n  token_env: {token_env}\n  base_url: {self.base_url}\n"
                f"  base_file_url: {self.base_file_url}\n  operators: {operators}\n"
                f"  approvals_chat: {approvals_chat}\n  poll_timeout: {poll_timeout}\n" + extra)

    # -- test controls -------------------------------------------------------------
    def fail(self, method: str, status: int, description: str, *, times: int = 1,
             retry_after: int | None = None) -> None:
        """The next ``times`` calls of ``method`` answer this error."""
        with self.cond:
            self._failures.setdefault(method, []).append(
                _Failure(status, description, retry_after, times))

    def drop(self, method: str, *, times: int = 1) -> None:
        """The next ``times`` calls of ``method`` get the connection closed unanswered."""
        with self.cond:
            self._failures.setdefault(method, []).append(_Failure(0, "", None, times, True))

    def lose_reply(self, method: str, *, times: int = 1) -> None:
        """The next ``times`` calls of ``method`` take effect (a message is stored, say),
        then the connection is closed before the answer: an ambiguous timeout."""
        with self.cond:
            self._failures.setdefault(method, []).append(
                _Failure(0, "", None, times, lose_reply=True))

    def recover(self, method: str) -> None:
        """Drop every failure still queued for ``method``: it answers normally again."""
        with self.cond:
            self._failures.pop(method, None)

    def rate_limit(self, per_second: float | None) -> None:
        """Enforce ``per_second`` sendMessage/sendDocument calls (429 + retry_after)."""
        with self.cond:
            self._bucket = _Bucket(per_second, per_second) if per_second else None

    def hold(self, method: str) -> threading.Event:
        """Block calls of ``method`` until the returned event is set."""
        with self.cond:
            ev = self._hold[method] = threading.Event()
            return ev

    def inject(self, update: dict) -> dict:
        """Queue a raw update (an ``update_id`` is assigned)."""
        with self.cond:
            update = dict(update, update_id=next(self._update_ids))
            self._updates.append(update)
            self.cond.notify_all()
            return update

    def redeliver(self, update: dict) -> None:
        """Queue an update again with its original ``update_id`` (a getUpdates answer
        that was never confirmed), as Telegram does after a crash."""
        with self.cond:
            self._updates.append(update)
            self._updates.sort(key=lambda u: u["update_id"])
            self.cond.notify_all()

    def _user(self, user_id: int, first_name: str) -> dict:
        return {"id": user_id, "is_bot": False, "first_name": first_name}

    def _chat(self, chat_id: int) -> dict:
        if chat_id > 0:
            return {"id": chat_id, "type": "private", "first_name": "op"}
        return {"id": chat_id, "type": "supergroup", "title": "approvals"}

    def message_json(self, m: StoredMessage) -> dict:
        out: dict[str, Any] = {"message_id": m.message_id, "date": int(time.time()),
                               "chat": self._chat(m.chat_id), "from": self.bot}
        if m.kind == "document":
            out["document"] = {"file_id": f"doc{m.message_id}", "file_unique_id":
                               f"u{m.message_id}", "file_name": m.filename}
        elif m.kind == "photo":
            # A PNG's width and height are in its IHDR chunk, at bytes 16-24.
            png = m.document or b""
            w, h = (int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")) \
                if png.startswith(b"\x89PNG") else (0, 0)
            out["photo"] = [{"file_id": f"photo{m.message_id}", "file_unique_id":
                             f"p{m.message_id}", "width": w, "height": h}]
            if m.text:
                out["caption"] = m.text
        else:
            out["text"] = m.text
        if m.reply_markup is not None and "inline_keyboard" in m.reply_markup:
            # Telegram returns only inline keyboards as a message's reply_markup.
            out["reply_markup"] = m.reply_markup
        return out

    def callback_update(self, user_id: int, chat_id: int, message_id: int, data: str,
                        first_name: str = "Op") -> dict:
        """An update for a button tap (not queued; see :meth:`tap`)."""
        with self.cond:
            stored = self.messages.get((chat_id, message_id))
            msg = (self.message_json(stored) if stored else
                   {"message_id": message_id, "date": int(time.time()),
                    "chat": self._chat(chat_id), "from": self.bot, "text": "?"})
            cq = {"id": f"cq{next(self._cq_ids)}", "from": self._user(user_id, first_name),
                  "chat_instance": str(chat_id), "data": data, "message": msg}
        return {"callback_query": cq}

    def tap(self, user_id: int, chat_id: int, message_id: int, data: str,
            first_name: str = "Op") -> dict:
        """Queue a button tap; returns the queued update."""
        return self.inject(self.callback_update(user_id, chat_id, message_id, data, first_name))

    def say(self, user_id: int, chat_id: int, text: str, *, reply_to: int | None = None,
            first_name: str = "Op") -> dict:
        """Queue a text message (a command when it starts with '/')."""
        msg: dict[str, Any] = {"message_id": self._new_mid(chat_id), "date": int(time.time()),
                               "chat": self._chat(chat_id),
                               "from": self._user(user_id, first_name), "text": text}
        if text.startswith("/"):
            msg["entities"] = [{"type": "bot_command", "offset": 0,
                                "length": len(text.split()[0])}]
        if reply_to is not None:
            with self.cond:
                stored = self.messages.get((chat_id, reply_to))
            msg["reply_to_message"] = (self.message_json(stored) if stored else
                                       {"message_id": reply_to, "date": int(time.time()),
                                        "chat": self._chat(chat_id), "text": "?"})
        return self.inject({"message": msg})

    # -- queries ---------------------------------------------------------------------
    def calls_of(self, method: str, ok: bool | None = None) -> list[Call]:
        with self.cond:
            return [c for c in self.calls if c.method == method and
                    (ok is None or (c.status == 200) == ok)]

    def chat_messages(self, chat_id: int) -> list[StoredMessage]:
        with self.cond:
            return sorted((m for (c, _), m in self.messages.items() if c == chat_id),
                          key=lambda m: m.message_id)

    def message(self, chat_id: int, message_id: int) -> StoredMessage:
        with self.cond:
            return self.messages[(int(chat_id), int(message_id))]

    def answer_for(self, update: dict) -> dict | None:
        with self.cond:
            return self.answers.get(update["callback_query"]["id"])

    def wait_for(self, predicate: Callable[[], Any], timeout: float = 10.0) -> Any:
        """Wait until ``predicate()`` (called under the lock) is truthy; return it."""
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                value = predicate()
                if value:
                    return value
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError("fake telegram: condition not met in time")
                self.cond.wait(left)

    async def await_for(self, predicate: Callable[[], Any], timeout: float = 10.0) -> Any:
        return await asyncio.to_thread(self.wait_for, predicate, timeout)

    async def answered(self, update: dict, timeout: float = 10.0) -> dict:
        """Wait for the answerCallbackQuery of a tap."""
        cid = update["callback_query"]["id"]
        return await self.await_for(lambda: self.answers.get(cid), timeout)

    # -- server side -----------------------------------------------------------------
    def _new_mid(self, chat_id: int) -> int:
        with self.cond:
            mid = self._next_mid.get(chat_id, 0) + 1
            self._next_mid[chat_id] = mid
            return mid

    def _handle(self, req: BaseHTTPRequestHandler) -> None:
        length = int(req.headers.get("Content-Length") or 0)
        body = req.rfile.read(length) if length else b""
        path = req.path.split("?")[0]
        prefix = f"/bot{self.token}/"
        if not path.startswith(prefix):
            self._reply(req, 404, {"ok": False, "error_code": 404, "description": "Not Found"})
            return
        method = path[len(prefix):]
        try:
            params = self._params(req.headers.get("Content-Type", ""), body)
        except ValueError as exc:
            self._reply(req, 400, {"ok": False, "error_code": 400,
                                   "description": f"Bad Request: {exc}"})
            return
        with self.cond:
            ev = self._hold.get(method)
        if ev is not None:
            ev.wait(60)
        with self.cond:
            failure = self._take_failure(method)
            if self.down or (failure and failure.drop):
                self.calls.append(Call(method, params, 0, time.time()))
                self.cond.notify_all()
                drop = True
            else:
                drop = False
        if drop:
            self._hang_up(req)
            return
        if failure and failure.lose_reply:
            with self.cond:
                status, payload = self._dispatch(method, params)
                self.calls.append(Call(method, params, 0, time.time(), payload))
                self.cond.notify_all()
            self._hang_up(req)
            return
        if failure:
            status, payload = failure.status, {"ok": False, "error_code": failure.status,
                                               "description": failure.description}
            if failure.retry_after is not None:
                payload["parameters"] = {"retry_after": failure.retry_after}
        elif method == "getUpdates":
            status, payload = self._get_updates(params)
        else:
            with self.cond:
                status, payload = self._dispatch(method, params)
        with self.cond:
            self.calls.append(Call(method, params, status, time.time(), payload))
            self.cond.notify_all()
        self._reply(req, status, payload)

    @staticmethod
    def _hang_up(req: BaseHTTPRequestHandler) -> None:
        """Close the connection without an answer (what a lost reply looks like)."""
        req.close_connection = True
        try:
            req.connection.shutdown(2)
        except OSError:
            pass

    def _take_failure(self, method: str) -> _Failure | None:
        return take_fault(self._failures, method)

    @staticmethod
    def _reply(req: BaseHTTPRequestHandler, status: int, payload: Any) -> None:
        try:
            send_json(req, status, payload)
        except OSError:
            pass

    @staticmethod
    def _params(ctype: str, body: bytes) -> dict[str, Any]:
        if not body:
            return {}
        if ctype.startswith("application/json"):
            return json.loads(body)
        if ctype.startswith("multipart/form-data"):
            msg = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(
                b"Content-Type: " + ctype.encode() + b"\r\n\r\n" + body)
            out: dict[str, Any] = {}
            for part in msg.iter_parts():
                name = part.get_param("name", header="content-disposition")
                filename = part.get_filename()
                payload = part.get_payload(decode=True) or b""
                if filename is not None:
                    out[name] = {"filename": filename, "content": payload}
                else:
                    out[name] = FakeTelegram._value(name, payload.decode("utf-8"))
            return out
        return {k: FakeTelegram._value(k, v)
                for k, v in parse_qsl(body.decode("utf-8"), keep_blank_values=True)}

    @staticmethod
    def _value(name: str, value: str) -> Any:
        if name in _STRING_PARAMS:
            return value
        try:
            return json.loads(value)
        except ValueError:
            return value

    def _get_updates(self, params: dict) -> tuple[int, Any]:
        offset = int(params.get("offset") or 0)
        limit = int(params.get("limit") or 100)
        timeout = float(params.get("timeout") or 0)
        deadline = time.monotonic() + timeout
        with self.cond:
            # A newer getUpdates ends an older long poll, as Telegram does (409).
            self._poll_gen += 1
            gen = self._poll_gen
            if offset:
                # Telegram forgets every update below the offset: that confirms them.
                self._updates = [u for u in self._updates if u["update_id"] >= offset]
            while True:
                if gen != self._poll_gen:
                    return 409, {"ok": False, "error_code": 409, "description":
                                 "Conflict: terminated by other getUpdates request; make sure "
                                 "that only one bot instance is running"}
                if self._updates or self._server is None:
                    return 200, {"ok": True, "result": self._updates[:limit]}
                left = deadline - time.monotonic()
                if left <= 0:
                    return 200, {"ok": True, "result": []}
                self.cond.wait(min(left, 0.5))

    def _rate_limited(self) -> dict | None:
        b = self._bucket
        if b is None:
            return None
        now = time.monotonic()
        b.tokens = min(b.rate, b.tokens + (now - b.last) * b.rate)
        b.last = now
        if b.tokens >= 1:
            b.tokens -= 1
            return None
        self.rate_limited += 1
        return {"ok": False, "error_code": 429, "description": "Too Many Requests: retry after 1",
                "parameters": {"retry_after": 1}}

    def _dispatch(self, method: str, p: dict) -> tuple[int, Any]:
        handler = getattr(self, "_m_" + method, None)
        if handler is None:
            return 404, {"ok": False, "error_code": 404, "description": "Not Found"}
        try:
            return handler(p)
        except _ApiError as exc:
            return exc.status, {"ok": False, "error_code": exc.status,
                                "description": exc.description}

    # -- methods -----------------------------------------------------------------------
    def _m_getMe(self, p: dict) -> tuple[int, Any]:
        return 200, {"ok": True, "result": dict(self.bot, can_join_groups=True,
                                                 can_read_all_group_messages=False,
                                                 supports_inline_queries=False)}

    def _m_deleteWebhook(self, p: dict) -> tuple[int, Any]:
        self.webhook = {}
        return 200, {"ok": True, "result": True}

    def _m_setWebhook(self, p: dict) -> tuple[int, Any]:
        self.webhook = dict(p)
        return 200, {"ok": True, "result": True}

    def _m_setMyCommands(self, p: dict) -> tuple[int, Any]:
        cmds = p.get("commands") or []
        for c in cmds:
            if not re.fullmatch(r"[a-z0-9_]{1,32}", c.get("command", "")):
                raise _ApiError(400, "Bad Request: BOT_COMMAND_INVALID")
        self.commands = cmds
        return 200, {"ok": True, "result": True}

    def _m_getMyCommands(self, p: dict) -> tuple[int, Any]:
        return 200, {"ok": True, "result": self.commands}

    def _chat_id(self, p: dict) -> int:
        try:
            chat_id = int(p["chat_id"])
        except (KeyError, TypeError, ValueError):
            raise _ApiError(400, "Bad Request: chat not found") from None
        if chat_id == 0:
            raise _ApiError(400, "Bad Request: chat not found")
        return chat_id

    def _check_markup(self, markup: Any) -> dict | None:
        if markup in (None, ""):
            return None
        if not isinstance(markup, dict):
            raise _ApiError(400, "Bad Request: can't parse reply keyboard markup JSON object")
        for row in markup.get("inline_keyboard", []):
            for button in row:
                data = button.get("callback_data")
                if data is not None and not 1 <= len(data.encode("utf-8")) <= 64:
                    raise _ApiError(400, "Bad Request: BUTTON_DATA_INVALID")
        return markup

    def _text(self, p: dict, key: str = "text") -> tuple[str, str]:
        raw = p.get(key)
        if raw is None or raw == "":
            raise _ApiError(400, "Bad Request: message text is empty")
        if p.get("parse_mode") == "HTML":
            try:
                visible = parse_html(raw)
            except ParseError as exc:
                raise _ApiError(400, f"Bad Request: {exc}") from None
        elif p.get("parse_mode"):
            raise _ApiError(400, "Bad Request: unsupported parse_mode in the fake")
        else:
            visible = raw
        if not visible.strip():
            raise _ApiError(400, "Bad Request: message text is empty")
        if _utf16_len(visible) > MAX_TEXT:
            raise _ApiError(400, "Bad Request: message is too long")
        return raw, visible

    @staticmethod
    def _reply_to(p: dict) -> int | None:
        rp = p.get("reply_parameters")
        if isinstance(rp, dict) and rp.get("message_id"):
            return int(rp["message_id"])
        if p.get("reply_to_message_id"):
            return int(p["reply_to_message_id"])
        return None

    def _post(self, chat_id: int, text: str, raw: str, markup, p: dict,
              **kw) -> tuple[int, Any]:
        """A new message in ``chat_id`` (replying as ``p`` says; ``kw``: StoredMessage's
        other fields), unless rate limited: the API's answer."""
        limited = self._rate_limited()
        if limited:
            return 429, limited
        m = StoredMessage(chat_id, self._new_mid(chat_id), text, raw, markup,
                          self._reply_to(p), **kw)
        self.messages[(chat_id, m.message_id)] = m
        return 200, {"ok": True, "result": self.message_json(m)}

    def _m_sendMessage(self, p: dict) -> tuple[int, Any]:
        chat_id = self._chat_id(p)
        raw, visible = self._text(p)
        markup = self._check_markup(p.get("reply_markup"))
        return self._post(chat_id, visible, raw, markup, p)

    def _m_sendDocument(self, p: dict) -> tuple[int, Any]:
        chat_id = self._chat_id(p)
        doc = p.get("document")
        if not isinstance(doc, dict):
            raise _ApiError(400, "Bad Request: there is no document in the request")
        if p.get("caption"):
            self._text(p, "caption")
        return self._post(chat_id, p.get("caption", ""), "", None, p, kind="document",
                          document=doc["content"], filename=doc["filename"])

    def _m_sendPhoto(self, p: dict) -> tuple[int, Any]:
        """A photo uploaded as multipart (a file id or URL is not accepted here)."""
        chat_id = self._chat_id(p)
        photo = p.get("photo")
        if not isinstance(photo, dict) or not photo.get("content"):
            raise _ApiError(400, "Bad Request: there is no photo in the request")
        if p.get("caption"):
            self._text(p, "caption")
            if _utf16_len(p["caption"]) > 1024:
                raise _ApiError(400, "Bad Request: message caption is too long")
        return self._post(chat_id, p.get("caption", ""), "", None, p, kind="photo",
                          document=photo["content"], filename=photo["filename"])

    def _stored(self, p: dict) -> StoredMessage:
        chat_id = self._chat_id(p)
        try:
            return self.messages[(chat_id, int(p.get("message_id")))]
        except (KeyError, TypeError, ValueError):
            raise _ApiError(400, "Bad Request: message to edit not found") from None

    def _m_editMessageText(self, p: dict) -> tuple[int, Any]:
        m = self._stored(p)
        raw, visible = self._text(p)
        markup = self._check_markup(p.get("reply_markup"))
        if visible == m.text and markup == m.reply_markup:
            raise _ApiError(400, "Bad Request: message is not modified: specified new message "
                                 "content and reply markup are exactly the same as a current "
                                 "content and reply markup of the message")
        m.text, m.html, m.reply_markup = visible, raw, markup
        m.edits += 1
        return 200, {"ok": True, "result": self.message_json(m)}

    def _m_editMessageReplyMarkup(self, p: dict) -> tuple[int, Any]:
        m = self._stored(p)
        markup = self._check_markup(p.get("reply_markup"))
        if markup == m.reply_markup:
            raise _ApiError(400, "Bad Request: message is not modified: specified new message "
                                 "content and reply markup are exactly the same as a current "
                                 "content and reply markup of the message")
        m.reply_markup = markup
        m.edits += 1
        return 200, {"ok": True, "result": self.message_json(m)}

    def _m_deleteMessage(self, p: dict) -> tuple[int, Any]:
        chat_id = self._chat_id(p)
        if self.messages.pop((chat_id, int(p.get("message_id") or 0)), None) is None:
            raise _ApiError(400, "Bad Request: message to delete not found")
        return 200, {"ok": True, "result": True}

    def _m_answerCallbackQuery(self, p: dict) -> tuple[int, Any]:
        cid = p.get("callback_query_id")
        if not cid or not str(cid).startswith("cq") or cid in self.answers:
            raise _ApiError(400, "Bad Request: query is too old and response timeout expired "
                                 "or query ID is invalid")
        if len(p.get("text") or "") > 200:
            raise _ApiError(400, "Bad Request: MESSAGE_TOO_LONG")
        self.answers[cid] = dict(p)
        return 200, {"ok": True, "result": True}


class _ApiError(Exception):
    def __init__(self, status: int, description: str) -> None:
        super().__init__(description)
        self.status = status
        self.description = description
