"""Microsoft Graph through the real CLI: ``validate`` on the microsoft keys, ``auth
microsoft`` (the device-code flow against the fake identity platform), ``run`` and
``review`` against the fake Graph (a card, a restart that drafts nothing twice, a
SIGKILL while Graph holds the send: at most one reply, found afterwards)."""

from __future__ import annotations

import os
import re
import signal
import stat
import subprocess
import sys

import pytest

from tests._proc import ROOT, reap, run_cli, sqlite_rows, template_console_config, two_new_mails
from tests.fakes.microsoft import FakeGraph
from tests.support.microsoft_world import CLIENT_ID, customer_mail, sign_in, write_deployment


def cli(*args: str) -> subprocess.CompletedProcess:
    return run_cli(*args, timeout=120)


def account(extra: str = "") -> str:
    return (f"microsoft:\n  accounts:\n    office:\n      client_id: {CLIENT_ID}\n{extra}")


def deployment(tmp_path, text: str, pipeline: str = "source: {type: microsoft, account: office}\n"
               "sender: {type: microsoft_reply}\n") -> str:
    return template_console_config(tmp_path, "office", text, pipeline)


def test_validate_accepts_a_microsoft_account(tmp_path):
    r = cli("validate", "-c", deployment(tmp_path, account()))
    assert r.returncode == 0, r.stderr
    assert "source microsoft" in r.stdout and "sender microsoft_reply" in r.stdout


@pytest.mark.parametrize("text, pipeline, expected", [
    (account("      client_secret: hunter2\n"), None,
     "do not belong in YAML; draftgate uses the device-code flow of a public client"),
    (account().replace(CLIENT_ID, "my-app"), None,
     "microsoft.accounts.office.client_id: expected the app registration's Application "
     "(client) ID, a GUID"),
    (account("      tenant: contoso\n"), None, "microsoft.accounts.office.tenant: expected common"),
    (account("      graph_endpont: https://x/\n"), None,
     "microsoft.accounts.office.graph_endpont: unknown key; did you mean 'graph_endpoint'?"),
    (account("      authority_host: http://login.example/\n"), None,
     "microsoft.accounts.office.authority_host: expected an https URL"),
    (account(), "source: {type: microsoft, account: ofice}\nsender: {type: microsoft_draft}\n",
     "pipelines/office.yaml: source.account: unknown Microsoft account 'ofice'; add it under "
     "microsoft.accounts"),
    (account(), "source: {type: microsoft, account: office, batch: 50}\n"
                "sender: {type: microsoft_reply}\n",
     "source.batch: expected a number of requests from 1 to 20"),
])
def test_validate_explains_what_is_wrong_with_microsoft_keys(tmp_path, text, pipeline, expected):
    r = cli("validate", "-c", deployment(tmp_path, text, *(pipeline,) if pipeline else ()))
    assert r.returncode == 2
    assert expected in r.stderr, r.stderr
    assert "hunter2" not in r.stderr


def _issued(fake: FakeGraph) -> list[str]:
    return [*fake.tokens, *fake.refresh_tokens]


def test_auth_runs_the_device_code_flow_and_writes_the_token_0600(tmp_path, fake):
    cfg = write_deployment(tmp_path, fake)
    proc = subprocess.Popen([sys.executable, "-m", "bot", "auth", "microsoft", "--account",
                             "office", "-c", str(cfg), "-vv"], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=dict(os.environ))
    try:
        seen = ""
        for line in proc.stdout:  # type: ignore[union-attr]
            seen += line
            code = re.search(r"enter the code (\S+)", line)
            if code:
                fake.approve(code.group(1))
                break
        out, err = proc.communicate(timeout=60)
    finally:
        reap(proc)
    assert proc.returncode == 0, err
    assert "https://microsoft.com/devicelogin" in seen
    assert "Requesting scopes: Mail.ReadWrite, Mail.Send, offline_access" in seen
    token = tmp_path / "office-token.json"
    assert stat.S_IMODE(token.stat().st_mode) == 0o600
    assert f"Token written to {token} (mode 0600)" in out
    for secret in _issued(fake):
        assert secret in token.read_text()
        assert secret not in seen + out + err


