"""`status` and `pending` tell the truth: queued and held items are visible, a
pipeline whose drafting is held, backlogged or failing is not "healthy", and a
deliberate stop is not a failure. Driven through the CLI as an operator meets it."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from bot.__main__ import main
from bot.store import create_store
from tests._proc import ORDER_EMAIL
from tests.fakes.llm import FakeLLM

ROOT = Path(__file__).resolve().parents[2]


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def _deployment(tmp: Path, model: str = "") -> Path:
    """The demo pipeline over the sample inbox, with its own store; ``model`` (YAML
    under ``models:``) replaces the template drafter with a model named m."""
    shutil.copytree(ROOT / "demo", tmp / "demo")
    (tmp / "pipelines").mkdir()
    text = (ROOT / "pipelines" / "demo.yaml").read_text()
    if model:
        text = text.replace("model: template ", "model: m ")
    (tmp / "pipelines" / "demo.yaml").write_text(text)
    cfg = tmp / "draftgate.yaml"
    cfg.write_text("store: sqlite:///state.db\npipelines: pipelines/*.yaml\n"
                   + (f"models:\n  m:\n{model}" if model else ""))
    return cfg


def _model(url: str, timeout: str = "10s") -> str:
    return (f"    provider: openai\n    base_url: {url}\n    model: fake\n"
            f"    api_key_env: DG_STATUS_KEY\n    timeout: {timeout}\n    retries: 0\n")


@pytest.fixture
def deployment(tmp_path: Path) -> Path:
    return _deployment(tmp_path)


def _status(capsys, cfg: Path) -> dict:
    code, out, err = run(capsys, "status", "-c", str(cfg), "--json")
    assert code == 0, err
    return {row["name"]: row for row in json.loads(out)}


# -- issue 11 item 2: status that tells the truth ------------------------------------

def test_replayed_items_are_counted_and_listed_as_queued(deployment, capsys):
    """After `replay` the item waits for the next tick: status and pending show it
    (they said `pending 0` and listed nothing)."""
    assert run(capsys, "run", "--once", "-c", str(deployment))[0] == 0
    item = "<nl-2026-48.support@mailer.outdoor-weekly.example>"
    assert run(capsys, "replay", "demo", item, "-c", str(deployment))[0] == 0

    assert _status(capsys, deployment)["demo"]["queued"] == 1
    code, out, _ = run(capsys, "status", "-c", str(deployment))
    assert "pending 5  queued 1" in out.splitlines()[0]
    code, out, _ = run(capsys, "status", "demo", "-c", str(deployment))
    assert "pending 5 · queued 1 ·" in out
    code, out, _ = run(capsys, "pending", "-c", str(deployment))
    [line] = [line for line in out.splitlines() if "queued" in line]
    assert line.startswith("demo #6 v2 · queued for drafting")
    code, out, _ = run(capsys, "pending", "-c", str(deployment), "--json")
    assert [d["item_id"] for d in json.loads(out) if d["status"] == "queued"] == [item]


def test_a_setup_error_holds_drafting_and_status_elsewhere_says_why_until_it_works(
        tmp_path, capsys, monkeypatch):
    """A model that refuses the key: every item stays queued. `status` (another
    process, reading the store) said healthy with pending 0; now it says held, why,
    and what to do, until a draft succeeds again."""
    monkeypatch.setenv("DG_STATUS_KEY", "wrong-key")
    with FakeLLM() as fake:
        fake.default = fake.error(401, "invalid api key")
        cfg = _deployment(tmp_path, _model(fake.openai_url))
        assert run(capsys, "run", "--once", "-c", str(cfg))[0] == 0

    row = _status(capsys, cfg)["demo"]
    assert row["health"] == "held" and row["queued"] == 5 and row["pending"] == 0
    assert row["hold"]["until"] is None and "setup error" in row["hold"]["reason"]
    assert "401" in row["problem"] and "fix it" in row["problem"]
    code, out, _ = run(capsys, "status", "-c", str(cfg))
    assert out.startswith("demo  ⚠ ") and "queued 5  drafting held: setup error" in out
    code, out, _ = run(capsys, "status", "demo", "-c", str(cfg))
    assert out.splitlines()[0] == "demo · every 5m · held"
    assert out.splitlines()[1].startswith("⚠ drafting held: setup error")
    code, out, _ = run(capsys, "pending", "-c", str(cfg))
    assert out.count("queued for drafting") == 5
    assert "⚠ demo: drafting held: setup error" in out

    # The key is fixed (here: the offline drafter): the first draft clears the hold.
    pipeline = tmp_path / "pipelines" / "demo.yaml"
    pipeline.write_text(pipeline.read_text().replace("model: m ", "model: template "))
    assert run(capsys, "run", "--once", "-c", str(cfg))[0] == 0
    row = _status(capsys, cfg)["demo"]
    assert (row["health"], row["hold"], row["queued"], row["pending"]) == ("healthy", None, 0, 5)


def test_a_long_retry_after_holds_drafting_until_then(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("DG_STATUS_KEY", "k")
    with FakeLLM() as fake:
        fake.default = fake.error(429, "slow down", retry_after=1800)
        cfg = _deployment(tmp_path, _model(fake.openai_url))
        assert run(capsys, "run", "--once", "-c", str(cfg))[0] == 0
    row = _status(capsys, cfg)["demo"]
    assert row["health"] == "held" and row["queued"] == 5
    assert row["hold"]["until"] is not None and "asked to wait" in row["problem"]


def _on_store(deployment, fn) -> None:
    """``await fn(store)`` on the deployment's store, opened for it and closed after."""
    async def go():
        async with create_store(f"sqlite:///{deployment.parent}/state.db") as store:
            await fn(store)

    asyncio.run(go())


