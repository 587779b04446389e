"""Gmail OAuth: the token file (0600, refreshed in place), the error for a dead token,
the scopes the pipelines need, `draftgate auth gmail` end to end, and doctor."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from bot.config.gmail import GmailAccount
from bot.config.load import load_settings
from bot.errors import AuthError
from bot.gmail import auth, doctor
from bot.gmail.client import GmailClient
from tests.fakes.gmail import FakeGmail, write_deployment, write_token_file
from tests.support.gmail_auth import (  # noqa: F401
    ROOT,
    _run_flow,
)


@pytest.fixture
def fake():
    with FakeGmail() as f:
        yield f


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_write_token_is_0600_and_atomic(tmp_path):
    """A token file is never readable by others, even when it replaces a wider file."""
    path = tmp_path / "secrets" / "t.json"
    path.parent.mkdir()
    path.write_text("old")
    os.chmod(path, 0o644)
    auth.write_token(path, '{"token": "x"}')
    assert _mode(path) == 0o600 and json.loads(path.read_text()) == {"token": "x"}
    assert [p.name for p in path.parent.iterdir()] == ["t.json"]  # no temp file left


async def test_expired_token_is_refreshed_and_saved_in_place_0600(tmp_path, fake):
    """An expired access token is refreshed at token_uri before the call; the file is
    rewritten with the new token and stays 0600."""
    token = write_token_file(tmp_path / "tok.json", fake, expired=True)
    client = GmailClient("support", GmailAccount(token_file=str(token), api_endpoint=fake.url))
    try:
        profile = await client.aread(lambda s: s.users().getProfile(userId="me"), "getProfile")
    finally:
        await client.aclose()
    assert profile["emailAddress"] == fake.address
    assert len(fake.calls_to("token")) == 1
    saved = json.loads(Path(token).read_text())
    assert saved["token"] == "fake-access-token-1"
    assert saved["refresh_token"] == "fake-refresh-token"
    assert _mode(token) == 0o600


async def test_revoked_token_raises_one_clear_auth_error(tmp_path, fake):
    """Refresh answers invalid_grant: AuthError naming the account and the command."""
    token = write_token_file(tmp_path / "tok.json", fake, expired=True)
    fake.revoke()
    client = GmailClient("support", GmailAccount(token_file="tok.json", api_endpoint=fake.url),
                         base_dir=tmp_path, config_file=tmp_path / "draftgate.yaml")
    try:
        with pytest.raises(AuthError) as err:
            await client.aread(lambda s: s.users().getProfile(userId="me"), "getProfile")
    finally:
        await client.aclose()
    assert str(err.value) == (
        "Gmail account 'support': token expired or revoked; run `draftgate auth gmail "
        f"--account support -c {tmp_path}/draftgate.yaml --client-secrets client_secret.json "
        f"--token {tmp_path}/tok.json`")
    assert fake.api_calls() == []
    assert json.loads(Path(token).read_text())["token"] == "fake-access-token"


async def test_missing_token_file_says_which_command_creates_it(tmp_path):
    client = GmailClient("sales", GmailAccount(token_file="secrets/sales.json"), base_dir=tmp_path)
    try:
        with pytest.raises(AuthError, match=r"token file .*sales.json not found; run "
                                            r"`draftgate auth gmail --account sales"):
            await client.aread(lambda s: s.users().getProfile(userId="me"), "getProfile")
    finally:
        await client.aclose()


@pytest.mark.parametrize("sender,expected", [
    ("{type: gmail_reply, account: support}", ["gmail.readonly", "gmail.send"]),
    ("{type: gmail_draft, account: support}", ["gmail.compose", "gmail.readonly"]),
    ("{type: gmail_reply, account: support, mark_read: true}", ["gmail.modify"]),
    ("{type: gmail_draft, account: support, label: Done}", ["gmail.modify"]),
    ("{type: outbox, path: out, from: s@shop.example}", ["gmail.readonly"]),
])
def test_required_scopes_are_the_smallest_set(tmp_path, fake, sender, expected):
    settings = load_settings(write_deployment(tmp_path, fake, sender=sender))
    got = auth.required_scopes(settings, "support")
    assert [s.rsplit("/", 1)[-1] for s in got] == expected
    assert auth.required_scopes(settings, "other") == []


def test_missing_scopes_knows_what_covers_what():
    assert auth.missing_scopes([auth.SCOPE_MODIFY], [auth.SCOPE_READONLY, auth.SCOPE_SEND]) == []
    assert auth.missing_scopes([auth.SCOPE_READONLY], [auth.SCOPE_READONLY, auth.SCOPE_SEND]) \
        == [auth.SCOPE_SEND]


async def test_doctor_reports_profile_and_scopes(tmp_path, fake):
    settings = load_settings(write_deployment(tmp_path, fake))
    results = await doctor.check(settings)
    assert [(n, ok) for n, ok, _ in results] == [("gmail:support profile", True),
                                                 ("gmail:support scopes", True)]
    write_token_file(tmp_path / "support-token.json", fake, scopes=[auth.SCOPE_READONLY])
    fake.revoke()
    results = await doctor.check(settings)
    assert [ok for _, ok, _ in results] == [False, False]
    assert "draftgate auth gmail --account support" in results[0][2]
    assert "lacks gmail.send" in results[1][2]


def test_auth_gmail_cli_runs_the_installed_app_flow_and_writes_0600(tmp_path, fake):
    """`draftgate auth gmail --no-browser` prints the URL; after the browser's redirect
    the code is exchanged and the token file is written with mode 0600."""
    secrets = tmp_path / "client_secret.json"
    secrets.write_text(json.dumps({"installed": {
        "client_id": "cid", "client_secret": "csecret", "auth_uri": fake.url + "auth",
        "token_uri": fake.token_uri, "redirect_uris": ["http://localhost"]}}))
    token = tmp_path / "secrets" / "support-token.json"
    token.parent.mkdir()
    code, out, err = _run_flow(fake, secrets, token)
    assert code == 0, err
    assert "Token written" in out and "fake-access" not in out + err
    assert _mode(token) == 0o600
    saved = json.loads(token.read_text())
    assert saved["refresh_token"] == "fake-refresh-token" and saved["token"].startswith("fake-access")
    (exchange,) = fake.calls_to("token")
    assert exchange.body["grant_type"] == ["authorization_code"]


def test_auth_gmail_cli_reports_a_partial_grant(tmp_path, fake):
    """The user unticked gmail.send on the consent screen: the token is still written
    (0600, with the granted scopes) and the command fails naming what is missing."""
    fake.grant_scope = auth.SCOPE_READONLY
    secrets = tmp_path / "client_secret.json"
    secrets.write_text(json.dumps({"installed": {
        "client_id": "cid", "client_secret": "csecret", "auth_uri": fake.url + "auth",
        "token_uri": fake.token_uri, "redirect_uris": ["http://localhost"]}}))
    token = tmp_path / "tok.json"
    code, out, err = _run_flow(fake, secrets, token)
    assert code == 1 and f"granted without {auth.SCOPE_SEND}" in err
    assert _mode(token) == 0o600
    assert json.loads(token.read_text())["scopes"] == [auth.SCOPE_READONLY]




def _suggested(error: str) -> list[str]:
    """The command inside ``run `...` `` of an error, as argv after `draftgate`."""
    import shlex

    return shlex.split(error.split("`")[1])[1:]


async def test_the_suggested_command_works_from_any_directory(tmp_path, fake, monkeypatch):
    """The dead-token message names `-c <deployment file>` and the token file as
    draftgate resolved it: run from another directory, the suggested command asks for
    the scopes the pipelines need (gmail.modify for mark_read) and writes the token
    where draftgate reads it."""
    import argparse
    import io

    from tests.fakes.gmail import GmailWorld

    deploy = tmp_path / "deploy"
    deploy.mkdir()
    w = GmailWorld(deploy, fake=fake, sender="{type: gmail_reply, account: support, "
                                             "mark_read: true}")
    await w.open()
    try:
        fake.revoke()
        await w.tick()
        (run,) = await w.store.recent_runs("support", 1)
    finally:
        if w.engine:
            await w.engine.stop()
        await w.store.close()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    parser = argparse.ArgumentParser(prog="draftgate")
    auth.add_cli(parser.add_subparsers(dest="command"))
    args = parser.parse_args(_suggested(run.error_text))
    scopes, token = auth._scopes_for(args, io.StringIO())
    assert scopes == [auth.SCOPE_MODIFY]
    assert Path(token) == deploy / "support-token.json"


def test_account_without_a_readable_config_fails_instead_of_guessing_scopes(
        tmp_path, monkeypatch, capsys):
    """`--account` with no deployment file to read: a clear error naming -c, exit 2,
    and no authorisation with guessed scopes."""
    from bot.__main__ import main

    monkeypatch.chdir(tmp_path)
    code = main(["auth", "gmail", "--account", "support", "--client-secrets", "cs.json",
                 "--token", "t.json", "--no-browser"])
    err = capsys.readouterr().err
    assert code == 2
    assert "--account support: cannot load the deployment file draftgate.yaml, which " \
           "decides the scopes to request; pass -c FILE" in err
    assert "draftgate.yaml: file not found" in err
    assert not (tmp_path / "t.json").exists()


def _auth(tmp_path, capsys, *extra: str) -> tuple[int, str]:
    from bot.__main__ import main

    code = main(["auth", "gmail", "--no-browser", "--port", "0", "--scopes", "readonly", *extra])
    return code, capsys.readouterr().err


def _client_secrets(tmp_path, content: dict) -> Path:
    path = tmp_path / "client_secret.json"
    path.write_text(json.dumps(content))
    return path


@pytest.mark.parametrize("content", [{"installed": 5}, {"installed": {}}, [], 5])
def test_a_client_secrets_file_of_the_wrong_shape_is_explained(tmp_path, capsys, content):
    """{"installed": 5} used to end in an AttributeError traceback from the library."""
    secrets = _client_secrets(tmp_path, content)
    code, err = _auth(tmp_path, capsys, "--client-secrets", str(secrets),
                      "--token", str(tmp_path / "t.json"))
    assert code == 2 and "Traceback" not in err
    assert f"error: {secrets} is not an OAuth client secrets file: " in err
    assert "download the OAuth client (Desktop app) JSON" in err


def test_client_secrets_that_is_a_folder_is_explained(tmp_path, capsys):
    (tmp_path / "cs.json").mkdir()
    code, err = _auth(tmp_path, capsys, "--client-secrets", str(tmp_path / "cs.json"),
                      "--token", str(tmp_path / "t.json"))
    assert code == 2
    assert err == (f"error: --client-secrets {tmp_path}/cs.json is a folder; name the JSON "
                   f"file in it (client_secret_....json)\n")


def test_a_token_path_that_cannot_be_written_is_refused_before_the_browser(
        tmp_path, capsys, monkeypatch):
    """The token used to be written after the consent, so an unwritable --token cost the
    user the whole browser round trip and then printed a traceback."""
    from google_auth_oauthlib import flow

    def no_flow(*a, **kw):
        raise AssertionError("the OAuth flow must not start")

    monkeypatch.setattr(flow.InstalledAppFlow, "from_client_secrets_file", no_flow)
    secrets = str(tmp_path / "client_secret.json")
    (tmp_path / "secrets").mkdir()
    code, err = _auth(tmp_path, capsys, "--client-secrets", secrets,
                      "--token", str(tmp_path / "secrets"))
    assert (code, err) == (2, f"error: --token {tmp_path}/secrets: is a folder; name the token "
                              f"file, e.g. {tmp_path}/secrets/token.json\n")
    (tmp_path / "plain").write_text("a file, not a folder")
    code, err = _auth(tmp_path, capsys, "--client-secrets", secrets,
                      "--token", str(tmp_path / "plain" / "sub" / "t.json"))
    assert (code, err) == (2, f"error: --token {tmp_path}/plain/sub/t.json: {tmp_path}/plain "
                              f"is not a folder, so the token file cannot be created under it\n")


def test_a_token_folder_without_write_permission_is_refused_before_the_browser(tmp_path):
    """Run as a user without the right to write there (root drops CAP_DAC_OVERRIDE
    through setpriv, as the audit did)."""
    import shutil

    locked = tmp_path / "locked"
    locked.mkdir(mode=0o555)
    prefix: list[str] = []
    if os.geteuid() == 0:
        if not shutil.which("setpriv"):
            pytest.skip("root without setpriv: every folder is writable")
        prefix = ["setpriv", "--bounding-set=-dac_override,-dac_read_search"]
    try:
        proc = subprocess.run(
            [*prefix, sys.executable, "-m", "bot", "auth", "gmail", "--no-browser",
             "--client-secrets", str(tmp_path / "missing.json"), "--scopes", "readonly",
             "--token", str(locked / "new" / "t.json")],
            cwd=ROOT, capture_output=True, text=True, timeout=60,
            env=dict(os.environ, PYTHONPATH=str(ROOT)))
    finally:
        locked.chmod(0o700)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr == (f"error: --token {locked}/new/t.json: cannot write in {locked} "
                           f"(Permission denied); choose a folder you can write to\n")
    assert list(locked.iterdir()) == []  # nothing created, no probe left behind


def test_the_token_path_probe_leaves_nothing_behind(tmp_path):
    assert auth.token_path_problem(tmp_path / "new" / "deeper" / "t.json") is None
    assert list(tmp_path.iterdir()) == []
