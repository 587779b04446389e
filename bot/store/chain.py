"""The audit chain: every audit row carries ``hash = sha256(prev_hash || canonical row)``.

One chain per store. A row's chain position ``seq`` (1, 2, 3, ...), the hash of the row
before it (``prev_hash``; the first row's is 64 zeros) and its own hash are written in
the same transaction as the change the row records. The head of the chain (last
position and hash) lives in the one-row table ``audit_head``: an append reads it (on
PostgreSQL ``FOR UPDATE``, which orders appends from every host) and moves it on.

The canonical row is the JSON array ``[seq, at, actor, action, draft_key, text_sha256,
detail]`` (UTF-8, no spaces, ``at`` as a float). The row's database id is not in it:
ids only name rows; the order is ``seq``.

:class:`Walker` recomputes a chain row by row (from the store, or from an export) and
names the first row that was changed, removed or inserted.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from typing import Any, Iterable, NamedTuple, Sequence

from ..errors import StoreError

GENESIS = "0" * 64
#: Columns of a chained row, in the order ``Walker.feed`` and the exports read them.
CHAIN_COLS = ("id", "seq", "at", "actor", "action", "draft_key", "text_sha256", "detail",
              "prev_hash", "hash")
INSERT_SQL = ("INSERT INTO audit (at, actor, action, draft_key, text_sha256, detail, seq, "
              "prev_hash, hash) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)")
HEAD_SQL = "SELECT seq, hash FROM audit_head WHERE one = 1"
SET_HEAD_SQL = "UPDATE audit_head SET seq = ?, hash = ? WHERE one = 1"
#: After migrate-store: the head follows the last copied row (rows keep their hashes).
ADOPT_HEAD_SQL = (
    "UPDATE audit_head SET seq = coalesce((SELECT max(seq) FROM audit), 0), hash = coalesce("
    "(SELECT hash FROM audit WHERE seq = (SELECT max(seq) FROM audit)), '" + GENESIS + "') "
    "WHERE one = 1")
#: SQLite: the first chained row whose position is not a whole number (text, a real).
ODD_SEQ_SQL = ("SELECT id, seq FROM audit WHERE seq IS NOT NULL AND typeof(seq) <> 'integer' "
               "ORDER BY id LIMIT 1")
WALK_SQL = f"SELECT {', '.join(CHAIN_COLS)} FROM audit WHERE seq IS NOT NULL ORDER BY seq, id"
#: The first row outside the chain (inserted without a position or hash), if any.
LOOSE_SQL = "SELECT min(id) FROM audit WHERE seq IS NULL OR hash IS NULL"
EXPORT_SQL = f"SELECT {', '.join(CHAIN_COLS)} FROM audit WHERE seq > ? ORDER BY seq LIMIT ?"
FIRST_SINCE_SQL = "SELECT min(seq) FROM audit WHERE at >= ?"


class Record(NamedTuple):
    """An audit row before it is chained (the text is already hashed and cleaned)."""

    at: float
    actor: str
    action: str
    draft_key: str | None
    text_sha256: str | None
    detail: str | None


# The strings' JSON form, as json.dumps(..., ensure_ascii=False) writes it: built by
# hand from json's own string encoder, it costs a fifth of a JSONEncoder call (admit
# hashes one row per item).
_STR = json.encoder.encode_basestring


def _json(v: Any) -> str:
    return "null" if v is None else _STR(str(v))


def canonical(seq: int, r: Record | tuple) -> str:
    """``json.dumps([seq, at, actor, action, draft_key, text_sha256, detail],
    ensure_ascii=False, separators=(",", ":"))``."""
    at, actor, action, key, text, detail = r
    at = float(at)
    if not math.isfinite(at):
        raise ValueError(f"an audit row's time must be a finite number, got {at!r}")
    return (f"[{int(seq)},{at!r},{_STR(str(actor))},{_STR(str(action))},{_json(key)},"
            f"{_json(text)},{_json(detail)}]")


def row_hash(prev_hash: str, seq: int, r: Record | tuple) -> str:
    return hashlib.sha256((prev_hash + canonical(seq, r)).encode("utf-8", "surrogatepass")
                          ).hexdigest()


NO_HEAD = ("the audit chain's head (the one row of table audit_head) is missing, so "
           "nothing audited can be written: the store was changed outside draftgate; run "
           "`draftgate audit verify` and restore the store from a backup")


def head_of(rows: list) -> tuple[int, str]:
    """The chain head from ``HEAD_SQL``'s rows; its row gone means someone removed it."""
    if not rows:
        raise StoreError(NO_HEAD)
    return int(rows[0][0]), str(rows[0][1])