async def _tick_ended(store, counts: dict) -> None:
    """A tick of demo started and ended ok with ``counts``."""
    run_id = await store.start_run("demo")
    await store.end_run(run_id, "ok", counts)


def test_a_spent_budget_holds_drafting(deployment, capsys):
    async def spend(store):
        await store.add_tokens("demo", 1000)

    _on_store(deployment, spend)
    pipeline = deployment.parent / "pipelines" / "demo.yaml"
    pipeline.write_text(pipeline.read_text() + "daily_token_budget: 100\n")
    assert run(capsys, "run", "--once", "-c", str(deployment))[0] == 0
    row = _status(capsys, deployment)["demo"]
    assert row["health"] == "held" and row["queued"] == 5
    assert "daily token budget spent (1,000 of 100 tokens)" in row["problem"]


def test_items_waiting_longer_than_two_ticks_are_a_backlog(deployment, capsys):
    """Queued work that nothing drafts (no `run`, or a stalled one) is not healthy."""
    import time

    from bot.models import Item, Message

    async def queue_long_ago(store):
        await _tick_ended(store, {"fetched": 0})
        await store.admit("demo", "maildir", "v1", [Item("old", Message(subject="s"))],
                          now=time.time() - 3600)

    _on_store(deployment, queue_long_ago)
    row = _status(capsys, deployment)["demo"]
    assert row["health"] == "backlog" and row["queued"] == 1
    assert "1 item(s) waiting to be drafted since" in row["problem"]


def test_a_tick_whose_every_draft_failed_is_failing(deployment, capsys):
    _on_store(deployment, lambda store: _tick_ended(
        store, {"fetched": 2, "new": 2, "drafted": 0, "failed": 2}))
    row = _status(capsys, deployment)["demo"]
    assert row["health"] == "failing" and "every draft of the last tick failed" in row["problem"]


