"""`draftgate run` as a service, in a real subprocess against the fakes: /metrics read
with prometheus_client's parser, /healthz naming a stuck loop, /readyz, JSON logs, and
systemd's notify protocol played by a unix datagram socket."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from bot.cli.common import version
from tests._proc import ROOT, reap, sqlite_rows
from tests.fakes.telegram import FakeTelegram
from tests.support.service import (  # noqa: F401
    _email,
    _free_port,
    _get,
)

pytestmark = pytest.mark.slow
ANNA, CHAT = 42, 1001
OPENAI_KEY = "sk-svc-test-key-0123456789"  # registered (an unused model names it), never logged






def _config(tmp_path: Path, fake: FakeTelegram, port: int, *, schedule: str = "1h",
            lease: str = "10m") -> Path:
    (tmp_path / "inbox").mkdir()
    (tmp_path / "reply.txt").write_text("Hi {first_name},\n\nthanks for writing about {subject}.\n")
    (tmp_path / "pipelines").mkdir()
    (tmp_path / "pipelines" / "support.yaml").write_text(textwrap.dedent(f"""\
        name: support
        schedule: {schedule}
        lease: {lease}
        source: {{type: maildir, path: inbox}}
        filters: {{skip_senders: ["noreply@*"]}}
        drafter: {{model: template, prompt: reply.txt}}
        approval: {{channel: telegram}}
        sender: {{type: outbox, path: outbox, from: "Acme <support@acme.example>"}}
        """))
    cfg = tmp_path / "draftgate.yaml"
    cfg.write_text(textwrap.dedent(f"""\
        store: sqlite:///{tmp_path}/state.db
        pipelines: pipelines/*.yaml
        observability:
          listen: 127.0.0.1:{port}
        """) + fake.config_yaml("DG_SVC_TELEGRAM_TOKEN", [ANNA], CHAT, "2s") + textwrap.dedent("""\
        models:
          unused:
            provider: openai
            model: gpt-test
            api_key_env: DG_SVC_OPENAI_KEY
        """))
    return cfg


def _start(cfg: Path, fake: FakeTelegram, tmp_path: Path, *args: str,
           env: dict[str, str] | None = None) -> subprocess.Popen:
    with (tmp_path / "stderr.log").open("ab") as err, (tmp_path / "stdout.log").open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "bot", "run", "-c", str(cfg), *args], cwd=ROOT,
            stdin=subprocess.DEVNULL, stdout=out, stderr=err,
            env=dict(os.environ, DG_SVC_TELEGRAM_TOKEN=fake.token, DG_SVC_OPENAI_KEY=OPENAI_KEY,
                     **(env or {})))




def _wait_get(port: int, path: str, want: int) -> dict:
    """Poll ``path`` until it answers ``want`` (the server may not listen yet); its JSON."""
    deadline = time.monotonic() + 60
    last: object = None
    while time.monotonic() < deadline:
        try:
            status, body = _get(port, path)
            if status == want:
                return json.loads(body)
            last = (status, body)
        except OSError as exc:
            last = exc
        time.sleep(0.1)
    raise AssertionError(f"{path} never answered {want}; last: {last}")


def _metrics(port: int) -> dict[tuple[str, frozenset], float]:
    status, body = _get(port, "/metrics")
    assert status == 200
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(body.decode())
            for s in family.samples}


def _value(m: dict, name: str, **labels: str) -> float:
    return m.get((name, frozenset(labels.items())), 0.0)


def _button(card, label: str) -> str:
    return next(b["callback_data"] for row in card.reply_markup["inline_keyboard"] for b in row
                if label in b["text"])


def test_metrics_count_what_happened_and_json_logs_carry_fields_not_secrets(tmp_path):
    """/metrics over HTTP matches the flow (2 drafted, 1 skipped, 1 sent, 1 rejected, a
    Telegram 429), /readyz and /healthz say ok, and every stderr line of the run (at
    -vv, with --log-format json) is a JSON object with the structured fields and no
    token or API key."""
    port = _free_port()
    with FakeTelegram() as fake:
        cfg = _config(tmp_path, fake, port)
        (tmp_path / "inbox" / "1.eml").write_bytes(_email(1))
        (tmp_path / "inbox" / "2.eml").write_bytes(_email(2, "Bob <bob@customer.example>"))
        (tmp_path / "inbox" / "3.eml").write_bytes(_email(3, "noreply@shop.example"))
        fake.fail("getUpdates", 429, "Too Many Requests: retry after 1", retry_after=1)
        proc = _start(cfg, fake, tmp_path, "-vv", "--log-format", "json")
        try:
            cards = fake.wait_for(lambda: len(fake.chat_messages(CHAT)) == 2
                                  and fake.chat_messages(CHAT), 60)
            fake.wait_for(lambda: sqlite_rows(tmp_path / "state.db", "SELECT status FROM drafts "
                                              "WHERE status = 'awaiting'") == [("awaiting",)] * 2, 30)
            before = _metrics(port)
            assert _value(before, "draftgate_drafts", pipeline="support", status="awaiting") == 2
            assert _value(before, "draftgate_oldest_undecided_card_age_seconds",
                          pipeline="support") >= 0
            approve = fake.tap(ANNA, CHAT, cards[0].message_id, _button(cards[0], "Approve"), "Anna")
            reject = fake.tap(ANNA, CHAT, cards[1].message_id, _button(cards[1], "Reject"), "Anna")
            for tap in (approve, reject):
                fake.wait_for(lambda t=tap: fake.answers.get(t["callback_query"]["id"]), 30)
            prompt = fake.wait_for(lambda: [m for m in fake.chat_messages(CHAT)
                                            if "reason" in m.text], 30)[0]
            fake.say(ANNA, CHAT, "not our customer", reply_to=prompt.message_id)
            fake.wait_for(lambda: sqlite_rows(tmp_path / "state.db", "SELECT status FROM drafts "
                                              "WHERE status = 'rejected'"), 30)
            fake.wait_for(lambda: fake.calls_of("getUpdates", ok=True), 30)
            assert _wait_get(port, "/readyz", 200) == {"status": "ok"}
            assert _wait_get(port, "/healthz", 200) == {"status": "ok", "stuck": {}}
            # The store gauges are cached for a few seconds: wait for the decided state.
            deadline = time.monotonic() + 30
            while _value(m := _metrics(port), "draftgate_drafts", pipeline="support",
                         status="rejected") != 1 and time.monotonic() < deadline:
                time.sleep(0.2)
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(30) == 0, (tmp_path / "stderr.log").read_text()
        finally:
            reap(proc)
    v = lambda name, **labels: _value(m, name, **labels)  # noqa: E731
    assert v("draftgate_build_info", version=version()) == 1
    assert v("draftgate_items_total", pipeline="support", outcome="admitted") == 2
    assert v("draftgate_items_total", pipeline="support", outcome="skipped") == 1
    assert v("draftgate_items_total", pipeline="support", outcome="drafted") == 2
    assert v("draftgate_items_total", pipeline="support", outcome="failed") == 0
    runs = sqlite_rows(tmp_path / "state.db", "SELECT COUNT(*) FROM pipeline_runs WHERE status = 'ok'")
    assert v("draftgate_ticks_total", pipeline="support", outcome="ok") == runs[0][0] >= 1
    assert v("draftgate_tick_duration_seconds_count", pipeline="support") == runs[0][0]
    assert v("draftgate_last_successful_tick_timestamp_seconds", pipeline="support") > 0
    assert v("draftgate_sends_total", pipeline="support", outcome="sent") == 1
    assert v("draftgate_sends_total", pipeline="support", outcome="failed") == 0
    assert v("draftgate_model_calls_total", model="template", outcome="ok") == 2
    assert v("draftgate_model_call_duration_seconds_count", model="template", outcome="ok") == 2
    for decision in ("approved", "rejected"):
        assert v("draftgate_card_decision_wait_seconds_count", pipeline="support",
                 decision=decision) == 1
    for status in ("sent", "rejected", "skipped"):
        assert v("draftgate_drafts", pipeline="support", status=status) == 1
    assert v("draftgate_drafts", pipeline="support", status="awaiting") == 0
    assert v("draftgate_telegram_rate_limited_total", method="getUpdates") == 1
    assert v("draftgate_telegram_api_errors_total", method="getUpdates", error="429") == 1
    labels = {value for (_, ls) in m for _, value in ls}
    assert not [x for x in labels if "@" in x or ".eml" in x or "order-" in x], labels

    lines = (tmp_path / "stderr.log").read_text().splitlines()
    records = [json.loads(line) for line in lines]  # every line is one JSON object
    assert len(records) > 20
    assert all({"time", "level", "logger", "message"} <= r.keys() for r in records)
    sent = next(r for r in records if r["message"].startswith("support #") and " sent (" in r["message"])
    assert sent["pipeline"] == "support" and isinstance(sent["draft_id"], int) and sent["item_id"]
    assert any(isinstance(r.get("run_id"), int) and r["pipeline"] == "support" for r in records)
    assert any(r["message"].startswith("draftgate running 1 pipeline") for r in records)
    text = "\n".join(lines)
    assert fake.token not in text and fake.token.split(":")[1] not in text
    assert OPENAI_KEY not in text


class _Systemd:
    """The notify socket's other end: an abstract unix datagram socket, as systemd may
    hand out (``@name``), read by a thread into :attr:`seen` as datagrams arrive."""

    def __init__(self) -> None:
        self.name = f"@draftgate-test-{uuid.uuid4().hex}"
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind("\0" + self.name[1:])
        self.seen: list[str] = []
        self.cond = threading.Condition()
        self._read = 0
        threading.Thread(target=self._reader, daemon=True).start()

    def _reader(self) -> None:
        with contextlib.suppress(OSError):
            while msg := self.sock.recv(4096):
                with self.cond:
                    self.seen.append(msg.decode())
                    self.cond.notify_all()

    def until(self, predicate) -> list[str]:
        """The messages after those already returned, up to the first that satisfies
        ``predicate`` (included)."""
        with self.cond:
            start = self._read
            found = lambda: next((i for i in range(start, len(self.seen))  # noqa: E731
                                  if predicate(self.seen[i])), None)
            assert self.cond.wait_for(lambda: found() is not None, 30), self.seen[start:]
            end = found() + 1
            self._read = end
            return self.seen[start:end]

    def close(self) -> None:
        self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()


def test_healthz_and_the_systemd_watchdog_follow_a_stuck_pipeline_loop(tmp_path):
    """systemd is told READY=1, then WATCHDOG=1 while healthy. A tick hung on a
    Telegram call that never answers makes /healthz 503 naming the pipeline's loop,
    and the watchdog pings stop (STATUS= says why) until it answers; SIGTERM sends
    STOPPING=1."""
    port = _free_port()
    systemd = _Systemd()
    with FakeTelegram() as fake:
        # Bound: 2 x the 1 s schedule + the 1 s lease = 3 s without progress.
        cfg = _config(tmp_path, fake, port, schedule="1s", lease="1s")
        (tmp_path / "inbox" / "1.eml").write_bytes(_email(1))
        proc = _start(cfg, fake, tmp_path, env={"NOTIFY_SOCKET": systemd.name,
                                                "WATCHDOG_USEC": "400000"})
        try:
            systemd.until(lambda msg: "READY=1" in msg.splitlines())
            systemd.until(lambda msg: "WATCHDOG=1" in msg.splitlines())
            fake.wait_for(lambda: fake.chat_messages(CHAT), 30)
            assert _wait_get(port, "/healthz", 200)["stuck"] == {}

            release = fake.hold("sendMessage")  # the next card's post hangs the tick
            (tmp_path / "inbox" / "2.eml").write_bytes(_email(2, "Bob <bob@customer.example>"))
            body = _wait_get(port, "/healthz", 503)
            assert body["status"] == "stuck" and list(body["stuck"]) == ["support"], body
            assert "no progress" in body["stuck"]["support"]
            # Three watchdog periods while stuck: a STATUS line each, no WATCHDOG=1.
            systemd.until(lambda msg: msg.startswith("STATUS=unhealthy: support"))
            stuck = [systemd.until(lambda msg: msg.startswith("STATUS=")) for _ in range(3)]
            assert not [m for batch in stuck for m in batch if "WATCHDOG=1" in m.splitlines()]

            release.set()
            _wait_get(port, "/healthz", 200)
            systemd.until(lambda msg: "WATCHDOG=1" in msg.splitlines())
            fake.wait_for(lambda: len(fake.chat_messages(CHAT)) == 2, 30)
            proc.send_signal(signal.SIGTERM)
            systemd.until(lambda msg: "STOPPING=1" in msg.splitlines())
            assert proc.wait(30) == 0, (tmp_path / "stderr.log").read_text()
        finally:
            reap(proc)
            systemd.close()


# -- in process: configuration, the JSON form, the listener's edges ------------------------

@pytest.mark.parametrize("listen, expected", [
    ("9464", "observability.listen: expected HOST:PORT like 127.0.0.1:9464, got '9464'"),
    ("127.0.0.1:99999", "observability.listen: expected HOST:PORT like 127.0.0.1:9464"),
    ("localhost:http", "observability.listen: expected HOST:PORT"),
])
def test_a_bad_listen_address_says_what_is_expected(tmp_path, listen, expected):
    """observability.listen is refused with the file, the key and an example."""
    from tests.support.configs import GOOD, errors_of, write

    cfg = write(tmp_path, {"a.yaml": GOOD.format(name="a")},
                f"observability:\n  listen: {listen!r}\n")
    assert any(e.startswith(f"{cfg}: {expected}") for e in errors_of(cfg)), errors_of(cfg)


def test_logging_format_accepts_text_or_json_only(tmp_path):
    from bot.config.load import load_settings
    from tests.support.configs import GOOD, errors_of, write

    cfg = write(tmp_path, {"a.yaml": GOOD.format(name="a")}, "logging: {format: xml}\n")
    assert errors_of(cfg) == [f"{cfg}: logging.format: expected one of text, json, got 'xml'"]
    cfg = write(tmp_path, {"a.yaml": GOOD.format(name="a")},
                "logging: {format: json}\nobservability: {listen: '[::1]:9464'}\n")
    s = load_settings(cfg)
    assert (s.log_format, s.listen) == ("json", ("::1", 9464))


def test_a_json_log_line_carries_the_scope_and_hides_secrets():
    """Fields bound by the scope, a traceback in `exception`, secrets redacted, one line."""
    import logging

    from bot import redact
    from bot.service import logfmt

    redact.register("tok-123456789-secret", "TEST_TOKEN")
    fmt = logfmt.JsonFormatter()
    try:
        raise ValueError("bad\nline tok-123456789-secret")
    except ValueError:
        record = logging.LogRecord("draftgate.engine", logging.WARNING, __file__, 1,
                                   "%s: failed with %s", ("support", "tok-123456789-secret"),
                                   sys.exc_info())
    with logfmt.scope(pipeline="support", run_id=7):
        line = fmt.format(record)
    assert "\n" not in line and "tok-123456789-secret" not in line
    out = json.loads(line)
    assert out["pipeline"] == "support" and out["run_id"] == 7 and out["level"] == "WARNING"
    assert out["message"] == "support: failed with [redacted TEST_TOKEN]"
    assert "ValueError: bad\\nline [redacted TEST_TOKEN]" in out["exception"]
    assert "run_id" not in json.loads(fmt.format(record))  # the scope ended


async def test_the_listener_answers_404_and_readyz_503_when_the_store_fails(tmp_path):
    """Unknown paths get 404; /readyz is 503 with the store's error (no model, Gmail or
    Telegram call is involved)."""
    import asyncio

    from bot.config.load import load_settings
    from bot.service.observe import Service
    from tests.support.configs import GOOD, write

    port = _free_port()
    cfg = write(tmp_path, {"a.yaml": GOOD.format(name="a")},
                f"observability: {{listen: '127.0.0.1:{port}'}}\n")

    class DeadStore:
        async def ping(self) -> None:
            raise ConnectionError("database is gone")

    service = await Service(load_settings(cfg), DeadStore()).start()
    try:
        answers = [await asyncio.to_thread(_get, port, path) for path in ("/nope", "/readyz")]
    finally:
        await service.close()
    assert answers[0][0] == 404
    assert answers[1][0] == 503 and "database is gone" in json.loads(answers[1][1])["error"]


def test_a_loop_is_stuck_only_past_its_bound_working_or_asleep():
    """Working: stuck after `bound` seconds without progress (progress restarts the
    count). Waiting: stuck only when `bound` seconds late waking up."""
    from bot.service.health import Health

    now = [1000.0]
    health = Health(clock=lambda: now[0])
    health.expect("support", 30)
    health.waiting("support", 600)  # a 10-minute sleep is no sign of trouble
    now[0] += 620
    assert health.stuck() == {}
    now[0] += 20  # 40 s late waking up
    assert health.stuck() == {"support": "40s late waking up (bound 30s)"}
    health.busy("support")
    now[0] += 25
    health.progress("support")  # an item drafted
    now[0] += 25
    assert health.stuck() == {}
    now[0] += 10
    assert health.stuck() == {"support": "no progress for 35s (bound 30s)"}
    health.progress("support")
    assert health.stuck() == {}


async def test_gmail_quota_units_counted_match_what_gmail_charged(tmp_path):
    """draftgate_gmail_quota_units_total counts every Gmail call's units, by account:
    the fake Gmail's own tally of a first run and a tick with new mail agrees."""
    from bot.service import metrics
    from tests.fakes.gmail import GmailWorld, simple_message

    observer = metrics.Observer(metrics.Metrics("test"))
    metrics.install(observer)
    w = await GmailWorld(tmp_path).open()
    try:
        await w.tick()
        for n in range(3):
            w.fake.add_message(simple_message(n))
        await w.tick()
        charged = w.fake.units()
    finally:
        await w.close()
        metrics.install(None)
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for f in text_string_to_metric_families(observer.exposition().decode())
               for s in f.samples}
    assert charged > 2 * 5  # history.list, then each new message read
    assert samples[("draftgate_gmail_quota_units_total", (("account", "support"),))] == charged


# -- a listener starved of descriptors (issue 22, finding 4) ---------------------------------

def test_idle_connections_past_the_descriptor_limit_starve_neither_the_listener_nor_the_rest(
        tmp_path):
    """With RLIMIT_NOFILE at 256, 600 connections that never send a header (more than
    the process may hold) leave /healthz answering, the next mail drafted and posted,
    and the log a few lines long, not one line per refused accept."""
    import resource

    def low_limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))

    port = _free_port()
    idle: list[socket.socket] = []
    with FakeTelegram() as fake:
        cfg = _config(tmp_path, fake, port, schedule="1s")
        (tmp_path / "inbox" / "1.eml").write_bytes(_email(1))
        with (tmp_path / "stderr.log").open("ab") as err:
            proc = subprocess.Popen(
                [sys.executable, "-m", "bot", "run", "-c", str(cfg)], cwd=ROOT,
                stdin=subprocess.DEVNULL, stdout=err, stderr=err, preexec_fn=low_limit,
                env=dict(os.environ, DG_SVC_TELEGRAM_TOKEN=fake.token,
                         DG_SVC_OPENAI_KEY=OPENAI_KEY))
        try:
            fake.wait_for(lambda: fake.chat_messages(CHAT), 60)
            _wait_get(port, "/healthz", 200)
            before = len((tmp_path / "stderr.log").read_text().splitlines())
            for _ in range(600):  # connect without waiting: the kernel completes them
                s = socket.socket()
                s.setblocking(False)
                s.connect_ex(("127.0.0.1", port))
                idle.append(s)

            assert _wait_get(port, "/healthz", 200)["status"] == "ok"
            (tmp_path / "inbox" / "2.eml").write_bytes(_email(2, "Bob <bob@customer.example>"))
            fake.wait_for(lambda: len(fake.chat_messages(CHAT)) == 2, 60)
            assert _wait_get(port, "/healthz", 200)["status"] == "ok"
            log = (tmp_path / "stderr.log").read_text().splitlines()[before:]
            assert not [line for line in log if "Too many open files" in line
                        and "observability" not in line], log[:20]
            assert len(log) < 40, "\n".join(log[:40])
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(60) == 0, (tmp_path / "stderr.log").read_text()[-3000:]
        finally:
            for s in idle:
                s.close()
            reap(proc)


_OUT_OF_DESCRIPTORS = """
import asyncio, logging, os, signal, sys
from bot.service.listener import Listener, bind

logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(levelname)s %(message)s")

async def answer(head, read):
    return b"HTTP/1.1 200 OK\\r\\nContent-Length: 2\\r\\nConnection: close\\r\\n\\r\\nok"

async def main():
    loop = asyncio.get_running_loop()
    freed, stop = asyncio.Event(), asyncio.Event()
    loop.add_signal_handler(signal.SIGUSR1, freed.set)
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    socks = bind("127.0.0.1", 0)
    listener = Listener(socks, answer, cap=128, head_timeout=5)
    print(socks[0].getsockname()[1], flush=True)
    filler = []
    try:  # the rest of the process has used up every descriptor
        while True:
            filler.append(os.open(os.devnull, os.O_RDONLY))
    except OSError:
        pass
    await freed.wait()
    for fd in filler[:8]:
        os.close(fd)
    await stop.wait()
    await listener.close()

asyncio.run(main())
"""


def test_a_process_out_of_descriptors_logs_one_line_when_accepting_fails_and_one_when_it_recovers(
        tmp_path):
    """The listener in a process with RLIMIT_NOFILE 64 and every descriptor taken: 20
    connections waiting to be accepted give one WARNING (asyncio's own server logged a
    traceback per attempt, 91,360 lines in 45 s); once descriptors are free again it
    answers and says so in one INFO line."""
    import queue
    import resource

    def low_limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))

    proc = subprocess.Popen([sys.executable, "-c", _OUT_OF_DESCRIPTORS], cwd=ROOT,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, preexec_fn=low_limit)
    lines: queue.Queue[str] = queue.Queue()
    seen: list[str] = []

    def until(text: str) -> None:
        while True:
            line = lines.get(timeout=60)
            seen.append(line)
            if text in line:
                return

    reader = threading.Thread(target=lambda: [lines.put(x) for x in proc.stderr], daemon=True)
    reader.start()
    waiting: list[socket.socket] = []
    try:
        port = int(proc.stdout.readline())
        for _ in range(20):
            s = socket.socket()
            s.setblocking(False)
            s.connect_ex(("127.0.0.1", port))
            waiting.append(s)
        until("cannot accept connections (Too many open files)")
        for s in waiting:
            s.close()
        proc.send_signal(signal.SIGUSR1)
        status, body = _get(port, "/healthz")
        assert (status, body) == (200, b"ok")
        until("accepting connections again")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
        reader.join(30)
        while not lines.empty():
            seen.append(lines.get_nowait())
        assert len([x for x in seen if "cannot accept" in x]) == 1, seen
        assert not [x for x in seen if "Traceback" in x], seen
    finally:
        for s in waiting:
            s.close()
        reap(proc)
        proc.stdout.close()
        proc.stderr.close()
