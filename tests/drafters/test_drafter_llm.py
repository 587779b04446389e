"""The OpenAI-compatible and Anthropic drafters, through the real SDKs, against the fake
model server in tests/fakes/llm.py. Every test runs for both providers."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from bot.config.load import load_settings
from bot.engine.build import build_drafter
from bot.errors import ConfigError, DrafterError, DrafterRetryable, DrafterSetupError
from bot.models import DraftRequest, Message
from tests.fakes.llm import FakeLLM
from tests.support.llm import (  # noqa: F401
    KEY_ENV,
    PROVIDERS,
    write_config,
)

SECRET = "sk-test-secret-value-123"


def make(tmp: Path, provider: str, fake: FakeLLM, **kw):
    url = fake.openai_url if provider == "openai" else fake.url
    settings = load_settings(write_config(tmp, provider, url, **kw))
    return build_drafter(settings.pipelines[0], settings)


def request(**kw) -> DraftRequest:
    m = dict(message_id="<q1@customer.example>", from_name="Alice Buyer",
             from_addr="alice@customer.example", reply_to="alice@customer.example",
             subject="Where is my order #1234?", date="2025-11-29T10:02:00+00:00",
             body="Hi, where is my order #1234? It was due Friday.\n\nAlice")
    m.update(kw.pop("message", {}))
    return DraftRequest("support", Message(**m), draft_key="support|test|q1|v1", **kw)


@pytest.fixture(autouse=True)
def api_key(monkeypatch):
    monkeypatch.setenv(KEY_ENV, SECRET)


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_a_draft_carries_the_model_text_and_its_token_usage(tmp_path, fake, provider):
    """One call: the body is the model's text, tokens come from the usage fields."""
    fake.script(fake.reply("  Hi Alice,\n\nyour parcel left on Monday.\n\n-- Anna  \n",
                           tokens_in=321, tokens_out=45))
    d = make(tmp_path, provider, fake)
    try:
        result = await d.draft(request())
    finally:
        await d.close()
    assert result.body == "Hi Alice,\n\nyour parcel left on Monday.\n\n-- Anna"
    assert (result.tokens_in, result.tokens_out) == (321, 45)
    [req] = fake.requests
    assert req.body["model"] == "test-model" and req.body["max_tokens"] == 1024
    assert req.body.get("temperature") == (0.2 if provider == "openai" else None)
    assert "tools" not in req.body  # the model can do nothing but write text
    # openai sends "Authorization: Bearer"; anthropic 2.x does too (older: x-api-key).
    assert SECRET in req.headers.get("authorization", "") + req.headers.get("x-api-key", "")
    system, user = req.texts()
    assert system.startswith("You are the support desk of Example Shop.")
    assert "-- Anna, Example Shop" in system and "language the sender wrote in" in system
    assert "Where is my order #1234?" in user and "alice@customer.example" in user
    assert "Where is my order" not in system


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_429_then_success_gives_one_draft_after_honouring_retry_after(tmp_path, fake, provider):
    fake.script(fake.error(429, "slow down", retry_after=0.4), fake.reply("Hello again"))
    d = make(tmp_path, provider, fake)
    started = time.monotonic()
    try:
        result = await d.draft(request())
    finally:
        await d.close()
    assert result.body == "Hello again"
    assert len(fake.requests) == 2
    assert fake.requests[1].at - fake.requests[0].at >= 0.4
    assert time.monotonic() - started >= 0.4


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_a_retry_after_beyond_the_cap_returns_the_item_to_the_queue_at_once(tmp_path, fake, provider):
    """Sitting out a 5-minute rate limit would hold the claim; the queue retries later."""
    fake.script(fake.error(429, "quota", retry_after=300))
    err = await _raised(make(tmp_path, provider, fake), DrafterRetryable)
    assert err.value.retry_after == 300 and "429" in str(err.value)
    assert len(fake.requests) == 1


