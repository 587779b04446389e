"""Configuration errors name the file, the key path and what was expected."""

from __future__ import annotations

from pathlib import Path

import pytest

from bot.__main__ import main
from bot.config.checker import parse_duration, parse_size
from bot.config.load import load_settings
from tests.support.configs import (  # noqa: F401
    GOOD,
    errors_of,
    write,
    write_raw,
)


def test_a_good_config_loads_with_defaults(tmp_path):
    s = load_settings(write(tmp_path, {"a.yaml": GOOD.format(name="a")}))
    [p] = s.pipelines
    assert (p.name, p.interval, p.recipe, p.mark_seen, p.max_attempts, p.lease) == \
        ("a", 300.0, "v1", "at_fetch", 3, 600.0)
    assert s.store == f"sqlite:///{tmp_path}/s.db"


def test_missing_field_names_file_and_path(tmp_path):
    cfg = write(tmp_path, {"a.yaml": "name: a\nschedule: 5m\nsource: {type: maildir, path: x}\n"})
    assert errors_of(cfg) == [
        "pipelines/a.yaml: sender: missing; expected a mapping with type: "
        "outbox | webhook | gmail_reply | gmail_draft | smtp_reply | imap_draft | microsoft_reply | microsoft_draft"]


def test_wrong_type_names_file_path_and_expectation(tmp_path):
    cfg = write(tmp_path, {"a.yaml": GOOD.format(name="a") + "max_attempts: three\n"})
    [err] = errors_of(cfg)
    assert err.startswith("pipelines/a.yaml: max_attempts: expected a whole number, got a string")


def test_unknown_source_type_lists_the_known_ones(tmp_path):
    cfg = write(tmp_path, {"a.yaml": GOOD.format(name="a").replace("maildir", "pop3")})
    [err] = errors_of(cfg)
    assert err == ("pipelines/a.yaml: source.type: expected one of maildir, schedule, gmail, "
                   "imap, microsoft, got 'pop3'")


def test_duplicate_pipeline_name_names_both_files(tmp_path):
    cfg = write(tmp_path, {"a.yaml": GOOD.format(name="same"), "b.yaml": GOOD.format(name="same")})
    [err] = errors_of(cfg)
    assert err.startswith("pipelines/b.yaml: name: duplicate pipeline name 'same', already used "
                          "in pipelines/a.yaml")


def test_every_error_is_reported_at_once(tmp_path):
    cfg = write(tmp_path, {"a.yaml": "name: a\nschedule: every tuesday\nsource: {type: pop3}\n"
                                     "sender: {type: outbox}\nlease: soon\nbogus: 1\n"},
                top="max_in_flight: -1\n")
    errs = errors_of(cfg)
    joined = "\n".join(errs)
    for expected in ("draftgate.yaml: max_in_flight:", "pipelines/a.yaml: schedule:",
                     "pipelines/a.yaml: source.type:", "pipelines/a.yaml: lease:",
                     "pipelines/a.yaml: bogus: unknown key"):
        assert expected in joined
    assert len(errs) >= 5


def test_unknown_key_suggests_the_close_one(tmp_path):
    cfg = write(tmp_path, {"a.yaml": GOOD.format(name="a") + "max_attemps: 3\n"})
    [err] = errors_of(cfg)
    assert "did you mean 'max_attempts'?" in err


def test_yaml_syntax_error_gives_line_and_column(tmp_path):
    cfg = write(tmp_path, {"a.yaml": "name: a\nsource: {type: maildir\n"})
    [err] = errors_of(cfg)
    assert err.startswith("pipelines/a.yaml: line ") and "not valid YAML" in err


def test_a_secret_in_yaml_is_refused(tmp_path):
    cfg = write(tmp_path, {"a.yaml": GOOD.format(name="a")},
                top="telegram: {token: '123:abc', operators: [1], approvals_chat: 1}\n")
    [err] = errors_of(cfg)
    assert "telegram.token" in err and "token_env" in err and "123:abc" not in err


def test_telegram_operators_must_be_numeric_ids(tmp_path):
    cfg = write(tmp_path, {"a.yaml": GOOD.format(name="a")},
                top="telegram: {operators: ['@anna'], approvals_chat: 1}\n")
    [err] = errors_of(cfg)
    assert err.endswith("draftgate.yaml: telegram.operators[0]: expected a numeric Telegram user id, "
                        "got '@anna' (usernames can change; ids cannot)")


