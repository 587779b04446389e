"""Slots come from the schedule, never from the wall clock."""

from dataclasses import dataclass

import pytest

from bot.scheduler import describe, last_due, next_due, slot_id, slots_between, validate_cron

T0 = 1_764_410_400.0  # 2025-11-29T10:00:00Z


@dataclass
class S:
    interval: float | None = None
    cron: str | None = None
    timezone: str = "UTC"


@pytest.mark.parametrize("sched, after, expected", [
    (S(interval=300), T0, T0 + 300),
    (S(interval=300), T0 + 1, T0 + 300),
    (S(interval=300), T0 - 0.5, T0),
    (S(cron="0 9 * * *"), T0, T0 + 23 * 3600),
    (S(cron="*/15 * * * *"), T0 + 60, T0 + 900),
])
def test_next_due(sched, after, expected):
    assert next_due(sched, after) == expected


@pytest.mark.parametrize("sched, at, expected", [
    (S(interval=300), T0 + 299, T0),
    (S(interval=300), T0, T0),
    (S(cron="0 * * * *"), T0 + 3599, T0),
    (S(cron="0 * * * *"), T0, T0),
])
def test_last_due(sched, at, expected):
    assert last_due(sched, at) == expected


def test_slots_between_interval_keeps_newest_when_limited():
    s = S(interval=3600)
    assert slots_between(s, T0, T0 + 5 * 3600) == [T0 + h * 3600 for h in range(1, 6)]
    assert slots_between(s, T0, T0 + 5 * 3600, limit=2) == [T0 + 4 * 3600, T0 + 5 * 3600]
    assert slots_between(s, T0, T0) == []


def test_slots_between_cron_matches_interval_equivalent():
    assert slots_between(S(cron="0 * * * *"), T0, T0 + 3 * 3600) == \
        slots_between(S(interval=3600), T0, T0 + 3 * 3600)


def test_a_catchup_run_and_the_original_share_the_slot_id():
    """The slot id depends on the scheduled time only: running late changes nothing."""
    s = S(interval=3600)
    original = slot_id(last_due(s, T0 + 5))
    catch_up = slot_id(last_due(s, T0 + 3599))
    assert original == catch_up == "2025-11-29T10:00"


def test_validate_cron_explains_problems():
    assert validate_cron("0 9 * * MON-FRI") is None
    assert "5" in validate_cron("0 9 * *")
    assert validate_cron("99 9 * * *") is not None


def test_describe():
    assert describe(S(interval=300)) == "every 5m"
    assert describe(S(interval=7200)) == "every 2h"
    assert describe(S(cron="0 9 * * *")) == "cron 0 9 * * *"


@pytest.mark.parametrize("expr", ["0 9 31 2 *", "0 9 30 2 *", "0 0 31 4,6,9,11 *"])
def test_a_cron_that_never_fires_is_a_config_error(tmp_path, capsys, expr):
    """croniter accepts 31 February and fails only when asked for the next run: validate
    said OK and `run --once` died with CroniterBadDateError."""
    from bot.__main__ import main

    assert "never fires" in validate_cron(expr)
    (tmp_path / "pipelines").mkdir()
    (tmp_path / "pipelines" / "a.yaml").write_text(
        f"name: a\nschedule: '{expr}'\nsource: {{type: maildir, path: inbox}}\n"
        "sender: {type: outbox, path: out, from: s@shop.example}\n")
    cfg = tmp_path / "draftgate.yaml"
    cfg.write_text("store: sqlite:///s.db\n")
    for argv in (["validate"], ["run", "--once"]):
        assert main([*argv, "-c", str(cfg)]) == 2
        err = capsys.readouterr().err
        assert f"pipelines/a.yaml: schedule: expected an interval like 5m or a cron expression " \
               f"like '0 9 * * MON-FRI': '{expr}' never fires" in err
        assert "Traceback" not in err
    assert not (tmp_path / "s.db").exists()


def test_a_rare_cron_is_fine():
    assert validate_cron("0 9 29 2 *") is None  # every leap year
    assert validate_cron("0 9 31 2 MON") is None  # day OR weekday: every Monday


# -- time zones: cron at local time across daylight saving changes -------------------

BERLIN = "Europe/Berlin"


def _local(t: float, tz: str = BERLIN) -> str:
    from datetime import datetime
    from zoneinfo import ZoneInfo

    return datetime.fromtimestamp(t, ZoneInfo(tz)).strftime("%Y-%m-%d %H:%M%z")