@pytest.mark.parametrize("value,seconds", [
    ("inf", None), ("-inf", None), ("nan", None), ("Infinity", None), ("soon", None),
    ("1e308", 3600), ("31536000", 3600), ("Fri, 01 Jan 2100 00:00:00 GMT", 3600), ("90", 90),
])
def test_retry_after_is_finite_and_at_most_an_hour(value, seconds):
    from bot.drafters.failures import MAX_HOLD, retry_after_seconds

    assert MAX_HOLD == 3600
    assert retry_after_seconds({"retry-after": value}) == seconds


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_a_retry_after_of_a_year_holds_the_item_for_an_hour_at_most(tmp_path, fake, provider):
    fake.script(fake.error(429, "come back next year", retry_after=365 * 86400))
    err = await _raised(make(tmp_path, provider, fake), DrafterRetryable)
    assert err.value.retry_after == 3600 and "retry after 3600s" in str(err.value)
    assert len(fake.requests) == 1


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_an_infinite_retry_after_is_ignored_like_a_missing_one(tmp_path, fake, provider):
    fake.script(fake.error(429, "slow down", retry_after=float("inf")), fake.reply("Hello"))
    d = make(tmp_path, provider, fake)
    try:
        assert (await d.draft(request())).body == "Hello"  # retried after the backoff
    finally:
        await d.close()
    assert len(fake.requests) == 2


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_500_on_every_attempt_is_retryable_with_the_providers_reason(tmp_path, fake, provider):
    fake.script(*[fake.error(500, "upstream exploded", retry_after=0.01)] * 3)
    err = await _raised(make(tmp_path, provider, fake), DrafterRetryable)
    assert "HTTP 500" in str(err.value) and "upstream exploded" in str(err.value)
    assert "3 attempts" in str(err.value)
    assert len(fake.requests) == 3  # retries: 2, and the SDK's own retries are off


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_a_model_that_does_not_answer_in_time_is_retryable(tmp_path, fake, provider):
    """The request reached the model, which never answered: a timeout, retryable. (2 s,
    not less: on a loaded machine an SDK's first request can take longer than 0.3 s to
    arrive, and then the timeout is not the one this test is about.)"""
    model = f"    timeout: 2s\n    retries: 0\n    api_key_env: {KEY_ENV}\n"
    hold = fake.hold()
    fake.script(hold)
    d = make(tmp_path, provider, fake, model=model)
    try:
        with pytest.raises(DrafterRetryable) as err:
            await d.draft(request())
    finally:
        hold.release()
        await d.close()
    assert hold.arrived.is_set()
    assert "timeout" in str(err.value) and "2s" in str(err.value)
    assert len(fake.requests) == 1


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_an_answer_trickling_in_past_the_timeout_is_cut_off_as_a_timeout(tmp_path, fake, provider):
    """Every piece arrives well within the SDK's read timeout, so without a bound on
    the whole attempt this would succeed after ~4 s."""
    model = f"    timeout: 0.5s\n    retries: 0\n    api_key_env: {KEY_ENV}\n"
    fake.script(fake.reply("x" * 400, trickle=0.1))
    d = make(tmp_path, provider, fake, model=model)
    try:
        with pytest.raises(DrafterRetryable, match="timeout"):
            await d.draft(request())
    finally:
        await d.close()


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_a_slow_answer_within_the_timeout_is_a_draft(tmp_path, fake, provider):
    fake.script(fake.reply("took a while", delay=0.3))
    d = make(tmp_path, provider, fake)
    try:
        assert (await d.draft(request())).body == "took a while"
    finally:
        await d.close()


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_401_is_a_setup_error_naming_the_env_var_but_never_the_key(tmp_path, fake, provider):
    """A wrong key fails every item alike: the setup is wrong, not the item."""
    fake.script(fake.error(401, "invalid x-api-key"))
    err = await _raised(make(tmp_path, provider, fake), DrafterSetupError)
    text = str(err.value)
    assert KEY_ENV in text and "models.llm.api_key_env" in text and "HTTP 401" in text
    assert SECRET not in text
    assert len(fake.requests) == 1


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_403_and_404_are_setup_errors_saying_what_to_check(tmp_path, fake, provider):
    fake.script(fake.error(403, "no access to this model"), fake.error(404, "no such model"))
    denied, missing = await _two_setup_errors(make(tmp_path, provider, fake))
    assert "HTTP 403" in str(denied.value) and "no access to this model" in str(denied.value)
    assert KEY_ENV in str(denied.value) and "models.llm.model" in str(denied.value)
    assert "HTTP 404" in str(missing.value) and "no such model" in str(missing.value)
    assert "models.llm.model ('test-model')" in str(missing.value)
    assert "models.llm.base_url (http://127.0.0.1:" in str(missing.value)
    assert len(fake.requests) == 2  # no retries


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_a_403_for_flagged_input_fails_only_that_email(tmp_path, fake, provider):
    """OpenRouter answers 403 when a moderated model flags the input: one email's
    problem, so it fails that item (visible, replayable), not the whole pipeline."""
    fake.script(fake.error(403, "Your chosen model requires moderation and your input "
                                "was flagged for 'harassment'"))
    refused = await _raised(make(tmp_path, provider, fake), DrafterError)
    assert not isinstance(refused.value, (DrafterSetupError, DrafterRetryable))
    assert "refused this email's content (HTTP 403)" in str(refused.value)
    assert "flagged" in str(refused.value)


