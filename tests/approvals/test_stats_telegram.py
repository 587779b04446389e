"""/stats in Telegram (issue 25 item 1): the real python-telegram-bot against the fake
Bot API answers with a PNG chart of the documented size and the summary as its caption,
with the same figures as `draftgate stats --json`; the chart is drawn off the event
loop (a tap is answered while one renders); an operator not on the pipeline is refused."""

from __future__ import annotations

import asyncio
import io
import json
import threading

from PIL import Image

from bot import scoreboard
from bot.__main__ import main
from bot.approvals.telegram import chart
from bot.scoreboard import Figures
from tests.fakes.telegram import FakeTelegram
from tests.support.team import team_config
from tests.support.telegram_world import ANNA, BO, SUPPORT_CHAT, World, start_world

WAIT = 60.0  # the first chart of a process also loads matplotlib and its fonts


async def _world(tmp_path, fake, monkeypatch, worlds, approval: str = "") -> World:
    return await start_world(tmp_path, fake, monkeypatch, worlds,
                             team_config(tmp_path, fake, approval))


def _photos(fake: FakeTelegram) -> list:
    return [m for m in fake.chat_messages(SUPPORT_CHAT) if m.kind == "photo"]


async def _history(w: World) -> None:
    """One reply sent as drafted, one edited by a reply to its card then sent."""
    d = await w.deliver(1)
    assert await w.tap(d, "ap") == "✅ Sent."
    d = await w.deliver(2)
    await w.say("Hi Alice, it ships on Monday.", reply_to=int(d.approval_message_id))
    await w.fake.await_for(lambda: w.card(d).edits > 0, WAIT)
    d = await w.draft(d)
    assert d.version == 2 and await w.tap(d, "ap") == "✅ Sent."


async def test_stats_sends_a_chart_and_the_summary_the_cli_agrees_with(
        tmp_path, fake, monkeypatch, worlds, capsys):
    w = await _world(tmp_path, fake, monkeypatch, worlds)
    await _history(w)
    fake.say(ANNA, SUPPORT_CHAT, "/stats support", first_name="Anna")
    [photo] = await fake.await_for(lambda: _photos(fake), WAIT)
    image = Image.open(io.BytesIO(photo.document))
    assert image.format == "PNG" and image.size == (chart.WIDTH, chart.HEIGHT)
    assert len(image.convert("RGB").getcolors(maxcolors=1 << 20) or []) > 10  # not blank
    caption = photo.text.splitlines()
    assert caption[0].startswith("📈 support · 30 days to ")
    assert await asyncio.to_thread(main, ["-c", str(w.cfg), "stats", "support", "--json"]) == 0
    board = json.loads(capsys.readouterr().out)
    total = {k: v for k, v in board["total"].items() if k != "as_drafted_share"}
    assert (total["decided"], total["sent"], total["sent_as_drafted"], total["edited"]) == (
        2, 2, 1, 1)
    assert caption[1:] == [scoreboard.figures_line(Figures(**total)),
                           scoreboard.claims_line(Figures(**total))]
    # What is wrong with a command line, and what to give instead.
    for argv, said in ((["stats", "--since", "3 months"], "expected a window like 30d, 8w"),
                       (["stats", "nosuch"], "nosuch")):
        assert await asyncio.to_thread(main, ["-c", str(w.cfg), *argv]) == 2
        assert said in capsys.readouterr().err


async def test_a_tap_is_answered_while_a_chart_renders(tmp_path, fake, monkeypatch, worlds):
    w = await _world(tmp_path, fake, monkeypatch, worlds)
    rendering, release = threading.Event(), threading.Event()

    def held(board) -> bytes:
        rendering.set()
        assert release.wait(WAIT), "the test never released the chart"
        return chart.render(board)

    w.channel.render_chart = held
    d = await w.deliver(1)
    try:
        fake.say(ANNA, SUPPORT_CHAT, "/stats", first_name="Anna")
        assert await asyncio.to_thread(rendering.wait, WAIT)
        fake.say(BO, SUPPORT_CHAT, "/stats support", first_name="Bo")  # a second one
        assert await w.tap(d, "ap") == "✅ Sent."  # answered while both wait to render
        assert _photos(fake) == []
    finally:
        release.set()
    photos = await fake.await_for(lambda: len(_photos(fake)) == 2 and _photos(fake), WAIT)
    assert {p.text.splitlines()[0].split(" · ")[0] for p in photos} == {
        "📈 all pipelines", "📈 support"}


async def test_an_operator_not_on_the_pipeline_is_refused_its_stats(
        tmp_path, fake, monkeypatch, worlds):
    w = await _world(tmp_path, fake, monkeypatch, worlds, f"operators: [{ANNA}]")
    assert await w.say("/stats support", user=BO) == (
        "Not yours to decide: support's cards are decided by its approval.operators.")
    assert _photos(fake) == []
    refused = [e.detail for e in await w.store.audit_log() if e.action == "refused"]
    assert refused == ["stats: not in approval.operators of support"]


def test_status_does_not_import_matplotlib_nor_rapidfuzz():
    """The chart's and the edit size's libraries load when a chart is drawn or a draft is
    measured, never for `draftgate status` (nor when the Telegram channel is built)."""
    import subprocess
    import sys

    code = ("import sys, bot.__main__, bot.approvals.telegram.channel, bot.desk.desk; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('matplotlib', 'rapidfuzz', 'PIL')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=120)
    assert out.stdout.strip() == "[]"
