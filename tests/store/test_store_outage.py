"""A store that goes away, as a running service meets it: the real `draftgate run` on a
private PostgreSQL server that the test kills and starts again, and on a SQLite store
whose disk fills up. One WARNING when the store becomes unreachable and one INFO when
it is back, `/healthz` and `/status` saying held, `/readyz` 503, one notice past
``outage.notify_after`` and one at the end, and nothing lost."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests._pgcluster import pg_cluster  # noqa: F401 (a fixture)
from tests._proc import ORDER_EMAIL, ROOT, reap
from tests.fakes.telegram import FakeTelegram
from tests.support.service import _email, _free_port, _get

ANNA, CHAT = 42, 1001


def _config(tmp_path: Path, fake: FakeTelegram, port: int, store: str,
            max_body: str = "200kB") -> Path:
    (tmp_path / "inbox").mkdir(exist_ok=True)
    (tmp_path / "reply.txt").write_text("Hi {first_name},\n\nthanks for writing about {subject}.\n")
    (tmp_path / "pipelines").mkdir(exist_ok=True)
    (tmp_path / "pipelines" / "support.yaml").write_text(textwrap.dedent(f"""\
        name: support
        schedule: 1s
        lease: 30s
        source: {{type: maildir, path: inbox, max_body: {max_body}}}
        drafter: {{model: template, prompt: reply.txt}}
        approval: {{channel: telegram}}
        sender: {{type: outbox, path: outbox, from: "Acme <support@acme.example>"}}
        """))
    cfg = tmp_path / "draftgate.yaml"
    cfg.write_text(textwrap.dedent(f"""\
        store: {store}
        pipelines: pipelines/*.yaml
        outage: {{notify_after: 2s}}
        observability:
          listen: 127.0.0.1:{port}
        logging: {{format: json}}
        """) + fake.config_yaml("DG_OUT_TELEGRAM_TOKEN", [ANNA], CHAT, "1s"))
    return cfg


class _Run:
    """`python -m bot run` with its JSON log lines read as they come."""

    def __init__(self, cfg: Path, fake: FakeTelegram, tmp_path: Path):
        self.cfg, self.log = cfg, tmp_path / "stderr.log"
        with self.log.open("ab") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "bot", "run", "-c", str(cfg)], cwd=ROOT,
                stdin=subprocess.DEVNULL, stdout=err, stderr=err,
                env=dict(os.environ, DG_OUT_TELEGRAM_TOKEN=fake.token))

    def lines(self) -> list[dict]:
        out = []
        for raw in self.log.read_text(errors="replace").splitlines():
            try:
                out.append(json.loads(raw))
            except ValueError:
                out.append({"level": "RAW", "message": raw})
        return out

    def until(self, predicate, timeout: float = 60.0) -> dict:
        """The first log line matching ``predicate``, waiting for it."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = [line for line in self.lines() if predicate(line)]
            if found:
                return found[0]
            if self.proc.poll() is not None:
                break
            time.sleep(0.1)
        raise AssertionError("no such log line; the log:\n" + self.log.read_text()[-6000:])


def _health(port: int, path: str) -> tuple[int, dict]:
    status, body = _get(port, path)
    return status, json.loads(body)


def _wait_health(port: int, path: str, check) -> dict:
    deadline = time.monotonic() + 60
    last: object = None
    while time.monotonic() < deadline:
        try:
            last = _health(port, path)
            if check(*last):
                return last[1]
        except OSError as exc:
            last = exc
        time.sleep(0.1)
    raise AssertionError(f"{path} never answered as expected; last: {last}")


def _noisy(lines: list[dict]) -> list[dict]:
    """WARNING and worse lines, tracebacks and lines that are not draftgate's JSON."""
    return [line for line in lines if line.get("level") in ("WARNING", "ERROR", "CRITICAL", "RAW")
            or "exception" in line]


def _notices(fake: FakeTelegram) -> list[str]:
    return [m.text for m in fake.chat_messages(CHAT)
            if m.text.startswith(("⚠️ The store", "✅ The store"))]


def _outage_cycle(run: _Run, fake: FakeTelegram, port: int, tmp_path: Path,
                  go_away, come_back, n_before: int) -> None:
    """Take the store away, check what the service says, bring it back, check again."""
    go_away()
    warning = run.until(lambda line: "store unreachable" in line.get("message", "")
                        and line["level"] == "WARNING")
    body = _wait_health(port, "/healthz", lambda status, b: b.get("status") == "held")
    assert body["held"].startswith("store unreachable since "), body
    status, ready = _health(port, "/readyz")
    assert status == 503, ready
    # `draftgate status` asks the running service; /status in Telegram says it too.
    shown = subprocess.run([sys.executable, "-m", "bot", "status", "-c", str(run.cfg)],
                           cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert "held: store unreachable since " in shown.stdout, (shown.stdout, shown.stderr)
    asked = fake.say(ANNA, CHAT, "/status")
    asked_id = asked["message"]["message_id"]
    reply = fake.wait_for(lambda: [m for m in fake.chat_messages(CHAT)
                                   if m.message_id > asked_id and "held:" in m.text], 30)
    assert "held: store unreachable since " in reply[0].text, reply[0].text
    # Past notify_after (2 s), the ops chat is told once.
    fake.wait_for(lambda: any("unreachable" in t for t in _notices(fake)), 30)
    (tmp_path / "inbox" / "late.eml").write_bytes(_email(99, "Carol <carol@customer.example>"))
    come_back()
    back = run.until(lambda line: "store is back" in line.get("message", ""))
    assert back["level"] == "INFO", back
    assert " after " in back["message"], back
    fake.wait_for(lambda: any("back" in t for t in _notices(fake)), 30)
    _wait_health(port, "/healthz", lambda status, b: status == 200 and b["status"] == "ok")
    _wait_health(port, "/readyz", lambda status, b: status == 200)
    # Mail that came during the outage still gets its card, once.
    fake.wait_for(lambda: [m for m in fake.chat_messages(CHAT) if "Carol" in m.text], 60)
    # And mail that comes after it.
    (tmp_path / "inbox" / "after.eml").write_bytes(_email(100, "Dan <dan@customer.example>"))
    fake.wait_for(lambda: [m for m in fake.chat_messages(CHAT) if "Dan" in m.text], 60)
    noisy = _noisy(run.lines())
    assert noisy == [warning], "\n".join(json.dumps(line) for line in noisy)
    notices = _notices(fake)
    assert len([t for t in notices if "unreachable" in t]) == 1, notices
    assert len([t for t in notices if "back" in t]) == 1, notices
    cards = [m for m in fake.chat_messages(CHAT) if "Where is my order" in m.text]
    assert len(cards) == n_before + 2, [m.text for m in cards]


@pytest.mark.slow
def test_a_postgresql_outage_is_one_warning_held_health_two_notices_and_no_loss(
        tmp_path, pg_cluster):  # noqa: F811
    """The server is killed under a running service: one WARNING, /healthz held,
    /readyz 503, a notice after notify_after; restarted: one INFO with the outage's
    length, a notice, and mail that came meanwhile gets its card."""
    port = _free_port()
    with FakeTelegram() as fake:
        cfg = _config(tmp_path, fake, port, pg_cluster.dsn + "?schema=outage")
        (tmp_path / "inbox" / "1.eml").write_bytes(ORDER_EMAIL)
        run = _Run(cfg, fake, tmp_path)
        try:
            fake.wait_for(lambda: fake.chat_messages(CHAT), 60)
            _wait_health(port, "/healthz", lambda status, b: status == 200)
            _outage_cycle(run, fake, port, tmp_path, pg_cluster.kill, pg_cluster.start, 1)
        finally:
            reap(run.proc)


@pytest.fixture
def small_disk(tmp_path):
    """A 32 MB tmpfs for the store alone (root only: mount)."""
    where = tmp_path / "disk"
    where.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=32m,mode=0755", "tmpfs",
                           str(where)], capture_output=True, text=True)
    if done.returncode != 0:
        why = f"cannot mount a small tmpfs for a full disk: {done.stderr.strip()}"
        if os.environ.get("CI") == "true":
            pytest.fail("CI=true: " + why)
        pytest.skip(why)
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


def _fill(disk: Path) -> None:
    """Write a file until the disk is full."""
    chunk = b"\0" * 65536
    with (disk / "filler").open("wb", buffering=0) as f:
        with contextlib.suppress(OSError):
            while True:
                f.write(chunk)
        with contextlib.suppress(OSError):  # the last few pages
            while True:
                f.write(b"\0" * 512)
    with pytest.raises(OSError) as full:
        (disk / "probe").write_bytes(chunk)
    assert full.value.errno == errno.ENOSPC


@pytest.mark.slow
def test_a_full_sqlite_disk_is_one_warning_held_health_two_notices_and_no_loss(
        tmp_path, small_disk):
    """The store's disk fills up under a running service (an 8 MB mail cannot be
    stored: more than SQLite's write-ahead log can take without growing): one WARNING, /healthz held, /readyz 503, a notice after notify_after;
    space freed: one INFO with the length, a notice, and both the big mail and one
    that came meanwhile get their cards."""
    port = _free_port()
    big = ORDER_EMAIL.replace(b"Where is my order #1234?", b"Big attachment") \
        .replace(b"<order-1234@", b"<big-1@") + b"x" * 8_000_000 + b"\n"

    def go_away() -> None:
        _fill(small_disk)
        (tmp_path / "inbox" / "big.eml").write_bytes(big)

    with FakeTelegram() as fake:
        cfg = _config(tmp_path, fake, port, f"sqlite:///{small_disk}/state.db", "20MB")
        (tmp_path / "inbox" / "1.eml").write_bytes(ORDER_EMAIL)
        run = _Run(cfg, fake, tmp_path)
        try:
            fake.wait_for(lambda: fake.chat_messages(CHAT), 60)
            _wait_health(port, "/healthz", lambda status, b: status == 200)
            _outage_cycle(run, fake, port, tmp_path, go_away,
                          lambda: (small_disk / "filler").unlink(), 1)
            fake.wait_for(lambda: [m for m in fake.chat_messages(CHAT)
                                   if "Big attachment" in m.text], 60)
        finally:
            reap(run.proc)


# -- outage.notify_after ------------------------------------------------------------------

@pytest.mark.parametrize("value, expected", [
    (None, 120.0), ("30s", 30.0), ("0s", 0.0), ("5m", 300.0)])
def test_notify_after_is_a_duration_with_a_two_minute_default(tmp_path, value, expected):
    """outage.notify_after: left out, 2 minutes; else the duration given (0: at once)."""
    from bot.config.load import load_settings
    from tests.support.configs import GOOD, write

    top = "" if value is None else f"outage: {{notify_after: {value}}}\n"
    cfg = write(tmp_path, {"a.yaml": GOOD.format(name="a")}, top)
    assert load_settings(cfg).outage.notify_after == expected


@pytest.mark.parametrize("outage, expected", [
    ("{notify_after: -5}", "draftgate.yaml: outage.notify_after: expected a duration of 0 "
                           "or more like 2m, got -5"),
    ("{notify_after: soon}", "draftgate.yaml: outage.notify_after: expected a duration like "
                             "30s, 5m, 1h or 2d, got 'soon'"),
    ("{notify_afer: 2m}", "draftgate.yaml: outage.notify_afer: unknown key; did you mean "
                          "'notify_after'?"),
    ("5m", "draftgate.yaml: outage: expected a mapping"),
])
def test_a_bad_notify_after_is_refused_naming_the_key(tmp_path, outage, expected):
    """A negative, unreadable or misspelt outage option is a configuration error that
    names the file, the key and what is expected."""
    from tests.support.configs import GOOD, errors_of, write

    cfg = write(tmp_path, {"a.yaml": GOOD.format(name="a")}, f"outage: {outage}\n")
    found = errors_of(cfg)
    assert any(expected in e for e in found), found
