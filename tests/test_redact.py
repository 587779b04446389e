"""No secret leaves the process, and no stranger's text reaches a log line raw.

The real CLI (``python -m bot run -vv``, ``doctor -vv``) runs against the fakes:
Telegram, Gmail, an OpenAI-compatible model and a webhook receiver that echoes the
request's headers (``Authorization: Bearer <secret>`` included) in its error answer.
Nothing it logs, stores, puts on a card or sends as a notice may carry the bot token,
the model key, the webhook secret, the Gmail OAuth tokens or the client secret; and a
stranger's terminal escapes and bidi controls are logged escaped.
"""

from __future__ import annotations

import io
import logging
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from urllib.parse import quote

import pytest

from bot import redact
from bot.approvals import cards
from bot.config.load import Settings
from bot.errors import SendFailed
from bot.models import Draft, Message, draft_key
from bot.senders import webhook
from tests import _stage
from tests._proc import ROOT, sqlite_rows
from tests.fakes.gmail import FakeGmail, simple_message
from tests.fakes.llm import FakeLLM
from tests.fakes.telegram import FakeTelegram
from tests.fakes.webhook import FakeWebhook
from tests.support.gmail_telegram import gmail_telegram_deployment

ANNA, STRANGER, CHAT, OPS = 42, 666, 1001, 1002
TOKEN = "123456:SECRET-bot-token-AAAA"
MODEL_KEY = "sk-SECRET-model-key-BBBB"
HOOK_SECRET = "whsec-SECRET-hook-CCCC"
ACCESS = "ya29.SECRET-access-DDDD"
REFRESH = "1//SECRET-refresh-EEEE"
CLIENT_SECRET = "csecret"  # what write_token_file puts in every token file
ENV = {"DG_RD_TOKEN": TOKEN, "DG_RD_MODEL_KEY": MODEL_KEY, "DG_RD_HOOK": HOOK_SECRET}
#: A stranger's command: a colour escape and a right-to-left override.
HOSTILE = "/start\x1b[31mRED\u202eevil"


def _leaks(text: str, extra: tuple[str, ...] = ()) -> list[str]:
    """Each secret (also percent-encoded, as in a URL) that ``text`` contains."""
    found = []
    for secret in (TOKEN, MODEL_KEY, HOOK_SECRET, ACCESS, REFRESH, CLIENT_SECRET) + extra:
        for form in {secret, quote(secret, safe="")}:
            if form in text:
                found.append(form)
    return found