def test_a_stop_during_a_tick_is_shown_as_stopped_not_red_and_notifies_nobody(tmp_path, capsys,
                                                                               monkeypatch):
    """SIGTERM while the model is answering: the run is ⏹ stopped; the pipeline does
    not turn red, no "failed" notice is printed, and the next tick is no "green again"."""
    with FakeLLM() as fake:
        held = fake.hold()
        fake.script(held)
        cfg = _deployment(tmp_path, _model(fake.openai_url, timeout="120s"))
        cfg.write_text("max_in_flight: 1\n" + cfg.read_text())  # only the held call
        env = dict(os.environ, DG_STATUS_KEY="k")
        proc = subprocess.Popen([sys.executable, "-m", "bot", "run", "-c", str(cfg)],
                                cwd=ROOT, env=env, stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        try:
            assert held.arrived.wait(60)
            proc.send_signal(signal.SIGTERM)
            out = proc.communicate(timeout=60)[0].decode()
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
            held.release()
    assert proc.returncode == 0, out
    assert "failed" not in out and "turned red" not in out and "❌" not in out
    assert "Traceback" not in out
    row = _status(capsys, cfg)["demo"]
    assert row["last_run"]["status"] == "stopped" and row["health"] == "stopped"
    assert row["queued"] == 5  # the draft being written went back to the queue
    code, text, _ = run(capsys, "status", "-c", str(cfg))
    assert text.startswith("demo  ⏹ ") and "❌" not in text
    code, text, _ = run(capsys, "status", "demo", "-c", str(cfg))
    assert "runs ⏹ (newest right)" in text and "stopped: draftgate was stopped" in text
    assert "first red" not in text

    monkeypatch.setenv("DG_STATUS_KEY", "k")
    with FakeLLM() as fake:
        cfg.write_text(cfg.read_text().replace(cfg.read_text().split("base_url: ")[1]
                                               .split("\n")[0], fake.openai_url))
        code, out, err = run(capsys, "run", "--once", "-c", str(cfg))
    assert code == 0, err
    assert "green again" not in out + err and "❌" not in out
    assert _status(capsys, cfg)["demo"]["health"] == "healthy"


# -- issue 11 item 4: no traceback, nothing created by accident -------------------------

@pytest.mark.parametrize("command", [["status"], ["pending"], ["doctor"], ["sweep"],
                                     ["replay", "demo", "x"], ["run", "--once"], ["demo"]])
def test_a_store_that_cannot_be_opened_is_one_line_without_a_traceback(tmp_path, command):
    cfg = _deployment(tmp_path)
    cfg.write_text("store: sqlite:////proc/draftgate-state.db\npipelines: pipelines/*.yaml\n")
    for _ in range(3):  # the traceback came from a thread racing the exit: look thrice
        proc = subprocess.run([sys.executable, "-m", "bot", *command, "-c", str(cfg)],
                              cwd=ROOT, capture_output=True, text=True, timeout=60,
                              stdin=subprocess.DEVNULL)
        assert proc.returncode != 0
        assert "Traceback" not in proc.stderr and "Exception in thread" not in proc.stderr
        lines = [line for line in proc.stderr.splitlines() if "/proc/draftgate-state.db" in line]
        assert len(lines) == 1 or "❌ store" in proc.stdout, proc.stderr


@pytest.mark.parametrize("command", [["status"], ["pending"], ["doctor"], ["sweep"]])
def test_commands_on_a_missing_store_say_so_and_create_nothing(tmp_path, capsys, command):
    """A typo in `store:` must not look like "never run", nor leave a new empty
    store (and its folder) behind."""
    cfg = _deployment(tmp_path)
    cfg.write_text("store: sqlite:///var/state.dbb\npipelines: pipelines/*.yaml\n")
    code, out, err = run(capsys, *command, "-c", str(cfg))
    assert code == 1
    assert f"no store at {tmp_path}/var/state.dbb: nothing has run with this configuration " \
           f"yet, or `store:` names the wrong file; nothing was created" in out + err
    assert "never run" not in out
    assert not (tmp_path / "var").exists()


def test_doctor_reports_a_corrupt_store(deployment, capsys):
    assert run(capsys, "run", "--once", "-c", str(deployment))[0] == 0
    db = deployment.parent / "state.db"
    assert not Path(str(db) + "-wal").exists() or Path(str(db) + "-wal").stat().st_size == 0
    data = bytearray(db.read_bytes())
    page = int.from_bytes(data[16:18], "big")
    assert len(data) >= 6 * page
    # Pages 3 to 5 (b-trees of the tables), overwritten: the header and schema stay.
    data[2 * page:5 * page] = b"\xa5" * (3 * page)
    db.write_bytes(bytes(data))
    code, out, _ = run(capsys, "doctor", "-c", str(deployment))
    assert code == 1
    [line] = [line for line in out.splitlines() if " store " in line]
    assert line.startswith("❌ store") and "restore it from a backup" in line


def test_validate_lists_every_error_of_a_file_with_three_typos_at_once(deployment, capsys):
    pipeline = deployment.parent / "pipelines" / "demo.yaml"
    text = pipeline.read_text()
    text = text.replace("schedule: 5m", "schedul: 5m")  # unknown key in the pipeline
    text = text.replace("  path: var/demo/outbox", "  pth: var/demo/outbox")  # sender's own
    text = text.replace("  skip_mailing_lists: true", "  skip_mailing_list: true")
    pipeline.write_text(text)
    code, _, err = run(capsys, "validate", "-c", str(deployment))
    assert code == 2
    for expected in ("pipelines/demo.yaml: schedul: unknown key; did you mean 'schedule'?",
                     "pipelines/demo.yaml: sender.pth: unknown key; did you mean 'path'?",
                     "pipelines/demo.yaml: sender.path: missing",
                     "pipelines/demo.yaml: filters.skip_mailing_list: unknown key; did you "
                     "mean 'skip_mailing_lists'?"):
        assert expected in err
    assert err.startswith("configuration errors (4):")


def test_validate_checks_that_a_maildir_path_is_a_folder(deployment, capsys):
    pipeline = deployment.parent / "pipelines" / "demo.yaml"
    (deployment.parent / "inbox.eml").write_bytes(ORDER_EMAIL)
    pipeline.write_text(pipeline.read_text().replace("path: demo/inbox", "path: inbox.eml"))
    code, _, err = run(capsys, "validate", "-c", str(deployment))
    assert code == 2 and "pipelines/demo.yaml: source.path: inbox.eml is a file" in err
    pipeline.write_text(pipeline.read_text().replace("path: inbox.eml", "path: inbx"))
    code, out, _ = run(capsys, "validate", "-c", str(deployment))
    assert "pipelines/demo.yaml: source.path: folder not found: inbx" in out


def test_run_once_exits_non_zero_when_a_tick_failed(deployment, capsys):
    shutil.rmtree(deployment.parent / "demo" / "inbox")
    code, out, err = run(capsys, "run", "--once", "-c", str(deployment))
    assert code == 1
    assert "tick failed: demo: " in err


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_during_a_console_prompt_in_run_ends_the_process(tmp_path, capsys, sig):
    """`draftgate run` in a terminal asks about each card; SIGTERM or Ctrl-C while it
    waits for an answer used to hang until Enter. The draft stays awaiting."""
    import pty

    cfg = _deployment(tmp_path)
    master, slave = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "bot", "run", "-c", str(cfg)], cwd=ROOT,
                            stdin=slave, stdout=slave, stderr=slave, start_new_session=True)
    os.close(slave)
    seen = bytearray()
    prompted = threading.Event()

    def read() -> None:
        while True:
            try:
                chunk = os.read(master, 4096)
            except OSError:  # EIO once the child is gone
                return
            if not chunk:
                return
            seen.extend(chunk)
            if b"[a]pprove" in seen:
                prompted.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert prompted.wait(60), seen.decode(errors="replace")
        proc.send_signal(sig)
        # Generous for a loaded machine; it hung until Enter before.
        assert proc.wait(30) == 0, seen.decode(errors="replace")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        reader.join(10)
        os.close(master)
    assert b"Traceback" not in seen
    code, out, _ = run(capsys, "pending", "-c", str(cfg), "--json")
    statuses = [d["status"] for d in json.loads(out)]
    # The prompted card stays awaiting. It need not be the oldest draft's: drafts run
    # concurrently, and one still `ready` (or not yet drafted) at the stop gets its
    # card at the next start.
    assert "awaiting" in statuses, statuses
    assert set(statuses) <= {"awaiting", "ready", "queued", "drafting"}, statuses
    assert not list((tmp_path / "var" / "demo" / "outbox").glob("*.eml"))


