"""Every error draftgate raises on purpose.

::

    DraftgateError
    ├── ConfigError            bad YAML or settings; message names file, path, expectation
    ├── StoreError             the store cannot be read or written (tick fails, is recorded)
    │   └── StoreUnavailable   it cannot be reached at all (server down, disk full, I/O
    │                          error): ticks are held until it answers (bot.engine.outage)
    ├── SourceError            fetching failed (the tick fails; nothing admitted is lost)
    │   └── AuthError          credentials missing, expired or revoked: says which command fixes it
    ├── DrafterError           the model call failed
    │   ├── DrafterRetryable   timeout, 429, 5xx: the draft goes back to queued (attempt + 1)
    │   ├── DrafterSetupError  401/403/404, missing key or prompt: the pipeline's setup is
    │   │                      wrong, not the item: it goes back to queued (no attempt)
    │   └── BudgetExhausted    daily token budget spent: items stay queued
    ├── ApprovalError          the approval channel is unreachable: drafts wait in ``ready``
    ├── NotAllowed             an operator not in the pipeline's approval.operators acted
    └── SendError
        ├── SendFailed         definite failure before delivery -> send_failed, Retry offered
        └── SendUnknown        timeout, reset, 5xx: may have been delivered -> send_unknown
"""

from __future__ import annotations

import asyncio

from .redact import scrub_line


class DraftgateError(Exception):
    """Base of every error draftgate raises on purpose."""


class ConfigError(DraftgateError):
    """Configuration is invalid. ``errors`` holds every problem found, one per line."""

    def __init__(self, errors: list[str] | str):
        self.errors = [errors] if isinstance(errors, str) else list(errors)
        super().__init__("\n".join(self.errors))


class StoreError(DraftgateError):
    pass


class StoreUnavailable(StoreError):
    """The store cannot be reached or written at all: the server is down or refuses
    connections, the disk is full, an I/O error. Every call would fail alike, so the
    schedule holds its ticks until the store answers again (:mod:`bot.engine.outage`);
    what was not admitted is fetched again then."""


class SourceError(DraftgateError):
    pass


class AuthError(SourceError):
    pass


class Throttled(SourceError):
    """The mail service asked to wait (429 / 503 with Retry-After) longer than a tick
    waits: the tick is recorded failed and the pipeline shows as held until ``until``."""

    def __init__(self, message: str, until: float):
        super().__init__(message)
        self.until = until


class DrafterError(DraftgateError):
    tokens: int = 0  # what an unusable answer still cost; the engine counts it


class DrafterRetryable(DrafterError):
    def __init__(self, message: str, retry_after: float | None = None):
        super().__init__(message)
        self.retry_after = retry_after


class DrafterSetupError(DrafterError):
    """The model cannot be used at all (bad key, unknown model, missing prompt file):
    every item would fail the same way, so items wait in the queue and the operators
    are told what to fix."""


class BudgetExhausted(DrafterError):
    pass


class ApprovalError(DraftgateError):
    pass


class NotAllowed(DraftgateError):
    """An operator acted on a pipeline whose ``approval.operators`` does not list them:
    nothing changed (it is audited). ``str(exc)`` is the answer they get."""


class NeedsConfirmation(DraftgateError):
    """Approve on a version with claims its sources do not support, in a pipeline with
    ``grounding: confirm``: nothing counted yet; the operator is asked once more
    ("Send anyway?") and approves with ``confirmed``. ``claims``: what to list."""

    def __init__(self, claims: list[str]):
        self.claims = list(claims)
        super().__init__("Not in the sources: " + " · ".join(self.claims) + ". Send anyway?")


class SendError(DraftgateError):
    pass


class SendFailed(SendError):
    """The recipient certainly did not get it (e.g. a 4xx before delivery)."""


class SendUnknown(SendError):
    """It may or may not have been delivered. Never retried blindly."""


def describe_error(exc: BaseException) -> str:
    """A one-line error text for runs, cards and notifications."""
    if isinstance(exc, DraftgateError):
        text = str(exc)
    elif isinstance(exc, (asyncio.TimeoutError, TimeoutError)):
        text = "timed out"
    else:
        text = f"{type(exc).__name__}: {exc}"
    # Cut (with a margin, see scrub_line) before it is scrubbed: an exception can quote
    # a whole answer, and this runs on the event loop.
    return scrub_line(text, 500, mark="") or type(exc).__name__
