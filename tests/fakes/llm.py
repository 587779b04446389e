"""A fake OpenAI-compatible and Anthropic model server on 127.0.0.1.

It answers ``POST /v1/chat/completions``, ``POST /v1/messages`` (and ``/v1/embeddings``,
see FakeLLM.embed) in the shapes the
real ``openai`` and ``anthropic`` SDKs parse, with usage fields, and records every
request body. Each request takes the next scripted step (or the default: a normal
answer), so a test can say "429 with Retry-After, then an answer" or "hold this one
until I say so"::

    with FakeLLM() as fake:
        fake.script(fake.error(429, retry_after=0.05), fake.reply("Hi"))
        hold = fake.hold()            # the request after that waits for hold.release()
        fake.script(hold)
        ...
        assert hold.arrived.wait(5)   # the client's request is in the server now
        fake.script(fake.raw(b"<html>Welcome</html>"))   # not the API at all

Synchronisation is by events, never by sleeps: ``hold.arrived`` is set when the held
request came in, ``hold.finished`` when its late answer has been written to a client
that may have given up long ago.
"""

from __future__ import annotations

import itertools
import json
import socket
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = ["FakeLLM", "Reply", "Error", "Raw", "Hold"]


@dataclass
class Reply:
    """A normal answer. ``text=None`` answers with a default draft naming the request."""

    text: str | None = None
    tokens_in: int = 11
    tokens_out: int = 7
    delay: float = 0.0  # seconds to wait before answering (a slow model)
    finish: str = "stop"  # openai finish_reason; "length" means cut off, "content_filter"
    #                       and "refusal" become anthropic's stop_reason "refusal"
    refusal: str | None = None  # openai: message.refusal
    trickle: float = 0.0  # send the body in small pieces this many seconds apart
    echo: bool = False  # answer with the request's data (a model parroting its input)


@dataclass
class Error:
    status: int
    message: str = "fake error"
    retry_after: float | None = None  # seconds, sent as a Retry-After header
    code: str | None = None  # openai: error.code (default: the status); anthropic: error.type


@dataclass
class Raw:
    """An answer that is not the API's: a web page, a proxy's text, an empty body, or
    JSON of another shape (``body`` a dict or list is sent as JSON)."""

    body: bytes | dict[str, Any] | list[Any] = b""
    content_type: str = "text/html; charset=utf-8"
    status: int = 200


@dataclass
class Hold:
    """Keep the request open until :meth:`release`; then answer with ``then``."""

    then: Reply | Error | Raw = field(default_factory=Reply)
    arrived: threading.Event = field(default_factory=threading.Event)
    released: threading.Event = field(default_factory=threading.Event)
    # Set once the late answer was written (or the write failed because the client
    # had gone); a client that closed its socket may still "accept" the bytes.
    finished: threading.Event = field(default_factory=threading.Event)

    def release(self) -> None:
        self.released.set()


Step = Reply | Error | Raw | Hold


@dataclass
class Request:
    path: str
    headers: dict[str, str]
    body: dict[str, Any]
    at: float
    client_port: int = 0  # the caller's TCP port (to find the process that asked)

    @property
    def api(self) -> str:
        return "anthropic" if self.path.endswith("/messages") else "openai"

    def texts(self) -> tuple[str, str]:
        """(instructions, data): the system prompt and the user message's text."""
        if self.api == "anthropic":
            system = self.body.get("system", "")
            if isinstance(system, list):
                system = "".join(b.get("text", "") for b in system)
            user = "".join(_content_text(m.get("content")) for m in self.body["messages"]
                           if m.get("role") == "user")
            return system, user
        system = "".join(_content_text(m.get("content")) for m in self.body["messages"]
                         if m.get("role") in ("system", "developer"))
        user = "".join(_content_text(m.get("content")) for m in self.body["messages"]
                       if m.get("role") == "user")
        return system, user


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(b.get("text", "") for b in content if isinstance(b, dict))
    return ""


