"""Sender ``webhook``: POSTs the approved reply as JSON to a URL you run.

::

    sender:
      type: webhook
      url: https://helpdesk.example/hooks/draftgate
      secret_env: DRAFTGATE_WEBHOOK_SECRET   # optional; sent as Authorization: Bearer,
                                             # read at the first send
      timeout: 10s
      status_url: https://helpdesk.example/hooks/draftgate/status   # optional

The body is ``{key, pipeline, item_id, to, subject, in_reply_to, message_id, body,
version}`` and the ``Idempotency-Key`` header is the draft key, so a receiver can
drop a duplicate. Each send is ONE request: no transport retries, no redirects
followed. Outcomes:

* 2xx: sent; the id is the answer's JSON ``"id"``, else the draft key.
* other 4xx (and 3xx), or the connection could not even be opened: ``send_failed``
  (it certainly did not arrive), the operator gets Retry.
* timeout after connecting, connection reset or dropped, 408, 429, 5xx:
  ``send_unknown``; it may have arrived, so it is never retried blindly.

``check`` (recovery of ``send_unknown``) GETs ``status_url?key=<draft key>`` (with
the same Idempotency-Key header): 2xx means it arrived, 404 means it did not. Without
a ``status_url`` there is no way to tell, and the operator is asked.
"""

from __future__ import annotations

import json
import os
import string
import urllib.parse

import httpx

from .. import redact
from ..config.checker import url_problem
from ..config.load import PipelineConfig, Settings
from ..config.options import WebhookSenderOptions, expect
from ..errors import SendFailed, SendUnknown
from ..mail.reply import reply_message_id, reply_subject
from ..models import Draft, SendResult

_HEADER_SAFE = "".join(c for c in string.printable if c not in "%\r\n\t\x0b\x0c")
#: Raised while the request is built (URL, header encoding), before any I/O.
_NOT_BUILT = (httpx.InvalidURL, UnicodeEncodeError, ValueError)
#: Raised by the transport before a byte of the request is written (an unsupported
#: scheme; a header h11 refuses to put on the wire).
_NOT_WRITTEN = (httpx.UnsupportedProtocol, httpx.LocalProtocolError)


def payload(draft: Draft) -> dict:
    """The JSON body for ``draft``. The recipient is the original's, never the body's."""
    m = draft.message
    slot = m.kind == "slot"
    return {"key": draft.key, "pipeline": draft.pipeline, "item_id": draft.item_id,
            "to": "" if slot else m.reply_to,
            "subject": m.subject if slot else reply_subject(m.subject),
            "in_reply_to": "" if slot else m.message_id,
            "message_id": reply_message_id(draft), "body": draft.body,
            "version": draft.version}


def header_key(key: str) -> str:
    """The draft key as an HTTP header value (non-ASCII percent-encoded)."""
    return urllib.parse.quote(key, safe=_HEADER_SAFE)


