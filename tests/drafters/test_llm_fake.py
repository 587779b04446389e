"""The fake model server refuses what OpenAI and Anthropic refuse, so a test passing
against it means the providers would take the request too.

Driven by the real ``openai`` and ``anthropic`` SDKs (and draftgate's own embedder):
an undocumented top-level field or a structured-output schema that strict mode
rejects is a 400 in the provider's error shape; draftgate's own requests (drafts,
triage, embeddings) are taken.
"""

from __future__ import annotations

import json

import anthropic
import openai
import pytest

from bot.context.embedders import RemoteEmbedder
from bot.drafters.triage import SCHEMA
from tests.fakes.llm import request_problem

MESSAGES = [{"role": "user", "content": "Where is my order?"}]
OPEN = {"type": "object", "properties": {"action": {"type": "string"}}, "required": ["action"]}


async def test_openai_refuses_an_unknown_field_and_a_schema_strict_mode_rejects(fake):
    client = openai.AsyncOpenAI(api_key="sk-test", base_url=fake.openai_url, max_retries=0)
    try:
        with pytest.raises(openai.BadRequestError, match="Unrecognized request argument "
                                                          "supplied: max_output_tokens"):
            await client.chat.completions.create(model="m", messages=MESSAGES,
                                                 extra_body={"max_output_tokens": 5})
        with pytest.raises(openai.BadRequestError, match="'additionalProperties' is required"):
            await client.chat.completions.create(
                model="m", messages=MESSAGES, response_format={
                    "type": "json_schema",
                    "json_schema": {"name": "answer", "strict": True, "schema": OPEN}})
        partial = {**SCHEMA, "required": ["action"]}
        with pytest.raises(openai.BadRequestError, match="every key in properties"):
            await client.chat.completions.create(
                model="m", messages=MESSAGES, response_format={
                    "type": "json_schema",
                    "json_schema": {"name": "answer", "strict": True, "schema": partial}})
        assert fake.requests == [] and len(fake.refused) == 3
        fake.script(fake.reply(json.dumps({"action": "reply", "reason": "a question"})))
        ok = await client.chat.completions.create(
            model="m", messages=MESSAGES, max_tokens=200, response_format={
                "type": "json_schema",
                "json_schema": {"name": "answer", "strict": True, "schema": SCHEMA}})
        assert json.loads(ok.choices[0].message.content)["action"] == "reply"
    finally:
        await client.close()


async def test_anthropic_refuses_an_unknown_field_and_an_open_output_schema(fake):
    client = anthropic.AsyncAnthropic(api_key="sk-ant-test", base_url=fake.url, max_retries=0)
    try:
        with pytest.raises(anthropic.BadRequestError, match="temperature"):
            await client.messages.create(model="m", max_tokens=50, messages=MESSAGES,
                                         extra_body={"temperature": 0.2})
        with pytest.raises(anthropic.BadRequestError, match="additionalProperties"):
            await client.messages.create(
                model="m", max_tokens=50, messages=MESSAGES,
                output_config={"format": {"type": "json_schema", "schema": OPEN}})
        assert fake.requests == [] and len(fake.refused) == 2
        ok = await client.messages.create(
            model="m", max_tokens=50, system="Sort email.", messages=MESSAGES,
            output_config={"format": {"type": "json_schema", "schema": SCHEMA}})
        assert ok.content[0].text
    finally:
        await client.close()


async def test_the_embedder_is_answered_with_unit_vectors_and_an_empty_text_is_refused(fake):
    emb = RemoteEmbedder("llm", fake.openai_url, "text-embedding-3-small", "sk-test", 10)
    try:
        m = await emb.embed(["where is my order", "my order is late", "invoice attached"])
        assert m.shape == (3, fake.DIM)
        assert all(abs(float((row * row).sum()) - 1) < 1e-5 for row in m)
        assert float(m[0] @ m[1]) > float(m[0] @ m[2])
        with pytest.raises(openai.BadRequestError, match="empty string"):
            await emb.embed(["fine", ""])
    finally:
        await emb.close()
    [(req, _)] = fake.refused
    assert req.path == "/v1/embeddings"


@pytest.mark.parametrize("path,body,problem", [
    ("/v1/chat/completions", {"model": "m"}, "missing required parameter: 'messages'"),
    ("/v1/chat/completions", {"model": "m", "messages": [], "tempreature": 1},
     "Unrecognized request argument supplied: tempreature"),
    ("/v1/chat/completions", {"model": "m", "messages": [], "response_format": {
        "type": "json_schema", "json_schema": {"name": "an answer", "strict": True,
                                               "schema": SCHEMA}}}, "json_schema.name"),
    ("/v1/chat/completions", {"model": "m", "messages": [], "response_format": {
        "type": "json_schema", "json_schema": {"name": "a", "strict": True,
                                               "schema": {"type": "array"}}}},
     "the root must be of type object"),
    ("/v1/messages", {"model": "m", "messages": []}, "missing required parameter: 'max_tokens'"),
    ("/v1/messages", {"model": "m", "messages": [], "max_tokens": 5,
                      "output_config": {"format": {"type": "json", "schema": SCHEMA}}},
     "expected {type: json_schema, schema}"),
    ("/v1/embeddings", {"model": "m", "input": []}, "cannot be an empty string or an empty list"),
    ("/v1/embeddings", {"model": "m", "input": "x", "encoding": "float"},
     "Unrecognized request argument supplied: encoding"),
])
def test_request_problem_names_what_the_provider_would_refuse(path, body, problem):
    assert problem in (request_problem(path, body) or "")