@pytest.mark.parametrize("message", [
    "Your access was terminated due to violation of our policies",
    "model not allowed: violates terms of your organization's guardrail policy",
])
def test_a_403_about_access_stays_a_setup_error_even_with_policy_words(message):
    from bot.drafters.failures import _about_the_content

    assert not _about_the_content(message)
    assert _about_the_content("Your chosen model requires moderation and your input was flagged")


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_a_web_server_refusing_the_post_is_a_setup_error_about_base_url(tmp_path, fake, provider):
    fake.script(fake.raw(b"<html>405 Not Allowed</html>", status=405))
    err = await _raised(make(tmp_path, provider, fake), DrafterSetupError)
    assert "HTTP 405" in str(err.value) and str(err.value).endswith("check models.llm.base_url")


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("status", [400, 413, 422])
async def test_a_refused_request_fails_only_its_item(tmp_path, fake, provider, status):
    fake.script(fake.error(status, "context too long"))
    err = await _raised(make(tmp_path, provider, fake), DrafterError)
    assert not isinstance(err.value, (DrafterRetryable, DrafterSetupError))
    assert f"HTTP {status}" in str(err.value) and "context too long" in str(err.value)
    assert len(fake.requests) == 1


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_an_exhausted_quota_is_a_setup_error_about_billing_not_a_rate_limit(tmp_path, fake, provider):
    """OpenAI's 429 insufficient_quota (and a 402) lasts until someone pays: retrying
    and holding the pipeline for a Retry-After would never end it."""
    fake.script(fake.error(429, "You exceeded your current quota", code="insufficient_quota"),
                fake.error(402, "Your credit balance is too low"))
    quota, credit = await _two_setup_errors(make(tmp_path, provider, fake))
    for err in (quota, credit):
        assert "check the billing/quota of the account" in str(err.value)
        assert KEY_ENV in str(err.value)
    assert "You exceeded your current quota" in str(quota.value)
    assert len(fake.requests) == 2  # no retries


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_a_missing_key_variable_is_a_setup_error_named_at_first_call_and_nothing_is_sent(
        tmp_path, fake, provider, monkeypatch):
    monkeypatch.delenv(KEY_ENV)
    d = make(tmp_path, provider, fake)  # building needs no secret (validate, start-up)
    with pytest.raises(DrafterSetupError) as err:
        await d.draft(request())
    await d.close()
    assert f"models.llm: environment variable {KEY_ENV} is not set" in str(err.value)
    assert fake.requests == []


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("content", [None, b"\xff\xfe not utf-8"])
async def test_a_missing_or_unreadable_prompt_file_is_a_setup_error_and_its_fix_needs_no_restart(
        tmp_path, fake, provider, content):
    d = make(tmp_path, provider, fake)
    prompt_file = tmp_path / "prompts" / "support.md"
    if content is None:
        prompt_file.unlink()
    else:
        prompt_file.write_bytes(content)
    try:
        with pytest.raises(DrafterSetupError) as err:
            await d.draft(request())
        assert fake.requests == []
        prompt_file.write_text("You are the support desk.\n")
        assert (await d.draft(request())).body
    finally:
        await d.close()
    text = str(err.value)
    assert "pipelines/support.yaml: drafter.prompt: cannot read the prompt file" in text
    assert str(prompt_file) in text
    assert ("No such file" if content is None else "not UTF-8") in text