class WebhookSender:
    """POSTs each approved draft once."""

    name = "webhook"

    def __init__(self, options: WebhookSenderOptions, *, where: str = "sender"):
        self.url = options.url
        self.status_url = options.status_url
        self.timeout = options.timeout
        self._secret_env = options.secret_env
        self._secret = ""  # read at the first send
        self._where = where
        self._client: httpx.AsyncClient | None = None

    def _http(self) -> httpx.AsyncClient:
        if self._client is None:
            headers = {"User-Agent": "draftgate"}
            if self._secret_env:
                # Read at first use (like the model API keys), so `validate` works on a
                # machine without the secrets; the error names the variable only.
                secret = os.environ.get(self._secret_env, "").strip()
                redact.register(secret, self._secret_env)
                if not secret:
                    raise SendFailed(f"{self._where}.secret_env: environment variable "
                                     f"{self._secret_env} is not set; export it with the "
                                     f"webhook's token. Nothing was sent.")
                if not all(" " <= c <= "~" for c in secret):
                    raise SendFailed(f"{self._where}.secret_env: environment variable "
                                     f"{self._secret_env} holds a character an HTTP header "
                                     f"cannot carry (a line break, a control character or a "
                                     f"non-ASCII letter); export the token alone. Nothing "
                                     f"was sent.")
                headers["Authorization"] = f"Bearer {secret}"
                self._secret = secret
            # retries=0: a POST whose answer was lost must not be sent again by the
            # transport; deciding that is the operator's job (send_unknown).
            self._client = httpx.AsyncClient(
                timeout=self.timeout, follow_redirects=False, headers=headers,
                transport=httpx.AsyncHTTPTransport(retries=0))
        return self._client

    async def send(self, draft: Draft) -> SendResult:
        headers = {"Idempotency-Key": header_key(draft.key), "Content-Type": "application/json"}
        body = json.dumps(payload(draft), ensure_ascii=False).encode("utf-8")
        if url_problem(self.url):  # create checks it; a port out of range would
            # otherwise escape httpx as an OverflowError. The URL is not repeated whole:
            # its query may hold a token.
            raise SendFailed(f"{self._where}.url: {_host(self.url)} is not a usable http(s) "
                             f"URL; fix it (draftgate validate says why); nothing was sent")
        client = self._http()
        try:
            request = client.build_request("POST", self.url, content=body, headers=headers)
        except _NOT_BUILT as exc:
            raise SendFailed(f"webhook {_host(self.url)}: the request could not be made "
                             f"({_describe(exc)}); nothing was sent") from exc
        try:
            response = await client.send(request)
        except _NOT_WRITTEN as exc:
            # Refused before a byte was written, so it certainly did not arrive.
            raise SendFailed(f"webhook {_host(self.url)}: the request could not be sent "
                             f"({_describe(exc)}); nothing was sent") from exc
        except (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout) as exc:
            # No connection was made, so nothing was sent.
            raise SendFailed(f"webhook {_host(self.url)}: could not connect "
                             f"({_describe(exc)}); nothing was sent") from exc
        except httpx.TimeoutException as exc:
            raise SendUnknown(f"webhook {_host(self.url)}: no answer within {self.timeout:g}s; "
                              f"it may have been received") from exc
        except httpx.HTTPError as exc:
            raise SendUnknown(f"webhook {_host(self.url)}: connection lost before the answer "
                              f"({_describe(exc)}); it may have been received") from exc
        status = response.status_code
        if 200 <= status < 300:
            return SendResult(sent_id=_answer_id(response) or draft.key)
        what = f"webhook {_host(self.url)} answered {status}: {self._excerpt(response)}"
        if status in (408, 429) or status >= 500:
            raise SendUnknown(what + " (it may have been received)")
        raise SendFailed(what)

    async def check(self, draft: Draft) -> str | None:
        if not self.status_url:
            raise SendUnknown("cannot check a webhook send without sender.status_url; "
                              "ask the receiver whether it got key " + draft.key)
        try:
            client = self._http()
        except SendFailed as exc:  # the secret is missing: cannot ask, cannot tell
            raise SendUnknown(str(exc).replace(" Nothing was sent.", "")) from None
        try:
            response = await client.get(
                self.status_url, params={"key": draft.key},
                headers={"Idempotency-Key": header_key(draft.key)})
        except (httpx.HTTPError, *_NOT_BUILT) as exc:
            raise SendUnknown(f"webhook status {_host(self.status_url)}: {_describe(exc)}") from exc
        if 200 <= response.status_code < 300:
            return _answer_id(response) or draft.key
        if response.status_code == 404:
            return None
        raise SendUnknown(f"webhook status {_host(self.status_url)} answered "
                          f"{response.status_code}: {self._excerpt(response)}")

    def _excerpt(self, response: httpx.Response) -> str:
        """The start of the receiver's answer, for the card and the log: its body only
        (never its headers), without our secret should the receiver echo the request's
        Authorization header. Only its start is read and scrubbed (a 150 kB error page
        would stall the event loop), with a margin so that no part of a secret survives."""
        text = response.text
        if self._secret:  # whatever its length (the registry skips very short ones)
            text = text.replace(self._secret, f"[redacted {self._secret_env}]")
        return redact.scrub_line(text, 200) or "(empty body)"

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None


def _answer_id(response: httpx.Response) -> str | None:
    try:
        data = response.json()
    except (ValueError, UnicodeDecodeError):
        return None
    if isinstance(data, dict) and isinstance(data.get("id"), (str, int)) \
            and not isinstance(data.get("id"), bool):
        return str(data["id"])[:200] or None
    return None


def _describe(exc: Exception) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def _host(url: str) -> str:
    """Scheme, host and path only: a token in the query string is never shown."""
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port
    except ValueError:  # a malformed host or port: show what is before the query
        return url.split("?", 1)[0].split("#", 1)[0].rsplit("@", 1)[-1]
    return f"{parts.scheme}://{parts.hostname or ''}{f':{port}' if port else ''}{parts.path}"


def create(pipeline: PipelineConfig, settings: Settings) -> WebhookSender:
    """Build the sender from its checked ``sender:`` options (no network I/O)."""
    return WebhookSender(expect(pipeline.sender, WebhookSenderOptions), where=f"{pipeline.file}: sender")
