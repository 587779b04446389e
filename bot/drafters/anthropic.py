"""Drafter for Anthropic's Messages API. Options (``models.<name>``)::

    provider: anthropic
    base_url: https://api.anthropic.com   # the default
    model: claude-sonnet-4-5
    api_key_env: ANTHROPIC_API_KEY        # the default for the official endpoint
    max_output_tokens: 1024
    timeout: 60s                          # per attempt
    retries: 2
    backoff: 1s

There is no ``temperature``: the Messages API of anthropic 2.x takes none, so the
option is refused with a config error rather than sent and answered with a 400.
"""

from __future__ import annotations

import anthropic

from ..config import ModelConfig, PipelineConfig, Settings
from ._retry import Answer, Failure, LLMDrafter, status_failure
from .prompt import Prompt

__all__ = ["create", "AnthropicDrafter"]


class AnthropicDrafter(LLMDrafter):
    provider = "anthropic"
    default_base_url = "https://api.anthropic.com"
    default_key_env = "ANTHROPIC_API_KEY"
    # anthropic 2.x's Messages API has no sampling temperature.
    temperature_ok = False

    def _new_client(self, api_key: str) -> anthropic.AsyncAnthropic:
        # An explicit api_key and base_url keep the SDK from reading credentials or a
        # base URL from the environment or from profile files on disk.
        return anthropic.AsyncAnthropic(api_key=api_key, base_url=self.opts.base_url,
                                        timeout=self.opts.timeout, max_retries=0)

    async def _call(self, client: anthropic.AsyncAnthropic, p: Prompt, max_tokens: int) -> Answer:
        resp = await client.messages.create(
            model=self.opts.model, max_tokens=max_tokens, system=p.system,
            messages=[{"role": "user", "content": p.user}])
        text = "".join(getattr(b, "text", "") for b in resp.content if b.type == "text")
        usage = resp.usage
        return Answer(text=text, cut_off=resp.stop_reason == "max_tokens",
                      tokens_in=(usage.input_tokens or 0) if usage else 0,
                      tokens_out=(usage.output_tokens or 0) if usage else 0,
                      model=str(resp.model or ""))

    def _classify(self, exc: BaseException) -> Failure | None:
        if isinstance(exc, anthropic.APITimeoutError):
            return Failure(f"no answer within {self.opts.timeout:g}s (timeout)", True)
        if isinstance(exc, anthropic.APIConnectionError):
            cause = exc.__cause__ or exc
            return Failure(f"cannot connect to {self.opts.shown_url}: {cause}", True)
        if isinstance(exc, anthropic.APIStatusError):
            message = exc.api_message or exc.message
            return status_failure(exc.status_code, message, exc.response.headers, self.opts,
                                  code=exc.error_code or exc.type)
        if isinstance(exc, anthropic.AnthropicError):
            return Failure(f"unusable answer: {exc}", False)
        return None


def create(model: ModelConfig, pipeline: PipelineConfig, settings: Settings) -> AnthropicDrafter:
    """Check the options and build the drafter (no I/O, no secret read yet)."""
    return AnthropicDrafter(model, pipeline, settings)
