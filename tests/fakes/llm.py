"""A fake OpenAI-compatible and Anthropic model server on 127.0.0.1.

It answers ``POST /v1/chat/completions``, ``POST /v1/embeddings`` and ``POST
/v1/messages`` in the shapes the real ``openai`` and ``anthropic`` SDKs parse, with
usage fields, and records every request body. A request the provider would refuse is
refused with a 400 in the provider's error shape, before any scripted step: a
top-level field the endpoint does not document, a missing required field, or a
structured-output schema that strict mode rejects (see :func:`request_problem`), so
the fake does not agree with whatever the code sends. Embeddings are made from words
(see FakeLLM.embed). Each request takes the next scripted step (or the default: a normal
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

from tests.fakes._common import send_head

__all__ = ["FakeLLM", "Reply", "Error", "Raw", "Hold", "request_problem"]

# The documented top-level request fields (required ones first) of each endpoint:
# OpenAI's API reference for Create chat completion and Create embeddings, Anthropic's
# for Create a Message (the 2.x Messages API: no temperature/top_p/top_k). The
# providers answer anything else with 400 ("Unrecognized request argument supplied",
# "Extra inputs are not permitted").
_REQUIRED = {
    "/v1/chat/completions": ("model", "messages"),
    "/v1/embeddings": ("model", "input"),
    "/v1/messages": ("model", "messages", "max_tokens"),
}
_FIELDS = {
    "/v1/chat/completions": frozenset({
        "model", "messages", "audio", "frequency_penalty", "function_call", "functions",
        "logit_bias", "logprobs", "max_completion_tokens", "max_tokens", "metadata",
        "modalities", "moderation", "n", "parallel_tool_calls", "prediction",
        "presence_penalty", "prompt_cache_key", "prompt_cache_options",
        "prompt_cache_retention", "reasoning_effort", "response_format",
        "safety_identifier", "seed", "service_tier", "stop", "store", "stream",
        "stream_options", "temperature", "tool_choice", "tools", "top_logprobs", "top_p",
        "user", "verbosity", "web_search_options"}),
    "/v1/embeddings": frozenset({"model", "input", "dimensions", "encoding_format", "user"}),
    "/v1/messages": frozenset({
        "model", "messages", "max_tokens", "cache_control", "container", "diagnostics",
        "inference_geo", "metadata", "output_config", "service_tier", "speed",
        "stop_sequences", "stream", "system", "thinking", "tool_choice", "tools"}),
}
_SCHEMA_TYPES = {"object", "array", "string", "number", "integer", "boolean", "null"}


def request_problem(path: str, body: Any) -> str | None:
    """Why the provider would refuse this request body with a 400, or None."""
    if not isinstance(body, dict):
        return "the request body must be a JSON object"
    missing = [f for f in _REQUIRED[path] if f not in body]
    if missing:
        return f"missing required parameter: {missing[0]!r}"
    unknown = sorted(set(body) - _FIELDS[path])
    if unknown:
        return f"Unrecognized request argument supplied: {unknown[0]}"
    if path == "/v1/embeddings":
        inputs = body["input"] if isinstance(body["input"], list) else [body["input"]]
        if not inputs or any(i == "" for i in inputs):
            return "'input' cannot be an empty string or an empty list"
        return None
    if path == "/v1/messages":
        fmt = (body.get("output_config") or {}).get("format") if isinstance(
            body.get("output_config"), dict) else None
        if body.get("output_config") is not None and not isinstance(body["output_config"], dict):
            return "output_config: expected an object"
        if fmt is None:
            return None
        if fmt.get("type") != "json_schema" or set(fmt) - {"type", "schema"}:
            return "output_config.format: expected {type: json_schema, schema}"
        return _schema_problem(fmt.get("schema"), "output_config.format.schema", strict=False)
    rf = body.get("response_format")
    if rf is None:
        return None
    if not isinstance(rf, dict) or rf.get("type") not in ("text", "json_object", "json_schema"):
        return "response_format.type: expected text, json_object or json_schema"
    if rf["type"] != "json_schema":
        return None
    js = rf.get("json_schema")
    if not isinstance(js, dict) or set(js) - {"name", "description", "schema", "strict"}:
        return "response_format.json_schema: expected {name, description, schema, strict}"
    name = js.get("name")
    if not (isinstance(name, str) and 0 < len(name) <= 64
            and all(c.isascii() and (c.isalnum() or c in "_-") for c in name)):
        return "response_format.json_schema.name: a-z, A-Z, 0-9, _ or -, at most 64"
    if js.get("strict") is True:
        return _schema_problem(js.get("schema"), "response_format.json_schema.schema", strict=True)
    return None


def _schema_problem(schema: Any, where: str, *, strict: bool, root: bool = True) -> str | None:
    """Structured outputs' rules for a schema: the root an object, every object closed
    (``additionalProperties: false``) and, for OpenAI's strict mode, every property
    required; types from JSON Schema's set."""
    if not isinstance(schema, dict):
        return f"Invalid schema for {where}: expected an object"
    kind = schema.get("type")
    kinds = kind if isinstance(kind, list) else [kind]
    if root and kind != "object":
        return f"Invalid schema for {where}: the root must be of type object, got {kind!r}"
    if "enum" not in schema and "const" not in schema and "anyOf" not in schema and (
            kind is None or any(k not in _SCHEMA_TYPES for k in kinds)):
        return f"Invalid schema for {where}: unknown or missing type {kind!r}"
    if "object" in kinds:
        props = schema.get("properties", {})
        if schema.get("additionalProperties") is not False:
            return (f"Invalid schema for {where}: 'additionalProperties' is required to be "
                    "supplied and to be false")
        if not isinstance(props, dict):
            return f"Invalid schema for {where}: properties must be an object"
        required = schema.get("required", [])
        if strict and sorted(required) != sorted(props):
            return (f"Invalid schema for {where}: 'required' is required to be supplied and "
                    f"to be an array including every key in properties")
        if any(r not in props for r in required):
            return f"Invalid schema for {where}: 'required' names a key not in properties"
        for key, sub in props.items():
            problem = _schema_problem(sub, f"{where}.properties.{key}", strict=strict, root=False)
            if problem:
                return problem
    if "array" in kinds and "items" in schema:
        return _schema_problem(schema["items"], f"{where}.items", strict=strict, root=False)
    for sub in schema.get("anyOf", []):
        problem = _schema_problem(sub, f"{where}.anyOf", strict=strict, root=False)
        if problem:
            return problem
    return None


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

    @property
    def inputs(self) -> list[str]:
        """The texts of an embeddings request."""
        got = self.body.get("input", [])
        return got if isinstance(got, list) else [got]

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
        # Requests refused with a 400 because the provider would refuse them (recorded
        # apart: they take no scripted step).
        self.refused: list[tuple[Request, str]] = []
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
        data = []
        for i, t in enumerate(texts):
            vec: Any = self.embed(t)
            if body.get("encoding_format") == "base64":  # as the openai SDK asks by default
                import base64
                import struct

                vec = base64.b64encode(struct.pack(f"<{len(vec)}f", *vec)).decode()
            data.append({"object": "embedding", "index": i, "embedding": vec})
        words = sum(len(str(t).split()) for t in texts)
        return 200, {"object": "list", "data": data, "model": body.get("model", ""),
                     "usage": {"prompt_tokens": words, "total_tokens": words}}

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
        if path not in _REQUIRED:
            self._send(404, {"error": {"message": f"no route {path}"}})
            return
        req = Request(path, {k.lower(): v for k, v in self.headers.items()}, body, time.time(),
                      self.client_address[1])
        problem = request_problem(path, body)
        if problem is not None:
            with fake._lock:
                fake.refused.append((req, problem))
            self._send(400, _error_body(req.api, Error(400, problem, code="invalid_request_error")))
            return
        if path == "/v1/embeddings":
            status, answer = fake._embeddings(body)
            self._send(status, answer)
            return
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
            send_head(self, status, content_type, len(data), headers)
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
