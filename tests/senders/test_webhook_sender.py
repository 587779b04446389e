"""The webhook sender against a real HTTP receiver: one POST per send, and every
outcome mapped to sent / send_failed / send_unknown."""

from __future__ import annotations

import pytest

from bot.config.load import PipelineConfig, Settings
from bot.config.options import WebhookSenderOptions
from bot.errors import ConfigError, SendFailed, SendUnknown
from bot.mail.reply import reply_message_id
from bot.models import Draft, Message, draft_key
from bot.senders import webhook
from bot.stages import Sender
from tests._stage import pipeline
from tests.fakes.webhook import FakeWebhook
from tests.support.configs import write_raw
from tests.support.fixtures import fake_webhook

ALICE = Message(message_id="<order-1234@customer.example>", from_name="Alice Buyer",
                from_addr="alice@customer.example", reply_to="alice@customer.example",
                subject="Where is my order #1234?")


def _draft(item="<order-1234@customer.example>", message=ALICE) -> Draft:
    return Draft(id=7, key=draft_key("support", "maildir", item, "v1"), pipeline="support",
                 scope="maildir", item_id=item, recipe="v1", status="sending", message=message,
                 body="Hi Alice,\n\nIt ships today.\n", version=2)


def _pipeline(**sender) -> PipelineConfig:
    return pipeline(source={"type": "maildir", "path": "inbox"},
                    sender={"type": "webhook", **sender})


def _create(**opts) -> webhook.WebhookSender:
    return webhook.create(_pipeline(**opts), Settings(file="draftgate.yaml", base_dir=".",
                                                      store="x", pipelines=[]))


hook = fake_webhook  # the fixture: a fake webhook receiver (support/fixtures.py)


@pytest.fixture
async def sender(hook):
    s = _create(url=hook.url + "/hooks/draftgate", timeout="0.5s", status_url=hook.url + "/status")
    yield s
    await s.close()


async def test_posts_json_with_idempotency_key(hook, sender, monkeypatch):
    assert isinstance(sender, Sender)
    d = _draft()
    result = await sender.send(d)
    assert result.sent_id == "wh-1"
    [req] = hook.posts
    assert req.path == "/hooks/draftgate"
    assert req.headers["Idempotency-Key"] == d.key
    assert req.headers["Content-Type"] == "application/json"
    assert "Authorization" not in req.headers
    assert req.json() == {
        "key": d.key, "pipeline": "support", "item_id": "<order-1234@customer.example>",
        "to": "alice@customer.example", "subject": "Re: Where is my order #1234?",
        "in_reply_to": "<order-1234@customer.example>", "message_id": reply_message_id(d),
        "body": "Hi Alice,\n\nIt ships today.\n", "version": 2}


async def test_secret_is_sent_as_bearer_and_never_shown(hook, monkeypatch):
    monkeypatch.setenv("HOOK_SECRET", "s3cr3t-value")
    s = _create(url=hook.url + "/h?token=also-secret", secret_env="HOOK_SECRET", timeout="0.5s")
    try:
        await s.send(_draft())
        assert hook.posts[0].headers["Authorization"] == "Bearer s3cr3t-value"
        hook.mode = "bad"
        with pytest.raises(SendFailed) as err:
            await s.send(_draft("<other@x>"))
        assert "s3cr3t" not in str(err.value) and "also-secret" not in str(err.value)
    finally:
        await s.close()


# mode -> (exception, text in the message)
OUTCOMES = [
    ("bad", SendFailed, "answered 400: {\"error\": \"field 'to' is not an address we serve\"}"),
    ("redirect", SendFailed, "answered 307"),
    ("error", SendUnknown, "answered 500"),
    ("busy", SendUnknown, "answered 429"),
    ("drop", SendUnknown, "connection lost before the answer"),
    ("reset", SendUnknown, "connection lost before the answer"),
    ("hang", SendUnknown, "no answer within 0.5s"),
]