async def test_a_wrong_key_keeps_the_queue_and_tells_the_operators_once(tmp_path, fake):
    """What the operator sees: no item is failed (no /replay for each), one notice that
    names the variable to fix."""
    from tests.support.engine_world import deploy

    fake.default = fake.error(401, "Incorrect API key provided")
    cfg = deploy(tmp_path, fake, emails=4, in_flight=2)
    cfg.write_text(cfg.read_text().replace("    model: m\n", f"    model: m\n    api_key_env: {KEY_ENV}\n"))
    by_status, cards = await _two_ticks(cfg)
    assert by_status == {"queued": 4}
    [note] = [n for n in cards.notes if "support" in n]
    assert KEY_ENV in note and "HTTP 401" in note and SECRET not in note
    assert "drafting failed" not in " ".join(cards.notes)


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_a_local_server_without_a_key_needs_no_variable(tmp_path, fake, provider):
    d = make(tmp_path, provider, fake, model="    timeout: 2s\n")
    try:
        assert (await d.draft(request())).body
    finally:
        await d.close()
    assert len(fake.requests) == 1


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_an_unreachable_server_is_retryable(tmp_path, provider):
    with FakeLLM() as gone:
        url = gone.openai_url if provider == "openai" else gone.url
    settings = load_settings(write_config(
        tmp_path, provider, url, model="    timeout: 2s\n    retries: 1\n    backoff: 10ms\n"))
    err = await _draft_error(settings, DrafterRetryable)
    assert "cannot connect" in str(err.value)


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("answer,reason", [("   \n ", "empty draft"),
                                           ("\u200b\u2800\ufeff\n\u200b", "only invisible characters"),
                                           ("x" * 20_001, "20,001 characters"),
                                           ("Dear Al", "cut off"),
                                           ("ECHO", "data block or a boundary line"),
                                           ("<<<END EMAIL>>>", "data block or a boundary line")])
async def test_an_unusable_answer_is_a_definite_error(tmp_path, fake, provider, answer, reason):
    echo = answer == "ECHO"  # the model parrots the request's data, boundaries and all
    fake.script(fake.reply(None if echo else answer, echo=echo,
                           finish="length" if reason == "cut off" else "stop"))
    err = await _raised(make(tmp_path, provider, fake), DrafterError)
    assert not isinstance(err.value, DrafterRetryable) and reason in str(err.value)
    assert err.value.tokens == 18  # paid for, though unusable


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_an_answer_stopped_by_a_content_filter_is_refused_not_offered_as_a_draft(
        tmp_path, fake, provider):
    """The text before the filter cut in is a fragment: it must never reach a card."""
    fake.script(fake.reply("Dear Alice, about your refund we", finish="content_filter"))
    err = await _raised(make(tmp_path, provider, fake), DrafterError)
    assert not isinstance(err.value, (DrafterRetryable, DrafterSetupError))
    assert ("content filter" if provider == "openai" else "stop_reason refusal") in str(err.value)
    assert "answer it by hand" in str(err.value)
    assert "about your refund" not in str(err.value)
    assert err.value.tokens == 18  # paid for, though unusable
    assert len(fake.requests) == 1


