"""gmail.accounts.NAME options: every error names the file and the key path, durations
take the same forms as elsewhere, and unknown keys are errors listing the known ones."""

from __future__ import annotations

from pathlib import Path

import pytest

from bot.__main__ import main
from bot.config.load import load_settings
from bot.errors import ConfigError

PIPELINE = """\
name: support
schedule: 5m
source: {type: gmail, account: support}
drafter: {model: template, prompt: reply.txt}
sender: {type: gmail_reply, account: support}
"""

KNOWN = "token_file, address, api_endpoint, batch_endpoint, timeout, backoff, read_attempts, max_wait"


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # errors then name the file as the user typed it


def write(tmp_path: Path, account: str) -> Path:
    (tmp_path / "pipelines").mkdir(exist_ok=True)
    (tmp_path / "pipelines" / "support.yaml").write_text(PIPELINE)
    (tmp_path / "reply.txt").write_text("Hi {first_name},\n")
    body = "".join(f"      {line}\n" for line in account.strip().splitlines())
    (tmp_path / "draftgate.yaml").write_text(
        f"store: sqlite:///{tmp_path}/s.db\npipelines: pipelines/*.yaml\n"
        f"gmail:\n  accounts:\n    support:\n{body}")
    return Path("draftgate.yaml")


def errors_of(cfg: Path) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load_settings(cfg)
    return info.value.errors


def test_durations_take_the_usual_forms_and_reach_the_client(tmp_path):
    """`timeout: 30s` used to crash `draftgate validate` with a ValueError traceback."""
    from bot.engine.build import check_all
    from bot.gmail.client import GmailClient

    cfg = write(tmp_path, "token_file: t.json\naddress: support@example.com\n"
                          "api_endpoint: http://127.0.0.1:1/\ntimeout: 30s\nbackoff: 500ms\n"
                          "max_wait: 1m\nread_attempts: 5")
    settings = load_settings(cfg)
    acc = settings.gmail_accounts["support"]
    assert (acc.timeout, acc.backoff, acc.max_wait, acc.read_attempts) == \
        (30.0, 0.5, 60.0, 5)
    assert check_all(settings) == []
    client = GmailClient("support", acc, base_dir=settings.base_dir)
    try:
        assert (client.timeout, client.backoff, client.max_wait, client.read_attempts) == \
            (30.0, 0.5, 60.0, 5)
    finally:
        client.close()


def test_validate_accepts_a_duration_with_a_unit(tmp_path, capsys):
    cfg = write(tmp_path, "token_file: t.json\ntimeout: 30s")
    assert main(["validate", "-c", str(cfg)]) == 0


def test_a_typo_is_an_error_listing_the_known_keys(tmp_path):
    cfg = write(tmp_path, "token_file: t.json\nadress: support@example.com\ntimout: 5")
    assert errors_of(cfg) == [
        "draftgate.yaml: gmail.accounts.support.adress: unknown key; did you mean 'address'? "
        f"Known keys: {KNOWN}",
        "draftgate.yaml: gmail.accounts.support.timout: unknown key; did you mean 'timeout'? "
        f"Known keys: {KNOWN}"]
    cfg = write(tmp_path, "token_file: t.json\nscopes: [send]")
    assert errors_of(cfg) == [
        f"draftgate.yaml: gmail.accounts.support.scopes: unknown key; known keys: {KNOWN}"]


@pytest.mark.parametrize("line,error", [
    ("timeout: 30x", "gmail.accounts.support.timeout: expected a duration like 30s, 5m, 1h "
                     "or 2d, got '30x'"),
    ("timeout: 0", "gmail.accounts.support.timeout: expected a duration above 0 like 30s, "
                   "got 0"),
    ("backoff: soon", "gmail.accounts.support.backoff: expected a duration like 30s, 5m, 1h "
                      "or 2d, got 'soon'"),
    ("max_wait: -5", "gmail.accounts.support.max_wait: expected a duration of 0 or more "
                     "like 30s, got -5"),
    ("read_attempts: 0", "gmail.accounts.support.read_attempts: expected a whole number of "
                         "at least 1, got 0"),
    ("read_attempts: three", "gmail.accounts.support.read_attempts: expected a whole number, "
                             "got a string 'three'"),
    ("address: support", "gmail.accounts.support.address: expected an email address like "
                         "support@example.com, got 'support'"),
    ("api_endpoint: gmail.googleapis.com", "gmail.accounts.support.api_endpoint: expected an "
                                           "http(s) URL like https://gmail.googleapis.com/, "
                                           "got 'gmail.googleapis.com'"),
    ("token_file: [a, b]", "gmail.accounts.support.token_file: expected a string, got a list "
                           "['a', 'b']"),
])
def test_bad_values_name_the_file_the_path_and_what_is_expected(tmp_path, line, error):
    base = "" if line.startswith("token_file") else "token_file: t.json\n"
    assert errors_of(write(tmp_path, base + line)) == [f"draftgate.yaml: {error}"]


def test_validate_reports_them_without_a_traceback(tmp_path, capsys):
    cfg = write(tmp_path, "token_file: t.json\ntimeout: 30x\nadress: a@b.example")
    assert main(["validate", "-c", str(cfg)]) == 2
    err = capsys.readouterr()
    text = err.out + err.err
    assert "Traceback" not in text
    assert "gmail.accounts.support.timeout: expected a duration like 30s" in text
    assert "gmail.accounts.support.adress: unknown key; did you mean 'address'?" in text