def test_missing_deployment_file(tmp_path):
    [err] = errors_of(tmp_path / "nope.yaml")
    assert "nope.yaml" in err and "file not found" in err


@pytest.mark.parametrize("text, seconds", [("30s", 30), ("5m", 300), ("1h", 3600), ("2d", 172800),
                                           (45, 45), ("1.5m", 90)])
def test_durations(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("bad", ["soon", "5 minutes", "", True])
def test_bad_durations_explain_the_format(bad):
    with pytest.raises(ValueError, match="30s, 5m, 1h or 2d"):
        parse_duration(bad)


@pytest.mark.parametrize("text, size", [("200kB", 200_000), ("5MB", 5_000_000), (1024, 1024)])
def test_sizes(text, size):
    assert parse_size(text) == size


def test_validate_command_exits_2_with_every_error(tmp_path, capsys):
    cfg = write(tmp_path, {"a.yaml": GOOD.format(name="a").replace("maildir", "pop3"),
                           "b.yaml": GOOD.format(name="a")})
    assert main(["validate", "-c", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert "source.type" in err and "duplicate pipeline name" in err


def test_validate_command_accepts_the_demo_and_the_examples(capsys):
    root = Path(__file__).resolve().parents[2]
    assert main(["validate", "-c", str(root / "draftgate.demo.yaml")]) == 0
    assert main(["validate", "-c", str(root / "draftgate.example.yaml")]) == 0
    out = capsys.readouterr().out
    assert "demo:" in out and "support:" in out and "posts:" in out


def test_a_telegram_pipeline_needs_a_chat(tmp_path):
    cfg = write(tmp_path, {"a.yaml": GOOD.format(name="a") + "approval: {channel: telegram}\n"},
                top="telegram: {operators: [1]}\n")
    [err] = errors_of(cfg)
    assert err.startswith("pipelines/a.yaml: approval.chat: missing") and "approvals_chat" in err


# -- what the YAML itself says -------------------------------------------------------------


def test_a_config_file_that_is_not_utf8_names_the_byte_and_the_fix(tmp_path, capsys):
    cfg = write(tmp_path, {"a.yaml": GOOD.format(name="a")})
    (tmp_path / "pipelines" / "b.yaml").write_bytes(b"name: caf\xe9\n")
    cfg.write_bytes(cfg.read_bytes() + b"# caf\xe9\n")
    assert main(["validate", "-c", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert f"{cfg}: not UTF-8 (byte 0xe9 at offset " in err and "save it as UTF-8" in err
    assert "Traceback" not in err
    cfg.write_text(cfg.read_text(encoding="latin-1").replace("caf\xe9", "cafe"))
    assert errors_of(cfg) == ["pipelines/b.yaml: not UTF-8 (byte 0xe9 at offset 9); "
                              "save it as UTF-8"]


def test_a_key_written_twice_is_refused_with_both_lines(tmp_path):
    cfg = write(tmp_path, {"a.yaml": GOOD.format(name="a") + "name: other\n"})
    assert errors_of(cfg) == [
        "pipelines/a.yaml: line 5: duplicate key 'name' (first on line 1); YAML would "
        "silently keep only the last one, so delete or rename one of them"]
    nested = GOOD.format(name="a").replace("path: out,", "path: out, path: elsewhere,")
    cfg = write(tmp_path, {"a.yaml": nested})
    [err] = errors_of(cfg)
    assert err.startswith("pipelines/a.yaml: line 4: duplicate key 'path' (first on line 4)")


def test_a_merge_key_may_be_overridden(tmp_path):
    text = ("name: a\nschedule: 5m\nx-base: &base {type: maildir, path: x}\n"
            "source: {<<: *base, path: inbox}\nsender: {type: outbox, path: out, from: s@shop.example}\n")
    cfg = write(tmp_path, {"a.yaml": text})
    [err] = errors_of(cfg)  # only the unknown key; the override is fine
    assert err.startswith("pipelines/a.yaml: x-base: unknown key")


@pytest.mark.parametrize("value", ["9:00", "'9:00'", "09:30:00"])
def test_a_time_of_day_is_not_an_interval(tmp_path, value):
    """YAML 1.1 reads 9:00 as 540 (base 60): it would have run every 9 minutes."""
    cfg = write(tmp_path, {"a.yaml": GOOD.format(name="a").replace("5m", value)})
    [err] = errors_of(cfg)
    assert err.startswith("pipelines/a.yaml: schedule: ") and "looks like a time of day" in err
    assert "'0 9 * * *'" in err and "9m" in err


def test_a_duration_with_a_colon_is_explained(tmp_path):
    cfg = write(tmp_path, {"a.yaml": GOOD.format(name="a") + "lease: 10:00\n"})
    [err] = errors_of(cfg)
    assert err.startswith("pipelines/a.yaml: lease: expected a duration like 30s, 5m, 1h or "
                          "2d, got '10:00': a value with ':' is not a duration")


# -- pipeline files: what the loader checks --------------------------------------------------


@pytest.mark.parametrize("key, value, expected", [
    ("source", "{}", "pipelines/a.yaml: source.type: missing; expected one of maildir, "
                     "schedule, gmail"),
    ("source", "", "pipelines/a.yaml: source.type: missing; expected one of maildir, "
                   "schedule, gmail"),
    ("sender", "{}", "pipelines/a.yaml: sender.type: missing; expected one of outbox, "
                     "webhook, gmail_reply, gmail_draft"),
    ("sender", "null", "pipelines/a.yaml: sender.type: missing; expected one of outbox, "
                       "webhook, gmail_reply, gmail_draft"),
])
def test_an_empty_source_or_sender_says_type_is_missing(tmp_path, capsys, key, value, expected):
    text = "\n".join(f"{key}: {value}" if line.startswith(key + ":") else line
                     for line in GOOD.format(name="a").splitlines()) + "\n"
    cfg = write(tmp_path, {"a.yaml": text})
    assert main(["validate", "-c", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert expected in err and "Traceback" not in err


def test_a_gmail_account_that_is_not_a_string(tmp_path, capsys):
    cfg = write(tmp_path, {"a.yaml": GOOD.format(name="a").replace(
        "{type: maildir, path: inbox}", "{type: gmail, account: [s]}")},
        top="gmail: {accounts: {s: {token_file: t.json}}}\n")
    assert main(["validate", "-c", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert "pipelines/a.yaml: source.account: expected a string, got a list ['s']" in err


def test_every_pipeline_pattern_that_matches_nothing_is_reported(tmp_path):
    cfg = write(tmp_path, {"a.yaml": GOOD.format(name="a")})
    cfg.write_text(cfg.read_text().replace(
        "pipelines: pipelines/*.yaml", "pipelines: [pipelines/a.yaml, pipelnes/*.yaml, b.yaml]"))
    assert errors_of(cfg) == [
        f"{cfg}: pipelines[1]: no pipeline files match pipelnes/*.yaml: folder "
        f"{tmp_path}/pipelnes not found",
        f"{cfg}: pipelines[2]: b.yaml: file not found (looked for {tmp_path}/b.yaml)"]
    # A glob in a folder that exists may match nothing (*.yml beside *.yaml)...
    cfg.write_text(cfg.read_text().replace(
        "pipelines: [pipelines/a.yaml, pipelnes/*.yaml, b.yaml]",
        "pipelines: [pipelines/*.yaml, pipelines/*.yml]"))
    assert [p.name for p in load_settings(cfg).pipelines] == ["a"]
    # ... but not every pattern at once.
    cfg.write_text(cfg.read_text().replace(
        "pipelines: [pipelines/*.yaml, pipelines/*.yml]", "pipelines: [pipelines/*.yml]"))
    assert errors_of(cfg) == [f"{cfg}: pipelines: no pipeline files match pipelines/*.yml "
                              f"(in {tmp_path})"]
    cfg.write_text(cfg.read_text().replace("pipelines: [pipelines/*.yml]",
                                           "pipelines: [pipelines/a.yaml, pipelnes/*.yaml, b.yaml]"))
    cfg.write_text(cfg.read_text().replace(
        "pipelines: [pipelines/a.yaml, pipelnes/*.yaml, b.yaml]", "pipelines: []"))
    assert errors_of(cfg) == [f"{cfg}: pipelines: expected at least one pipeline file or "
                              "glob, like pipelines/*.yaml"]


def test_a_file_matched_by_two_patterns_is_loaded_once(tmp_path):
    cfg = write(tmp_path, {"a.yaml": GOOD.format(name="a")})
    cfg.write_text(cfg.read_text().replace(
        "pipelines: pipelines/*.yaml", "pipelines: [pipelines/a.yaml, pipelines/*.yaml, "
                                       "./pipelines/a.yaml]"))
    assert [p.name for p in load_settings(cfg).pipelines] == ["a"]


def test_an_approval_typo_is_not_silently_the_console(tmp_path):
    cfg = write(tmp_path, {"a.yaml": GOOD.format(name="a") + "approval: {chanel: telegram}\n"})
    assert errors_of(cfg) == ["pipelines/a.yaml: approval.chanel: unknown key; "
                              "did you mean 'channel'?"]


@pytest.mark.parametrize("value", ["-1", "0s", "0"])
def test_a_lease_must_be_above_zero(tmp_path, value):
    """0s used to become the 10 minute default, -1 made every draft time out."""
    cfg = write(tmp_path, {"a.yaml": GOOD.format(name="a") + f"lease: {value}\n"})
    [err] = errors_of(cfg)
    assert err.startswith("pipelines/a.yaml: lease: expected a duration above 0 like 10m, got ")
    assert "Traceback" not in err


def test_a_missing_lease_gets_the_default(tmp_path):
    cfg = write(tmp_path, {"a.yaml": GOOD.format(name="a") + "lease:\n"})
    assert load_settings(cfg).pipelines[0].lease == 600.0


@pytest.mark.parametrize("sweep, expected", [
    ("{every: 0s}", "draftgate.yaml: sweep.every: expected a duration of at least 1 minute "
                    "like 1d, got '0s'"),
    ("{every: 30s}", "draftgate.yaml: sweep.every: expected a duration of at least 1 minute"),
    ("{seen_ttl_days: -1}", "draftgate.yaml: sweep.seen_ttl_days: expected a number of days "
                            "above 0, got -1"),
    ("{runs_keep_days: 0}", "draftgate.yaml: sweep.runs_keep_days: expected a number of days "
                            "above 0, got 0"),
    ("{approval_ttl_days: -3}", "draftgate.yaml: sweep.approval_ttl_days: expected a number "
                                "of days above 0, got -3; leave it out"),
])
def test_sweep_settings_must_be_sensible(tmp_path, sweep, expected):
    cfg = write(tmp_path, {"a.yaml": GOOD.format(name="a")}, top=f"sweep: {sweep}\n")
    [err] = errors_of(cfg)
    assert expected in err


def test_a_prompt_must_be_a_file_found_where_the_drafter_reads_it(tmp_path, monkeypatch):
    home = tmp_path / "home"
    home.mkdir()
    (home / "reply.txt").write_text("Hi {first_name}")
    monkeypatch.setenv("HOME", str(home))
    (tmp_path / "templates").mkdir()

    def drafter(prompt):
        return write(tmp_path, {"a.yaml": GOOD.format(name="a")
                                + f"drafter: {{model: template, prompt: '{prompt}'}}\n"})

    [p] = load_settings(drafter("~/reply.txt")).pipelines  # the runtime expands ~ too
    assert p.path(p.drafter.prompt) == home / "reply.txt"
    assert errors_of(drafter("templates")) == [
        f"pipelines/a.yaml: drafter.prompt: templates is a folder ({tmp_path}/templates); "
        "expected a file"]
    assert errors_of(drafter("/nowhere/reply.txt")) == [
        "pipelines/a.yaml: drafter.prompt: file not found: /nowhere/reply.txt "
        "(looked for /nowhere/reply.txt)"]


@pytest.mark.parametrize("line, expected", [
    ("daily_token_budget: -5", "pipelines/a.yaml: daily_token_budget: expected a whole number "
                               "of tokens (0 or left out: no budget), got -5"),
    ("catchup: {policy: all, max: -1}", "pipelines/a.yaml: catchup.max: expected a whole "
                                        "number of slots of at least 1, got -1"),
])
def test_budgets_and_catchup_limits_must_be_positive(tmp_path, line, expected):
    cfg = write(tmp_path, {"a.yaml": GOOD.format(name="a") + line + "\n"})
    [err] = errors_of(cfg)
    assert err.startswith(expected)


def test_a_bad_store_url_is_reported_at_load_naming_the_key(tmp_path, capsys):
    cfg = write(tmp_path, {"a.yaml": GOOD.format(name="a")})
    cfg.write_text(cfg.read_text().replace(f"sqlite:///{tmp_path}/s.db", "sqlite://"))
    for command in ("validate", "status"):
        assert main([command, "-c", str(cfg)]) == 2
        err = capsys.readouterr().err
        assert f"{cfg}: store: bad SQLite store URL 'sqlite://'" in err
    cfg.write_text(cfg.read_text().replace("sqlite://", "postgresql://u@h/db?schema=a-b"))
    [err] = errors_of(cfg)
    assert err.startswith(f"{cfg}: store: store URL 'postgresql://u@h/db?schema=a-b': "
                          "schema='a-b' is not a plain identifier")


# -- telegram: what run would refuse, validate reports (without reading the token) ------------


@pytest.mark.parametrize("telegram, approval, expected", [
    ("{operators: [1], approvals_chat: 5}", "{channel: telegram, chat: abc}",
     ["pipelines/a.yaml: approval.chat: expected a numeric Telegram chat id (like 123456789, "
      "or -1001234567890 for a group), got a string 'abc'"]),
    ("{operators: [1], approvals_chat: 5, receive: webhook}", "{channel: telegram}",
     ["draftgate.yaml: telegram.webhook.url: missing; required when telegram.receive is webhook",
      "draftgate.yaml: telegram.webhook.secret_env: missing; required when telegram.receive "
      "is webhook"]),
    ("{operators: [1], approvals_chat: 5, base_url: 'not a url', token_env: ''}",
     "{channel: telegram}",
     ["draftgate.yaml: telegram.token_env: expected the name of an environment variable, like "
      "TELEGRAM_BOT_TOKEN, got ''",
      "draftgate.yaml: telegram.base_url: expected an http:// or https:// URL, got 'not a url'"]),
    ("{operators: [1], approvals_chat: 5, receive: webhook, webhook: {url: 'https://b.example/t',"
     " secret_env: S, port: 99999, lisen: x}}", "{channel: telegram}",
     ["draftgate.yaml: telegram.webhook.lisen: unknown key; did you mean 'listen'?",
      "draftgate.yaml: telegram.webhook.port: expected a port from 1 to 65535, got 99999"]),
])
def test_validate_reports_what_the_telegram_channel_would_refuse(
        tmp_path, capsys, monkeypatch, telegram, approval, expected):
    monkeypatch.delenv("TELEGRAM_BOT_TOKEN", raising=False)
    cfg = write(tmp_path, {"a.yaml": GOOD.format(name="a") + f"approval: {approval}\n"},
                top=f"telegram: {telegram}\n")
    assert main(["validate", "-c", str(cfg)]) == 2
    err = capsys.readouterr().err
    for e in expected:
        assert e in err
    assert "Traceback" not in err


def test_a_model_no_pipeline_uses_is_checked_too(tmp_path, capsys):
    """README: an api_key in YAML is refused; that held only for models in use."""
    cfg = write(tmp_path, {"a.yaml": GOOD.format(name="a")},
                top="models:\n  spare: {provider: openai, model: x, api_key: sk-123, tmeout: 5s}\n"
                    "  local: {provider: template, base_url: 'http://x'}\n")
    assert main(["validate", "-c", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert "draftgate.yaml: models.spare.api_key: never put the key in YAML" in err
    assert "draftgate.yaml: models.spare.tmeout: unknown key; did you mean 'timeout'?" in err
    assert "draftgate.yaml: models.local.base_url: unknown key" in err
    assert "sk-123" not in err and "<unused>" not in err and "Traceback" not in err


def test_a_tilde_in_a_relative_sqlite_store_means_the_home_folder(tmp_path, monkeypatch):
    from bot.config.load import load_settings

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    cfg = write_raw(tmp_path, {"p.yaml": GOOD.format(name="p")},
                    "store: sqlite:///~/draftgate/state.db\npipelines: pipelines/*.yaml\n")
    assert load_settings(cfg).store == f"sqlite:///{tmp_path}/home/draftgate/state.db"


def test_quoted_numbers_a_zero_budget_and_a_proxy_login_in_the_bot_api_url_are_accepted(tmp_path):
    """Valid before the stricter checks, still valid: port: "8443", budget 0 (none), and
    a self-hosted Bot API behind a proxy that wants a login."""
    cfg = write(tmp_path, {"a.yaml": GOOD.format(name="a") + "daily_token_budget: 0\n"
                                                             'max_attempts: "4"\n'})
    settings = load_settings(cfg)
    [p] = settings.pipelines
    assert p.daily_token_budget is None and p.max_attempts == 4
    cfg.write_text(cfg.read_text() + "telegram:\n  token_env: TG_TOKEN\n  operators: [1]\n"
                   "  approvals_chat: 1\n  base_url: https://user:pw@botapi.example/bot\n")
    assert load_settings(cfg).telegram.base_url == "https://user:pw@botapi.example/bot"


def test_a_bad_url_is_reported_without_the_credentials_in_it(tmp_path):
    cfg = write(tmp_path, {"a.yaml": GOOD.format(name="a")})
    cfg.write_text(cfg.read_text() + "telegram:\n  token_env: TG_TOKEN\n  operators: [1]\n"
                   "  approvals_chat: 1\n  base_url: https://user:S3CRETPW@host:99999/bot\n")
    [err] = errors_of(cfg)
    assert "telegram.base_url" in err and "S3CRETPW" not in err


def test_a_store_left_in_a_folder_named_tilde_is_not_silently_replaced(tmp_path, monkeypatch):
    """Before ~ was expanded, sqlite:///~/dg/state.db lived in <config dir>/~/dg: an
    upgrade must not start an empty store elsewhere (maildir mail drafted again)."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    cfg = write(tmp_path, {"a.yaml": GOOD.format(name="a")})
    cfg.write_text(cfg.read_text().replace(f"store: sqlite:///{tmp_path}/s.db",
                                           "store: sqlite:///~/dg/state.db"))
    assert "sqlite:///~/dg/state.db" in cfg.read_text()
    (tmp_path / "~" / "dg").mkdir(parents=True)
    (tmp_path / "~" / "dg" / "state.db").write_bytes(b"")
    [err] = errors_of(cfg)
    assert f"the store is at {tmp_path}/~/dg/state.db" in err and "move the file there" in err


def test_stage_options_are_parsed_once_at_load_into_frozen_types_with_their_defaults(tmp_path):
    """Nothing downstream reads the YAML mapping: the loader hands over typed options,
    each default filled in from one place."""
    from dataclasses import FrozenInstanceError

    from bot.config.options import (
        ApprovalOptions,
        DrafterOptions,
        MaildirSourceOptions,
        WebhookSenderOptions,
    )

    cfg = write(tmp_path, {"a.yaml": "name: a\nsource: {type: maildir, path: inbox}\n"
                                     "sender: {type: webhook, url: 'https://h.example/x'}\n"
                                     "filters: {max_body: 1MB, skip_own:}\n"})
    [p] = load_settings(cfg).pipelines
    assert p.source == MaildirSourceOptions("inbox", max_body=200_000, max_age=None)
    assert p.sender == WebhookSenderOptions("https://h.example/x", secret_env=None, timeout=10.0)
    assert (p.filters.max_body, p.filters.skip_own) == (1_000_000, True)
    assert (p.approval, p.drafter) == (ApprovalOptions("console", None), DrafterOptions())
    with pytest.raises(FrozenInstanceError):
        p.sender.timeout = 1.0  # type: ignore[misc]


def test_a_wrong_stage_option_is_reported_when_the_configuration_loads(tmp_path):
    """Not only when a command gets round to building the stage."""
    cfg = write(tmp_path, {"a.yaml": "name: a\nsource: {type: maildir, path: inbox}\n"
                                     "sender: {type: webhook, url: 'https://h.example/x', "
                                     "timeout: soon}\n"})
    assert errors_of(cfg) == ["pipelines/a.yaml: sender.timeout: expected a duration like 30s, "
                              "5m, 1h or 2d, got 'soon'"]


TEAM_TOP = "telegram:\n  token_env: T\n  operators: [1, 2]\n  approvals_chat: 5\n"


def test_the_team_keys_load_typed_with_their_defaults(tmp_path):
    """approval.quorum/operators/remind_after and telegram.digest become typed options;
    left out, one approval by any operator, no reminders, no digest."""
    team = GOOD.format(name="a") + ("approval: {channel: telegram, quorum: 2, operators: [1, 2],"
                                    " remind_after: 4h}\n")
    plain = GOOD.format(name="b") + "approval: {channel: telegram}\n"
    s = load_settings(write(tmp_path, {"a.yaml": team, "b.yaml": plain},
                            TEAM_TOP + '  digest: "0 8 * * *"\n'))
    a, b = s.pipelines
    assert (a.approval.quorum, a.approval.operators, a.approval.remind_after) == (2, (1, 2), 14400.0)
    assert (b.approval.quorum, b.approval.operators, b.approval.remind_after) == (1, None, None)
    assert s.telegram.digest == "0 8 * * *"
    # The console decides only a pipeline one operator approves and that names nobody.
    assert (a.approval.console, b.approval.console) == (False, True)
    from bot.desk.operator import CONSOLE, refusal, telegram

    assert refusal(s, telegram(1), "a") is None and refusal(s, telegram(3), "a") is not None
    assert refusal(s, CONSOLE, "a") is None  # reading
    assert refusal(s, CONSOLE, "a", deciding=True) is not None
    assert refusal(s, CONSOLE, "b", deciding=True) is None


def test_bad_team_keys_are_refused_naming_the_path_and_the_fix(tmp_path):
    bad = GOOD.format(name="a") + ("approval: {channel: telegram, quorum: 3, operators: [1, 9, x],"
                                   " remind_after: 0s}\n")
    console = GOOD.format(name="b") + "approval: {channel: console, quorum: 2}\n"
    nobody = GOOD.format(name="c") + "approval: {channel: telegram, operators: []}\n"
    cfg = write(tmp_path, {"a.yaml": bad, "b.yaml": console, "c.yaml": nobody},
                TEAM_TOP + '  digest: "every morning"\n')
    assert errors_of(cfg) == [
        f"{cfg}: telegram.digest: expected a cron expression like '0 8 * * *' (every "
        "day at 08:00 UTC): 'every morning' has 2 fields, cron needs 5 (minute hour day month "
        "weekday)",
        "pipelines/a.yaml: approval.operators[1]: 9 is not in telegram.operators of "
        f"{cfg}, so the bot drops their taps; add them there too",
        "pipelines/a.yaml: approval.operators[2]: expected a numeric Telegram user id, got 'x'",
        "pipelines/a.yaml: approval.quorum: 3 approvals needed but only 2 operator(s) may "
        "decide this pipeline's cards; nothing could be sent",
        "pipelines/a.yaml: approval.remind_after: expected a duration of at least 1s like 4h, "
        "got '0s'",
        "pipelines/b.yaml: approval.quorum: needs approval.channel: telegram (a console "
        "approval has one operator and no card)",
        "pipelines/c.yaml: approval.operators: expected at least one numeric user id; leave "
        "it out to let every telegram.operators entry decide"]


def test_timezone_is_an_iana_name_and_a_typo_gets_the_closest_one(tmp_path):
    good = write(tmp_path, {"a.yaml": GOOD.format(name="a").replace("5m", "'0 9 * * *'")
                            + "timezone: Europe/Berlin\n"})
    [p] = load_settings(good).pipelines
    assert (p.timezone, p.cron) == ("Europe/Berlin", "0 9 * * *")
    assert load_settings(write(tmp_path, {"a.yaml": GOOD.format(name="a")})).pipelines[0] \
        .timezone == "UTC"
    cfg = write(tmp_path, {"a.yaml": GOOD.format(name="a") + "timezone: Europe/Berln\n"},
                top="telegram: {operators: [1], approvals_chat: 1, timezone: utc}\n")
    assert errors_of(cfg) == [
        f"{cfg}: telegram.timezone: unknown time zone 'utc'; did you mean 'UTC'? Use "
        "an IANA name such as Europe/Berlin, America/New_York or UTC",
        "pipelines/a.yaml: timezone: unknown time zone 'Europe/Berln'; did you mean "
        "'Europe/Berlin'? Use an IANA name such as Europe/Berlin, America/New_York or UTC"]


def test_grounded_draft_keys_default_and_refuse_what_they_cannot_do(tmp_path):
    """retrieval / embeddings / grounding (issue 24): defaults, a bare YAML off, and
    errors that say what is expected."""
    models = ("models:\n  llm: {provider: openai, base_url: 'http://127.0.0.1:9/v1', model: m}\n"
              "  claude: {provider: anthropic, model: c}\n")
    ok = GOOD.format(name="a") + "drafter: {model: llm}\n"
    [p] = load_settings(write(tmp_path, {"a.yaml": ok}, models)).pipelines
    assert (p.drafter.retrieval, p.drafter.embeddings, p.drafter.grounding) == \
        ("hybrid", "local", "flag")
    off = GOOD.format(name="a") + "drafter: {model: llm, grounding: off, embeddings: llm}\n"
    [p] = load_settings(write(tmp_path, {"a.yaml": off}, models)).pipelines
    assert (p.drafter.grounding, p.drafter.embeddings) == ("off", "llm")
    bad = GOOD.format(name="a") + ("drafter: {model: llm, retrieval: vector, grounding: block, "
                                   "embeddings: claude}\n")
    errors = errors_of(write(tmp_path, {"a.yaml": bad}, models))
    assert any("drafter.retrieval: expected one of hybrid, lexical" in e for e in errors)
    assert any("drafter.grounding: expected one of flag, confirm, off" in e for e in errors)
    assert any("drafter.embeddings: expected local" in e and "'claude'" in e for e in errors)


# -- YAML aliases and long values (issue 22, finding 8) -------------------------------------

_LAUGHS = "".join(f"{c}: &{c} [{', '.join([f'*{p}'] * 9) if p.strip() else ', '.join(['lol'] * 9)}]\n"
                  for p, c in zip(" abcdefgh", "abcdefghi", strict=True)) + "pipelines: *i\nstore: *i\n"


def test_nested_aliases_are_refused_at_once_with_a_short_error(tmp_path):
    """A few hundred bytes of nested aliases ("billion laughs") make `validate` answer
    in one short line naming the file, not run for seconds printing megabytes."""
    import subprocess
    import sys

    cfg = tmp_path / "draftgate.yaml"
    cfg.write_text(_LAUGHS)
    assert len(_LAUGHS) < 500
    done = subprocess.run([sys.executable, "-m", "bot", "validate", "-c", str(cfg)],
                          capture_output=True, text=True, timeout=300,
                          cwd=Path(__file__).resolve().parents[2])
    out = done.stdout + done.stderr
    assert done.returncode != 0
    assert len(out) < 1000, out[:2000]
    assert f"{cfg}: its aliases (*name) expand it by more than 10000 values" in out


def test_an_alias_that_contains_itself_is_refused(tmp_path):
    cfg = write(tmp_path, {"a.yaml": GOOD.format(name="a") + "extra: &loop [1, *loop]\n"})
    assert errors_of(cfg) == [
        "pipelines/a.yaml: an alias (*name) contains itself, so it would expand without end; "
        "aliases are for small repeated pieces: write the values out or nest aliases less "
        "deeply"]


def test_anchors_and_merge_keys_for_shared_settings_still_load(tmp_path):
    shared = "x-defaults: &defaults {schedule: 5m, max_attempts: 4}\n"
    cfg = write(tmp_path, {f"{n}.yaml": shared + GOOD.format(name=n).replace("schedule: 5m\n", "")
                           + "<<: *defaults\n" for n in ("a", "b")})
    with pytest.raises(Exception) as info:  # x-defaults is not a pipeline key
        load_settings(cfg)
    assert all("x-defaults: unknown key" in e for e in info.value.errors)  # type: ignore[attr-defined]


def test_a_long_wrong_value_is_cut_before_it_is_shown(tmp_path):
    """A wrong value is quoted in a few dozen characters, whatever its size."""
    cfg = write(tmp_path, {"a.yaml": GOOD.format(name="a") + "max_attempts: [" +
                           ", ".join(["'" + "x" * 1000 + "'"] * 1000) + "]\n"})
    [err] = errors_of(cfg)
    assert err.startswith("pipelines/a.yaml: max_attempts: expected a whole number, got a list ['xx")
    assert len(err) < 500  # the value was 1 MB