def _deployment(tmp: Path, tg: FakeTelegram, gmail: FakeGmail, llm: FakeLLM,
                hook: FakeWebhook, *, expired: bool) -> Path:
    return gmail_telegram_deployment(tmp, f"""\
        name: support
        schedule: 1h
        source: {{type: gmail, account: support, query: "in:inbox", backfill: 5}}
        drafter: {{model: local, prompt: prompt.md}}
        approval: {{channel: telegram}}
        sender: {{type: webhook, url: "{hook.url}/hooks/draftgate", secret_env: DG_RD_HOOK}}
        """, store=f"sqlite:///{tmp}/state.db", tg=tg, gmail=gmail, llm=llm,
        token_env="DG_RD_TOKEN", operators=[ANNA], chat=CHAT, ops_chat=OPS,
        token={"expired": expired, "token": ACCESS, "refresh_token": REFRESH},
        model={"api_key_env": "DG_RD_MODEL_KEY"})


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI", "DG_RD_"))}
    return dict(env, **ENV)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_run_vv_through_a_whole_flow_shows_no_secret_and_escapes_a_strangers_text(tmp_path):
    """`run -vv` (debug logs of PTB, httpx, googleapiclient, openai...), a Gmail token
    refresh, a draft, a card, a stranger's hostile command, an approval and a webhook
    receiver that echoes our Authorization header in its 500: no secret in the log,
    in drafts.error, in the runs, in the audit, on the card or in the ops notice; the
    stranger's escape and bidi control are logged escaped."""
    log = tmp_path / "bot.log"
    db = tmp_path / "state.db"
    with FakeTelegram(token=TOKEN) as tg, FakeGmail() as gmail, FakeLLM() as llm, \
            FakeWebhook() as hook:
        hook.mode = "echo"  # 500 with the request headers in the body
        gmail.add_message(simple_message(1))
        cfg = _deployment(tmp_path, tg, gmail, llm, hook, expired=True)
        with log.open("ab") as out:
            proc = subprocess.Popen([sys.executable, "-m", "bot", "run", "-vv", "-c", str(cfg)],
                                    cwd=ROOT, stdin=subprocess.DEVNULL, stdout=out,
                                    stderr=subprocess.STDOUT, env=_env())
        try:
            card = tg.wait_for(lambda: tg.chat_messages(CHAT), 90)[0]
            sent = {k.lower(): v for k, v in llm.requests[0].headers.items()}
            assert sent["authorization"] == f"Bearer {MODEL_KEY}"  # the key was really used
            tg.say(STRANGER, CHAT, HOSTILE, first_name="Mallory")
            data = card.reply_markup["inline_keyboard"][0][0]["callback_data"]
            tap = tg.tap(ANNA, CHAT, card.message_id, data, "Anna")
            tg.wait_for(lambda: tg.answers.get(tap["callback_query"]["id"]), 60)
            assert hook.posts[0].headers["Authorization"] == f"Bearer {HOOK_SECRET}"
            # The unknown send is checked after a delay; without a status_url the ops
            # chat is told, quoting the error.
            notices = tg.wait_for(lambda: tg.chat_messages(OPS), 60)
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(60) == 0, log.read_text(errors="replace")[-4000:]
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
        refreshed = tuple(t for t in gmail.valid_tokens if t.startswith("fake-access-token-"))
        assert refreshed, "the expired access token was refreshed"
        shown = [card.html for card in tg.chat_messages(CHAT)] + \
                [m.text for m in tg.chat_messages(CHAT)] + [m.text for m in notices]
    text = log.read_text(errors="replace")
    assert "Set Bot API URL" in text  # the debug line that used to carry the token
    assert _leaks(text, refreshed) == [], text[-4000:]
    assert "[redacted DG_RD_TOKEN]" in text
    [(status, error)] = sqlite_rows(db, "SELECT status, error FROM drafts")
    assert status == "send_unknown" and "answered 500" in error
    assert "[redacted DG_RD_HOOK]" in error and _leaks(error) == []
    stored = sqlite_rows(db, "SELECT COALESCE(error_text, '') FROM pipeline_runs") + \
        sqlite_rows(db, "SELECT COALESCE(detail, '') FROM audit")
    assert _leaks(repr(stored)) == []
    assert any("answered 500" in s for s in shown)  # the card and the notice quote it...
    assert _leaks("\n".join(shown)) == []  # ...without the secret
    # The stranger's command is named in the log, escaped: no terminal escape, no
    # reordering of the line.
    assert "\x1b" not in text and "\u202e" not in text
    assert "dropped command /start\\x1b[31mRED\\u202eevil from user 666" in text


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_doctor_vv_shows_no_secret(tmp_path):
    """`doctor -vv` builds the bot, the Gmail service and the model client at debug
    level; the output names the variables, never their values."""
    with FakeTelegram(token=TOKEN) as tg, FakeGmail() as gmail, FakeLLM() as llm, \
            FakeWebhook() as hook:
        gmail.valid_tokens.add(ACCESS)
        cfg = _deployment(tmp_path, tg, gmail, llm, hook, expired=False)
        done = subprocess.run([sys.executable, "-m", "bot", "doctor", "-vv", "-c", str(cfg)],
                              cwd=ROOT, stdin=subprocess.DEVNULL, capture_output=True,
                              text=True, errors="replace", env=_env(), timeout=150)
    out = done.stdout + done.stderr
    assert "✅ telegram" in out and "Set Bot API URL" in out, out
    assert _leaks(out) == [], out


# -- the webhook sender's own secret ------------------------------------------------------------