async def test_an_openai_refusal_is_refused_with_the_models_words(tmp_path, fake):
    fake.script(fake.reply("", refusal="I can't help with that request."))
    err = await _raised(make(tmp_path, "openai", fake), DrafterError)
    assert "the model refused to write this reply: I can't help with that request." in str(err.value)


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_the_regenerate_instruction_is_an_instruction_and_the_old_draft_is_data(
        tmp_path, fake, provider):
    d = make(tmp_path, provider, fake)
    try:
        await d.draft(request(instruction="Mention the 30-day refund window.",
                              previous_body="Hi Alice, it is on its way."))
    finally:
        await d.close()
    system, user = fake.requests[0].texts()
    assert "Mention the 30-day refund window." in system
    assert "Mention the 30-day refund window." not in user
    nonce = fake.requests[0].texts()[1].split("<<<EMAIL ")[1].split(">>>")[0]
    prev = user.split(f"<<<PREVIOUS DRAFT {nonce}>>>")[1].split(f"<<<END PREVIOUS DRAFT {nonce}>>>")[0]
    assert prev.strip() == "Hi Alice, it is on its way."
    assert "Hi Alice, it is on its way." not in system


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_a_schedule_slot_gets_a_writing_prompt_not_a_reply_prompt(tmp_path, fake, provider):
    d = make(tmp_path, provider, fake)
    try:
        await d.draft(request(message=dict(kind="slot", slot="2025-11-29T09:00", subject="",
                                           body="", from_addr="", from_name="")))
    finally:
        await d.close()
    system, user = fake.requests[0].texts()
    assert "scheduled slot 2025-11-29T09:00" in system
    assert "reply" not in system.split("Rules that always apply:")[1].splitlines()[1].lower()
    assert "Slot: 2025-11-29T09:00" in user


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_a_long_email_is_cut_to_max_input_with_a_visible_marker(tmp_path, fake, provider):
    d = make(tmp_path, provider, fake, drafter="  max_input: 1000\n")
    newest = "Please cancel order #99. " * 20  # ~500 chars, the part that matters
    history = "\n".join(f"> old line {i} " + "x" * 60 for i in range(500))
    try:
        await d.draft(request(message=dict(body=f"{newest}\n\nOn Mon, Shop wrote:\n{history}")))
    finally:
        await d.close()
    _, user = fake.requests[0].texts()
    assert newest.strip() in user  # the newest message survives whole
    assert "[truncated]" in user and "old line 0" in user and "old line 499" not in user
    assert len(user) < 1400


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_one_client_serves_many_drafts_and_close_releases_it(tmp_path, fake, provider):
    d = make(tmp_path, provider, fake)
    for _ in range(3):
        await d.draft(request())
    client = d._client
    await d.close()
    assert client is not None and d._client is None
    assert len(fake.requests) == 3


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_ping_makes_one_minimal_request(tmp_path, fake, provider):
    d = make(tmp_path, provider, fake)
    try:
        text = await d.ping()
    finally:
        await d.close()
    assert "ok" in text and fake.requests[0].body["max_tokens"] == 5


# -- configuration errors ---------------------------------------------------------------


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("model,expected", [
    ("    timeout: soon\n", "draftgate.yaml: models.llm.timeout: expected a duration"),
    ("    retries: -1\n", "draftgate.yaml: models.llm.retries: expected a whole number from 0 to 10"),
    ("    temprature: 0.3\n", "draftgate.yaml: models.llm.temprature: unknown key; did you mean 'temperature'?"),
    ("    api_key: sk-123\n", "draftgate.yaml: models.llm.api_key: never put the key in YAML"),
    ("    max_output_tokens: 0\n", "draftgate.yaml: models.llm.max_output_tokens: expected a whole number of at least 1"),
])
def test_bad_model_options_name_the_file_and_path(tmp_path, fake, provider, model, expected):
    with pytest.raises(ConfigError) as err:
        make(tmp_path, provider, fake, model=model)
    assert expected in str(err.value)
    assert "sk-123" not in str(err.value)


def test_temperature_is_checked_and_refused_where_the_api_has_none(tmp_path, fake):
    with pytest.raises(ConfigError) as err:
        make(tmp_path, "openai", fake, model="    temperature: 7\n")
    assert "draftgate.yaml: models.llm.temperature: expected a number from 0 to 2" in str(err.value)
    with pytest.raises(ConfigError) as err:
        make(tmp_path, "anthropic", fake, model="    temperature: 0.3\n")
    assert "draftgate.yaml: models.llm.temperature: the anthropic provider takes no temperature" in str(err.value)


@pytest.mark.parametrize("provider", PROVIDERS)
def test_a_lease_shorter_than_the_calls_worst_case_is_refused(tmp_path, fake, provider):
    with pytest.raises(ConfigError) as err:
        make(tmp_path, provider, fake, model="    timeout: 60s\n    retries: 2\n", lease="2m")
    assert "pipelines/support.yaml: lease: 120s" in str(err.value)
    assert "drafted twice" in str(err.value)


