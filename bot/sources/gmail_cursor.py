"""The Gmail source's stored cursor (see :mod:`bot.sources.gmail`): the historyId,
when it was taken, and the ids still to re-check or to take."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger("draftgate.sources.gmail")  # the source's log, as before

# Kinds of backlog entries (ids found but not taken yet because of max_per_tick):
# "h" new in history (still to be matched against the query), "b" listed by the query
# for a backfill (taken as they are), "r" listed by the query in a resync (taken
# unless they arrived before the first run).
_KINDS = {"h", "b", "r"}


@dataclass
class Cursor:
    """The stored sync position; see :mod:`bot.sources.gmail`."""

    history_id: str
    synced: float | None = None  # when history_id was current (taken before the call)
    first: float | None = None  # when the first run took its cursor
    # (gmail id, internalDate in ms): candidates the search has not returned yet
    recheck: list[tuple[str, int]] = field(default_factory=list)
    # (gmail id, kind), oldest first: found but not taken yet (max_per_tick); see _take
    backlog: list[tuple[str, str]] = field(default_factory=list)

    @classmethod
    def parse(cls, value: str) -> "Cursor":
        value = value.strip()
        if not value.startswith("{"):
            return cls(value)  # a bare historyId, as stored before
        try:
            data = json.loads(value)
            return cls(str(data.get("historyId") or ""), _seconds(data.get("synced")),
                       _seconds(data.get("first")), _recheck(data.get("recheck")),
                       _backlog(data.get("backlog")))
        except (ValueError, AttributeError):
            log.warning("gmail: unreadable stored cursor %r; resyncing by query", value[:80])
            return cls("")  # the fallback (bounded by resync_window) takes it from here

    def dump(self) -> str:
        data: dict[str, Any] = {"historyId": self.history_id}
        if self.synced is not None:
            data["synced"] = self.synced
        if self.first is not None:
            data["first"] = self.first  # unrounded: compared with internalDate in ms
        if self.recheck:
            data["recheck"] = [[gid, date] for gid, date in self.recheck]
        if self.backlog:
            data["backlog"] = [[gid, kind] for gid, kind in self.backlog]
        return json.dumps(data, separators=(",", ":"))


def _seconds(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _recheck(value: Any) -> list[tuple[str, int]]:
    """The stored ``recheck`` list; entries that are not [id, ms] are left out (logged)."""
    return _pairs(value, "re-check list", value, "re-check entry",
                  lambda x: None if _seconds(x) is None else int(x))


def _backlog(value: Any) -> list[tuple[str, str]]:
    """The stored ``backlog``; an entry that is not [id, kind] is left out (logged)."""
    return _pairs(value, "backlog", str(value)[:80], "backlog entry",
                  lambda x: x if x in _KINDS else None)


def _pairs(value: Any, what: str, shown: Any, entry_what: str,
           second: Callable[[Any], Any]) -> list:
    """The [id, x] entries of a stored list whose x ``second`` reads (not None)."""
    out = []
    if value is not None and not isinstance(value, list):
        log.warning("gmail: unreadable %s %r in the stored cursor; left out", what, shown)
    for entry in value if isinstance(value, list) else []:
        if isinstance(entry, list) and len(entry) == 2 and isinstance(entry[0], str) \
                and entry[0] and (x := second(entry[1])) is not None:
            out.append((entry[0], x))
        else:
            log.warning("gmail: unreadable %s %r in the stored cursor; left out", entry_what, entry)
    return out


def join_queues(*lists: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """The lists joined in order, each id once (its first place and kind)."""
    out: dict[str, str] = {}
    for entries in lists:
        for gid, kind in entries:
            out.setdefault(gid, kind)
    return list(out.items())