@pytest.mark.parametrize("mode,exc,text", OUTCOMES, ids=[o[0] for o in OUTCOMES])
async def test_outcome_mapping_with_exactly_one_post(hook, sender, mode, exc, text):
    """Definite refusals fail; anything that may have arrived is unknown. Never a
    second POST, whatever happened to the first."""
    hook.mode = mode
    with pytest.raises(exc) as err:
        await sender.send(_draft())
    assert text in str(err.value)
    hook.release()
    assert len(hook.posts) == 1


async def test_nothing_listening_is_a_definite_failure():
    with FakeWebhook() as gone:
        url = gone.url
    s = _create(url=url + "/h", timeout="0.5s")
    try:
        with pytest.raises(SendFailed, match="could not connect.*nothing was sent"):
            await s.send(_draft())
    finally:
        await s.close()


async def test_unset_secret_env_fails_before_anything_is_sent(hook, monkeypatch):
    """validate passes without the secret; the send says which variable to export."""
    monkeypatch.delenv("DG_TEST_UNSET_VAR", raising=False)
    s = _create(url=hook.url + "/h", secret_env="DG_TEST_UNSET_VAR")
    with pytest.raises(SendFailed, match=r"pipelines/support.yaml: sender.secret_env: environment "
                                         r"variable DG_TEST_UNSET_VAR is not set"):
        await s.send(_draft())
    assert hook.requests == []
    await s.close()


async def test_answer_without_id_uses_the_key(hook, sender):
    hook.mode = "no_id"
    d = _draft()
    assert (await sender.send(d)).sent_id == d.key


async def test_check_asks_the_status_url(hook, sender):
    d = _draft()
    assert await sender.check(d) is None  # 404: certainly not there
    await sender.send(d)
    assert await sender.check(d) == "wh-1"
    assert [r.method for r in hook.requests] == ["GET", "POST", "GET"]


async def test_check_without_status_url_cannot_tell(hook):
    s = _create(url=hook.url + "/h")
    with pytest.raises(SendUnknown, match="ask the receiver"):
        await s.check(_draft())
    assert hook.requests == []
    await s.close()


async def test_non_ascii_key_is_percent_encoded_in_the_header(hook, sender):
    d = _draft(item="<café@example.fr>")
    await sender.send(d)
    req = hook.posts[0]
    assert req.headers["Idempotency-Key"] == d.key.replace("é", "%C3%A9")
    assert req.json()["key"] == d.key
    assert await sender.check(d) == "wh-1"


async def test_slot_post_has_no_recipient(hook, sender):
    m = Message(kind="slot", slot="2026-11-30T09:00", subject="Weekly product tip")
    await sender.send(_draft(item="2026-11-30T09:00", message=m))
    body = hook.posts[0].json()
    assert (body["to"], body["subject"], body["in_reply_to"]) == ("", "Weekly product tip", "")


async def test_client_is_created_lazily_and_closed(hook):
    s = _create(url=hook.url + "/h")
    assert s._client is None
    await s.send(_draft())
    client = s._client
    await s.close()
    assert client.is_closed and s._client is None


@pytest.mark.parametrize("opts,expected", [
    ({}, "pipelines/support.yaml: sender.url: missing"),
    ({"url": "ftp://x"}, "pipelines/support.yaml: sender.url: expected an http:// or https:// URL"),
    ({"url": "https://u:p@x/h"}, "pipelines/support.yaml: sender.url: do not put credentials"),
    ({"url": "https://x/h", "timeout": "soon"}, "pipelines/support.yaml: sender.timeout: expected a duration"),
    ({"url": "https://x/h", "secret": "abc"}, "pipelines/support.yaml: sender.secret: never put the secret"),
    ({"url": "https://x/h", "retries": 3}, "pipelines/support.yaml: sender.retries: unknown key"),
])
def test_create_reports_bad_options(opts, expected):
    with pytest.raises(ConfigError) as err:
        _create(**opts)
    assert len(err.value.errors) == 1 and err.value.errors[0].startswith(expected), err.value.errors


