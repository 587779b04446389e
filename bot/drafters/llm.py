"""How draftgate calls a model: the ``models:`` options every LLM drafter shares, and
one bounded retry loop around a single SDK call.

The SDKs' own retries are switched off (``max_retries=0``) so that there is exactly
one place that decides how often and how long we wait. One ``draft()`` never outlives
its claim: 90% of the pipeline's lease must be longer than ``timeout * (retries + 1)``
plus the backoff (:func:`model_options` refuses a shorter one at start-up), and no retry
starts that could not finish within that 90% of the lease (a long Retry-After ends the
call early as retryable instead). Otherwise a slow but healthy call could lose its
claim and the item would be drafted twice.

After the in-call retries a transient failure (429, 5xx, timeout, connection) raises
:class:`DrafterRetryable` (the engine puts the item back in the queue). A model that
cannot be used at all (401, 403, 404, an exhausted quota, an unset key variable, a
200 answer that is not the API's JSON) raises :class:`DrafterSetupError` (items wait,
the operators are told what to fix). A refusal of this one request (400, 413, 422, an
unusable answer) raises :class:`DrafterError` (the item fails with the reason).
Gateways such as OpenRouter can answer 200 with ``{"error": {"code": 502, ...}}``;
that code is classified like an HTTP status.
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import json
import logging
import math
import os
import random
import time
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, TypeVar
from urllib.parse import unquote, urlsplit

from ..config.load import Checker, ModelConfig, PipelineConfig, Settings, parse_duration
from ..errors import ConfigError, DrafterError, DrafterRetryable, DrafterSetupError
from ..models import DraftRequest, DraftResult
from ..redact import redact_url, register
from . import prompt as _prompt

log = logging.getLogger(__name__)

T = TypeVar("T")

#: Longest Retry-After we sit out inside one call; a longer one goes back to the queue.
MAX_WAIT = 60.0
#: Longest Retry-After we hand on at all (a provider asking for days or ``inf`` gets an
#: hour; the next probe after that asks again).
MAX_HOLD = 3600.0
_MAX_BACKOFF = 30.0
_KNOWN = {"provider", "base_url", "model", "api_key_env", "temperature", "max_output_tokens",
          "timeout", "retries", "backoff", "price"}
#: The part of a pipeline's lease one draft() may use; the rest is the margin for
#: storing the answer. Start-up validation and the retry loop use the same share.
LEASE_SHARE = 0.9
#: Used as the API key for local servers (Ollama, llama.cpp...) that want none.
NO_KEY = "not-needed"


@dataclass
class ModelOptions:
    name: str  # the models: entry, e.g. "default"
    provider: str
    base_url: str | None
    model: str
    api_key_env: str | None
    temperature: float | None
    max_output_tokens: int
    timeout: float
    retries: int
    backoff: float

    @property
    def where(self) -> str:
        return f"models.{self.name}"

    @property
    def shown_url(self) -> str:
        """``base_url`` as an operator may read it: credentials in it are hidden."""
        return redact_url(self.base_url or "", keep_user=False)

    def redact(self, text: str) -> str:
        """``text`` without the credentials of ``base_url`` or the API key, should an
        SDK, a proxy or a provider have echoed them."""
        url = self.base_url or ""
        if url and url != self.shown_url:
            text = text.replace(url, self.shown_url)
        secrets = []
        with contextlib.suppress(ValueError):
            parts = urlsplit(url)
            secrets += [parts.password or "", parts.username or ""]
        if self.api_key_env:
            secrets.append(os.environ.get(self.api_key_env, ""))
        for secret in sorted(filter(None, secrets), key=len, reverse=True):
            for form in {secret, unquote(secret)}:
                if len(form) >= 3:
                    text = text.replace(form, "***")
        return text

    def worst_case(self) -> float:
        """Least time every attempt needs when each one times out (plus the backoff
        between them); 90% of the lease (:data:`LEASE_SHARE`) has to be longer."""
        waits = sum(min(self.backoff * 2 ** i, _MAX_BACKOFF) for i in range(self.retries))
        return self.timeout * (self.retries + 1) + waits

    def api_key(self) -> str:
        """The secret, read at first use. The error names the variable, never a value."""
        if not self.api_key_env:
            return NO_KEY
        value = os.environ.get(self.api_key_env, "")
        register(value, self.api_key_env)  # hidden wherever it might be echoed
        if not value:
            raise DrafterSetupError(
                f"{self.where}: environment variable {self.api_key_env} is not set; export it "
                f"with the {self.provider} API key (or remove api_key_env for a local server "
                f"that needs no key)")
        return value


#: The environment variable each provider's key is read from when ``api_key_env`` is not
#: set and the model has no ``base_url`` of its own.
DEFAULT_KEY_ENV = {"openai": "OPENAI_API_KEY", "anthropic": "ANTHROPIC_API_KEY"}


def model_options(model: ModelConfig, pipeline: PipelineConfig, settings: Settings, *,
                  default_base_url: str, default_key_env: str,
                  temperature_ok: bool = True) -> ModelOptions:
    """Check ``models.<name>`` (errors name the deployment file and key path) and that
    the pipeline's lease outlasts the worst case of one call. No I/O."""
    errors: list[str] = []
    ck = Checker(settings.file, errors)
    where = f"models.{model.name}"
    data = model.options
    if "api_key" in data:
        ck.error(f"{where}.api_key", "never put the key in YAML; set api_key_env to the name "
                                     "of an environment variable that holds it")
    ck.unknown({k: v for k, v in data.items() if k != "api_key"}, _KNOWN, where)
    base_url = ck.get(data, "base_url", where, str, default=None)
    if base_url is not None and not base_url.startswith(("http://", "https://")):
        ck.error(f"{where}.base_url", f"expected an http:// or https:// URL, got "
                                     f"{redact_url(base_url, keep_user=False)!r}")
    name = ck.get(data, "model", where, str)
    if name is not None and not name.strip():
        ck.error(f"{where}.model", "expected a model name, e.g. gpt-4.1-mini or llama3.1")
    # The official endpoint needs a key, so it defaults to the usual variable; a
    # custom base_url (Ollama, vLLM...) often needs none.
    key_env = ck.get(data, "api_key_env", where, str, default=None if base_url else default_key_env)
    temperature = ck.get(data, "temperature", where, float, default=None)
    if temperature is not None and not temperature_ok:
        ck.error(f"{where}.temperature", f"the {model.provider} provider takes no temperature "
                                         f"(its Messages API has none); remove it")
    elif temperature is not None and not 0 <= temperature <= 2:
        ck.error(f"{where}.temperature", f"expected a number from 0 to 2, got {temperature}")
    max_out = ck.get(data, "max_output_tokens", where, int, default=1024)
    if max_out is not None and max_out < 1:
        ck.error(f"{where}.max_output_tokens", "expected a whole number of at least 1")
    timeout = ck.convert(data, "timeout", where, parse_duration, default=60.0)
    if timeout is not None and timeout <= 0:
        ck.error(f"{where}.timeout", "expected a duration above zero, like 60s")
    retries = ck.get(data, "retries", where, int, default=2)
    if retries is not None and not 0 <= retries <= 10:
        ck.error(f"{where}.retries", f"expected a whole number from 0 to 10, got {retries}")
    backoff = ck.convert(data, "backoff", where, parse_duration, default=1.0)
    if backoff is not None and backoff < 0:
        ck.error(f"{where}.backoff", "expected a duration of zero or more, like 1s")
    if errors:
        raise ConfigError(errors)
    opts = ModelOptions(model.name, model.provider, base_url or default_base_url, name,
                        key_env, temperature, max_out, timeout, retries, backoff)
    worst = opts.worst_case()
    usable = pipeline.lease * LEASE_SHARE
    if usable <= worst:
        raise ConfigError(
            f"{pipeline.file}: lease: {pipeline.lease:g}s leaves {usable:g}s for one draft "
            f"(90% of the lease; the rest is kept for storing it), which is not longer than "
            f"one draft can take with {where} (timeout {opts.timeout:g}s x {opts.retries + 1} "
            f"attempts plus backoff = {worst:g}s): the last attempts would never be made, and "
            f"a call that slow would lose its claim and the item would be drafted twice. "
            f"lease x 0.9 must be longer than {worst:g}s: set lease to at least "
            f"{int(worst * 1.5) + 1}s, or lower {where}.timeout or {where}.retries")
    return opts


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