def test_an_expired_token_is_refreshed_in_place_and_never_logged(tmp_path, fake):
    cfg = write_deployment(tmp_path, fake)
    sign_in(fake, cfg)
    token = tmp_path / "office-token.json"
    before = token.read_text()
    fake.expire_tokens()  # Graph refuses the old access token from now on
    fake.token_lifetime = 3600
    # MSAL refreshes an access token it holds as expired: make the cache say so.
    token.write_text(re.sub(r'"expires_on": "\d+"', '"expires_on": "1"', before))
    r = cli("run", "--once", "-c", str(cfg), "-vv")
    assert r.returncode == 0, r.stderr
    assert [c.path for c in fake.calls if c.route == "token"][-1] == "refresh_token"
    after = token.read_text()
    assert after != before and stat.S_IMODE(token.stat().st_mode) == 0o600
    for secret in _issued(fake):
        assert secret not in r.stdout + r.stderr
    assert "token refreshed" in r.stderr


def drafts(tmp_path) -> list[tuple]:
    return sqlite_rows(tmp_path / "state.db", "SELECT item_id, status FROM drafts ORDER BY id")


def test_run_gives_new_mail_a_card_and_a_restart_drafts_nothing_twice(tmp_path, fake):
    cfg = write_deployment(tmp_path, fake)
    sign_in(fake, cfg)
    two_new_mails(cli, cfg, fake.deliver, customer_mail)
    assert drafts(tmp_path) == [("<order-1@customer.test>", "awaiting"),
                                ("<order-2@customer.test>", "awaiting")]
    r = cli("run", "--once", "-c", str(cfg))  # a restart
    assert r.returncode == 0 and "Where is my order" not in r.stdout
    assert len(drafts(tmp_path)) == 2


def test_sigkill_during_the_send_sends_once_and_the_restart_finds_it(tmp_path, fake):
    """``review`` approves and is killed while Graph holds the send. Graph then carries
    it out; the restart finds the row cut off in sending, looks the reply up in Sent
    Items by its internetMessageId and records it sent: one reply, never a second."""
    cfg = write_deployment(tmp_path, fake)
    sign_in(fake, cfg)
    assert cli("run", "--once", "-c", str(cfg)).returncode == 0
    fake.deliver(customer_mail(3))
    assert cli("run", "--once", "-c", str(cfg)).returncode == 0
    hold = fake.hold_send()
    review = subprocess.Popen([sys.executable, "-m", "bot", "review", "-c", str(cfg)],
                              cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, env=dict(os.environ))
    try:
        review.stdin.write(b"a\n")  # type: ignore[union-attr]
        review.stdin.flush()  # type: ignore[union-attr]
        assert fake.send_reached.wait(60), "the send never reached Graph"
        review.send_signal(signal.SIGKILL)
        review.wait(10)
    finally:
        reap(review)
        review.stdin.close()  # type: ignore[union-attr]
    hold.set()  # Graph goes on and sends it
    for _ in range(2):
        r = cli("run", "--once", "-c", str(cfg))
        assert r.returncode == 0, r.stderr
    [(status,)] = sqlite_rows(tmp_path / "state.db", "SELECT status FROM drafts")
    assert status == "sent"
    assert fake.sends == 1 and len(fake.sent) == 1


def test_doctor_checks_the_token_scopes_and_folders_without_sending(tmp_path, fake):
    cfg = write_deployment(tmp_path, fake)
    r = cli("doctor", "-c", str(cfg))
    assert "❌ microsoft:office token" in r.stdout and "draftgate auth microsoft --account " \
        "office" in r.stdout, r.stdout
    sign_in(fake, cfg)
    r = cli("doctor", "-c", str(cfg))
    for line in ("✅ microsoft:office token", "signed in as support@contoso.test",
                 "✅ microsoft:office scopes", "✅ microsoft:office folder inbox",
                 "✅ microsoft:office folder sentitems", "✅ microsoft:office folder drafts"):
        assert line in r.stdout, r.stdout
    assert fake.sends == 0 and "createReply" not in fake.routes()
    (tmp_path / "pipelines" / "office.yaml").write_text(
        (tmp_path / "pipelines" / "office.yaml").read_text().replace(
            "account: office}", "account: office, folder: nosuchfolder}", 1))
    r = cli("doctor", "-c", str(cfg))
    assert "❌ microsoft:office folder nosuchfolder" in r.stdout, r.stdout
