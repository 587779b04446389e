"""An async Microsoft Graph client for one account (httpx), shared by its source and
sender and reused across ticks.

Reads may be repeated: a transport error, a 5xx or a throttling answer (429 / 503 /
504) is tried again with backoff, waiting out ``Retry-After`` when Graph gives one.
A Retry-After longer than ``max_wait``, or throttling that outlasts ``read_attempts``,
raises :class:`~bot.errors.Throttled` so the pipeline shows as held. A send is made
once (:meth:`GraphClient.send_once`): no retry here, none in httpx (no transport
retries are configured).
"""

from __future__ import annotations

import asyncio
import base64
import logging
import random
import ssl
import time
from typing import Any
from urllib.parse import quote

import httpx

from ..config.microsoft import MicrosoftAccount
from ..errors import AuthError, SourceError, Throttled
from ..shared import Lease, Shared
from .auth import READ_WRITE, RESERVED, SEND, Tokens

log = logging.getLogger("draftgate.microsoft")

RETRY_STATUS = {429, 500, 502, 503, 504}
THROTTLE_STATUS = {429, 503}
BATCH_MAX = 20  # requests per JSON $batch (Graph's limit)
PAGE = 100  # messages per delta / list page asked for


class GraphError(SourceError):
    def __init__(self, message: str, status: int = 0, code: str = ""):
        super().__init__(message)
        self.status, self.code = status, code


def error_of(resp: httpx.Response) -> tuple[str, str]:
    try:
        err = resp.json().get("error") or {}
        return str(err.get("code", "")), str(err.get("message", ""))
    except (ValueError, AttributeError):
        return "", resp.text[:200]


def retry_after(headers: Any, default: float) -> float:
    try:
        return max(0.0, float(headers.get("Retry-After")))
    except (TypeError, ValueError):
        return default


