"""Style notes learned from edits (issue 25): the edit pairs they are learned from, and
the versions of each pipeline's rules with their decisions, each change audited in the
same transaction. Rules never cross pipelines: every statement names one."""

from __future__ import annotations

import json
from typing import Any

from ..models import Status, StyleNotes
from .base import Backend

_COLS = ("id, pipeline, version, rules, status, created_at, created_by, decided_by, "
         "decided_at, approval_chat, approval_message_id")
PROPOSED, APPROVED, REJECTED, SUPERSEDED = "proposed", "approved", "rejected", "superseded"


def _notes(r: Any) -> StyleNotes:
    return StyleNotes(int(r[0]), r[1], int(r[2]), list(json.loads(r[3])), r[4], float(r[5]),
                      r[6], r[7], None if r[8] is None else float(r[8]), r[9], r[10])


class NotesSql(Backend):
    async def edit_pairs(self, pipeline: str, limit: int) -> list[tuple[str, str]]:
        """The newest ``limit`` (first draft, sent reply) pairs of ``pipeline``: sent
        replies an operator edited, with the text the model had written before."""
        rows = await self._query(
            "SELECT first_body, body FROM drafts WHERE pipeline = ? AND status = ? AND "
            "first_body IS NOT NULL ORDER BY id DESC LIMIT ?",
            (pipeline, Status.SENT, int(limit)))
        return [(r[0], r[1]) for r in rows]

    async def notes(self, note_id: int) -> StyleNotes | None:
        rows = await self._query(f"SELECT {_COLS} FROM style_notes WHERE id = ?", (note_id,))
        return _notes(rows[0]) if rows else None

    async def notes_versions(self, pipeline: str, limit: int = 20) -> list[StyleNotes]:
        """The newest versions of ``pipeline``'s notes, newest first."""
        rows = await self._query(f"SELECT {_COLS} FROM style_notes WHERE pipeline = ? "
                                 "ORDER BY version DESC LIMIT ?", (pipeline, int(limit)))
        return [_notes(r) for r in rows]

    async def approved_notes(self, pipeline: str) -> StyleNotes | None:
        """The version the drafter of ``pipeline`` is given (None: none approved)."""
        rows = await self._query(f"SELECT {_COLS} FROM style_notes WHERE pipeline = ? AND "
                                 "status = ? ORDER BY version DESC LIMIT 1", (pipeline, APPROVED))
        return _notes(rows[0]) if rows else None

    async def unposted_notes(self) -> list[StyleNotes]:
        rows = await self._query(f"SELECT {_COLS} FROM style_notes WHERE status = ? AND "
                                 "approval_message_id IS NULL ORDER BY id", (PROPOSED,))
        return [_notes(r) for r in rows]

    async def notes_posted(self, note_id: int, chat: str, message_id: str) -> None:
        await self._execute("UPDATE style_notes SET approval_chat = ?, approval_message_id = ? "
                            "WHERE id = ?", (chat, message_id, note_id))

    async def add_notes(self, pipeline: str, rules: list[str], actor: str, *,
                        status: str = PROPOSED, detail: str = "",
                        now: float | None = None) -> StyleNotes:
        """A new version of ``pipeline``'s notes (the next number), audited. An
        ``approved`` one supersedes the version approved before it."""
        t = self._now(now)

        async def tx(db) -> int:
            [(top,)] = await db.rows("SELECT COALESCE(MAX(version), 0) FROM style_notes WHERE "
                                     "pipeline = ?", (pipeline,))
            version = int(top) + 1
            if status == APPROVED:
                await db.run("UPDATE style_notes SET status = ? WHERE pipeline = ? AND "
                             "status = ?", (SUPERSEDED, pipeline, APPROVED))
            await db.run("INSERT INTO style_notes (pipeline, version, rules, status, created_at, "
                          "created_by, decided_by, decided_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                          (pipeline, version, self._clean(json.dumps(rules)), status, t, actor,
                           actor if status == APPROVED else None,
                           t if status == APPROVED else None))
            text = "\n".join(rules)
            await self._append(db, [self._audit_row(
                t, actor, f"notes_{'propose' if status == PROPOSED else 'change'}",
                f"{pipeline}|style-notes|v{version}", text, detail or f"{len(rules)} rule(s)")])
            return version

        version = await self._run(tx)
        rows = await self._query(f"SELECT {_COLS} FROM style_notes WHERE pipeline = ? AND "
                                 "version = ?", (pipeline, version))
        return _notes(rows[0])

    async def decide_notes(self, note_id: int, decision: str, actor: str,
                           rules: list[str] | None = None,
                           now: float | None = None) -> StyleNotes | None:
        """CAS ``proposed -> approved | rejected`` (``rules``: as the operator edited them;
        ``proposed`` with ``rules``: an edit that stays to be decided). None when it is
        not proposed any more. Approving supersedes the version approved before."""
        t = self._now(now)

        async def tx(db) -> bool:
            rows = await db.rows(f"SELECT {_COLS} FROM style_notes WHERE id = ? AND status = ?",
                                 (note_id, PROPOSED))
            if not rows:
                return False
            n = _notes(rows[0])
            if decision == APPROVED:
                await db.run("UPDATE style_notes SET status = ? WHERE pipeline = ? AND "
                             "status = ?", (SUPERSEDED, n.pipeline, APPROVED))
            new_rules = n.rules if rules is None else rules
            await db.run("UPDATE style_notes SET status = ?, rules = ?, decided_by = ?, "
                         "decided_at = ? WHERE id = ?",
                         (decision, self._clean(json.dumps(new_rules)),
                          None if decision == PROPOSED else actor,
                          None if decision == PROPOSED else t, note_id))
            action = {APPROVED: "notes_approve", REJECTED: "notes_reject"}.get(decision,
                                                                               "notes_edit")
            await self._append(db, [self._audit_row(t, actor, action, n.key, "\n".join(new_rules),
                                                    f"{len(new_rules)} rule(s)")])
            return True

        return await self.notes(note_id) if await self._run(tx) else None

    async def last_notes_at(self, pipeline: str) -> float | None:
        """When ``pipeline``'s newest version was made (the weekly distill's clock)."""
        rows = await self._query("SELECT MAX(created_at) FROM style_notes WHERE pipeline = ?",
                                 (pipeline,))
        return None if not rows or rows[0][0] is None else float(rows[0][0])


__all__ = ["NotesSql", "PROPOSED", "APPROVED", "REJECTED", "SUPERSEDED"]
