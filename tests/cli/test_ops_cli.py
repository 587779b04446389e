"""Operator commands from the terminal: status, pending, replay, sweep, and the demo.

These run the real CLI entry point (``bot.__main__.main``) against a real SQLite store
filled by real ticks over the demo inbox.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bot.__main__ import main
from bot.app import App
from tests.support.desk import op, started

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def deployment(tmp_path: Path) -> Path:
    """The demo deployment, copied so the test owns its state."""
    shutil.copytree(ROOT / "demo", tmp_path / "demo")
    (tmp_path / "pipelines").mkdir()
    text = (ROOT / "pipelines" / "demo.yaml").read_text()
    (tmp_path / "pipelines" / "demo.yaml").write_text(text)
    cfg = tmp_path / "draftgate.yaml"
    cfg.write_text("store: sqlite:///state.db\npipelines: pipelines/*.yaml\n")
    return cfg


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_status_before_any_run_says_never_run(deployment, capsys):
    import asyncio

    from bot.store import create_store

    async def create():
        async with create_store(f"sqlite:///{deployment.parent}/state.db"):
            pass

    asyncio.run(create())
    code, out, _ = run(capsys, "status", "-c", str(deployment))
    assert code == 0 and out.startswith("demo") and "never run" in out


def test_one_tick_then_status_pending_replay_and_sweep(deployment, capsys):
    code, _, _ = run(capsys, "run", "--once", "-c", str(deployment))
    assert code == 0

    code, out, _ = run(capsys, "status", "-c", str(deployment), "--json")
    [row] = json.loads(out)
    assert row["name"] == "demo" and row["health"] == "healthy" and row["pending"] == 5
    assert row["last_run"]["counts"]["drafted"] == 5 and row["last_run"]["counts"]["skipped"] == 3

    code, out, _ = run(capsys, "status", "demo", "-c", str(deployment))
    assert code == 0
    assert out.splitlines()[0] == "demo · every 5m · healthy"
    assert "runs ✅ (newest right)" in out and "pending 5 · queued 0 · seen 8" in out
    # The skipped items are listed with their item ids and reasons, ready for replay.
    listed = out.split("recent failed / skipped / rejected (replay with the item id):\n")[1]
    listed = listed.splitlines()
    assert len(listed) == 3 and all(" skipped " in line for line in listed)
    assert any("<nl-2026-48.support@mailer.outdoor-weekly.example>" in line
               and "mailing list" in line for line in listed)

    code, out, _ = run(capsys, "pending", "-c", str(deployment), "--json")
    pending = json.loads(out)
    assert len(pending) == 5 and {p["status"] for p in pending} == {"awaiting"}
    assert all(p["card"][1] for p in pending)

    # A skipped item can be replayed; it goes back to the queue, audited.
    code, out, _ = run(capsys, "replay", "demo", "<nl-2026-48.support@mailer.outdoor-weekly.example>",
                       "-c", str(deployment))
    assert code == 0 and "back in the queue" in out
    # An unknown item is reported, not invented.
    code, out, _ = run(capsys, "replay", "demo", "<nope@example>", "-c", str(deployment))
    assert code == 1 and "not found" in out
    code, _, err = run(capsys, "replay", "nosuch", "x", "-c", str(deployment))
    assert code == 2 and "unknown pipeline 'nosuch'" in err

    code, out, _ = run(capsys, "sweep", "--days", "0", "-c", str(deployment))
    assert code == 0 and out.startswith("swept: 8 seen marks deleted")
    code, _, err = run(capsys, "sweep", "--days", "-1", "-c", str(deployment))
    assert code == 2 and "--days" in err


def test_a_sent_item_cannot_be_replayed(deployment, capsys):
    import asyncio
    import io

    from bot.approvals.console import ConsoleChannel
    from bot.config.load import load_settings
    from bot.store import create_store

    async def tick_and_approve_all():
        settings = load_settings(deployment)
        store = create_store(settings.store)
        await store.open()
        try:
            engine = (await started(settings, store, {"console": ConsoleChannel(
                auto_approve=True, out=io.StringIO())})).engine
            await engine.tick("demo")
            await engine.stop()
            return [d for d in await store.item_drafts("demo", "<CAF1234.order-question@mail.customer.example>")]
        finally:
            await store.close()

    drafts = asyncio.run(tick_and_approve_all())
    assert [d.status for d in drafts] == ["sent"]
    code, out, _ = run(capsys, "replay", "demo", drafts[0].item_id, "-c", str(deployment))
    assert code == 1 and "refused" in out


def test_drafts_of_a_removed_pipeline_stay_visible_and_cannot_be_approved(deployment, capsys):
    """Renaming or removing a pipeline must not strand its cards out of sight, nor let
    an Approve turn them into replies that no sender will ever send."""
    import asyncio
    import io

    from bot.approvals.console import ConsoleChannel
    from bot.config.load import load_settings
    from bot.errors import ConfigError
    from bot.store import create_store

    assert run(capsys, "run", "--once", "-c", str(deployment))[0] == 0
    pipeline_file = deployment.parent / "pipelines" / "demo.yaml"
    pipeline_file.write_text(pipeline_file.read_text().replace("name: demo", "name: renamed", 1))

    code, out, _ = run(capsys, "status", "-c", str(deployment))
    assert code == 0
    assert "renamed" in out.splitlines()[0]
    assert "demo" in out.splitlines()[1] and "⚠ not configured  unfinished 5" in out
    code, out, _ = run(capsys, "pending", "-c", str(deployment))
    assert code == 0 and len(out.splitlines()) == 5
    assert all("pipeline demo is not configured" in line and "Reject" in line
               for line in out.splitlines())
    code, out, _ = run(capsys, "pending", "-c", str(deployment), "--json")
    assert [p["configured"] for p in json.loads(out)] == [False] * 5

    async def decide():
        settings = load_settings(deployment)
        store = create_store(settings.store)
        await store.open()
        try:
            desk = App(settings, {"console": ConsoleChannel(out=io.StringIO())}, store=store).desk
            first, second = (await store.pending())[:2]
            with pytest.raises(ConfigError, match="'demo' is not configured any more"):
                await desk.approve(op("anna"), first.id, first.version)
            with pytest.raises(ConfigError, match="not configured"):
                await desk.edit(op("anna"), first.id, first.version, "new text")
            rejected = await desk.reject(op("anna"), second.id, second.version, "obsolete")
            return (await store.get_draft(first.id)).status, rejected.status
        finally:
            await store.close()

    assert asyncio.run(decide()) == ("awaiting", "rejected")
    assert not list((deployment.parent / "var" / "demo" / "outbox").glob("*.eml"))
    code, out, _ = run(capsys, "status", "-c", str(deployment))
    assert "unfinished 4" in out

    async def queue_for_a_gone_pipeline():
        from bot.models import Item, Message

        settings = load_settings(deployment)
        store = create_store(settings.store)
        await store.open()
        try:
            await store.admit("gone", "inbox", "v1", [Item("q1", Message(subject="q"))])
        finally:
            await store.close()

    asyncio.run(queue_for_a_gone_pipeline())  # queued, never drafted: also shown
    code, out, _ = run(capsys, "status", "-c", str(deployment))
    assert "gone" in out and "⚠ not configured  unfinished 1" in out


def test_commands_report_a_broken_config_with_exit_2(tmp_path, capsys):
    cfg = tmp_path / "draftgate.yaml"
    cfg.write_text("store: mysql://nope\npipelines: missing/*.yaml\n")
    code, _, err = run(capsys, "status", "-c", str(cfg))
    assert code == 2 and "store:" in err and "no pipeline files match" in err


def test_the_demo_runs_twice_and_drafts_nothing_twice(tmp_path):
    """./scripts/demo's job: stages shown, replies in the outbox, the second run idle."""
    shutil.copytree(ROOT / "demo", tmp_path / "demo")
    shutil.copytree(ROOT / "pipelines", tmp_path / "pipelines")
    shutil.copy(ROOT / "draftgate.demo.yaml", tmp_path / "draftgate.demo.yaml")
    cmd = [sys.executable, "-m", "bot", "demo", "-c", str(tmp_path / "draftgate.demo.yaml")]
    first = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=ROOT,
                           stdin=subprocess.DEVNULL)
    assert first.returncode == 0, first.stderr
    assert "DEMO MODE" in first.stdout
    assert "fetched 8 · new 5 · skipped 3 · drafted 5 · cards 5 · sent 5" in first.stdout
    assert "tick 2: 8 item(s) already seen" in first.stdout and "new 0" in first.stdout
    # Skip reasons are in the status the demo prints; the log (WARNING and up) is quiet.
    assert "mailing list (List-Unsubscribe header)" in first.stdout and first.stderr == ""
    outbox = tmp_path / "var" / "demo" / "outbox"
    assert len(list(outbox.glob("*.eml"))) == 5
    second = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=ROOT,
                            stdin=subprocess.DEVNULL)
    assert second.returncode == 0, second.stderr
    ticks = [l for l in second.stdout.splitlines() if l.startswith("  fetched")]
    assert len(ticks) == 2
    assert all("new 0" in t and "drafted 0" in t and "sent 0" in t for t in ticks)
    assert len(list(outbox.glob("*.eml"))) == 5