class GraphClient:
    """See the module docstring. ``calls`` counts HTTP requests (for the bench)."""

    def __init__(self, account: MicrosoftAccount, tokens: Tokens, *, sleep=asyncio.sleep):
        self.account, self.tokens = account, tokens
        self.base = account.graph_endpoint
        self.calls = 0
        self._sleep = sleep
        self._http: httpx.AsyncClient | None = None
        self._scopes: list[str] | None = None

    @property
    def http(self) -> httpx.AsyncClient:
        if self._http is None:
            a = self.account
            verify: ssl.SSLContext | bool = \
                ssl.create_default_context(cafile=a.ca_file) if a.ca_file else True
            self._http = httpx.AsyncClient(
                timeout=a.timeout, verify=verify,
                limits=httpx.Limits(max_connections=8), follow_redirects=False)
        return self._http

    def url(self, path: str) -> str:
        return path if path.startswith(("http://", "https://")) else self.base + path.lstrip("/")

    async def _headers(self, force: bool = False) -> dict[str, str]:
        if self._scopes is None:
            granted = await asyncio.to_thread(self.tokens.scopes)
            self._scopes = [s for s in granted if s.lower() not in RESERVED] or [READ_WRITE, SEND]
        token = await asyncio.to_thread(self.tokens.token, self._scopes, force)
        return {"Authorization": f"Bearer {token}"}

    async def _once(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        extra = kwargs.pop("headers", {})
        self.calls += 1
        resp = await self.http.request(method, self.url(path),
                                       headers={**await self._headers(), **extra}, **kwargs)
        if resp.status_code == 401:
            # Graph refused a token the cache still holds as valid (revoked, or its clock
            # differs): one new token, and the request again. Not sent: 401 comes first.
            self.calls += 1
            resp = await self.http.request(method, self.url(path),
                                           headers={**await self._headers(True), **extra},
                                           **kwargs)
        return resp

    async def read(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """A request that may be repeated; returns the first answer that is not a
        transient failure, raising Throttled / GraphError / AuthError otherwise."""
        a = self.account
        delay, last = a.backoff, ""
        for attempt in range(1, a.read_attempts + 1):
            try:
                resp = await self._once(method, path, **kwargs)
            except httpx.TransportError as exc:
                last = f"{type(exc).__name__}: {exc}"
                wait = delay
            else:
                if resp.status_code not in RETRY_STATUS:
                    return self._check(resp)
                code, message = error_of(resp)
                last = f"HTTP {resp.status_code} {code} {message}".strip()
                wait = retry_after(resp.headers, delay)
                if resp.status_code in THROTTLE_STATUS and (
                        wait > a.max_wait or attempt == a.read_attempts):
                    raise Throttled(f"Microsoft Graph is throttling account {a.name!r} "
                                    f"({last}); retrying after {wait:.0f}s",
                                    until=time.time() + max(wait, 1.0))
            if attempt < a.read_attempts:
                log.info("microsoft %s: %s %s: %s; again in %.1fs", a.name, method,
                         path.split("?")[0][-60:], last, wait)
                await self._sleep(wait * (1 + random.random() / 10))
                delay *= 2
        raise GraphError(f"Microsoft Graph: {method} failed {a.read_attempts} time(s): {last}")

    def _check(self, resp: httpx.Response) -> httpx.Response:
        if resp.status_code == 401:
            raise AuthError(f"Microsoft account {self.account.name!r}: Graph refused the token "
                            f"(401 {error_of(resp)[0]}); run `draftgate auth microsoft --account "
                            f"{self.account.name}`")
        if resp.status_code == 403:
            code, message = error_of(resp)
            raise AuthError(f"Microsoft account {self.account.name!r}: access denied ({code} "
                            f"{message}); the token may lack a scope: run `draftgate auth "
                            f"microsoft --account {self.account.name}`")
        return resp

    async def get_json(self, path: str, **kwargs: Any) -> dict:
        resp = await self.read("GET", path, **kwargs)
        if resp.status_code >= 400:
            code, message = error_of(resp)
            raise GraphError(f"Microsoft Graph: GET {path.split('?')[0]}: {resp.status_code} "
                             f"{code} {message}".strip(), resp.status_code, code)
        return resp.json()

    async def pages(self, path: str) -> tuple[list[dict], str | None]:
        """Every entry of a collection, following ``@odata.nextLink``; and the
        ``@odata.deltaLink`` at its end (a delta query's cursor), if any."""
        out: list[dict] = []
        url: str | None = path
        while url:
            # Graph's pages hold 10 messages unless asked for more (delta-query-messages).
            page = await self.get_json(url, headers={"Prefer": f"odata.maxpagesize={PAGE}"})
            out.extend(page.get("value") or [])
            if "@odata.deltaLink" in page:
                return out, page["@odata.deltaLink"]
            url = page.get("@odata.nextLink")
        return out, None

    async def mime(self, ids: list[str], batch: int = BATCH_MAX) -> dict[str, bytes]:
        """The MIME source of each message (``/me/messages/{id}/$value``), ``batch`` (at
        most 20) to a JSON ``$batch``, the batches at once; a failed part goes again alone."""
        step = max(1, min(batch, BATCH_MAX))
        chunks = [ids[i:i + step] for i in range(0, len(ids), step)]
        found: dict[str, bytes] = {}
        for got in await asyncio.gather(*(self._batch(c) for c in chunks)):
            found.update(got)
        for mid in [i for i in ids if i not in found]:
            resp = await self.read("GET", f"me/messages/{quote(mid, safe='')}/$value")
            if resp.status_code == 404:
                continue  # deleted meanwhile: nothing to draft
            if resp.status_code >= 400:
                code, message = error_of(resp)
                raise GraphError(f"Microsoft Graph: message {mid}: {resp.status_code} {code} "
                                 f"{message}".strip(), resp.status_code, code)
            found[mid] = resp.content
        return found

    async def _batch(self, ids: list[str]) -> dict[str, bytes]:
        body = {"requests": [{"id": str(n), "method": "GET",
                              "url": f"/me/messages/{quote(mid, safe='')}/$value"}
                             for n, mid in enumerate(ids)]}
        resp = await self.read("POST", "$batch", json=body)
        if resp.status_code >= 400:
            return {}  # every part goes again alone
        out: dict[str, bytes] = {}
        for part in resp.json().get("responses") or []:
            try:
                mid = ids[int(part.get("id"))]
            except (TypeError, ValueError, IndexError):
                continue  # an answer to nothing asked: ignored; what was asked goes again
            if part.get("status") != 200 or not isinstance(part.get("body"), str):
                continue
            try:
                # Graph base64-encodes a non-JSON body (message/rfc822) inside a batch.
                out[mid] = base64.b64decode(part["body"], validate=True)
            except ValueError:
                continue
        return out

    async def send_once(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """One request that must not be repeated: no retry here or below."""
        return await self._once(method, path, **kwargs)

    async def close(self) -> None:
        if self._http is not None:
            http, self._http = self._http, None
            await http.aclose()


_clients: Shared[GraphClient] = Shared()


def acquire(account: MicrosoftAccount, token_path: str) -> GraphClient:
    """The one client of ``account`` in this process (its source and sender share it,
    with one token cache); give it back with :func:`release`."""
    return _clients.acquire((account, token_path),
                            lambda: GraphClient(account, Tokens(account, token_path)))


async def release(client: GraphClient) -> None:
    if _clients.release(client):
        await client.close()


def lease(account: MicrosoftAccount, token_path: str) -> Lease[GraphClient]:
    """A stage's hold on ``account``'s client: acquired at first use, released by its
    ``close()``."""
    return Lease(lambda: acquire(account, token_path), release)
