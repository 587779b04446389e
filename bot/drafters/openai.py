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

from ..config.load import ModelConfig, PipelineConfig, Settings
from .failures import (
    Answer,
    AnswerFailed,
    answer_of,
    error_in_body,
    json_object,
    mapping,
    not_the_api,
)
from .llm import LLMDrafter
from .prompt import Prompt

__all__ = ["create", "OpenAIDrafter"]


class OpenAIDrafter(LLMDrafter):
    provider = "openai"
    sdk, sdk_error, sdk_client = openai, openai.OpenAIError, openai.AsyncOpenAI

    async def _call(self, client: openai.AsyncOpenAI, p: Prompt, max_tokens: int,
                    schema: dict[str, Any] | None = None) -> Answer:
        extra: dict[str, Any] = {}
        if self.opts.temperature is not None:
            extra["temperature"] = self.opts.temperature
        if schema is not None:  # Structured Outputs: the answer must match the schema
            extra["response_format"] = {"type": "json_schema", "json_schema": {
                "name": "answer", "strict": True, "schema": schema}}
        # max_tokens rather than max_completion_tokens: every compatible server knows it.
        # The raw answer: a "compatible" server (or a proxy, or a web page where the
        # API should be) can answer 200 with anything, and the SDK would hand back a
        # string or an object of Nones. It is checked here instead.
        raw = await client.chat.completions.with_raw_response.create(
            model=self.opts.model, max_tokens=max_tokens,
            messages=[{"role": "system", "content": p.system},
                      {"role": "user", "content": p.user}], **extra)
        return self._answer(raw.content, raw.headers.get("content-type"))

    def _answer(self, body: bytes, content_type: str | None) -> Answer:
        data = json_object(body)
        choices = data.get("choices") if data is not None else None
        if data is not None and data.get("error") and not choices:
            # OpenRouter and other gateways: HTTP 200 carrying an upstream failure.
            raise AnswerFailed(error_in_body(self.opts, data["error"]))
        if data is None or not isinstance(choices, list):
            raise AnswerFailed(not_the_api(self.opts, "OpenAI-compatible", body, content_type))
        choice = choices[0] if choices and isinstance(choices[0], dict) else {}
        finish = choice.get("finish_reason")
        if finish == "error" or choice.get("error"):
            raise AnswerFailed(error_in_body(self.opts, choice.get("error") or data.get("error")
                                             or {"message": "finish_reason error"}))
        message = mapping(choice.get("message"))
        refusal = message.get("refusal")
        if isinstance(refusal, str) and refusal.strip():
            refused = "the model refused to write this reply: " + " ".join(refusal.split())[:300]
        elif finish == "content_filter":
            # What came before the filter cut in is a fragment, never a draft.
            refused = "the provider's content filter stopped the answer (finish_reason content_filter)"
        else:
            refused = ""
        return answer_of(data, _text(message.get("content")), finish == "length", refused,
                         ("prompt_tokens", "completion_tokens"))

    def _status_detail(self, exc: openai.APIStatusError) -> tuple[str, str | None]:
        body = exc.body if isinstance(exc.body, dict) else {}
        return body.get("message") or exc.message, exc.code or exc.type


def _text(content: Any) -> str | None:
    """A message's content: a string, or (some servers) a list of text parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(part.get("text") or "" for part in content
                       if isinstance(part, dict) and isinstance(part.get("text"), str))
    return None


def create(model: ModelConfig, pipeline: PipelineConfig, settings: Settings) -> OpenAIDrafter:
    """Check the options and build the drafter (no I/O, no secret read yet)."""
    return OpenAIDrafter(model, pipeline, settings)