def _sending_draft(draft_id: int, item: str) -> Draft:
    """Draft ``draft_id`` of support's maildir ``item``, v1, being sent."""
    return Draft(id=draft_id, key=draft_key("support", "maildir", item, "v1"), pipeline="support",
                 scope="maildir", item_id=item, recipe="v1", status="sending",
                 message=Message(message_id=item, from_addr="a@customer.example",
                                 reply_to="a@customer.example", subject="Order"),
                 body="Hi,\n\nIt ships today.\n", version=1)


def _webhook_sender(url: str) -> webhook.WebhookSender:
    pipeline = _stage.pipeline(
        source={"type": "maildir", "path": "inbox"},
        sender={"type": "webhook", "url": url, "secret_env": "DG_RD_SHORT", "timeout": "2s"})
    return webhook.create(pipeline, Settings(file="draftgate.yaml", base_dir=".", store="x",
                                             pipelines=[]))


@pytest.mark.parametrize("secret", ["Zq9!", "hook-secret-that-is-long-" + "x" * 200])
async def test_a_receiver_echoing_our_authorization_in_a_4xx_gets_no_secret_shown(
        monkeypatch, secret):
    """A 400 whose body quotes the request headers: the error (drafts.error, the card,
    the log) says what the receiver answered, without the secret, however short, and
    without a tail of a long one cut at the excerpt's end."""
    monkeypatch.setenv("DG_RD_SHORT", secret)
    draft = _sending_draft(7, "<order-1@customer.example>")
    with FakeWebhook() as hook:
        hook.mode, hook.echo_status = "echo", 400
        sender = _webhook_sender(hook.url + "/hooks")
        try:
            with pytest.raises(SendFailed) as err:
                await sender.send(draft)
        finally:
            await sender.close()
    assert hook.posts[0].headers["Authorization"] == f"Bearer {secret}"
    message = str(err.value)
    assert "answered 400" in message and "rejected" in message
    assert secret not in message and secret[:12] not in message
    assert "rejected Authorization: Bearer [redacted DG_RD_SHORT]" in message


# -- the layer itself ------------------------------------------------------------------------

def _formatted(logger: str, *args, **kw) -> str:
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(redact.LogFormatter("%(levelname)s %(name)s: %(message)s"))
    log = logging.getLogger(logger)
    log.addHandler(handler)
    old, log.propagate, level = log.propagate, False, log.level
    log.setLevel(logging.DEBUG)
    try:
        log.debug(*args, **kw)
    finally:
        log.removeHandler(handler)
        log.propagate, log.level = old, level
    return out.getvalue()


def test_a_registered_secret_is_hidden_in_any_loggers_message_args_and_traceback():
    redact.register("777:TOKEN-from-the-env-xyz", "DG_RD_UNIT_TOKEN")
    url = "https://api.telegram.org/bot777:TOKEN-from-the-env-xyz"
    try:
        raise RuntimeError(f"cannot reach {quote(url, safe='')}")
    except RuntimeError:
        text = _formatted("telegram.Bot", "Set Bot API URL: %s", url, exc_info=True)
    assert "TOKEN-from-the-env" not in text
    assert "Set Bot API URL: https://api.telegram.org/bot[redacted DG_RD_UNIT_TOKEN]" in text


def test_a_traceback_stays_readable_and_a_message_cannot_forge_a_log_line():
    def fail():
        raise ValueError("bad item\n2026-12-01 10:00:00 INFO draftgate: approved\x1b[2J")

    try:
        try:
            fail()
        except ValueError as exc:
            raise KeyError("lookup \u202eeulav") from exc
    except KeyError:
        text = _formatted("draftgate", "tick for %s failed", "sup\nport", exc_info=True)
    lines = text.splitlines()
    assert lines[0] == "DEBUG draftgate: tick for sup\\nport failed"
    assert lines[1] == "Traceback (most recent call last):"
    assert any(line.startswith("  File ") and "in fail" in line for line in lines)
    assert "The above exception was the direct cause of the following exception:" in lines
    assert ("ValueError: bad item\\n2026-12-01 10:00:00 INFO draftgate: approved\\x1b[2J"
            in lines)
    assert not any(line.startswith("2026-12-01") for line in lines)
    assert "\x1b" not in text and "\u202e" not in text and "\\u202e" in text