def test_an_edit_at_the_terminal_prompt_is_followed_by_a_prompt_for_the_new_version(
        deployment, monkeypatch):
    """Interactive console: `e` makes v2, which is shown and asked about at once (it
    used to wait for the prompt it was posted from, and the tick hung)."""
    import asyncio
    import io

    from bot.approvals import console
    from bot.approvals.console import ConsoleChannel
    from bot.config.load import load_settings
    from bot.store import create_store

    answers = iter(["e", "a"] + [""] * 20)  # edit the first card, approve its v2, skip the rest
    monkeypatch.setattr(console, "_ask", lambda prompt: next(answers))
    monkeypatch.setattr(console, "_read_block", lambda: "Edited at the prompt.")

    async def tick():
        settings = load_settings(deployment)
        store = create_store(settings.store)
        await store.open()
        try:
            engine = (await started(settings, store, {"console": ConsoleChannel(
                interactive=True, out=io.StringIO())})).engine
            await asyncio.wait_for(engine.tick("demo"), timeout=30)
            await engine.stop()
            return await store.count_by_status("demo")
        finally:
            await store.close()

    assert asyncio.run(tick())["sent"] == 1
    [reply] = (deployment.parent / "var" / "demo" / "outbox").glob("*.eml")
    assert "Edited at the prompt." in reply.read_text()