#: SQLite: a row chained and appended in one statement. It reads the head, hashes
#: itself with ``sqlite_row_hash`` (registered on the store's connection as
#: ``draftgate_row_hash``), and the trigger ``audit_head_follows`` moves the head on, so
#: ``executemany`` appends a whole batch in one trip to aiosqlite's thread. No head row:
#: nothing is inserted (the caller compares the row count).
SQLITE_APPEND_SQL = (
    "INSERT INTO audit (at, actor, action, draft_key, text_sha256, detail, seq, prev_hash, "
    "hash) SELECT ?1, ?2, ?3, ?4, ?5, ?6, seq + 1, hash, "
    "draftgate_row_hash(hash, seq + 1, ?1, ?2, ?3, ?4, ?5, ?6) FROM audit_head WHERE one = 1")


#: SQLite: moves the head on after each appended row, on the store's own connection only
#: (a TEMP trigger, made at open): a row inserted past the head by anything else leaves
#: the head behind, so `audit verify` names it; so does a row put back below the head.
HEAD_FOLLOWS_SQL = (
    "CREATE TEMP TRIGGER IF NOT EXISTS audit_head_follows AFTER INSERT ON main.audit "
    "WHEN NEW.seq > (SELECT seq FROM audit_head WHERE one = 1) BEGIN "
    "UPDATE audit_head SET seq = NEW.seq, hash = NEW.hash WHERE one = 1; END")


def sqlite_row_hash(prev_hash: str, seq: int, *record: Any) -> str:
    return row_hash(prev_hash, seq, record)


def link(head: tuple[int, str], records: Iterable[Record]) -> tuple[list[tuple], tuple[int, str]]:
    """The INSERT arguments (see ``INSERT_SQL``) of ``records`` appended after ``head``
    (seq, hash), and the new head."""
    seq, prev = int(head[0]), str(head[1])
    rows = []
    for r in records:
        seq += 1
        h = row_hash(prev, seq, r)
        rows.append((*r, seq, prev, h))
        prev = h
    return rows, (seq, prev)


@dataclass
class Report:
    """What ``audit verify`` found."""

    checked: int = 0
    problem: str | None = None
    row_id: int | None = None  # the row named by ``problem``
    head: tuple[int, str] | None = None  # (seq, hash) of the last row checked

    @property
    def ok(self) -> bool:
        return self.problem is None