@pytest.mark.parametrize("raw, shown", [
    ("postgresql://dg:pw-123@db/prod", "postgresql://dg:***@db/prod"),
    ("via https://tok3n-abc@proxy/v1 ok", "via https://***@proxy/v1 ok"),
    ("GET https://h/x?key=AIza123&q=1", "GET https://h/x?key=***&q=1"),
    ('{"Authorization": "Bearer abc.def-123", "Host": "h"}', '{"Authorization": "[redacted]", "Host": "h"}'),
    ("{'authorization': 'Basic dXNlcjpwYXNz'}", "{'authorization': '[redacted]'}"),
    ("Authorization: Bearer abc.def-123\nnext", "Authorization: [redacted]\nnext"),
    ("client_secret=GOCSPX-1&code=4/x", "client_secret=[redacted]&code=4/x"),
    ('{"refresh_token": "1//0gabc"}', '{"refresh_token": "[redacted]"}'),
    ("sent with Bearer eyJhbGciOi.x-1", "sent with Bearer [redacted]"),
    # Text that only looks near a credential stays as written.
    ("bearer tokens expire; api_key_env: OPENAI_API_KEY; https://h/p?page=2",
     "bearer tokens expire; api_key_env: OPENAI_API_KEY; https://h/p?page=2"),
])
def test_credentials_no_registry_knows_are_hidden(raw, shown):
    assert redact.scrub(raw) == shown


@pytest.mark.parametrize("url, shown", [
    # Without credentials: exactly as written (an empty authority is kept).
    ("sqlite:///var/lib/draftgate/store.db", "sqlite:///var/lib/draftgate/store.db"),
    ("sqlite:////abs/path.db", "sqlite:////abs/path.db"),
    ("sqlite:///relative.db", "sqlite:///relative.db"),
    ("sqlite:///state.db?mode=ro", "sqlite:///state.db?mode=ro"),
    ("postgresql://draftgate@db.example:5432/prod", "postgresql://draftgate@db.example:5432/prod"),
    ("postgresql:///prod?host=/run/postgresql", "postgresql:///prod?host=/run/postgresql"),
    # With a password: *** in its place, the rest as written.
    ("postgresql://draftgate:pw-123@db.example:5432/prod",
     "postgresql://draftgate:***@db.example:5432/prod"),
    ("postgresql:///prod?host=/run/postgresql&password=pw-123#x",
     "postgresql:///prod?host=/run/postgresql&password=***#x"),
])
def test_a_store_url_is_shown_as_written_with_only_its_password_hidden(url, shown):
    assert redact.redact_url(url) == shown
    if "password=" not in url:  # (scrub hides that field as [redacted])
        assert redact.scrub(f"store {url} ok") == f"store {shown} ok"


def test_a_card_never_shows_a_secret_from_a_stored_error():
    """An error stored before this version (or by another process) is scrubbed when
    the card is rendered."""
    redact.register("hook-secret-on-a-card-123", "DG_RD_CARD")
    item = "<o@x>"
    draft = Draft(id=3, key=draft_key("support", "maildir", item, "v1"), pipeline="support",
                  scope="maildir", item_id=item, recipe="v1", status="send_failed",
                  message=Message(message_id=item, from_addr="a@x", reply_to="a@x", subject="S"),
                  body="Hi", version=1, error="answered 400: Bearer hook-secret-on-a-card-123")
    text = cards.render_status(draft).text
    assert "hook-secret-on-a-card" not in text and "[redacted DG_RD_CARD]" in text


async def test_the_console_card_shows_a_strangers_escape_codes_escaped():
    """`draftgate review` prints the email's subject and the draft: a subject that
    would clear the screen or reverse the line is shown as escapes instead."""
    from bot.approvals.console import ConsoleChannel

    out = io.StringIO()
    item = "<o@x>"
    draft = Draft(id=4, key=draft_key("support", "maildir", item, "v1"), pipeline="support",
                  scope="maildir", item_id=item, recipe="v1", status="awaiting",
                  message=Message(message_id=item, from_addr="a@x", reply_to="a@x",
                                  subject="Refund\x1b[2J\u202ednuof"),
                  body="Hi,\nsee you.", version=1)
    await ConsoleChannel(out=out, interactive=False).post(draft)
    text = out.getvalue()
    assert "\x1b" not in text and "\u202e" not in text
    assert "Refund\\x1b[2J\\u202ednuof" in text and "Hi,\nsee you." in text


