"""How draftgate calls a model: the ``models:`` options every LLM drafter shares, and
one bounded retry loop around a single SDK call.

The SDKs' own retries are switched off (``max_retries=0``) so that there is exactly
one place that decides how often and how long we wait. One ``draft()`` never outlives
its claim: 90% of the pipeline's lease must be longer than ``timeout * (retries + 1)``
plus the backoff (:func:`checked` refuses a shorter one at start-up), and no retry
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
import dataclasses
import logging
import random
import time
from typing import Any, Awaitable, Callable, TypeVar

from ..config.load import ModelConfig, PipelineConfig, Settings
from ..config.models import MAX_BACKOFF
from ..errors import ConfigError, DrafterError, DrafterRetryable, DrafterSetupError
from ..models import DraftRequest, DraftResult
from . import prompt as _prompt
from .failures import Answer, AnswerFailed, Failure, status_failure

log = logging.getLogger(__name__)

T = TypeVar("T")

#: Longest Retry-After we sit out inside one call; a longer one goes back to the queue.
MAX_WAIT = 60.0
#: The part of a pipeline's lease one draft() may use; the rest is the margin for
#: storing the answer. Start-up validation and the retry loop use the same share.
LEASE_SHARE = 0.9


def checked(model: ModelConfig, pipeline: PipelineConfig) -> ModelConfig:
    """``model`` if the pipeline's lease outlasts the worst case of one call (the model's
    own keys were checked at load). No I/O."""
    worst = model.worst_case()
    usable = pipeline.lease * LEASE_SHARE
    if usable <= worst:
        where = model.where
        raise ConfigError(
            f"{pipeline.file}: lease: {pipeline.lease:g}s leaves {usable:g}s for one draft "
            f"(90% of the lease; the rest is kept for storing it), which is not longer than "
            f"one draft can take with {where} (timeout {model.timeout:g}s x {model.retries + 1} "
            f"attempts plus backoff = {worst:g}s): the last attempts would never be made, and "
            f"a call that slow would lose its claim and the item would be drafted twice. "
            f"lease x 0.9 must be longer than {worst:g}s: set lease to at least "
            f"{int(worst * 1.5) + 1}s, or lower {where}.timeout or {where}.retries")
    return model



async def call_with_retries(opts: ModelConfig, call: Callable[[], Awaitable[T]],
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
            wait = min(opts.backoff * 2 ** (attempt - 1), MAX_BACKOFF) * (1 - 0.25 * random.random())
        if time.monotonic() + wait + opts.timeout > deadline:
            raise DrafterRetryable(f"{where}: {failure.reason} (after {attempt} attempt"
                                   f"{'s' if attempt > 1 else ''}; no time left for another "
                                   f"within the lease)", retry_after=failure.retry_after)
        log.info("%s: %s; attempt %d of %d, retrying in %.2fs", where, failure.reason,
                 attempt, attempts, wait)
        await asyncio.sleep(wait)
    raise AssertionError("unreachable")



class LLMDrafter:
    """The flow shared by the OpenAI-compatible and Anthropic drafters. Subclasses say
    how to build the client, make one call and classify the SDK's errors."""

    provider = ""
    #: The SDK's module (an OpenAI- or Anthropic-style SDK, whose errors are named
    #: alike), the base class of all its errors and its async client class.
    sdk: Any = None
    sdk_error: type[BaseException] = Exception
    sdk_client: Any = None

    def __init__(self, model: ModelConfig, pipeline: PipelineConfig, settings: Settings):
        self.opts = checked(model, pipeline)
        self._config = pipeline  # its drafter: options shape the prompt
        self.name = f"{self.provider}:{model.name}"
        self.pipeline = pipeline.name
        # Most of the lease, keeping a margin for the store update after the call.
        self._budget = max(self.opts.timeout, pipeline.lease * LEASE_SHARE)
        self._prompt_text: str | None = None
        self._client: Any = None

    # -- subclass hooks ---------------------------------------------------------------
    def _new_client(self, api_key: str) -> Any:
        # max_retries=0: retries are ours (bounded, Retry-After aware, within the lease).
        # An explicit api_key and base_url keep the SDK from reading credentials or a
        # base URL from the environment or from profile files on disk.
        return self.sdk_client(api_key=api_key, base_url=self.opts.base_url,
                               timeout=self.opts.timeout, max_retries=0)

    async def _call(self, client: Any, p: _prompt.Prompt, max_tokens: int,
                    schema: dict[str, Any] | None = None) -> Answer:
        """One SDK call; ``schema``: ask for JSON of that schema with the provider's
        structured-output feature."""
        raise NotImplementedError

    def _status_detail(self, exc: Any) -> tuple[str, str | None]:
        """The message and error code of the SDK's ``APIStatusError`` ``exc``."""
        raise NotImplementedError

    def _classify(self, exc: BaseException) -> Failure | None:
        """The failure an SDK error stands for (None: not the SDK's)."""
        if isinstance(exc, self.sdk.APITimeoutError):
            return Failure(f"no answer within {self.opts.timeout:g}s (timeout)", True)
        if isinstance(exc, self.sdk.APIConnectionError):
            cause = exc.__cause__ or exc
            return Failure(f"cannot connect to {self.opts.shown_url}: {cause}", True)
        if isinstance(exc, self.sdk.APIStatusError):
            message, code = self._status_detail(exc)
            return status_failure(exc.status_code, message, exc.response.headers, self.opts,
                                  code=code)
        if isinstance(exc, self.sdk_error):
            return Failure(f"unusable answer: {exc}", False)
        return None

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
            dataclasses.replace(self.opts, retries=0),
            lambda: self._call(client, p, 5), self._classify, budget=self.opts.timeout)
        return f"{self.opts.provider} {answer.model or self.opts.model} at {self.opts.shown_url}: ok"

    async def close(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await client.close()