class Walker:
    """Checks chained rows fed in ``seq`` order; stops at the first problem."""

    def __init__(self, prev_hash: str = GENESIS, prev_seq: int = 0) -> None:
        self.report = Report()
        self._prev_hash, self._prev_seq, self._prev_id = prev_hash, prev_seq, None

    def _fail(self, row_id: int | None, problem: str) -> bool:
        self.report.problem, self.report.row_id = problem, row_id
        return False

    def feed(self, row: Any) -> bool:
        """Check one row (``CHAIN_COLS``, by name); False once a problem is found. A row
        that cannot be read (a position that is not a whole number, a time that is not
        a finite number) is named as changed: it was not written by draftgate."""
        if self.report.problem:
            return False
        bad = unreadable(row)
        if bad:
            return self._fail(row["id"], bad)
        return self._check(row["id"], int(row["seq"]), row)

    def _check(self, rid: Any, seq: int, row: Any) -> bool:
        after = f"#{self._prev_id}" if self._prev_id is not None else "the start"
        if seq <= self._prev_seq:
            return self._fail(rid, f"audit row #{rid} was inserted: chain position {seq} "
                                   f"already belongs to #{self._prev_id}")
        if seq > self._prev_seq + 1:
            missing = seq - self._prev_seq - 1
            gap = (rid - self._prev_id - 1) if self._prev_id is not None else None
            if missing == 1 and gap == 1:
                what = f"audit row #{rid - 1} was removed"
            else:
                what = f"{missing} audit row(s) were removed"
            return self._fail(rid - 1 if missing == 1 and gap == 1 else rid,
                              f"{what}: chain positions {self._prev_seq + 1}..{seq - 1} are "
                              f"missing between {after} and #{rid}")
        if row["prev_hash"] != self._prev_hash:
            return self._fail(self._prev_id or rid,
                              f"audit row #{self._prev_id} was changed and its hash rewritten "
                              f"(#{rid} records a different hash for it)"
                              if self._prev_id is not None else
                              f"audit row #{rid} does not start the chain (its prev_hash is "
                              "not the start value): rows before it were removed")
        record = tuple(row[c] for c in ("at", "actor", "action", "draft_key", "text_sha256",
                                        "detail"))
        h = row_hash(self._prev_hash, seq, record)
        if h != row["hash"]:
            return self._fail(rid, f"audit row #{rid} was changed: its content no longer "
                                   "matches its hash")
        self._prev_hash, self._prev_seq, self._prev_id = h, seq, rid
        self.report.checked += 1
        self.report.head = (seq, h)
        return True

    def finish(self, head: tuple[int, str] | None, loose: int | None = None) -> Report:
        """Compare the end of the walk with the store's chain ``head``; ``loose``: the id
        of a row outside the chain (no position or hash), if there is one."""
        r = self.report
        if r.problem:
            return r
        if loose is not None:
            self._fail(loose, f"audit row #{loose} is not part of the chain (no position or "
                              "hash): it was inserted outside draftgate")
        elif head is not None and (self._prev_seq, self._prev_hash) != tuple(head):
            if self._prev_seq < head[0]:
                self._fail(self._prev_id, f"the last audit row(s) were removed: the chain ends "
                                          f"at position {self._prev_seq} (#{self._prev_id}) "
                                          f"but the store's chain head is at {head[0]}")
            elif self._prev_seq > head[0]:
                self._fail(self._prev_id, f"audit row #{self._prev_id} was inserted: it is past "
                                          f"the store's chain head (position {head[0]})")
            else:
                self._fail(self._prev_id, f"audit row #{self._prev_id} was changed: the store's "
                                          "chain head records another hash for it")
        return r


def unreadable(row: Any) -> str | None:
    """Why chained ``row`` cannot be checked (no hash can be computed for it), or None."""
    rid, seq, at = row["id"], row["seq"], row["at"]
    if isinstance(seq, bool) or not isinstance(seq, int):
        return (f"audit row #{rid} was changed: its chain position is {_shown(seq)}, "
                "not a whole number")
    try:
        ok = not isinstance(at, (bool, str)) and math.isfinite(float(at))
    except (TypeError, ValueError, OverflowError):
        ok = False
    if not ok:
        return f"audit row #{rid} was changed: its time is {_shown(at)}, not a finite number"
    return None


def _shown(value: Any) -> str:
    """A tampered value as a message shows it: its repr, cut short."""
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def conclude(w: Walker, head: tuple | None, loose: int | None,
             odd: tuple[Any, Any] | None = None) -> Report:
    """The report of a whole-store walk; ``head`` None: the head row is gone. ``odd``:
    (id, seq) of a row whose position is not a whole number, if any (SQLite stores what
    it is given; such a row sorts after every number, so the walk first meets a gap
    where it belongs): it is named, not the gap."""
    if odd is not None:
        w.report.problem, w.report.row_id = (
            f"audit row #{odd[0]} was changed: its chain position is {_shown(odd[1])}, "
            "not a whole number"), odd[0]
        return w.report
    if head is None and w.report.ok:
        w.report.problem = "the chain head (the one row of table audit_head) was removed"
        return w.report
    return w.finish(head, loose)


def export_line(row: Any) -> str:
    """One JSON Lines record of a chained row (``CHAIN_COLS``, by name)."""
    return json.dumps({c: row[c] for c in CHAIN_COLS}, ensure_ascii=False)


async def seal(db: Any) -> None:
    """Migration step (both backends; ``db`` a ``rows.Db``): chain the rows written
    before the chain existed, in id order (so from this version on they are covered
    like every later row)."""
    old = await db.rows("SELECT id, at, actor, action, draft_key, text_sha256, detail "
                        "FROM audit WHERE seq IS NULL ORDER BY id")
    rows, head = link((0, GENESIS), [Record(*tuple(r)[1:]) for r in old])
    if rows:
        await db.many("UPDATE audit SET seq = ?, prev_hash = ?, hash = ? WHERE id = ?",
                      [(row[6], row[7], row[8], o[0]) for row, o in zip(rows, old, strict=True)])
    await db.run(SET_HEAD_SQL, head)