SLOW = f"    timeout: 0.5s\n    retries: 2\n    backoff: 10ms\n    api_key_env: {KEY_ENV}\n"


@pytest.mark.parametrize("provider", PROVIDERS)
def test_a_lease_whose_90_percent_cannot_hold_every_attempt_is_refused(tmp_path, fake, provider):
    """3 attempts of 0.5 s plus 30 ms backoff need 1.53 s; a 1.6 s lease is longer, but
    a draft may use only 90% of it (1.44 s), so the third attempt would never be made."""
    with pytest.raises(ConfigError) as err:
        make(tmp_path, provider, fake, model=SLOW, lease="1.6s")
    text = str(err.value)
    assert "pipelines/support.yaml: lease: 1.6s leaves 1.44s for one draft (90% of the lease" in text
    assert "lease x 0.9 must be longer than 1.53s" in text and "models.llm.timeout" in text


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_a_lease_that_validates_gets_every_attempt(tmp_path, fake, provider):
    holds = [fake.hold() for _ in range(3)]  # no answer until the test is over
    fake.script(*holds)
    # 90% of 4 s leaves 3.6 s for 1.53 s of attempts: room for a busy machine's overhead
    # per call (the boundary itself is the refusal test above).
    d = make(tmp_path, provider, fake, model=SLOW, lease="4s")
    try:
        with pytest.raises(DrafterRetryable) as err:
            await d.draft(request())
    finally:
        for h in holds:
            h.release()
        await d.close()
    assert "timeout" in str(err.value) and "after 3 attempts" in str(err.value)
    assert all(h.arrived.is_set() for h in holds) and len(fake.requests) == 3


@pytest.mark.parametrize("provider", PROVIDERS)
def test_unknown_drafter_options_name_the_pipeline_file(tmp_path, fake, provider):
    with pytest.raises(ConfigError) as err:
        make(tmp_path, provider, fake, drafter="  signatur: x\n  max_input: 10\n")
    text = str(err.value)
    assert "pipelines/support.yaml: drafter.signatur: unknown key; did you mean 'signature'?" in text
    assert "pipelines/support.yaml: drafter.max_input: expected at least 200" in text


def _make_store(tmp: Path) -> None:
    import asyncio

    from bot.store import create_store

    async def make() -> None:
        async with create_store(f"sqlite:///{tmp}/state.db"):
            pass

    asyncio.run(make())


def test_doctor_checks_the_model_endpoint_with_one_minimal_request(tmp_path, fake, capsys):
    """`draftgate doctor`: ok for a healthy endpoint; a 401 names the variable, not the key."""
    import logging

    from bot.__main__ import main

    cfg = write_config(tmp_path, "openai", fake.openai_url)
    _make_store(tmp_path)  # doctor checks a store; it never creates one
    handlers = logging.root.handlers[:]
    try:
        assert main(["doctor", "-c", str(cfg)]) == 0
        healthy = capsys.readouterr().out
        fake.script(fake.error(401, "bad key"))
        assert main(["doctor", "-c", str(cfg)]) == 1
        broken = capsys.readouterr().out
    finally:
        logging.root.handlers[:] = handlers
    assert "model llm" in healthy and "test-model" in healthy and "ok" in healthy
    assert "❌ model llm" in broken and KEY_ENV in broken and SECRET not in broken
    assert [r.body["max_tokens"] for r in fake.requests] == [5, 5]


# -- credentials never shown --------------------------------------------------------------


def _with_credentials(url: str) -> str:
    return url.replace("http://", "http://proxyuser:s3cr3tPW@")


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_credentials_in_base_url_never_reach_the_error_text(tmp_path, provider):
    with FakeLLM() as gone:
        url = gone.openai_url if provider == "openai" else gone.url
    settings = load_settings(write_config(
        tmp_path, provider, _with_credentials(url), model="    timeout: 2s\n    retries: 0\n"))
    err = await _draft_error(settings, DrafterRetryable)
    text = str(err.value)
    assert "cannot connect to http://***@127.0.0.1:" in text
    assert "s3cr3tPW" not in text and "proxyuser" not in text


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_a_provider_echoing_the_key_or_the_url_credentials_is_redacted(tmp_path, fake, provider):
    fake.script(fake.error(400, f"bad request from proxyuser:s3cr3tPW with key {SECRET}"))
    url = fake.openai_url if provider == "openai" else fake.url
    settings = load_settings(write_config(tmp_path, provider, _with_credentials(url)))
    err = await _draft_error(settings, DrafterError)
    text = str(err.value)
    assert "bad request from" in text and "with key ***" in text
    assert SECRET not in text and "s3cr3tPW" not in text