class FakeLLM:
    """The server. Use as a context manager, or call :meth:`start` / :meth:`stop`."""

    def __init__(self, *, latency: float = 0.0):
        self.latency = latency  # added to every answer (the bench's 200 ms model)
        self.requests: list[Request] = []
        self.default: Step = Reply()
        self._script: list[Step] = []
        self._lock = threading.Lock()
        self._holds: list[Hold] = []
        self._arrivals = threading.Condition(self._lock)
        self._ids = itertools.count(1)
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.concepts: dict[str, list[str]] = {}  # see _embeddings
        self.embedding_requests: list[list[str]] = []
        #: batches (calls of more than one text) answered before each further one is a 500
        self.embeddings_fail_after: int | None = None

    # -- /v1/embeddings ---------------------------------------------------------------
    #: Embeddings: each word is a dimension of its own (hashed into DIM), except the
    #: words a test names in ``concepts`` (concept -> words), which share their
    #: concept's: so "money back" and "refund" can mean the same to this model.
    DIM = 512

    def _embeddings(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        texts = body.get("input")
        texts = [texts] if isinstance(texts, str) else list(texts or [])
        with self._lock:
            self.embedding_requests.append(texts)
            batches = sum(len(r) > 1 for r in self.embedding_requests)
            if len(texts) > 1 and self.embeddings_fail_after is not None and \
                    batches > self.embeddings_fail_after:
                return 500, {"error": {"message": "fake embeddings outage", "type": "server_error"}}
        data = [{"object": "embedding", "index": i, "embedding": self.embed(t)}
                for i, t in enumerate(texts)]
        return 200, {"object": "list", "data": data, "model": body.get("model", ""),
                     "usage": {"prompt_tokens": 1, "total_tokens": 1}}

    def embed(self, text: str) -> list[float]:
        import hashlib
        import re

        concept = {w: c for c, words in self.concepts.items() for w in words}
        v = [0.0] * self.DIM
        for word in re.findall(r"[a-z0-9]+", text.lower()):
            key = concept.get(word, word)
            v[int(hashlib.sha256(key.encode()).hexdigest(), 16) % self.DIM] += 1.0
        return v

    # -- lifecycle ------------------------------------------------------------------
    def start(self) -> "FakeLLM":
        fake = self

        class Handler(_Handler):
            server_fake = fake

        self._server = _Server(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        for h in self._holds:
            h.release()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> "FakeLLM":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def url(self) -> str:
        """Base URL for the anthropic SDK (it appends ``/v1/messages``)."""
        assert self._server is not None, "start() the fake first"
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    @property
    def openai_url(self) -> str:
        """Base URL for the openai SDK (it appends ``/chat/completions``)."""
        return self.url + "/v1"

    # -- scripting ------------------------------------------------------------------
    def script(self, *steps: Step) -> None:
        """Queue steps; each request takes the next one, then the default."""
        with self._lock:
            self._script.extend(steps)

    @staticmethod
    def reply(text: str | None = None, **kw: Any) -> Reply:
        return Reply(text, **kw)

    @staticmethod
    def error(status: int, message: str = "fake error", retry_after: float | None = None,
              code: str | None = None) -> Error:
        return Error(status, message, retry_after, code)

    @staticmethod
    def raw(body: bytes | dict[str, Any] | list[Any] = b"", content_type: str | None = None,
            status: int = 200) -> Raw:
        if content_type is None:
            content_type = "text/html; charset=utf-8" if isinstance(body, bytes) else "application/json"
        return Raw(body, content_type, status)

    def hold(self, then: Reply | Error | Raw | None = None) -> Hold:
        h = Hold(then or Reply())
        self._holds.append(h)
        return h

    def wait_requests(self, n: int, timeout: float = 10.0) -> bool:
        """Block until at least ``n`` requests arrived."""
        with self._arrivals:
            return self._arrivals.wait_for(lambda: len(self.requests) >= n, timeout)

    def _next(self, req: Request) -> Step:
        with self._lock:
            self.requests.append(req)
            self._arrivals.notify_all()
            return self._script.pop(0) if self._script else self.default

    def _answer_body(self, req: Request, r: Reply) -> dict[str, Any]:
        n = next(self._ids)
        model = req.body.get("model", "fake-model")
        text = r.text if r.text is not None else f"Thank you for your message. (fake draft {n})"
        if r.echo:
            text = req.texts()[1]
        if req.api == "anthropic":
            return {
                "id": f"msg_fake{n}", "type": "message", "role": "assistant", "model": model,
                "content": [{"type": "text", "text": text}] if text else [],
                "stop_reason": {"length": "max_tokens", "content_filter": "refusal",
                                "refusal": "refusal"}.get(r.finish, "end_turn"),
                "stop_sequence": None,
                "usage": {"input_tokens": r.tokens_in, "output_tokens": r.tokens_out},
            }
        return {
            "id": f"chatcmpl-fake{n}", "object": "chat.completion", "created": int(time.time()),
            "model": model,
            "choices": [{"index": 0, "finish_reason": r.finish, "logprobs": None,
                         "message": {"role": "assistant", "content": text, "refusal": r.refusal}}],
            "usage": {"prompt_tokens": r.tokens_in, "completion_tokens": r.tokens_out,
                      "total_tokens": r.tokens_in + r.tokens_out},
        }


def _error_body(api: str, e: Error) -> dict[str, Any]:
    if api == "anthropic":
        kind = {400: "invalid_request_error", 401: "authentication_error", 402: "billing_error",
                403: "permission_error", 404: "not_found_error", 413: "request_too_large",
                429: "rate_limit_error", 529: "overloaded_error"}.get(e.status, "api_error")
        return {"type": "error", "error": {"type": e.code or kind, "message": e.message}}
    return {"error": {"message": e.message, "type": e.code or "fake_error", "param": None,
                      "code": e.code or str(e.status)}}


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that gave up (timeout, SIGKILL) resets its connection; that is a
        # scenario under test, not a server error worth a traceback.
        import sys

        if not isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):
            super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_fake: FakeLLM

    def log_message(self, format: str, *args: Any) -> None:  # quiet test output
        pass

    def setup(self) -> None:
        super().setup()
        # Headers and body go out in two writes; with Nagle on, the body waits for the
        # client's delayed ACK (~40 ms), which would swamp a 200 ms benchmark answer.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def do_POST(self) -> None:
        fake = self.server_fake
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            body = {"_raw": raw.decode("utf-8", "replace")}
        path = self.path.split("?")[0]
        if path == "/v1/embeddings":
            status, answer = fake._embeddings(body)
            self._send(status, answer)
            return
        if path not in ("/v1/chat/completions", "/v1/messages"):
            self._send(404, {"error": {"message": f"no route {path}"}})
            return
        req = Request(path, {k.lower(): v for k, v in self.headers.items()}, body, time.time(),
                      self.client_address[1])
        step = fake._next(req)
        hold: Hold | None = None
        if isinstance(step, Hold):
            hold = step
            hold.arrived.set()
            # Bounded so a forgotten hold cannot wedge the server for ever.
            hold.released.wait(120)
            step = hold.then
        try:
            if isinstance(step, Raw):
                data = step.body if isinstance(step.body, bytes) else json.dumps(step.body).encode()
                self._send_bytes(step.status, data, step.content_type)
            elif isinstance(step, Error):
                headers = {}
                if step.retry_after is not None:
                    headers["Retry-After"] = f"{step.retry_after:g}"
                self._send(step.status, _error_body(req.api, step), headers)
            else:
                delay = step.delay + fake.latency
                if delay:
                    time.sleep(delay)
                self._send(200, fake._answer_body(req, step), trickle=step.trickle)
        finally:
            if hold is not None:
                hold.finished.set()

    def _send(self, status: int, body: dict[str, Any], headers: dict[str, str] | None = None,
              *, trickle: float = 0.0) -> bool:
        return self._send_bytes(status, json.dumps(body).encode(), "application/json", headers,
                                trickle=trickle)

    def _send_bytes(self, status: int, data: bytes, content_type: str,
                    headers: dict[str, str] | None = None, *, trickle: float = 0.0) -> bool:
        try:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.end_headers()
            if trickle:
                for i in range(0, len(data), 16):
                    self.wfile.write(data[i:i + 16])
                    self.wfile.flush()
                    time.sleep(trickle)
            else:
                self.wfile.write(data)
            self.wfile.flush()
            return True
        except (BrokenPipeError, ConnectionResetError, ConnectionAbortedError, OSError):
            self.close_connection = True
            return False


def _main() -> None:
    """``python -m tests.fakes.llm [--latency 0.2]``: serve in a process of its own (so
    a benchmark's event loop does not share a GIL with it). Prints the base URL, serves
    until stdin closes."""
    import argparse
    import sys

    ap = argparse.ArgumentParser(description=_main.__doc__)
    ap.add_argument("--latency", type=float, default=0.0, help="seconds added to every answer")
    args = ap.parse_args()
    with FakeLLM(latency=args.latency) as fake:
        print(fake.url, flush=True)
        sys.stdin.read()


if __name__ == "__main__":
    _main()