async def call_with_retries(opts: ModelOptions, call: Callable[[], Awaitable[T]],
                            classify: Callable[[BaseException], Failure | None], *,
                            budget: float) -> T:
    """Run ``call`` up to ``retries + 1`` times. ``classify`` turns an SDK exception into
    a :class:`Failure` (``None``: not an SDK error, let it propagate). Waits honour
    Retry-After up to :data:`MAX_WAIT`, else back off exponentially with jitter. No
    retry starts that could not finish within ``budget`` seconds from now (the part of
    the lease we may use), so a claim is never outlived by its own call."""
    attempts = opts.retries + 1
    deadline = time.monotonic() + budget
    for attempt in range(1, attempts + 1):
        try:
            # The SDK's timeout is per network phase; a server that trickles bytes
            # could stretch one attempt past it. This bounds the whole attempt.
            return await asyncio.wait_for(call(), timeout=opts.timeout)
        except (DrafterError, asyncio.CancelledError):
            raise
        except TimeoutError:
            failure = Failure(f"no answer within {opts.timeout:g}s (timeout)", True)
        except AnswerFailed as exc:
            failure = exc.failure
        except Exception as exc:
            classified = classify(exc)
            if classified is None:
                raise
            failure = classified
        failure.reason = opts.redact(failure.reason)
        where = f"{opts.provider} {opts.model}"
        if not failure.retryable:
            raise (DrafterSetupError if failure.setup else DrafterError)(f"{where}: {failure.reason}")
        if failure.retry_after is not None and failure.retry_after > MAX_WAIT:
            # Sitting out a long rate limit would hold the claim for minutes; the queue
            # will offer the item again.
            raise DrafterRetryable(f"{where}: {failure.reason} (retry after "
                                   f"{failure.retry_after:g}s)", retry_after=failure.retry_after)
        if attempt == attempts:
            raise DrafterRetryable(f"{where}: {failure.reason} (after {attempts} attempt"
                                   f"{'s' if attempts > 1 else ''})",
                                   retry_after=failure.retry_after)
        if failure.retry_after is not None:
            wait = failure.retry_after
        else:
            wait = min(opts.backoff * 2 ** (attempt - 1), _MAX_BACKOFF) * (1 - 0.25 * random.random())
        if time.monotonic() + wait + opts.timeout > deadline:
            raise DrafterRetryable(f"{where}: {failure.reason} (after {attempt} attempt"
                                   f"{'s' if attempt > 1 else ''}; no time left for another "
                                   f"within the lease)", retry_after=failure.retry_after)
        log.info("%s: %s; attempt %d of %d, retrying in %.2fs", where, failure.reason,
                 attempt, attempts, wait)
        await asyncio.sleep(wait)
    raise AssertionError("unreachable")