def test_demo_never_auto_approves_into_a_real_sender_and_fresh_deletes_only_its_own_state(
        deployment, capsys):
    """demo approves by itself: a configuration whose sender can reach someone is
    refused, and --fresh with another configuration deletes nothing."""
    pipeline_file = deployment.parent / "pipelines" / "demo.yaml"
    text = pipeline_file.read_text()
    start = text.index("sender:")
    pipeline_file.write_text(text[:start] + "sender: {type: webhook, url: "
                             "'http://127.0.0.1:9/hook'}\n")
    code, _, err = run(capsys, "demo", "-c", str(deployment))
    assert code == 2
    assert "runs only pipelines whose sender is outbox" in err
    assert "pipelines/demo.yaml: sender.type is 'webhook'" in err
    assert not (deployment.parent / "state.db").exists()  # nothing ran

    pipeline_file.write_text(text)
    code, _, err = run(capsys, "demo", "-c", str(deployment), "--fresh")
    assert code == 2 and "--fresh resets only the bundled demo" in err
    assert deployment.exists() and pipeline_file.exists()


def test_replay_of_an_id_that_is_not_utf8_exits_2_naming_the_argument(deployment, capsys):
    """`draftgate replay demo $'\\xff'`: the shell passes a byte that is not UTF-8; it
    used to reach SQLite and end in a UnicodeEncodeError traceback."""
    code, _, err = run(capsys, "replay", "demo", "\udcff", "-c", str(deployment))
    assert code == 2
    assert "item_id: not valid text (byte 0xff is not UTF-8); copy it exactly as " \
           "`draftgate pending` or `draftgate status` shows it" in err
    assert "Traceback" not in err