def _utc(text: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(text).timestamp()


def _fire(sched: S, start: float, until: float) -> list[float]:
    """What the loop does with a fake clock: sleep to next_due, tick last_due there."""
    fired, clock = [], start
    while True:
        clock = next_due(sched, clock)
        if clock > until:
            return fired
        assert last_due(sched, clock) == clock  # the tick at that moment is that slot
        fired.append(clock)


@pytest.mark.parametrize("first, last, offsets", [
    # March: CET (+0100) until Sunday 29 March 02:00, then CEST (+0200).
    ("2026-03-26T00:00+00:00", "2026-04-01T23:00+00:00",
     ["+0100"] * 3 + ["+0200"] * 4),
    # October: CEST until Sunday 25 October 03:00, then CET.
    ("2026-10-22T00:00+00:00", "2026-10-28T23:00+00:00",
     ["+0200"] * 3 + ["+0100"] * 4),
])
def test_nine_oclock_berlin_fires_once_each_day_across_the_change(first, last, offsets):
    """`0 9 * * *` in Europe/Berlin: one firing per day, at 09:00 local, 23 or 25 hours
    apart across the change, each with its own slot id."""
    fired = _fire(S(cron="0 9 * * *", timezone=BERLIN), _utc(first), _utc(last))
    days = [_local(t)[:10] for t in fired]
    assert len(days) == 7 and len(set(days)) == 7
    assert [_local(t)[11:] for t in fired] == [f"09:00{o}" for o in offsets]
    gaps = {round((b - a) / 3600) for a, b in zip(fired, fired[1:], strict=False)}
    assert gaps == ({24, 23} if offsets[0] == "+0100" else {24, 25})
    ids = [slot_id(t, tz=BERLIN) for t in fired]
    assert len(set(ids)) == 7 and all(i.endswith("T09:00") for i in ids)


def test_a_time_the_spring_change_skips_fires_once_an_hour_later():
    """02:30 does not exist on 29 March 2026 in Berlin: it fires once, at 03:30 summer
    time (the instant 02:30 winter time would be), and on every other day at 02:30."""
    fired = _fire(S(cron="30 2 * * *", timezone=BERLIN), _utc("2026-03-27T12:00+00:00"),
                  _utc("2026-03-31T12:00+00:00"))
    assert [_local(t) for t in fired] == [
        "2026-03-28 02:30+0100", "2026-03-29 03:30+0200", "2026-03-30 02:30+0200",
        "2026-03-31 02:30+0200"]


def test_a_time_the_autumn_change_repeats_fires_once_at_its_first_occurrence():
    fired = _fire(S(cron="30 2 * * *", timezone=BERLIN), _utc("2026-10-24T12:00+00:00"),
                  _utc("2026-10-26T12:00+00:00"))
    assert [_local(t) for t in fired] == ["2026-10-25 02:30+0200", "2026-10-26 02:30+0100"]


@pytest.mark.parametrize("first, hours", [("2026-03-29T00:00+00:00", 3),
                                          ("2026-10-24T23:00+00:00", 4)])
def test_half_hourly_cron_across_a_change_never_doubles_a_slot(first, hours):
    """Every firing is a distinct instant with a distinct slot id, the same list whether
    the loop steps through them or a catch-up lists them at once."""
    sched = S(cron="*/30 * * * *", timezone=BERLIN)
    start = _utc(first)
    fired = _fire(sched, start, start + hours * 3600)
    assert fired == sorted(set(fired)) == slots_between(sched, start, start + hours * 3600)
    ids = [slot_id(t, tz=BERLIN) for t in fired]
    assert len(set(ids)) == len(ids)


def test_interval_slots_in_the_repeated_hour_get_their_offset_in_the_id():
    sched = S(interval=1800, timezone=BERLIN)
    start = _utc("2026-10-25T00:00+00:00")  # 02:00 CEST
    ids = [slot_id(t, tz=BERLIN) for t in slots_between(sched, start - 1, start + 7200)]
    assert ids == ["2026-10-25T02:00", "2026-10-25T02:30", "2026-10-25T02:00+0100",
                   "2026-10-25T02:30+0100", "2026-10-25T03:00"]


def test_describe_names_a_zone_other_than_utc():
    assert describe(S(cron="0 9 * * *", timezone=BERLIN)) == "cron 0 9 * * * Europe/Berlin"
    assert describe(S(cron="0 9 * * *")) == "cron 0 9 * * *"
