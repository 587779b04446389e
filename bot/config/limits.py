"""A pipeline's ``catchup``, ``lease``, ``max_attempts`` and ``max_per_tick`` (moved out of
:mod:`bot.config.load`, which had grown past the module limit)."""

from __future__ import annotations

from .checker import Checker, parse_duration

CATCHUP_POLICIES = ("latest", "all", "none")
#: Default ``max_per_tick``: enough for any normal tick, small enough that a flood or a
#: backfill is fetched, stored and drafted in bounded steps (memory, time to first card).
DEFAULT_MAX_PER_TICK = 200


def catchup_options(ck: Checker, data: dict) -> tuple[str | None, int | None]:
    """``catchup:``, a policy or ``{policy, max}``: the policy and the most slots."""
    catchup = data.get("catchup", "latest")
    if not isinstance(catchup, dict):
        return ck.get(data, "catchup", "", str, default="latest", choices=CATCHUP_POLICIES), 24
    ck.unknown(catchup, {"policy", "max"}, "catchup")
    catchup_max = ck.get(catchup, "max", "catchup", int, default=24)
    if catchup_max is not None and catchup_max < 1:
        ck.error("catchup.max", f"expected a whole number of slots of at least 1, got "
                                f"{catchup_max}")
    return ck.get(catchup, "policy", "catchup", str, default="latest",
                  choices=CATCHUP_POLICIES), catchup_max


def limits(ck: Checker, data: dict) -> tuple[float | None, int | None, int | None]:
    """``lease``, ``max_attempts`` and ``max_per_tick``, as far as they are valid."""
    lease = ck.convert(data, "lease", "", parse_duration, default=600.0)
    if lease is not None and lease <= 0:
        ck.error("lease", f"expected a duration above 0 like 10m, got {data['lease']!r}; a "
                          f"drafting claim that lasts no time would expire before every draft")
    max_attempts = ck.get(data, "max_attempts", "", int, default=3)
    if max_attempts is not None and max_attempts < 1:
        ck.error("max_attempts", "expected a whole number of at least 1")
    max_per_tick = ck.get(data, "max_per_tick", "", int, default=DEFAULT_MAX_PER_TICK)
    if max_per_tick is not None and max_per_tick < 1:
        ck.error("max_per_tick", f"expected a whole number of messages of at least 1, like "
                                 f"{DEFAULT_MAX_PER_TICK}, got {max_per_tick}; it bounds how "
                                 f"many new items one tick fetches (the rest come next tick)")
    return lease, max_attempts, max_per_tick