def test_a_reader_that_goes_away_ends_the_command_quietly(deployment, capsys):
    """`draftgate status | head -0`: a closed pipe is not a BrokenPipeError traceback."""
    assert run(capsys, "run", "--once", "-c", str(deployment))[0] == 0
    proc = subprocess.Popen([sys.executable, "-m", "bot", "status", "-c", str(deployment)],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()  # no reader left: the first write fails with EPIPE
    with proc.stderr:
        err = proc.stderr.read().decode()
    assert proc.wait(60) == 1
    assert err == ""


def test_run_once_skips_disabled_and_paused_pipelines_and_says_why(deployment, capsys):
    import asyncio

    from bot.store import create_store

    pipelines = deployment.parent / "pipelines"
    text = (pipelines / "demo.yaml").read_text()
    (pipelines / "spare.yaml").write_text(text.replace("name: demo", "name: spare")
                                        + "enabled: false\n")
    (pipelines / "held.yaml").write_text(text.replace("name: demo", "name: held"))

    async def pause():
        store = create_store(f"sqlite:///{deployment.parent}/state.db")
        await store.open()
        try:
            await store.set_paused("held", True, "test")
        finally:
            await store.close()

    asyncio.run(pause())
    code, _, err = run(capsys, "run", "--once", "-c", str(deployment))
    assert code == 0, err
    assert "spare: not run: enabled: false in pipelines/spare.yaml" in err
    assert "held: not run: paused (/resume held in Telegram schedules it again)" in err
    code, out, _ = run(capsys, "status", "-c", str(deployment), "--json")
    runs = {row["name"]: row["last_run"] for row in json.loads(out)}
    assert runs["spare"] is None and runs["held"] is None and runs["demo"] is not None


def test_run_refuses_to_start_without_a_models_key_and_validate_says_it_is_not_set_here(
        deployment, capsys, monkeypatch):
    monkeypatch.delenv("DG_TEST_UNSET_KEY", raising=False)
    deployment.write_text(deployment.read_text() + (
        "models:\n  default: {provider: openai, model: gpt-x, api_key_env: DG_TEST_UNSET_KEY}\n"))
    pipeline = deployment.parent / "pipelines" / "demo.yaml"
    pipeline.write_text(pipeline.read_text().replace("model: template ", "model: default "))
    expected = (f"{deployment}: models.default.api_key_env: environment variable "
                "DG_TEST_UNSET_KEY is not set (used by demo); export it with the openai API key")

    code, out, err = run(capsys, "validate", "-c", str(deployment))
    assert code == 0 and err == ""
    assert f"not set or not found here (1; `draftgate run` needs them):\n  {expected}\n" in out

    code, _, err = run(capsys, "run", "--once", "-c", str(deployment))
    assert code == 2 and expected in err and "Traceback" not in err
    assert not (deployment.parent / "state.db").exists()  # refused before anything ran


def test_config_and_verbose_options_work_before_and_after_the_command(deployment, capsys):
    code, out, err = run(capsys, "-c", str(deployment), "validate")
    assert code == 0 and out.startswith(f"{deployment}: OK"), err
    code, out, err = run(capsys, "validate", "-v", "-c", str(deployment))
    assert code == 0 and out.startswith(f"{deployment}: OK"), err
    with pytest.raises(SystemExit) as exit_:
        main(["-c", str(deployment), "migrate-store", "--from", "a", "--to", "b"])
    assert exit_.value.code == 2
    assert "-c/--config does not apply to migrate-store" in capsys.readouterr().err


@pytest.mark.parametrize("src, dst, expected", [
    ("sqlite://", "sqlite:///{tmp}/new.db", "migrate-store: --from: bad SQLite store URL "
                                           "'sqlite://': expected sqlite:////absolute/path"),
    ("sqlite:///{tmp}/old.db", "mysql://h/db", "migrate-store: --to: unknown store URL "
                                              "'mysql://h/db'; expected sqlite:///path or "
                                              "postgresql://..."),
])
def test_migrate_store_with_a_bad_url_is_a_bad_argument(tmp_path, capsys, src, dst, expected):
    code, _, err = run(capsys, "migrate-store", "--from", src.format(tmp=tmp_path),
                       "--to", dst.format(tmp=tmp_path))
    assert code == 2 and err.startswith(expected) and "Traceback" not in err
    assert list(tmp_path.iterdir()) == []


def test_run_pipeline_narrows_what_ticks_not_what_the_process_knows(deployment, capsys):
    pipelines = deployment.parent / "pipelines"
    text = (pipelines / "demo.yaml").read_text()
    (pipelines / "other.yaml").write_text(text.replace("name: demo", "name: other", 1))
    code, _, err = run(capsys, "run", "--once", "--pipeline", "demo", "-c", str(deployment))
    assert code == 0 and "other" not in err
    code, out, _ = run(capsys, "status", "-c", str(deployment), "--json")
    health = {row["name"]: row["health"] for row in json.loads(out)}
    assert health == {"demo": "healthy", "other": "never run"}
    code, _, err = run(capsys, "run", "--once", "--pipeline", "nope", "-c", str(deployment))
    assert code == 2 and "unknown pipeline 'nope'" in err


def test_review_offers_retry_for_a_failed_send_in_a_terminal_only_setup(deployment, monkeypatch,
                                                                        capsys):
    """Without Telegram there is no Retry button: review offers it."""
    import asyncio

    from bot.approvals import console
    from bot.config.load import load_settings
    from bot.store import create_store

    assert run(capsys, "run", "--once", "-c", str(deployment))[0] == 0

    async def fail_one_send():
        settings = load_settings(deployment)
        store = create_store(settings.store)
        await store.open()
        try:
            d = (await store.pending("demo"))[0]
            await store.approve(d.id, d.version, "anna")
            await store.begin_send(d.id)
            await store.mark_send_failed(d.id, "outbox folder was not writable")
            return d.id
        finally:
            await store.close()

    draft_id = asyncio.run(fail_one_send())
    answers = iter([""] * 4 + ["t"])  # leave the 4 awaiting cards, retry the failed send
    monkeypatch.setattr(console, "_ask", lambda prompt: next(answers, ""))
    assert run(capsys, "review", "-c", str(deployment))[0] == 0
    code, out, _ = run(capsys, "pending", "-c", str(deployment), "--json")
    assert draft_id not in [p["id"] for p in json.loads(out)]  # sent now
    [reply] = (deployment.parent / "var" / "demo" / "outbox").glob("*.eml")
    assert reply.exists()


def test_run_pipeline_on_a_telegram_host_needs_the_secrets_of_every_pipeline(deployment, capsys,
                                                                              monkeypatch):
    """Its bot decides every pipeline's cards and sends their replies: a secret only
    another pipeline needs must not be found missing at the first tap."""
    monkeypatch.setenv("DG_TG", "123:abc")
    monkeypatch.delenv("DG_OTHER_SECRET", raising=False)
    pipelines = deployment.parent / "pipelines"
    text = (pipelines / "demo.yaml").read_text()
    start = text.index("sender:")
    (pipelines / "other.yaml").write_text(
        text[:start].replace("name: demo", "name: other", 1)
        + "sender: {type: webhook, url: 'http://127.0.0.1:9/hook', secret_env: DG_OTHER_SECRET}\n")
    deployment.write_text(deployment.read_text() + "telegram:\n  token_env: DG_TG\n"
                          "  operators: [1]\n  approvals_chat: 1\n")
    code, _, err = run(capsys, "run", "--once", "--pipeline", "demo", "-c", str(deployment))
    assert code == 2 and "DG_OTHER_SECRET" in err


def test_in_review_a_regenerated_draft_is_asked_about_after_the_prompt_on_screen(
        deployment, monkeypatch, capsys):
    """The new version of a regenerated draft opened a second prompt beside the next
    draft's, and an answer could go to a card other than the one shown last. Every
    prompt now comes right after its own card."""
    import re

    from bot.approvals import console

    assert run(capsys, "run", "--once", "-c", str(deployment))[0] == 0
    capsys.readouterr()
    decided: list[str] = []

    def ask(prompt):
        cards = re.findall(r"📨 demo · (#\d+ v\d+)", capsys.readouterr().out)
        if prompt.lstrip().startswith("Instruction"):
            return ""
        shown = cards[-1] if cards else decided[-1]
        decided.append(shown)
        return {"#1 v1": "g", "#2 v1": "a", "#1 v2": "a"}.get(shown, "")

    monkeypatch.setattr(console, "_ask", ask)
    assert run(capsys, "review", "-c", str(deployment))[0] == 0
    assert sorted(decided) == sorted(["#1 v1", "#2 v1", "#3 v1", "#4 v1", "#8 v1", "#1 v2"])
    code, text, _ = run(capsys, "status", "demo", "-c", str(deployment), "--json")
    assert json.loads(text)["by_status"] == {"awaiting": 3, "sent": 2, "skipped": 3}
    assert len(list((deployment.parent / "var" / "demo" / "outbox").glob("*.eml"))) == 2


def test_a_pipeline_disabled_in_its_file_needs_no_secrets_to_start(deployment, capsys, monkeypatch):
    """enabled: false keeps a pipeline configured but not run: its missing secret must
    not stop the daemon (only pipelines left out by --pipeline need theirs)."""
    monkeypatch.setenv("DG_TG", "123:abc")
    monkeypatch.delenv("DG_OLD_SECRET", raising=False)
    pipelines = deployment.parent / "pipelines"
    text = (pipelines / "demo.yaml").read_text()
    (pipelines / "old.yaml").write_text(
        text[:text.index("sender:")].replace("name: demo", "name: old", 1) + "enabled: false\n"
        + "sender: {type: webhook, url: 'http://127.0.0.1:9/hook', secret_env: DG_OLD_SECRET}\n")
    # A bot that receives (polling), at an address where nothing answers: run --once
    # ticks without it.
    deployment.write_text(deployment.read_text() + "telegram:\n  token_env: DG_TG\n"
                          "  operators: [1]\n  approvals_chat: 1\n"
                          "  base_url: http://127.0.0.1:9/bot\n")
    code, _, err = run(capsys, "run", "--once", "-c", str(deployment))
    assert "DG_OLD_SECRET" not in err
    assert code == 0 and "old: not run: enabled: false" in err


def test_a_card_posted_while_another_prompt_waits_is_shown_with_its_own_prompt(monkeypatch):
    """A regenerated card printed under the next card's open prompt made an answer
    meant for one card go to the other: it is printed when its own prompt comes."""
    import asyncio
    import io

    from bot.approvals import console
    from bot.approvals.console import ConsoleChannel
    from bot.models import Draft, Message

    def draft(n, v):
        return Draft(id=n, key=f"k{n}", pipeline="demo", scope="s", item_id=f"i{n}",
                     recipe="v1", status="awaiting", message=Message(subject=f"S{n}"),
                     version=v, body=f"body {n} v{v}")

    out = io.StringIO()
    asked: list[str] = []

    async def scenario():
        ch = ConsoleChannel(interactive=True, out=out)
        release = asyncio.Event()

        class Decisions:
            async def approve(self, *a):
                return None

        await ch.start(Decisions())

        def ask(prompt):
            cards = [line for line in out.getvalue().splitlines() if line.startswith("📨")]
            asked.append(cards[-1])
            return ""

        monkeypatch.setattr(console, "_ask", ask)

        taken = asyncio.Event()

        async def first_prompt():
            async def hold(d):
                taken.set()
                await release.wait()
                await ch.review(d)
            await ch.ask(hold, draft(2, 1))

        holder = asyncio.create_task(first_prompt())
        await taken.wait()  # #2's prompt is on the terminal
        await ch.post(draft(1, 2))  # a regenerate finished meanwhile
        assert "#1 v2" not in out.getvalue()
        waiting = asyncio.create_task(ch.ask(ch.review, draft(1, 2)))
        release.set()
        await asyncio.gather(holder, waiting)

    asyncio.run(scenario())
    assert asked == ["📨 demo · #2 v1", "📨 demo · #1 v2"]


def test_doctor_with_a_check_that_cannot_be_imported_fails_instead_of_staying_green(deployment):
    """A check whose module does not import (a broken dependency of the Gmail check, say)
    must not drop out of doctor silently and leave every line green."""
    import asyncio

    from bot.store import create_store

    async def create():
        async with create_store(f"sqlite:///{deployment.parent}/state.db"):
            pass

    asyncio.run(create())
    script = ("import importlib.abc, sys\n"
              "class Broken(importlib.abc.MetaPathFinder):\n"
              "    def find_spec(self, name, path, target=None):\n"
              "        if name == 'bot.gmail.doctor':\n"
              "            raise ImportError('the Gmail check is broken here')\n"
              "sys.meta_path.insert(0, Broken())\n"
              "from bot.__main__ import main\n"
              "sys.exit(main(['doctor', '-c', sys.argv[1]]))\n")
    done = subprocess.run([sys.executable, "-c", script, str(deployment)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode != 0, done.stdout
    assert "the Gmail check is broken here" in done.stderr


def test_config_given_before_and_after_the_command_differently_is_refused(deployment, capsys,
                                                                          tmp_path):
    with pytest.raises(SystemExit) as exit_:
        main(["-c", str(deployment), "validate", "-c", str(tmp_path / "other.yaml")])
    assert exit_.value.code == 2
    assert "-c given twice" in capsys.readouterr().err
    code, out, err = run(capsys, "-v", "-c", str(deployment), "validate", "-c", str(deployment))
    assert code == 0 and out.startswith(f"{deployment}: OK"), err
    # -v after the commands that bring their own options too.
    code, _, err = run(capsys, "migrate-store", "--from", "sqlite://", "--to", "x", "-vv")
    assert code == 2 and err.startswith("migrate-store: --from: bad SQLite store URL")


def test_pending_pages_with_how_many_more_and_all_lists_every_one(deployment, capsys):
    """`draftgate pending` with 150 awaiting prints the first 100 and "… and 50 more";
    --all and --json list all 150."""
    import asyncio

    from bot.models import Item, Message
    from bot.store import create_store

    async def fill():
        async with create_store(f"sqlite:///{deployment.parent}/state.db") as store:
            await store.admit("demo", "bulk", "v1", [Item(f"<bulk-{i}@x>", Message(
                from_addr=f"c{i}@customer.example", subject=f"Question {i}", body="hi"))
                for i in range(150)])
            while claimed := await store.claim("demo", 600, limit=100):
                for d in claimed:
                    d = await store.finish_draft(d.id, d.fence, "Hello")
                    await store.mark_posted(d.id, d.version, "1", str(d.id))

    asyncio.run(fill())
    code, out, _ = run(capsys, "pending", "-c", str(deployment))
    lines = out.splitlines()
    assert code == 0 and len([x for x in lines if x.startswith("demo #")]) == 100
    assert "… and 50 more: `draftgate pending --all` lists every one" in lines
    code, out, _ = run(capsys, "pending", "-c", str(deployment), "--all")
    assert len([x for x in out.splitlines() if x.startswith("demo #")]) == 150
    assert "more:" not in out
    code, out, _ = run(capsys, "pending", "-c", str(deployment), "--json")
    assert len(json.loads(out)) == 150
