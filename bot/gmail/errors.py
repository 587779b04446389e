"""What a Gmail call's failure means: the error classes the source and the senders
catch, and the reading of a googleapiclient ``HttpError`` (status, message, reasons,
Retry-After) that the client's retry rules act on."""

from __future__ import annotations

import contextlib
import json

from ..errors import SourceError

QUOTA_REASONS = {"rateLimitExceeded", "userRateLimitExceeded", "quotaExceeded",
                  "dailyLimitExceeded", "RATE_LIMIT_EXCEEDED"}
# Short-term limits that clear after a pause (a daily quota does not).
BACKOFF_REASONS = {"rateLimitExceeded", "userRateLimitExceeded", "RATE_LIMIT_EXCEEDED"}


class GmailError(SourceError):
    """A Gmail call failed; ``status`` is the HTTP status (0: no answer)."""

    def __init__(self, message: str, status: int = 0):
        super().__init__(message)
        self.status = status


class NotFound(GmailError):
    pass


class RateLimited(GmailError):
    """429 or a quota 403. ``retry_after``: seconds Gmail asked us to wait."""

    def __init__(self, message: str, status: int, retry_after: float | None):
        super().__init__(message, status)
        self.retry_after = retry_after


class Cancelled(GmailError):
    """A read was not (re)tried because its caller no longer wants the result."""


class NotSent(GmailError):
    """A write that certainly did not reach Gmail (refused connection, 4xx)."""


class MaybeSent(GmailError):
    """A write whose outcome is unknown (timeout, reset, 5xx)."""


def reason(exc: BaseException) -> str:
    """A one-line reason for an exception, without secrets (GmailErrors are ours)."""
    if isinstance(exc, GmailError):
        return str(exc)
    return f"{type(exc).__name__}: {exc}"[:300]


def error_info(exc) -> tuple[int, str, set[str], float | None]:
    """(status, message, reasons, retry_after) of a googleapiclient HttpError."""
    status = int(getattr(exc.resp, "status", 0) or 0)
    reasons: set[str] = set()
    message = ""
    with contextlib.suppress(ValueError, AttributeError):
        data = json.loads(exc.content.decode("utf-8", "replace"))
        err = data.get("error", {}) if isinstance(data, dict) else {}
        if isinstance(err, dict):
            message = str(err.get("message", ""))
            for e in err.get("errors", []) or []:
                if isinstance(e, dict) and e.get("reason"):
                    reasons.add(str(e["reason"]))
            if err.get("status"):
                reasons.add(str(err["status"]))
        elif isinstance(err, str):
            message = err
    retry_after = None
    value = exc.resp.get("retry-after") if hasattr(exc.resp, "get") else None
    if value:
        try:
            retry_after = max(0.0, float(value))
        except ValueError:
            retry_after = None
    return status, (message or getattr(exc, "reason", "") or "")[:300], reasons, retry_after
