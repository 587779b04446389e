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

from typing import Any

import anthropic

from ..config.load import ModelConfig, PipelineConfig, Settings
from .failures import Answer, AnswerFailed, answer_of, error_in_body, json_object, not_the_api
from .llm import LLMDrafter
from .prompt import Prompt

__all__ = ["create", "AnthropicDrafter"]


class AnthropicDrafter(LLMDrafter):
    provider = "anthropic"  # its Messages API has no temperature (refused at load)
    sdk, sdk_error, sdk_client = anthropic, anthropic.AnthropicError, anthropic.AsyncAnthropic

    async def _call(self, client: anthropic.AsyncAnthropic, p: Prompt, max_tokens: int,
                    schema: dict[str, Any] | None = None) -> Answer:
        # Structured outputs (output_config.format, GA in anthropic 2.x): the text
        # block holds JSON matching the schema.
        extra: dict[str, Any] = {} if schema is None else {
            "output_config": {"format": {"type": "json_schema", "schema": schema}}}
        # The raw answer, checked here: a proxy or a web page at base_url can answer
        # 200 with anything, and the SDK would hand back a string.
        raw = await client.messages.with_raw_response.create(
            model=self.opts.model, max_tokens=max_tokens, system=p.system,
            messages=[{"role": "user", "content": p.user}], **extra)
        return self._answer(await raw.read(), raw.headers.get("content-type"))

    def _answer(self, body: bytes, content_type: str | None) -> Answer:
        data = json_object(body)
        content = data.get("content") if data is not None else None
        if data is not None and data.get("error") and not isinstance(content, list):
            # {"type": "error", "error": {"type": "overloaded_error", ...}} in a 200
            # answer: classified by its numeric code if it has one, else by its type.
            error = data["error"] if isinstance(data["error"], dict) else {"message": data["error"]}
            status = None if error.get("code") is not None else _ERROR_STATUS.get(str(error.get("type")), 500)
            raise AnswerFailed(error_in_body(self.opts, error, status=status))
        if data is None or not isinstance(content, list):
            raise AnswerFailed(not_the_api(self.opts, "Anthropic", body, content_type))
        text = "".join(b["text"] for b in content if isinstance(b, dict) and b.get("type") == "text"
                       and isinstance(b.get("text"), str))
        stop = data.get("stop_reason")
        refused = "the model refused to write this reply (stop_reason refusal)" \
            if stop == "refusal" else ""
        return answer_of(data, text, stop == "max_tokens", refused,
                         ("input_tokens", "output_tokens"))

    def _status_detail(self, exc: anthropic.APIStatusError) -> tuple[str, str | None]:
        return exc.api_message or exc.message, exc.error_code or exc.type


#: The Messages API's error types and the HTTP status each comes with.
_ERROR_STATUS = {"invalid_request_error": 400, "authentication_error": 401, "billing_error": 402,
                 "permission_error": 403, "not_found_error": 404, "request_too_large": 413,
                 "rate_limit_error": 429, "api_error": 500, "overloaded_error": 529}


def create(model: ModelConfig, pipeline: PipelineConfig, settings: Settings) -> AnthropicDrafter:
    """Check the options and build the drafter (no I/O, no secret read yet)."""
    return AnthropicDrafter(model, pipeline, settings)
