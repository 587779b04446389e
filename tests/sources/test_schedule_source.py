"""The schedule source: slot ids come from the scheduled time; catch-up by policy."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from bot.config.load import PipelineConfig, Settings
from bot.errors import ConfigError
from bot.models import draft_key
from bot.sources import schedule
from bot.stages import FetchContext, Source
from tests._stage import pipeline


def _t(text: str) -> float:
    return datetime.strptime(text, "%Y-%m-%d %H:%M").replace(tzinfo=timezone.utc).timestamp()


def _pipeline(*, every="1h", cron=None, catchup="latest", catchup_max=24, **source) -> PipelineConfig:
    interval = {"1h": 3600.0, "15m": 900.0}.get(every) if cron is None else None
    return pipeline(
        name="posts", file="pipelines/posts.yaml", schedule=cron or every, interval=interval,
        cron=cron, source={k: v for k, v in {"type": "schedule", "topic": "Weekly product tip",
                                             **source}.items() if v is not None},
        sender={"type": "outbox", "path": "out", "from": "s@shop.example"},
        catchup=catchup, catchup_max=catchup_max)


def _settings() -> Settings:
    return Settings(file="draftgate.yaml", base_dir=".", store="sqlite:///x.db", pipelines=[])


async def _fetch(p: PipelineConfig, scheduled_for: float, cursor: str | None):
    async def unseen(ids):
        return set(ids)

    src = schedule.create(p, _settings())
    return await src.fetch(FetchContext(p.name, src.scope, scheduled_for, cursor, unseen))


# policy, max, cursor (last admitted slot), this tick's slot -> expected slot ids
CATCHUP = [
    ("first run: just this slot", "latest", 24, None, "2026-11-29 14:00", ["2026-11-29T14:00"]),
    ("on time: the next slot", "latest", 24, "2026-11-29 13:00", "2026-11-29 14:00", ["2026-11-29T14:00"]),
    ("latest after downtime", "latest", 24, "2026-11-29 10:00", "2026-11-29 14:00", ["2026-11-29T14:00"]),
    ("all after downtime", "all", 24, "2026-11-29 10:00", "2026-11-29 14:00",
     ["2026-11-29T11:00", "2026-11-29T12:00", "2026-11-29T13:00", "2026-11-29T14:00"]),
    ("all keeps the newest max", "all", 2, "2026-11-29 10:00", "2026-11-29 14:00",
     ["2026-11-29T13:00", "2026-11-29T14:00"]),
    ("none drops missed slots", "none", 24, "2026-11-29 10:00", "2026-11-29 14:00", ["2026-11-29T14:00"]),
    ("slot already admitted", "all", 24, "2026-11-29 14:00", "2026-11-29 14:00", []),
    ("older tick than the cursor", "latest", 24, "2026-11-29 14:00", "2026-11-29 12:00", []),
]


@pytest.mark.parametrize("policy,limit,cursor,tick,expected", [c[1:] for c in CATCHUP],
                         ids=[c[0] for c in CATCHUP])
async def test_catchup_policy(policy, limit, cursor, tick, expected):
    p = _pipeline(catchup=policy, catchup_max=limit)
    result = await _fetch(p, _t(tick), repr(_t(cursor)) if cursor else None)
    assert [i.item_id for i in result.items] == expected
    if expected:
        assert float(result.cursor) == _t(tick)
    else:
        assert result.cursor is None  # unchanged


async def test_catchup_run_produces_the_same_ids_as_the_original_runs():
    """Ticks at 11, 12, 13, 14 one by one, or one catch-up tick at 14 after downtime:
    the same item ids, so the same draft keys and no second draft."""
    p = _pipeline(catchup="all")
    cursor, on_time = repr(_t("2026-11-29 10:00")), []
    for hour in (11, 12, 13, 14):
        result = await _fetch(p, _t(f"2026-11-29 {hour}:00"), cursor)
        on_time += [i.item_id for i in result.items]
        cursor = result.cursor
    caught_up = await _fetch(p, _t("2026-11-29 14:00"), repr(_t("2026-11-29 10:00")))
    assert [i.item_id for i in caught_up.items] == on_time


async def test_slot_comes_from_the_scheduled_time_not_the_clock():
    """A tick for the 14:00 slot that starts at 14:07 (scheduled_for is not on the
    slot boundary) still yields the 14:00 slot."""
    p = _pipeline(every="15m")
    result = await _fetch(p, _t("2026-11-29 14:07"), None)
    assert [i.item_id for i in result.items] == ["2026-11-29T14:00"]


async def test_slot_item_message_and_key():
    """A slot carries the topic; the recipe (not the source) is what gives a fresh draft."""
    result = await _fetch(_pipeline(), _t("2026-11-29 09:00"), None)
    item = result.items[0]
    m = item.message
    assert (m.kind, m.slot, m.subject, m.body) == ("slot", "2026-11-29T09:00", "Weekly product tip", "")
    assert m.date == "2026-11-29T09:00:00+00:00"
    assert draft_key("posts", "slot", item.item_id, "v1") == "posts|slot|2026-11-29T09:00|v1"
    assert draft_key("posts", "slot", item.item_id, "v2") != draft_key("posts", "slot", item.item_id, "v1")


async def test_cron_schedule_catches_up_weekly_slots():
    p = _pipeline(cron="0 9 * * MON", catchup="all")
    result = await _fetch(p, _t("2026-11-30 09:00"), repr(_t("2026-11-09 09:00")))
    assert [i.item_id for i in result.items] == ["2026-11-16T09:00", "2026-11-23T09:00", "2026-11-30T09:00"]


async def test_custom_slot_format():
    p = _pipeline(slot_format="%Y-%m-%dT%H")
    result = await _fetch(p, _t("2026-11-29 09:00"), None)
    assert result.items[0].item_id == "2026-11-29T09"


async def test_unreadable_cursor_is_a_first_run():
    result = await _fetch(_pipeline(catchup="all"), _t("2026-11-29 09:00"), "historyId=42")
    assert [i.item_id for i in result.items] == ["2026-11-29T09:00"]


@pytest.mark.parametrize("cron,fmt,ok", [
    ("0 9 * * MON-FRI", "%Y-%m-%d", True),
    ("0 9,21 * * *", "%Y-%m-%d", False),
    ("0 9,21 * * *", "%Y-%m-%dT%H", True),
    ("*/30 9-17 * * *", "%Y-%m-%dT%H", False),
])
def test_slot_format_must_tell_slots_apart(cron, fmt, ok):
    if ok:
        schedule.create(_pipeline(cron=cron, slot_format=fmt), _settings())
    else:
        with pytest.raises(ConfigError, match="gives two consecutive slots the same id"):
            _pipeline(cron=cron, slot_format=fmt)


def test_is_a_source():
    src = schedule.create(_pipeline(), _settings())
    assert isinstance(src, Source) and src.scope == "slot"


@pytest.mark.parametrize("opts,expected", [
    ({"topic": None}, "pipelines/posts.yaml: source.topic: missing"),
    ({"slot_format": "%Y-%m-%d"}, "pipelines/posts.yaml: source.slot_format: '%Y-%m-%d' gives two "
                                  "consecutive slots the same id"),
    ({"slot_format": "daily"}, "pipelines/posts.yaml: source.slot_format: expected a strftime format"),
    ({"path": "x"}, "pipelines/posts.yaml: source.path: unknown key"),
])
def test_create_reports_bad_options(opts, expected):
    with pytest.raises(ConfigError) as err:
        _pipeline(**opts)
    assert err.value.errors[0].startswith(expected), err.value.errors


def test_a_pipeline_in_new_york_ticks_ids_and_audits_in_new_york_time(tmp_path, capsys):
    """End to end in a non-UTC zone: ``0 9 * * *`` in America/New_York (UTC-5 in
    December). A tick at 08:59 New York takes yesterday's 09:00 slot, one at 09:00
    today's; the ids are New York wall times; the next firing is 09:00 New York
    tomorrow; ``audit show`` prints New York times and names the zone."""
    import asyncio
    import io

    from bot import scheduler
    from bot.__main__ import main
    from bot.approvals.console import ConsoleChannel
    from bot.config.load import load_settings
    from bot.store import create_store
    from tests.support.desk import started
    from tests.support.engine_world import Clock

    (tmp_path / "pipelines").mkdir()
    (tmp_path / "tip.txt").write_text("Today's tip: keep your receipts.\n")
    (tmp_path / "pipelines" / "posts.yaml").write_text(
        'name: posts\nschedule: "0 9 * * *"\ntimezone: America/New_York\n'
        "source: {type: schedule, topic: Daily tip}\n"
        "drafter: {model: template, prompt: tip.txt}\napproval: {channel: console}\n"
        "sender: {type: outbox, path: out, from: s@shop.example}\n")
    cfg = tmp_path / "draftgate.yaml"
    cfg.write_text("store: sqlite:///state.db\npipelines: pipelines/*.yaml\n")
    nine = _t("2026-12-07 14:00")  # 09:00 in New York

    async def flow() -> list[str]:
        settings = load_settings(cfg)
        clock = Clock(nine - 30)
        async with create_store(settings.store) as store:
            app = await started(settings, store, {"console": ConsoleChannel(
                out=io.StringIO(), interactive=False)}, clock=clock)
            try:
                await app.engine.tick("posts")
                clock.t = nine + 30
                await app.engine.tick("posts")
                p = settings.pipeline("posts")
                assert scheduler.next_due(p, clock.t) == nine + 86400
                return sorted(d.item_id for d in await store.recent("posts", ("awaiting",), 10))
            finally:
                await app.close()

    assert asyncio.run(flow()) == ["2026-12-06T09:00", "2026-12-07T09:00"]
    capsys.readouterr()
    assert main(["audit", "show", "posts", "2026-12-07T09:00", "-c", str(cfg)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "posts · item 2026-12-07T09:00 (times America/New_York)"
    assert lines[2] == "2026-12-07 09:00:30 admitted: queued"
    assert lines[3].startswith("2026-12-07 09:00:30 drafted: v1 by template")