# PostgreSQL: the chained rows and the new head in one statement (one round trip).
_PG_APPEND = (
    "WITH ins AS (INSERT INTO audit (at, actor, action, draft_key, text_sha256, detail, seq,"
    " prev_hash, hash) SELECT * FROM unnest($1::float8[], $2::text[], $3::text[], $4::text[],"
    " $5::text[], $6::text[], $7::int8[], $8::text[], $9::text[]))"
    " UPDATE audit_head SET seq = $10, hash = $11 WHERE one = 1")


#: PostgreSQL: ONE row chained and appended in one statement, hashed by the server
#: (``sha256``, PostgreSQL 11+; claim's MATERIALIZED needs 12) over the head it locks: ``prev_hash || '[' || seq ||
#: $7``, where $7 is the rest of the canonical row (``canonical_tail``), so the text
#: hashed is the one ``row_hash`` hashes. The head is then locked for this statement
#: and the COMMIT only, not for the round trips of reading it first: every host's
#: audited changes queue on it. No head row: nothing is written ("UPDATE 0"). The
#: main UPDATE reads ``n``, so ``h`` locks the head first; the INSERTs (and the tokens'
#: upsert), which it does not read, run after it: head before usage row, always.
_PG_APPEND_ONE = (
    "WITH h AS (SELECT seq, hash FROM audit_head WHERE one = 1 FOR UPDATE),"
    " n AS (SELECT seq + 1 AS seq, hash AS prev, encode(sha256(convert_to("
    "hash || '[' || (seq + 1)::text || $7, 'UTF8')), 'hex') AS hash FROM h),"
    " ins AS (INSERT INTO audit (at, actor, action, draft_key, text_sha256, detail, seq,"
    " prev_hash, hash) SELECT $1::float8, $2, $3, $4, $5, $6, seq, prev, hash FROM n)"
    " UPDATE audit_head SET seq = n.seq, hash = n.hash FROM n WHERE audit_head.one = 1")
_PG_TOKENS = ("INSERT INTO token_usage (pipeline, day, tokens) VALUES ({}, {}, {})"
              " ON CONFLICT (pipeline, day) DO UPDATE SET tokens = token_usage.tokens + excluded.tokens")
#: ``_PG_APPEND_ONE`` that also adds tokens to a pipeline's usage of a day ($8-$10).
_PG_APPEND_ONE_TOKENS = _PG_APPEND_ONE.replace(
    " UPDATE audit_head", f", tok AS ({_PG_TOKENS.format('$8', '$9', '$10')}) UPDATE audit_head")


def canonical_tail(r: Record) -> str:
    """``canonical(seq, r)`` without its first characters ``[<seq>``."""
    return canonical(0, r)[2:]


async def append_postgres(con: Any, records: Sequence[Record],
                          tokens: tuple[str, str, int] | None = None) -> None:
    """Append ``records`` inside the caller's PostgreSQL transaction, and add
    ``tokens`` (pipeline, day, count) to that day's usage in the same statement. The
    head row is locked FOR UPDATE until commit, so appends from every host are
    ordered: one waiting for it then reads the head its predecessor committed (READ
    COMMITTED re-reads a locked row)."""
    if len(records) == 1:  # a decision, a draft: hashed by the server under the lock
        [r] = records
        args = (float(r.at), *r[1:], canonical_tail(r))
        status = await (con.execute(_PG_APPEND_ONE, *args) if tokens is None else
                        con.execute(_PG_APPEND_ONE_TOKENS, *args, *tokens))
        if status != "UPDATE 1":
            raise StoreError(NO_HEAD)
        return
    if records:
        head = head_of(await con.fetch(HEAD_SQL + " FOR UPDATE"))
        rows, (seq, h) = link(head, records)
        await con.execute(_PG_APPEND, *[list(col) for col in zip(*rows, strict=True)], seq, h)
    if tokens is not None:  # after the head: the two are always locked in that order
        await con.execute(_PG_TOKENS.format("$1", "$2", "$3"), *tokens)