@pytest.mark.parametrize("opts,expected", [
    ({"url": "http://[::1"}, "pipelines/support.yaml: sender.url: expected an http:// or "
                             "https:// URL, got 'http://[::1' (Invalid IPv6 URL)"),
    ({"url": "http://h:abc/x"}, "pipelines/support.yaml: sender.url: expected an http:// or "
                                "https:// URL, got 'http://h:abc/x' (Port could not be cast"),
    ({"url": "http://h:99999/x"}, "pipelines/support.yaml: sender.url: expected an http:// or "
                                  "https:// URL, got 'http://h:99999/x' (Port out of range"),
    ({"url": "https://x/h", "status_url": "http://x:0/s"},
     "pipelines/support.yaml: sender.status_url: expected an http:// or https:// URL"),
    ({"url": "https://x/h", "secret_env": ""},
     "pipelines/support.yaml: sender.secret_env: expected the name of an environment "
     "variable, like WEBHOOK_SECRET, got ''"),
])
def test_create_reports_urls_that_would_fail_at_send_time(opts, expected):
    with pytest.raises(ConfigError) as err:
        _create(**opts)
    assert len(err.value.errors) == 1 and err.value.errors[0].startswith(expected), err.value.errors


def test_validate_names_a_malformed_webhook_url_instead_of_a_traceback(tmp_path, capsys):
    from bot.__main__ import main

    cfg = write_raw(tmp_path, {"a.yaml": "name: a\nsource: {type: maildir, path: inbox}\n"
                                         "sender: {type: webhook, url: 'http://[::1'}\n"},
                    "store: sqlite:///s.db\n")
    assert main(["validate", "-c", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert "pipelines/a.yaml: sender.url: expected an http:// or https:// URL" in err
    assert "Traceback" not in err


@pytest.mark.parametrize("secret", ["line\nbreak", "caf\u00e9", "tab\x7fdel"])
async def test_a_secret_no_header_can_carry_is_a_definite_failure(hook, monkeypatch, secret):
    """It used to leave as UnicodeEncodeError or h11's LocalProtocolError: send_unknown,
    although nothing had been written."""
    monkeypatch.setenv("HOOK_SECRET", secret)
    s = _create(url=hook.url + "/h", secret_env="HOOK_SECRET", timeout="0.5s")
    try:
        with pytest.raises(SendFailed) as err:
            await s.send(_draft())
    finally:
        await s.close()
    assert str(err.value) == (
        "pipelines/support.yaml: sender.secret_env: environment variable HOOK_SECRET holds a "
        "character an HTTP header cannot carry (a line break, a control character or a "
        "non-ASCII letter); export the token alone. Nothing was sent.")
    assert secret not in str(err.value) and hook.requests == []


async def test_a_header_refused_on_the_wire_is_a_definite_failure(hook, sender, monkeypatch):
    monkeypatch.setattr(webhook, "header_key", lambda key: "two\nlines")
    with pytest.raises(SendFailed, match=r"webhook http://127.0.0.1:\d+/hooks/draftgate: the "
                                         r"request could not be sent \(LocalProtocolError: "
                                         r".*\); nothing was sent"):
        await sender.send(_draft())
    assert hook.requests == []


@pytest.mark.parametrize("url, shown", [
    ("http://h:abc/x", "http://h:abc/x"),
    ("http://[::1/x", "http://[::1/x"),
    ("http://127.0.0.1:99999/x?token=t0k", "http://127.0.0.1:99999/x"),
])
async def test_a_url_that_cannot_be_used_fails_definitely_without_a_traceback(url, shown):
    """A sender built past validation (an older config) with a URL that cannot work:
    InvalidURL, or an OverflowError from the socket for port 99999."""
    s = webhook.WebhookSender(WebhookSenderOptions(url, timeout=0.5),
                              where="pipelines/support.yaml: sender")
    try:
        with pytest.raises(SendFailed) as err:
            await s.send(_draft())
    finally:
        await s.close()
    assert str(err.value) == (f"pipelines/support.yaml: sender.url: {shown} is not a usable "
                              f"http(s) URL; fix it (draftgate validate says why); nothing "
                              f"was sent")