def test_a_log_call_whose_arguments_do_not_fit_is_still_scrubbed():
    """logging's own report of a bad call prints the arguments raw; the layer writes
    the line itself instead."""
    redact.register("mismatched-secret-value-9", "DG_RD_ARGS")
    text = _formatted("httpx", "request %s to %s", "mismatched-secret-value-9")
    assert "mismatched-secret" not in text and "[redacted DG_RD_ARGS]" in text


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_auth_gmail_vv_shows_neither_the_client_secret_nor_the_tokens(tmp_path):
    """oauthlib logs the token request's body and the answer at debug level: with
    `-vv` neither the OAuth client secret nor the new access and refresh tokens show."""
    import json

    from tests.support.gmail_auth import _run_flow

    client_secret = "GOCSPX-SECRET-client-FFFF"
    with FakeGmail() as gmail:
        secrets = tmp_path / "client_secret.json"
        secrets.write_text(json.dumps({"installed": {
            "client_id": "cid", "client_secret": client_secret, "auth_uri": gmail.url + "auth",
            "token_uri": gmail.token_uri, "redirect_uris": ["http://localhost"]}}))
        code, out, err = _run_flow(gmail, secrets, tmp_path / "t.json", "-vv")
        issued = tuple(t for t in gmail.valid_tokens if t.startswith("fake-access-token-"))
    assert code == 0, err
    assert "DEBUG" in err  # the debug lines were written
    assert _leaks(out + err, (client_secret, "fake-refresh-token") + issued) == [], err


LOAD_CHILD = r"""
import sys
from bot import redact
from bot.cli.common import load
load(sys.argv[1])
print("sdk imported:", sorted(m for m in ("openai", "anthropic") if m in sys.modules))
for value in sys.argv[2:]:
    print(redact.scrub(f"[{value}]"))
"""