def test_doctor_hides_credentials_in_the_base_url(tmp_path, fake, capsys):
    import logging

    from bot.__main__ import main

    cfg = write_config(tmp_path, "openai", _with_credentials(fake.openai_url))
    _make_store(tmp_path)
    handlers = logging.root.handlers[:]
    try:
        assert main(["doctor", "-c", str(cfg)]) == 0
        out = capsys.readouterr().out
    finally:
        logging.root.handlers[:] = handlers
    assert "ok" in out and "http://***@127.0.0.1:" in out
    assert "s3cr3tPW" not in out and "proxyuser" not in out


@pytest.mark.parametrize("url,shown", [
    ("postgresql://app:pw@db.example/state", "postgresql://app:***@db.example/state"),
    ("postgresql://app@db.example/state", "postgresql://app@db.example/state"),
    ("postgresql://db.example/state?password=pw&schema=s", "postgresql://db.example/state?password=***&schema=s"),
])
def test_the_store_url_keeps_its_user_and_hides_its_password(url, shown):
    from bot.store.postgres import redact_url

    assert redact_url(url) == shown


# -- an HTTP 200 that is not a draft ------------------------------------------------------

API_NAME = {"openai": "an OpenAI-compatible API", "anthropic": "an Anthropic API"}


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("body,content_type,seen", [
    (b"<!doctype html><html><body>Open WebUI</body></html>", "text/html", "Open WebUI"),
    (b"", "application/json", "an empty body"),
    (b"", "text/plain", "an empty body"),
    (b"Please log in to the guest Wi-Fi", "text/plain", "guest Wi-Fi"),
    ({"status": "ok"}, "application/json", "status"),
    ([1, 2], "application/json", "[1, 2]"),
    (b"{not json", "application/json", "{not json"),
])
async def test_a_200_that_is_not_the_api_is_a_setup_error_naming_base_url(
        tmp_path, fake, provider, body, content_type, seen):
    """A web UI, proxy or captive portal where the API should be: every item would
    fail alike, so it is the setup; no traceback, no retries."""
    fake.script(fake.raw(body, content_type))
    url = fake.openai_url if provider == "openai" else fake.url
    settings = load_settings(write_config(tmp_path, provider, _with_credentials(url)))
    err = await _draft_error(settings, DrafterSetupError)
    text = str(err.value)
    shown = _with_credentials(url).replace("proxyuser:s3cr3tPW", "***")
    assert f"the server at {shown} did not answer like {API_NAME[provider]}" in text
    assert text.endswith("check models.llm.base_url") and seen in text
    assert "s3cr3tPW" not in text
    assert len(fake.requests) == 1


async def test_a_web_page_at_base_url_keeps_the_queue_and_tells_the_operators_once(tmp_path, fake, caplog):
    """What the operator sees: items wait, one notice naming base_url, no traceback."""
    import logging

    from tests.support.engine_world import deploy

    caplog.set_level(logging.INFO)
    fake.default = fake.raw(b"<!doctype html><html>Welcome to the portal</html>")
    by_status, cards = await _two_ticks(deploy(tmp_path, fake, emails=2, in_flight=1))
    assert by_status == {"queued": 2}
    [note] = [n for n in cards.notes if "support" in n]
    assert "did not answer like an OpenAI-compatible API" in note and "models.llm.base_url" in note
    assert [r.getMessage() for r in caplog.records if r.exc_info] == []


def _openai_error_200(code, message="Provider returned error", **extra) -> dict:
    return {"id": "gen-1", "error": {"code": code, "message": message, **extra}}


