"""Drafter for any OpenAI-compatible chat completions endpoint: OpenAI, Ollama, vLLM,
llama.cpp, LM Studio, OpenRouter. Options (``models.<name>`` in the deployment file)::

    provider: openai
    base_url: http://localhost:11434/v1   # default https://api.openai.com/v1
    model: llama3.1
    api_key_env: OPENAI_API_KEY           # default for the official endpoint; omit for a
                                          # local server that needs no key
    temperature: 0.3                      # optional
    max_output_tokens: 1024
    timeout: 60s                          # per attempt
    retries: 2                            # in-call retries on 429 / 5xx / timeouts
    backoff: 1s                           # first wait when no Retry-After is given
"""

from __future__ import annotations

from typing import Any

import openai

from ..config import ModelConfig, PipelineConfig, Settings
from ._retry import Answer, Failure, LLMDrafter, status_failure
from .prompt import Prompt

__all__ = ["create", "OpenAIDrafter"]


class OpenAIDrafter(LLMDrafter):
    provider = "openai"
    default_base_url = "https://api.openai.com/v1"
    default_key_env = "OPENAI_API_KEY"

    def _new_client(self, api_key: str) -> openai.AsyncOpenAI:
        # max_retries=0: retries are ours (bounded, Retry-After aware, within the lease).
        return openai.AsyncOpenAI(api_key=api_key, base_url=self.opts.base_url,
                                  timeout=self.opts.timeout, max_retries=0)

    async def _call(self, client: openai.AsyncOpenAI, p: Prompt, max_tokens: int) -> Answer:
        extra: dict[str, Any] = {}
        if self.opts.temperature is not None:
            extra["temperature"] = self.opts.temperature
        # max_tokens rather than max_completion_tokens: every compatible server knows it.
        resp = await client.chat.completions.create(
            model=self.opts.model, max_tokens=max_tokens,
            messages=[{"role": "system", "content": p.system},
                      {"role": "user", "content": p.user}], **extra)
        choice = resp.choices[0] if resp.choices else None
        usage = resp.usage
        return Answer(
            text=choice.message.content if choice else None,
            cut_off=bool(choice and choice.finish_reason == "length"),
            tokens_in=(usage.prompt_tokens or 0) if usage else 0,
            tokens_out=(usage.completion_tokens or 0) if usage else 0,
            model=resp.model or "")

    def _classify(self, exc: BaseException) -> Failure | None:
        if isinstance(exc, openai.APITimeoutError):
            return Failure(f"no answer within {self.opts.timeout:g}s (timeout)", True)
        if isinstance(exc, openai.APIConnectionError):
            cause = exc.__cause__ or exc
            return Failure(f"cannot connect to {self.opts.shown_url}: {cause}", True)
        if isinstance(exc, openai.APIStatusError):
            body = exc.body if isinstance(exc.body, dict) else {}
            message = body.get("message") or exc.message
            return status_failure(exc.status_code, message, exc.response.headers, self.opts,
                                  code=exc.code or exc.type)
        if isinstance(exc, openai.OpenAIError):
            return Failure(f"unusable answer: {exc}", False)
        return None


def create(model: ModelConfig, pipeline: PipelineConfig, settings: Settings) -> OpenAIDrafter:
    """Check the options and build the drafter (no I/O, no secret read yet)."""
    return OpenAIDrafter(model, pipeline, settings)