# -- issue 11 item 5: small truths ---------------------------------------------------------

@pytest.mark.parametrize("value", ["5", "'5'", "0.5"])
def test_a_schedule_without_a_unit_is_refused(deployment, capsys, value):
    pipeline = deployment.parent / "pipelines" / "demo.yaml"
    pipeline.write_text(pipeline.read_text().replace("schedule: 5m", f"schedule: {value}"))
    code, _, err = run(capsys, "validate", "-c", str(deployment))
    number = value.strip("'")
    assert code == 2 and f"schedule: {number} has no unit; write {number}m for every " \
                         f"{number} minutes or {number}s for seconds" in err


def test_run_once_does_not_talk_about_stopping(deployment, capsys):
    code, out, err = run(capsys, "run", "--once", "-c", str(deployment))
    assert code == 0
    assert "Ctrl-C" not in out + err and "stopping" not in out + err


def test_a_replay_refusal_says_its_prefix_once(deployment, capsys):
    assert run(capsys, "run", "--once", "-c", str(deployment))[0] == 0
    code, out, _ = run(capsys, "pending", "-c", str(deployment), "--json")
    item = json.loads(out)[0]["item_id"]
    code, out, _ = run(capsys, "replay", "demo", item, "-c", str(deployment))
    assert code == 1
    assert out == f"demo {item}: refused: draft #1 is still awaiting; decide on it or let " \
                  f"it finish first\n"