async def test_an_error_object_in_a_200_answer_is_retried_like_its_http_status(tmp_path, fake):
    """OpenRouter answers 200 with {"error": {"code": 502, ...}} when the upstream fails."""
    fake.script(fake.raw(_openai_error_200(502, "upstream 502")), fake.reply("Hello Alice"))
    d = make(tmp_path, "openai", fake)
    try:
        assert (await d.draft(request())).body == "Hello Alice"
    finally:
        await d.close()
    assert len(fake.requests) == 2


@pytest.mark.parametrize("code,error,says", [
    (502, DrafterRetryable, "server error (error 502 in an HTTP 200 answer): Provider returned error"),
    ("429", DrafterRetryable, "rate limited (error 429 in an HTTP 200 answer)"),
    (None, DrafterRetryable, "server error (error 502 in an HTTP 200 answer)"),
    (401, DrafterSetupError, f"check the API key in environment variable {KEY_ENV}"),
    (404, DrafterSetupError, "check models.llm.model"),
    ("insufficient_quota", DrafterSetupError, "check the billing/quota of the account"),
    (400, DrafterError, "request refused (error 400 in an HTTP 200 answer): Provider returned error"),
])
async def test_an_error_object_in_a_200_answer_is_classified_by_its_code(tmp_path, fake, code, error, says):
    fake.default = fake.raw(_openai_error_200(code))
    err = await _raised(make(tmp_path, "openai", fake), DrafterError)
    assert type(err.value) is error and says in str(err.value)
    assert len(fake.requests) == (3 if error is DrafterRetryable else 1)


async def test_a_choice_that_finished_with_an_error_is_classified_by_its_code(tmp_path, fake):
    choice = {"index": 0, "finish_reason": "error", "message": {"role": "assistant", "content": ""},
              "error": {"code": 503, "message": "upstream overloaded"}}
    fake.default = fake.raw({"id": "gen-2", "model": "m", "choices": [choice]})
    err = await _raised(make(tmp_path, "openai", fake), DrafterRetryable)
    assert "error 503 in an HTTP 200 answer" in str(err.value) and "upstream overloaded" in str(err.value)
    assert len(fake.requests) == 3


async def test_an_anthropic_error_event_in_a_200_answer_is_classified_by_its_type(tmp_path, fake):
    overloaded = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    fake.script(fake.raw(overloaded), fake.raw(overloaded), fake.reply("Hello Alice"))
    d = make(tmp_path, "anthropic", fake)
    try:
        assert (await d.draft(request())).body == "Hello Alice"
        fake.script(fake.raw({"type": "error", "error": {"type": "authentication_error",
                                                          "message": "invalid x-api-key"}}))
        with pytest.raises(DrafterSetupError) as err:
            await d.draft(request())
    finally:
        await d.close()
    assert "invalid x-api-key" in str(err.value) and KEY_ENV in str(err.value)
    assert len(fake.requests) == 4


async def _two_ticks(cfg):
    """Run the support pipeline of ``cfg`` for two ticks five minutes apart through the
    real engine; return its drafts by status and the recording channel."""
    from tests.support.engine_world import Clock, World

    w = World(cfg, Clock())
    try:
        engine, cards = await w.engine()
        await engine.tick("support")
        w.clock.t += 300
        await engine.tick("support")
        return await w.store.count_by_status("support"), cards
    finally:
        await w.close()


async def _raised(d, kind):
    """Draft one request with drafter ``d`` (closed after); the raised ``kind``, as
    pytest's ExceptionInfo."""
    try:
        with pytest.raises(kind) as info:
            await d.draft(request())
    finally:
        await d.close()
    return info


async def _two_setup_errors(d):
    """Draft two requests with drafter ``d`` (closed after): the DrafterSetupError each
    raised, as pytest's ExceptionInfo."""
    try:
        with pytest.raises(DrafterSetupError) as first:
            await d.draft(request())
        with pytest.raises(DrafterSetupError) as second:
            await d.draft(request())
    finally:
        await d.close()
    return first, second


async def _draft_error(settings, kind):
    """``_raised`` with the drafter of the settings' first pipeline."""
    return await _raised(build_drafter(settings.pipelines[0], settings), kind)
