"""``outage:`` in the deployment file: what operators hear when the store goes away."""

from __future__ import annotations

from dataclasses import dataclass

from .checker import Checker, parse_duration

#: The default of ``outage.notify_after``: a restart or a failover of the database takes
#: less; an outage longer than this is worth a human's attention.
NOTIFY_AFTER = 120.0


@dataclass(frozen=True)
class OutageOptions:
    #: How long the store may be unreachable before the ops chat is told (then told
    #: again when it is back). 0: at once.
    notify_after: float = NOTIFY_AFTER


def parse_outage(ck: Checker, data: dict) -> OutageOptions:
    """``outage.notify_after`` (a duration, 0 or more)."""
    outage = ck.mapping(data.get("outage"), "outage")
    ck.unknown(outage, {"notify_after"}, "outage")
    after = ck.convert(outage, "notify_after", "outage", parse_duration, default=NOTIFY_AFTER)
    if after is not None and after < 0:
        ck.error("outage.notify_after", f"expected a duration of 0 or more like 2m, got "
                                        f"{outage['notify_after']!r}; 0s tells at once")
        after = NOTIFY_AFTER
    return OutageOptions(NOTIFY_AFTER if after is None else after)