def test_a_notice_is_printed_once(deployment):
    """The console prints a notice; the log (on the same terminal) does not repeat it."""
    shutil.rmtree(deployment.parent / "demo" / "inbox")
    proc = subprocess.run([sys.executable, "-m", "bot", "run", "--once", "-c", str(deployment)],
                          cwd=ROOT, capture_output=True, text=True, timeout=60,
                          stdin=subprocess.DEVNULL)
    assert proc.returncode == 1
    assert (proc.stdout + proc.stderr).count("demo failed:") == 1


def test_version(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.startswith("draftgate 0.")


def test_the_demo_with_a_model_does_not_claim_the_offline_drafter(tmp_path, capsys,
                                                                     monkeypatch):
    monkeypatch.setenv("DG_STATUS_KEY", "k")
    with FakeLLM() as fake:
        cfg = _deployment(tmp_path, _model(fake.openai_url))
        code, out, err = run(capsys, "demo", "-c", str(cfg))
    assert code == 0, err
    banner = out.split("▶")[0]
    assert "offline" not in banner and "drafter: openai (calls the model)" in banner


def test_the_demo_runs_from_a_checkout_when_draftgate_is_installed_elsewhere(tmp_path):
    """`pip install .` puts the package in site-packages, away from the demo files:
    `draftgate demo` in the checkout finds them there."""
    site = tmp_path / "site"
    shutil.copytree(ROOT / "bot", site / "bot", ignore=shutil.ignore_patterns("__pycache__"))
    checkout = tmp_path / "checkout"
    for name in ("demo", "pipelines"):
        shutil.copytree(ROOT / name, checkout / name)
    shutil.copy(ROOT / "draftgate.demo.yaml", checkout)
    env = dict(os.environ, PYTHONPATH=str(site))
    proc = subprocess.run([sys.executable, "-m", "bot", "demo"], cwd=checkout, env=env,
                          capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr
    assert "5 replies written by this run" in proc.stdout
    assert len(list((checkout / "var" / "demo" / "outbox").glob("*.eml"))) == 5


# -- issue 10 item 8: demo -c never auto-approves into a real deployment ----------------------

def test_demo_refuses_the_store_of_a_real_deployment(deployment, capsys):
    """A deployment that has run (its store holds real mail awaiting a human): demo
    would approve it all. Refused without a terminal to ask (CI has no stdin)."""
    assert run(capsys, "run", "--once", "-c", str(deployment))[0] == 0
    code, _, err = run(capsys, "demo", "-c", str(deployment))
    assert code == 2
    assert "store" in err and "exists and was not created by the demo" in err
    code, out, _ = run(capsys, "pending", "-c", str(deployment), "--json")
    assert {d["status"] for d in json.loads(out)} == {"awaiting"}
    assert not (deployment.parent / "var" / "demo" / "outbox").exists()


def test_demo_refuses_an_outbox_it_did_not_create(deployment, capsys):
    """An outbox folder a mail relay picks files up from, with a new store."""
    relay = deployment.parent / "var" / "demo" / "outbox"
    relay.mkdir(parents=True)
    code, _, err = run(capsys, "demo", "-c", str(deployment))
    assert code == 2 and f"outbox {relay} exists and was not created by the demo" in err
    assert list(relay.iterdir()) == []
    assert not (deployment.parent / "state.db").exists()


@pytest.mark.parametrize("old, new, expected", [
    ("model: template ", "model: [template] ", "drafter.model: expected a string"),
    ("  type: outbox ", "  type: {a: 1} ", "sender.type: expected one of outbox"),
    ("prompt: demo/templates/reply.txt", "prompt: 5", "drafter.prompt: expected a string"),
])
def test_validate_goes_on_past_a_broken_stage_without_a_traceback(deployment, capsys, old, new,
                                                                   expected):
    """The stages of a pipeline with errors are still checked, but one whose own type
    or model is broken is not built (it would crash instead of reporting)."""
    pipeline = deployment.parent / "pipelines" / "demo.yaml"
    text = pipeline.read_text()
    assert old in text
    pipeline.write_text(text.replace(old, new).replace("schedule: 5m", "schedul: 5m"))
    code, _, err = run(capsys, "validate", "-c", str(deployment))
    assert code == 2 and expected in err and "schedul: unknown key" in err
