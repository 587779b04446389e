"""The operator desk's one rule, as operators meet it (issues 22 and 23).

Per-pipeline operators cover every command and every tap, not only cards (finding 10):
an operator of the bot who is not in a pipeline's ``approval.operators`` is refused
everything about that pipeline, the refusal is audited, and nothing changes. And the
console is one identity (finding 1): two shell users never make a quorum of two, and the
console decides only where ``approval.console`` lets it.

The real python-telegram-bot against the fake Bot API, the real desk and engine, a real
SQLite store; the terminal's answers come through the console's own input functions.
"""

from __future__ import annotations

import asyncio

import pytest

from bot.__main__ import main
from bot.approvals import cards, console
from tests.support.team import team_config
from tests.support.telegram_world import ANNA, BO, SUPPORT_CHAT, TOKEN_ENV, World

WAIT = 30.0
NOT_YOURS = "Not yours to decide: support's cards are decided by its approval.operators."


@pytest.fixture
async def world(tmp_path, fake, monkeypatch):
    monkeypatch.setenv(TOKEN_ENV, fake.token)
    w = World(tmp_path, fake, team_config(tmp_path, fake, f"operators: [{ANNA}]"))
    await w.start()
    yield w
    await w.stop()


async def say_as_bo(w: World, text: str) -> str:
    mid = w.fake.say(BO, SUPPORT_CHAT, text, first_name="Bo")["message"]["message_id"]
    msgs = await w.fake.await_for(
        lambda: [m for m in w.fake.chat_messages(SUPPORT_CHAT) if m.reply_to == mid], WAIT)
    return msgs[-1].text


async def refusals(w: World) -> list[str]:
    return [e.detail or "" for e in await w.store.audit_log() if e.action == "refused"
            and e.actor == f"tg:{BO} (Bo)"]


async def state(w: World, d) -> tuple:
    """What a refused action must leave as it was."""
    fresh = await w.draft(d)
    runs = await w.store.recent_runs("support", limit=100)
    return (fresh.status, fresh.version, fresh.body, "support" in await w.store.paused(),
            len(runs), len(w.sender.sent), w.card(d).text)


COMMANDS = [
    ("/status support", "status"),
    ("/replay support {item}", "replay"),
    ("/reply support {item} make it shorter", "reply"),
    ("/emails support", "emails"),
    ("/audit support {item}", "audit"),
    ("/pause support", "pause"),
    ("/resume support", "resume"),
    ("/run support", "run"),
]


@pytest.mark.parametrize("command,what", COMMANDS, ids=[c[1] for c in COMMANDS])
async def test_every_command_on_a_pipeline_refuses_an_operator_it_does_not_list(
        world, command, what):
    d = await world.deliver(1)
    if what == "resume":  # something to resume, paused by its own operator
        assert (await world.say("/pause support")).startswith("⏸")
    before = await state(world, d)
    answer = await say_as_bo(world, command.format(item=d.item_id))
    assert answer == NOT_YOURS
    assert await state(world, d) == before
    assert await refusals(world) == [f"{what}: not in approval.operators of support"]


async def test_the_pipeline_lists_and_pending_leave_out_what_an_operator_may_not_see(world):
    d = await world.deliver(1)
    assert await say_as_bo(world, "/pending") == "nothing pending"
    assert "support" not in await say_as_bo(world, "/status")
    assert f"support #{d.id} v1" in await world.say("/pending")
    assert "support" in await world.say("/status")


@pytest.mark.parametrize("action", cards.ACTIONS)
async def test_every_tap_refuses_an_operator_the_pipeline_does_not_list(world, fake, action):
    d = await world.deliver(1)
    before = await state(world, d)
    messages = len(fake.chat_messages(SUPPORT_CHAT))
    u = fake.tap(BO, SUPPORT_CHAT, int(d.approval_message_id), f"{action}:{d.id}:1", "Bo")
    assert (await fake.answered(u, WAIT))["text"] == NOT_YOURS
    assert await state(world, d) == before
    assert len(fake.chat_messages(SUPPORT_CHAT)) == messages  # no prompt, no file
    assert await refusals(world) == [f"tap {action} v1: not in approval.operators of support"]


