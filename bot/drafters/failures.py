"""What a model's answer or error means: a :class:`Failure` in words an operator can act
on (retryable or not, this item's fault or the setup's), read from an HTTP status, an
error object inside a 200 answer, a body that is not the API's, or a Retry-After
header; and :class:`Answer`, one successful answer, provider-neutral. The retry loop
that acts on them is :func:`bot.drafters.llm.call_with_retries`."""

from __future__ import annotations

import email.utils
import json
import math
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..config.models import ModelConfig

#: Longest Retry-After we hand on at all (a provider asking for days or ``inf`` gets an
#: hour; the next probe after that asks again).
MAX_HOLD = 3600.0


@dataclass
class Failure:
    """What went wrong with one attempt, in words an operator can act on."""

    reason: str
    retryable: bool
    retry_after: float | None = None
    #: Not this item's fault: the model cannot be used at all until its setup is fixed.
    setup: bool = False


def retry_after_seconds(headers: Any) -> float | None:
    """Seconds from ``retry-after-ms`` / ``Retry-After`` (seconds or an HTTP date), at
    most :data:`MAX_HOLD`. A value that is not a finite number or a date (``inf``,
    ``nan``, garbage) counts as absent: a broken header must not stop drafting for ever."""
    if headers is None:
        return None
    for name, scale in (("retry-after-ms", 0.001), ("retry-after", 1.0)):
        value = headers.get(name)
        if value is None:
            continue
        try:
            seconds = float(value) * scale
        except ValueError:
            try:
                parsed = email.utils.parsedate_tz(value)
                if parsed is None:
                    continue
                seconds = email.utils.mktime_tz(parsed) - time.time()
            except (ValueError, OverflowError, TypeError):
                continue
        if math.isfinite(seconds) and seconds >= 0:
            return min(seconds, MAX_HOLD)
    return None


#: Error codes meaning the account has no money or quota left: no retry helps until
#: someone fixes the billing (OpenAI's 429 ``insufficient_quota``).
_BILLING_CODES = {"insufficient_quota", "billing_hard_limit_reached", "billing_error"}


def status_failure(status: int, message: str, headers: Any, opts: ModelConfig,
                   code: str | None = None, *, in_body: bool = False) -> Failure:
    """Classify an HTTP error answer (or an error object in a 200 answer) from either
    provider. ``code`` is the error's code or type, when the body names one.

    429, 5xx, 408, 409: the provider's trouble, retryable. 401, 403, 404, 405, 407 and
    an exhausted quota: the setup is wrong (key, access, model name, base_url, billing),
    so every item would fail alike (:class:`DrafterSetupError`). Any other 4xx (400,
    413, 422...): this request was refused; the item fails with the reason.
    ``in_body``: the status is an error code inside an HTTP 200 answer (OpenRouter)."""
    message = " ".join(str(message).split())[:300]
    where, key_env = opts.where, opts.api_key_env
    http = f"error {status} in an HTTP 200 answer" if in_body else f"HTTP {status}"
    if status == 402 or (code or "").lower() in _BILLING_CODES:
        account = f"the account of the API key in {key_env}" if key_env else "the account"
        return Failure(f"the account has no quota or credit left ({http}): {message}; "
                       f"check the billing/quota of {account} ({where})", False, setup=True)
    if status == 429:
        return Failure(f"rate limited ({http}): {message}", True, retry_after_seconds(headers))
    if status in (408, 409) or status >= 500:
        return Failure(f"server error ({http}): {message}", True, retry_after_seconds(headers))
    if status == 401:
        hint = (f"check the API key in environment variable {key_env} ({where}.api_key_env)"
                if key_env else
                f"the server wants an API key: set {where}.api_key_env to the name of an "
                f"environment variable that holds it")
        return Failure(f"not authorised ({http}): {message}; {hint}", False, setup=True)
    if status == 403 and _about_the_content(message):
        # OpenRouter and moderated endpoints answer 403 when this input was flagged:
        # that is about one email, not the setup; only this item fails.
        return Failure(f"the provider refused this email's content ({http}): {message}", False)
    if status == 403:
        hint = (f"check that the API key in environment variable {key_env} may use model "
                f"{opts.model!r} ({where}.api_key_env, {where}.model)" if key_env else
                f"the server wants an API key with access: set {where}.api_key_env to the "
                f"name of an environment variable that holds it")
        return Failure(f"access denied ({http}): {message}; {hint}", False, setup=True)
    if status == 404:
        return Failure(f"not found ({http}): {message}; check {where}.model ({opts.model!r}) "
                       f"and {where}.base_url ({opts.shown_url})", False, setup=True)
    if status in (405, 407):
        # A web server or proxy at base_url, not the API (or a proxy wanting a login).
        what = "method not allowed" if status == 405 else "proxy authentication required"
        return Failure(f"{what} ({http}): {message}; {opts.shown_url} is not the API's "
                       f"endpoint: check {where}.base_url", False, setup=True)
    return Failure(f"request refused ({http}): {message}", False)