def test_every_model_key_is_registered_without_importing_a_model_sdk(tmp_path):
    """Each CLI command loads the deployment and registers its secrets first; that must
    not cost the seconds of importing openai or anthropic (only drafting needs them).
    Every model's key is registered anyway: its own api_key_env, the provider's default
    variable when it has neither that nor a base_url, the base_url's password."""
    (tmp_path / "pipelines").mkdir()
    (tmp_path / "pipelines" / "p.yaml").write_text(
        "name: p\nsource: {type: maildir, path: in}\ndrafter: {model: claude, prompt: r.txt}\n"
        "sender: {type: outbox, path: out, from: s@shop.example}\n")
    (tmp_path / "r.txt").write_text("Reply.")
    (tmp_path / "draftgate.yaml").write_text(textwrap.dedent("""\
        store: sqlite:///s.db
        models:
          gpt: {provider: openai, model: m}
          claude: {provider: anthropic, model: m, api_key_env: DG_RD_CLAUDE}
          proxy: {provider: openai, model: m, base_url: "https://u:proxy-pass-123@llm.example/v1"}
        """))
    env = {**_env(), "OPENAI_API_KEY": "sk-default-env-key-1", "DG_RD_CLAUDE": "sk-ant-own-key-2"}
    done = subprocess.run(
        [sys.executable, "-c", LOAD_CHILD, str(tmp_path / "draftgate.yaml"),
         "sk-default-env-key-1", "sk-ant-own-key-2", "proxy-pass-123"],
        cwd=ROOT, stdin=subprocess.DEVNULL, capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "sdk imported: []"
    assert not any(secret in done.stdout for secret in
                   ("sk-default-env-key-1", "sk-ant-own-key-2", "proxy-pass-123")), done.stdout
    assert len(lines) == 4


# -- bounded work (issue 22, finding 6) ------------------------------------------------------

#: Shapes of text that made the old patterns re-read the rest of the text at every
#: position (80k characters of the first: 4.3 s).
_HOSTILE = {
    "letters and dots, then ' ://'": lambda n: ("a." * n)[:n] + " ://",
    "letters and dots, then '://' and nothing": lambda n: ("a." * n)[:n] + "://",
    "digits and dashes before '://'": lambda n: ("1-" * n)[:n] + "://x",
    "'://' after no scheme, repeated": lambda n: ("1://" * n)[:n],
    "URLs with a user, repeated": lambda n: ("a://b@c " * n)[:n],
    "credential fields with an unclosed quote": lambda n: ('password: "' + "x" * 40 + "'") * (n // 52),
    "'[redacted' never closed": lambda n: ("password: [redacted " * n)[:n],
    "bearer words": lambda n: ("bearer " * n)[:n],
}
_ORDINARY = "Hello Alice, your order #1234 ships today, see https://track.example/x?id=9 . "


def _cpu_seconds(text: str, bound: float) -> float:
    """CPU time of this thread for one scrub (not the wall clock, which a loaded host
    stretches), retried twice when over ``bound`` so that one slow run does not decide."""
    import time

    best = float("inf")
    for _ in range(3):
        start = time.thread_time()
        redact.scrub(text)
        best = min(best, time.thread_time() - start)
        if best <= bound:
            break
    return best


@pytest.mark.parametrize("shape", sorted(_HOSTILE))
def test_scrub_work_grows_linearly_with_hostile_text(shape):
    """At 10k, 20k, 40k and 80k characters, a hostile shape scrubs within 100 times
    what as much ordinary text needs (linear code: 1-4 times; the quadratic pattern
    was 400 times at 10k and 3,000 times at 80k)."""
    for n in (10_000, 20_000, 40_000, 80_000):
        ordinary = _cpu_seconds((_ORDINARY * (n // len(_ORDINARY) + 1))[:n], 0.0)
        bound = 100 * ordinary + 0.01
        took = _cpu_seconds(_HOSTILE[shape](n), bound)
        assert took <= bound, f"{n} characters: {took:.3f}s of CPU, ordinary text {ordinary:.4f}s"


def test_scrub_line_scrubs_only_a_bounded_start_and_still_hides_a_secret(monkeypatch):
    """A 150 kB text is cut before it is scrubbed (with a margin): what is kept is
    scrubbed as before, and scrub never reads the rest."""
    redact.register("kept-part-secret-0123456789", "DG_RD_KEPT")
    seen: list[int] = []
    real = redact.scrub
    monkeypatch.setattr(redact, "scrub", lambda text: seen.append(len(text)) or real(text))
    text = ("Bad gateway, token kept-part-secret-0123456789 at https://u:pw@proxy.example/x "
            + "a." * 75_000 + " ://")
    line = redact.scrub_line(text, 200)
    assert line.startswith("Bad gateway, token [redacted DG_RD_KEPT] at "
                           "https://***@proxy.example/x a.a.a.")
    assert line.endswith("…") and len(line) == 201
    assert seen and max(seen) <= 200 + 4096


async def test_a_huge_hostile_error_page_is_cut_before_it_is_scrubbed(monkeypatch):
    """A receiver's 150 kB error page (the quadratic shape: it stalled the event loop
    15 s): the send fails with the page's start, and scrub never reads more than a
    few kB of it."""
    from bot.errors import SendUnknown

    seen: list[int] = []
    real = redact.scrub
    monkeypatch.setattr(redact, "scrub", lambda text: seen.append(len(text)) or real(text))
    draft = _sending_draft(8, "<order-2@customer.example>")
    monkeypatch.setenv("DG_RD_SHORT", "page-test-secret")
    with FakeWebhook() as hook:
        hook.mode, hook.echo_status = "page", 502
        hook.page = b"<html>Bad gateway " + b"a." * 75_000 + b" ://</html>"
        sender = _webhook_sender(hook.url + "/hooks")
        try:
            with pytest.raises(SendUnknown) as err:
                await sender.send(draft)
        finally:
            await sender.close()
    assert "answered 502: <html>Bad gateway a.a.a." in str(err.value)
    assert len(str(err.value)) < 600
    assert max(seen) <= 200 + 4096 + 100