async def test_a_reply_with_new_text_to_a_card_is_refused_too(world):
    d = await world.deliver(1)
    before = await state(world, d)
    mid = world.fake.say(BO, SUPPORT_CHAT, "Bo's own text.", reply_to=int(d.approval_message_id),
                         first_name="Bo")["message"]["message_id"]
    msgs = await world.fake.await_for(
        lambda: [m for m in world.fake.chat_messages(SUPPORT_CHAT) if m.reply_to == mid], WAIT)
    assert msgs[-1].text == NOT_YOURS
    assert await state(world, d) == before
    assert await refusals(world) == ["edit v1: not in approval.operators of support"]


# -- the console: one identity, deciding only where the pipeline lets it ------------------------

def _review(cfg, monkeypatch, user: str, answer: str = "a") -> int:
    """`draftgate review` run by shell user ``user``, answering ``answer``."""
    monkeypatch.setenv("USER", user)
    monkeypatch.setenv("LOGNAME", user)
    answers = iter([answer])
    monkeypatch.setattr(console, "_ask", lambda prompt: next(answers, ""))
    return main(["review", "-c", str(cfg)])


@pytest.fixture
async def quorum_world(tmp_path, fake, monkeypatch, request):
    monkeypatch.setenv(TOKEN_ENV, fake.token)
    w = World(tmp_path, fake, team_config(tmp_path, fake, request.param))
    await w.start()
    yield w
    await w.stop()


@pytest.mark.parametrize("quorum_world", [f"quorum: 2, operators: [{ANNA}, {BO}]"],
                         indirect=True)
async def test_two_shell_users_never_make_a_quorum_of_two(quorum_world, monkeypatch):
    """Finding 1: USER=alice and USER=bob each run `draftgate review` and approve: with
    quorum 2 and operators named, the console decides nothing; nothing is sent."""
    w = quorum_world
    d = await w.deliver(1)
    for user in ("alice", "bob"):
        assert await asyncio.to_thread(_review, w.cfg, monkeypatch, user) == 0
    assert w.sender.sent == [] and (await w.draft(d)).status == "awaiting"
    assert await w.store.votes(d.id, 1) == []
    refused = [(e.actor, e.detail) for e in await w.store.audit_log(d.key)
               if e.action == "refused"]
    assert refused == [("console", "approve v1: console decisions are off for support")] * 2
    # The two operators in Telegram still decide it.
    assert (await w.tap(d, "ap")).startswith("✅ Your approval counts (1/2)")
    assert await w.tap(d, "ap", user=BO, first_name="Bo") == "✅ Sent."
    assert len(w.sender.sent) == 1


@pytest.mark.parametrize("quorum_world", ["quorum: 2, console: true"], indirect=True)
async def test_where_the_console_may_decide_it_counts_once_whoever_runs_it(
        quorum_world, monkeypatch):
    """approval.console: true: alice's and bob's approvals at the console are one vote,
    "console", shown so on the card; one Telegram operator makes the second."""
    w = quorum_world
    d = await w.deliver(1)
    for user in ("alice", "bob"):
        assert await asyncio.to_thread(_review, w.cfg, monkeypatch, user) == 0
    assert w.sender.sent == []
    assert [v.operator for v in await w.store.votes(d.id, 1)] == ["console"]
    approvals = [(e.actor, e.detail) for e in await w.store.audit_log(d.key)
                 if e.action == "approve"]
    assert approvals == [("console", "v1: 1/2 approvals")]
    await w.engine.channels.update_card(await w.draft(d))
    assert "✅ 1/2 · console" in w.card(d).text
    assert await w.tap(d, "ap") == "✅ Sent."
    assert len(w.sender.sent) == 1
