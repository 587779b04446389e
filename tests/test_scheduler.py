"""Slots come from the schedule, never from the wall clock."""

from dataclasses import dataclass

import pytest

from bot.scheduler import describe, last_due, next_due, slot_id, slots_between, validate_cron

T0 = 1_764_410_400.0  # 2025-11-29T10:00:00Z


@dataclass
class S:
    interval: float | None = None
    cron: str | None = None


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
