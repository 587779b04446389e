"""IMAP through the real CLI: ``validate`` on the imap keys, and ``run`` against a real
Dovecot (new mail gets a card, a restart drafts nothing twice, a SIGKILL during the
send delivers at most once)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading

import pytest

from tests._dovecot import PASSWORD, USERS, Dovecot, SmtpRelay
from tests._imap_world import env, order_mail, write_deployment
from tests._proc import ROOT, reap, run_cli, sqlite_rows, template_console_config, two_new_mails


def cli(*args: str, environ: dict | None = None) -> subprocess.CompletedProcess:
    return run_cli(*args, env=environ or env())


def deployment(tmp_path, account: str, pipeline: str = "source: {type: imap, account: shop}\n"
               "sender: {type: smtp_reply, account: shop}\n"):
    return template_console_config(tmp_path, "shop", f"imap:\n  accounts:\n    shop:\n{account}",
                                   pipeline)


GOOD = ("      host: imap.example.net\n      username: support@shop.example\n"
        "      password_env: SHOP_MAIL_PASSWORD\n"
        "      smtp: {host: smtp.example.net, port: 465, security: tls}\n")


def test_validate_accepts_an_imap_account_and_names_its_unset_password(tmp_path):
    cfg = deployment(tmp_path, GOOD)
    r = cli("validate", "-c", cfg, environ={k: v for k, v in os.environ.items()
                                             if k != "SHOP_MAIL_PASSWORD"})
    assert r.returncode == 0, r.stderr
    assert "source imap" in r.stdout and "sender smtp_reply" in r.stdout
    assert "imap.accounts.shop.password_env: environment variable SHOP_MAIL_PASSWORD is not " \
           "set" in r.stdout


@pytest.mark.parametrize("account, pipeline, expected", [
    (GOOD + "      password: hunter2\n", None,
     "password does not belong in YAML; set password_env to the name"),
    (GOOD.replace("imap.example.net", "imap.example.net\n      security: plain"), None,
     "imap.accounts.shop.security: plain sends the password unencrypted"),
    (GOOD.replace("      password_env: SHOP_MAIL_PASSWORD\n", ""), None,
     "imap.accounts.shop.password_env: missing"),
    (GOOD + "      sent_foldr: Sent\n", None,
     "imap.accounts.shop.sent_foldr: unknown key; did you mean 'sent_folder'?"),
    (GOOD, "source: {type: imap, account: shopp}\nsender: {type: imap_draft}\n",
     "pipelines/shop.yaml: source.account: unknown IMAP account 'shopp'; add it under "
     "imap.accounts"),
    (GOOD.replace("      smtp: {host: smtp.example.net, port: 465, security: tls}\n", ""), None,
     "sender.type: smtp_reply needs imap.accounts.shop.smtp"),
])
def test_validate_explains_what_is_wrong_with_imap_keys(tmp_path, account, pipeline, expected):
    cfg = deployment(tmp_path, account, *(pipeline,) if pipeline else ())
    r = cli("validate", "-c", cfg)
    assert r.returncode == 2
    assert expected in r.stderr, r.stderr
    assert "hunter2" not in r.stderr


@pytest.fixture
def dovecot():
    d = Dovecot().start()
    yield d
    d.stop()


def awaiting(db) -> list[tuple]:
    return sqlite_rows(db, "SELECT item_id, status FROM drafts ORDER BY id")


def test_run_gives_new_mail_a_card_and_a_restart_drafts_nothing_twice(tmp_path, dovecot):
    cfg = write_deployment(tmp_path, dovecot, None, sender="{type: imap_draft, account: shop}")
    r = two_new_mails(cli, cfg, dovecot.deliver, order_mail)
    assert PASSWORD not in r.stdout + r.stderr
    db = tmp_path / "state.db"
    assert awaiting(db) == [("<order-1@customer.test>", "awaiting"),
                            ("<order-2@customer.test>", "awaiting")]
    r = cli("run", "--once", "-c", str(cfg))  # a restart
    assert r.returncode == 0 and "Where is my order" not in r.stdout
    assert len(awaiting(db)) == 2


async def test_sigkill_during_the_send_delivers_at_most_once(tmp_path, dovecot):
    """``review`` approves and is killed while the SMTP server holds the message. The
    restart finds the send cut off, cannot see it in Sent (the provider does not file
    SMTP mail), and says so: at most one delivery, never a second hand-over."""
    relay = SmtpRelay(dovecot).start()
    relay.hold = threading.Event()
    try:
        cfg = write_deployment(tmp_path, dovecot, relay)
        assert cli("run", "--once", "-c", str(cfg)).returncode == 0
        dovecot.deliver(order_mail(3))
        assert cli("run", "--once", "-c", str(cfg)).returncode == 0
        review = subprocess.Popen([sys.executable, "-m", "bot", "review", "-c", str(cfg)],
                                  cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL, env=env())
        try:
            review.stdin.write(b"a\n")
            review.stdin.flush()
            assert relay.holding.wait(30), "the send never reached DATA"
            review.send_signal(signal.SIGKILL)
            review.wait(10)
        finally:
            reap(review)
            review.stdin.close()
        relay.hold.set()  # the server goes on (aiosmtpd drops a message whose client left)
        r = cli("run", "--once", "-c", str(cfg))
        assert r.returncode == 0, r.stderr
        r = cli("run", "--once", "-c", str(cfg))
        [(status, error)] = sqlite_rows(tmp_path / "state.db", "SELECT status, error FROM drafts")
        assert status == "send_unknown" and "interrupted" in error
        assert len(dovecot.messages(USERS[1])) <= 1
        assert len(relay.accepted) == 1
    finally:
        relay.stop()


async def test_doctor_checks_login_folders_idle_and_smtp_without_sending(tmp_path, dovecot):
    relay = SmtpRelay(dovecot).start()
    try:
        cfg = write_deployment(tmp_path, dovecot, relay)
        cli("run", "--once", "-c", str(cfg))  # the store doctor checks exists
        r = cli("doctor", "-c", str(cfg))
        out = r.stdout
        assert "✅ imap:shop login" in out and "✅ imap:shop sent folder" in out
        assert "✅ imap:shop drafts folder" in out and "IDLE: new mail starts a tick" in out
        assert "✅ smtp:shop login" in out and "nothing sent" in out
        assert relay.logins == [USERS[0]] and relay.accepted == []
        assert PASSWORD not in out + r.stderr
        bad = cli("doctor", "-c", str(cfg), environ={**env(), "DG_TEST_IMAP_PASSWORD": "wrong"})
        assert bad.returncode == 1 and "❌ imap:shop login" in bad.stdout
        assert "login as support@shop.test refused" in bad.stdout
    finally:
        relay.stop()