class AnswerFailed(Exception):
    """Raised by a drafter's ``_call`` for an HTTP 200 answer that is not a draft (an
    error object in the body, a page that is not the API's JSON); the retry loop takes
    its :class:`Failure` like an SDK error's."""

    def __init__(self, failure: Failure):
        super().__init__(failure.reason)
        self.failure = failure


def not_the_api(opts: ModelConfig, api: str, body: bytes, content_type: str | None) -> Failure:
    """A 200 answer that is not the API's JSON: a web page, a proxy's or captive
    portal's answer, an empty body. base_url points at the wrong thing."""
    text = " ".join(body.decode("utf-8", "replace").split())
    if not text:
        what = "an empty body"
    else:
        kind = (content_type or "").split(";")[0].strip() or "untyped"
        what = f"a {kind} body starting {text[:60]!r}"
    return Failure(f"the server at {opts.shown_url} did not answer like an {api} API (HTTP 200 "
                   f"with {what}); check {opts.where}.base_url", False, setup=True)


def json_object(body: bytes) -> dict[str, Any] | None:
    """``body`` as a JSON object, or None."""
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None
    return data if isinstance(data, dict) else None


def mapping(value: Any) -> dict[str, Any]:
    """An answer's field that should be a JSON object, or an empty one."""
    return value if isinstance(value, dict) else {}


def text_field(value: Any) -> str:
    """An answer's field that should be a string, or ""."""
    return value if isinstance(value, str) else ""


def token_count(value: Any) -> int:
    """A usage field as a token count (0 when absent or not a count)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def error_in_body(opts: ModelConfig, error: Any, *, status: int | None = None) -> Failure:
    """An ``{"error": {...}}`` object inside an HTTP 200 answer (OpenRouter passes an
    upstream provider's failure on this way), classified by its code like an HTTP
    status; without a numeric code it counts as the provider's trouble (502)."""
    error = error if isinstance(error, dict) else {"message": error}
    code = error.get("code")
    if status is None:
        try:
            status = int(code)
        except (TypeError, ValueError):
            status = 0
        if not 100 <= status <= 599:
            status = 502
    message = error.get("message") or "the provider reported an error without a message"
    name = code if isinstance(code, str) and not code.isdigit() else error.get("type")
    return status_failure(status, str(message), None, opts, code=name if isinstance(name, str) else None,
                          in_body=True)


def answer_of(data: dict[str, Any], text: str | None, cut_off: bool, refused: str,
              usage: tuple[str, str]) -> Answer:
    """The answer of the API's JSON ``data``, with the model it names and the token
    counts its ``usage`` object holds under the keys ``usage`` (input, output)."""
    counts = mapping(data.get("usage"))
    return Answer(text=text, cut_off=cut_off, tokens_in=token_count(counts.get(usage[0])),
                  tokens_out=token_count(counts.get(usage[1])),
                  model=text_field(data.get("model")), refused=refused)


@dataclass
class Answer:
    """One successful model answer, provider-neutral."""

    text: str | None
    cut_off: bool
    tokens_in: int
    tokens_out: int
    model: str
    #: Why the provider withheld or stopped the answer (content filter, refusal).
    refused: str = ""


_CONTENT_WORDS = ("flagged", "moderation", "content policy", "content_policy", "input was")
#: Words of an access decision about the key, account or model: a setup error even
#: when content words appear too.
_ACCESS_WORDS = ("terminated", "allowlist", "allow list", "not allowed", "organization",
                 "account", "api key", "suspended", "banned")


def _about_the_content(message: str) -> bool:
    """Does a 403's message blame this input (moderation flagged it) rather than the
    key, account or model?"""
    text = (message or "").lower()
    return (any(word in text for word in _CONTENT_WORDS)
            and not any(word in text for word in _ACCESS_WORDS))
