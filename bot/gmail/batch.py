"""One Gmail batch request: up to :data:`MAX_PARTS` reads in a single HTTP request.

Gmail's batch endpoint takes a ``multipart/mixed`` body whose parts are HTTP requests
and answers a ``multipart/mixed`` body whose parts are their responses, matched by
Content-ID. Each part counts against the quota as the call it carries. Google asks for
at most 50 parts per batch (more are accepted but throttled).

This module only runs one batch (the envelope is written and read here: see
:func:`run_batch`; the parts are googleapiclient's own requests and answers) and says, per request id, what became of it; the
retry policy (which parts go again, backoff, 404, quota) is the client's
(:meth:`bot.gmail.client.GmailClient.get_many`). Only reads are ever batched: a send
in a batch would be re-sent with the parts that are retried.
"""

from __future__ import annotations

import re
import urllib.parse
import uuid
from dataclasses import dataclass
from typing import Any, Callable

import httplib2

#: Google's recommended maximum number of calls in one batch request.
MAX_PARTS = 50
#: Path of Gmail's batch endpoint under the API endpoint.
BATCH_PATH = "batch/gmail/v1"


def batch_uri(api_endpoint: str) -> str:
    """The batch endpoint that belongs to ``api_endpoint`` (Gmail's own, or a test's)."""
    return api_endpoint.rstrip("/") + "/" + BATCH_PATH


@dataclass
class Outcome:
    """What one part came back with: a resource, or the HttpError it answered."""

    resource: dict | None = None
    error: Any = None  # googleapiclient.errors.HttpError


class WrongResource(Exception):
    """A part answered 2xx with a resource that is not the one asked for (no ``id``,
    or another one's). It is a failed part like a 5xx: asked for again, never taken
    as the message asked for (whose id it would otherwise lose)."""


def as_asked(outcome: Outcome | None, gid: str, what: str) -> Outcome | None:
    """``outcome`` of the part that asked for ``gid``, with a resource that is not
    ``gid``'s turned into a :class:`WrongResource` failure."""
    if outcome is None or outcome.error is not None:
        return outcome
    got = (outcome.resource or {}).get("id")
    if got == gid:
        return outcome
    shown = "no id" if got is None else f"id {str(got)[:40]!r}"
    return Outcome(error=WrongResource(
        f"Gmail {what} answered 200 with {shown}, not the message asked for ({gid})"))


def status_of(exc: Any) -> int:
    """The HTTP status of a googleapiclient HttpError (0 for anything else)."""
    return int(getattr(getattr(exc, "resp", None), "status", 0) or 0)


def run_batch(batch_uri_: str, requests: dict[str, Any], http: Any) -> tuple[
        dict[str, Outcome], BaseException | None]:
    """Send ``requests`` (request id -> googleapiclient HttpRequest, GETs only) as one
    batch through ``http`` (an AuthorizedHttp: its Authorization applies to every part).

    Returns the outcome of every part that came back whole, and the exception that
    ended the batch early, if any (transport error, an error answer to the batch
    request itself, an answer cut off mid-body). A part missing from the first is to be
    retried: it may never have reached Gmail, or its answer was lost.

    googleapiclient's ``BatchHttpRequest`` would do the envelope, but it drops every
    part's answer when one is missing (its 401 pass indexes them all first), so an
    answer cut off mid-body would cost the whole batch instead of the missing parts.
    """
    from googleapiclient.errors import HttpError

    boundary = f"draftgate_{uuid.uuid4().hex}"
    body = "".join(_part(rid, request, boundary) for rid, request in requests.items())
    try:
        resp, content = http.request(
            batch_uri_, method="POST", body=f"{body}--{boundary}--\r\n",
            headers={"content-type": f'multipart/mixed; boundary="{boundary}"'})
        if resp.status >= 300:
            raise HttpError(resp, content, uri=batch_uri_)
        answers, whole = _parse(resp.get("content-type", ""), content)
    except Exception as exc:
        return {}, exc
    outcomes: dict[str, Outcome] = {}
    for rid, (status, headers, data) in answers.items():
        request = requests.get(rid)
        if request is None:
            continue
        part_resp = httplib2.Response({**headers, "status": str(status)})
        if status >= 300:
            outcomes[rid] = Outcome(error=HttpError(part_resp, data, uri=request.uri))
            continue
        try:
            outcomes[rid] = Outcome(resource=request.postproc(part_resp, data))
        except Exception:  # an unreadable part: it goes again with the missing ones
            continue
    cut = None if whole else _CutOff(f"answer cut off after {len(outcomes)} of "
                                     f"{len(requests)} parts")
    return outcomes, cut


class _CutOff(Exception):
    """The batch answer ended before its closing boundary."""


def _part(rid: str, request: Any, boundary: str) -> str:
    if request.method != "GET":  # a write in a batch would be re-sent with retried parts
        raise ValueError(f"only reads are batched, not {request.method} {request.uri}")
    url = urllib.parse.urlsplit(request.uri)
    target = url.path + (f"?{url.query}" if url.query else "")
    headers = "".join(f"{k}: {v}\r\n" for k, v in request.headers.items()
                      if k.lower() not in ("content-length", "authorization"))
    return (f"--{boundary}\r\nContent-Type: application/http\r\n"
            f"Content-ID: <{rid}>\r\n\r\nGET {target} HTTP/1.1\r\n{headers}\r\n")


def _parse(content_type: str, content: bytes) -> tuple[dict[str, tuple[int, dict, bytes]], bool]:
    """The whole parts of a multipart/mixed answer (Content-ID -> status, headers,
    body), and whether the answer reached its closing boundary."""
    match = re.search(r'boundary="?([^";]+)"?', content_type)
    if not match or not content_type.lower().startswith("multipart/mixed"):
        raise ValueError(f"batch answer is not multipart/mixed ({content_type!r})")
    segments = content.split(b"--" + match.group(1).encode())
    whole = len(segments) > 1 and segments[-1].startswith(b"--")
    answers = {}
    # The last segment is the closing "--", or a part cut off: neither is an answer.
    for segment in segments[1:-1]:
        head, _, inner = segment.lstrip(b"\r\n").partition(b"\r\n\r\n")
        cid = re.search(rb"(?im)^content-id:\s*<(?:response-)?([^>]*)>", head)
        status_line, _, rest = inner.partition(b"\r\n")
        inner_head, _, data = rest.partition(b"\r\n\r\n")
        if cid is None or not status_line.startswith(b"HTTP/"):
            continue
        headers = {k.strip().lower(): v.strip() for k, _, v in (
            line.partition(":") for line in inner_head.decode("latin-1").split("\r\n"))}
        data = data[:-2] if data.endswith(b"\r\n") else data  # the CRLF before the boundary
        if headers.get("content-length", str(len(data))) != str(len(data)):
            continue  # shorter than announced: cut off
        answers[cid.group(1).decode()] = (int(status_line.split()[1]), headers, data)
    return answers, whole


def build_requests(service: Any, kind: str, ids: list[str], params: dict[str, Any]
                   ) -> dict[str, Any]:
    """``users.<kind>.get`` requests for ``ids``, keyed by position (ids may repeat)."""
    get: Callable[..., Any] = getattr(service.users(), kind)().get
    return {str(n): get(userId="me", id=gid, **params) for n, gid in enumerate(ids)}