#: Error codes meaning the account has no money or quota left: no retry helps until
#: someone fixes the billing (OpenAI's 429 ``insufficient_quota``).
_BILLING_CODES = {"insufficient_quota", "billing_hard_limit_reached", "billing_error"}


def status_failure(status: int, message: str, headers: Any, opts: ModelOptions,
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


def not_the_api(opts: ModelOptions, api: str, body: bytes, content_type: str | None) -> Failure:
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


def error_in_body(opts: ModelOptions, error: Any, *, status: int | None = None) -> Failure:
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


class LLMDrafter:
    """The flow shared by the OpenAI-compatible and Anthropic drafters. Subclasses say
    how to build the client, make one call and classify the SDK's errors."""

    provider = ""
    default_base_url = ""
    default_key_env = ""
    temperature_ok = True

    def __init__(self, model: ModelConfig, pipeline: PipelineConfig, settings: Settings):
        self.opts = model_options(model, pipeline, settings, default_base_url=self.default_base_url,
                                  default_key_env=self.default_key_env,
                                  temperature_ok=self.temperature_ok)
        self._config = pipeline  # its drafter: options shape the prompt
        self.name = f"{self.provider}:{model.name}"
        self.pipeline = pipeline.name
        # Most of the lease, keeping a margin for the store update after the call.
        self._budget = max(self.opts.timeout, pipeline.lease * LEASE_SHARE)
        self._prompt_text: str | None = None
        self._client: Any = None

    # -- subclass hooks ---------------------------------------------------------------
    def _new_client(self, api_key: str) -> Any:
        raise NotImplementedError

    async def _call(self, client: Any, p: _prompt.Prompt, max_tokens: int,
                    schema: dict[str, Any] | None = None) -> Answer:
        """One SDK call; ``schema``: ask for JSON of that schema with the provider's
        structured-output feature."""
        raise NotImplementedError

    def _classify(self, exc: BaseException) -> Failure | None:
        raise NotImplementedError

    # -- Drafter ----------------------------------------------------------------------
    def _get_client(self) -> Any:
        if self._client is None:
            # Created at first use, not in create(): `validate` and start-up do no I/O
            # and need no secrets.
            self._client = self._new_client(self.opts.api_key())
        return self._client

    async def draft(self, request: DraftRequest) -> DraftResult:
        """One draft, with in-call retries; see the module docstring for the errors."""
        if self._prompt_text is None:
            self._prompt_text = _prompt.load_prompt(self._config)
        p = _prompt.build(request, self._config.drafter, self._prompt_text)
        client = self._get_client()
        answer = await call_with_retries(
            self.opts, lambda: self._call(client, p, self.opts.max_output_tokens),
            self._classify, budget=self._budget)
        try:
            body = _prompt.check_output(answer.text, cut_off=answer.cut_off, nonce=p.nonce,
                                        refused=answer.refused)
        except DrafterError as exc:
            err = DrafterError(f"{self.opts.provider} {self.opts.model}: {exc}")
            # The unusable answer was paid for; the engine may count it (add_tokens).
            err.tokens = answer.tokens_in + answer.tokens_out
            raise err from None
        return DraftResult(body, answer.tokens_in, answer.tokens_out, answer.model or self.opts.model)

    async def ask_json(self, p: _prompt.Prompt, schema: dict[str, Any], max_tokens: int) -> Answer:
        """One answer constrained to ``schema`` (triage), with the same bounded retries
        as a draft; what it says is the caller's to check."""
        client = self._get_client()
        return await call_with_retries(
            self.opts, lambda: self._call(client, p, min(max_tokens, self.opts.max_output_tokens),
                                          schema),
            self._classify, budget=self._budget)

    async def ping(self) -> str:
        """A minimal request for ``draftgate doctor``: one attempt, a one-token answer.
        Returns a short description; raises DrafterError saying what is wrong."""
        client = self._get_client()
        p = _prompt.Prompt("Answer with the single word: ok", "ping", "")
        answer = await call_with_retries(
            ModelOptions(**{**self.opts.__dict__, "retries": 0}),
            lambda: self._call(client, p, 5), self._classify, budget=self.opts.timeout)
        return f"{self.opts.provider} {answer.model or self.opts.model} at {self.opts.shown_url}: ok"

    async def close(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await client.close()


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
