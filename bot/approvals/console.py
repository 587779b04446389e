"""Approval in the terminal.

Interactive (a terminal on stdin): each card is shown and the operator answers
``a`` approve & send, ``e`` edit, ``g`` regenerate, ``r`` reject, or Enter to leave it
pending. Demo mode (``auto_approve=True``) approves every card at once and says so
on every card, so it is never mistaken for a real approval. With no terminal and no
demo mode, cards are printed and wait; ``draftgate review`` decides them later.

Inside ``draftgate run`` a prompt is part of its pipeline's tick: that pipeline's next
ticks wait until the prompt is answered (other pipelines go on). A stop (Ctrl-C,
SIGTERM) ends the wait at once; the undecided draft stays awaiting.
"""

from __future__ import annotations

import asyncio
import contextlib
import shlex
import sys
import textwrap
import threading
from typing import Any, TextIO

from ..desk.operator import CONSOLE, DEMO, Operator
from ..errors import DraftgateError, NeedsConfirmation
from ..models import REPLAYABLE_STATUSES, Draft, Status, unsupported_line, unsupported_of, used_line
from ..redact import escape_controls, scrub
from ..stages import PostedRef
from .base import DeskChannel

_RULE = "─" * 64


def render(draft: Draft, *, width: int = 76, excerpt: int = 400) -> str:
    m = draft.message
    head = f"📨 {draft.pipeline} · #{draft.id} v{draft.version}"
    lines = [head]
    if m.kind == "slot":
        lines.append(f"Slot: {m.slot}  Topic: {m.subject}")
    else:
        sender = f"{m.from_name} <{m.from_addr}>" if m.from_name else m.from_addr
        lines += [f"From: {sender}", f"Subject: {m.subject or '(no subject)'}",
                  f"Received: {m.date or 'unknown'}"]
        if m.reply_to and m.reply_to != m.from_addr:
            lines.append(f"Reply goes to: {m.reply_to}")
        original = " ".join(m.body.split())
        if original:
            cut = original[:excerpt] + ("…" if len(original) > excerpt else "")
            lines.append("» " + "\n  ".join(textwrap.wrap(cut, width - 2)))
    lines += [line for line in (used_line(draft.used), unsupported_line(draft.used)) if line]
    if draft.status == Status.NOTIFIED:  # triage said notify: an FYI, no draft
        lines.append(f"🔔 FYI, no reply drafted. Triage: {draft.triage_reason or 'no reason given'}")
        return "\n".join(lines)
    lines.append("Draft:")
    # The exact text that would be sent: never re-wrapped or shortened.
    lines.append(draft.body)
    return "\n".join(lines)


class ConsoleChannel(DeskChannel):
    """Approval channel ``console``. Its operator is the host's console, one identity
    whoever runs it (``$USER`` is not asked): it counts once toward a quorum, and only
    where the pipeline lets the console decide (``approval.console``)."""

    name = "console"

    def __init__(self, *, auto_approve: bool = False, interactive: bool | None = None,
                 out: TextIO | None = None, operator: Operator | None = None):
        self.auto_approve = auto_approve
        self.interactive = (sys.stdin.isatty() if interactive is None else interactive) and not auto_approve
        self.out = out or sys.stdout
        self.op = operator or (DEMO if auto_approve else CONSOLE)
        self._prompt_lock = asyncio.Lock()
        self._reviewer: asyncio.Task | None = None  # the task holding _prompt_lock
        self._shown_last: tuple[int, int] | None = None  # (draft id, version) printed last

    def _print(self, text: str = "") -> None:
        # Cards quote strangers (email, model): no terminal escape may reach the screen.
        print(escape_controls(scrub(text), keep_newlines=True), file=self.out, flush=True)

    def _show(self, draft: Draft) -> None:
        self._print(_RULE)
        self._print(render(draft))
        self._shown_last = (draft.id, draft.version)

    async def post(self, draft: Draft) -> PostedRef:
        if not (self._prompt_lock.locked() and self._reviewer is not asyncio.current_task()):
            # While another card's prompt waits for an answer, printing this card would
            # put it last on the screen above that prompt; its own prompt prints it.
            self._show(draft)
        if draft.approval_message_id:
            return PostedRef("console", draft.approval_message_id)
        return PostedRef("console", f"console-{draft.id}")

    async def on_posted(self, draft: Draft) -> bool:
        """Called by the engine once the card is recorded as awaiting a decision; True
        when the operator (or demo mode) was asked to decide."""
        if self._desk is None:
            return False
        if draft.status == Status.NOTIFIED:
            if not self.interactive:
                self._print("   FYI only: `draftgate review` offers Draft a reply or Dismiss")
                return False
            await self.ask(self.review_fyi, draft)
        elif self.auto_approve:
            self._print(f"   [DEMO MODE] auto-approving #{draft.id} v{draft.version} "
                        f"(a real deployment waits for an operator)")
            # Demo mode approves what a human would be asked about (grounding: confirm):
            # it says so, and a demo sends only to its own outbox.
            if claims := unsupported_of(draft.used):
                self._print(f"   [DEMO MODE] not in the sources: {' · '.join(claims)}; sent anyway")
            await self.desk.approve(self.op, draft.id, draft.version, confirmed=True)
        elif self.interactive:
            await self.ask(self.review, draft)
        else:
            self._print("   waiting for a decision: run `draftgate review` in a terminal")
            return False
        return True

    async def ask(self, prompt: Any, draft: Draft) -> None:
        """Run ``prompt(draft)`` (review or review_send) as the only prompt on the
        terminal: a version posted meanwhile by a background regenerate waits for it,
        so an answer always goes to the card shown last. A new version posted from
        inside the prompt (an edit) is asked about at once."""
        if self._reviewer is not None and self._reviewer is asyncio.current_task():
            await prompt(draft)
            return
        async with self._prompt_lock:
            self._reviewer = asyncio.current_task()
            try:
                await prompt(draft)
            finally:
                self._reviewer = None

    async def review(self, draft: Draft) -> None:
        """Ask the operator what to do with ``draft``."""
        if self._shown_last != (draft.id, draft.version):
            self._show(draft)  # another card was printed meanwhile: the prompt is for this one
        answer = (await _terminal(
            _ask, "   [a]pprove & send, [e]dit, re[g]enerate, [r]eject, Enter = later: ")).strip().lower()
        try:
            await self._decide(draft, answer)
        except DraftgateError as exc:  # not the console's to decide, budget spent, model hold
            self._print(f"   {exc}")

    async def _decide(self, draft: Draft, answer: str) -> None:
        desk, op = self.desk, self.op
        if answer in ("a", "approve"):
            try:
                after = await desk.approve(op, draft.id, draft.version)
            except NeedsConfirmation as exc:  # grounding: confirm asks once more
                self._print(f"   ⚠️ {exc}")
                sure = (await _terminal(_ask, "   Send anyway? [y/N]: ")).strip().lower()
                if sure not in ("y", "yes"):
                    self._print("   not approved; left pending")
                    return
                after = await desk.approve(op, draft.id, draft.version, confirmed=True)
            if after is not None and after.status == "awaiting":  # approval.quorum
                self._print("   the console's approval counts once; this pipeline needs more "
                            "operators' (approval.quorum) before it sends")
            elif after is not None and after.status == "approved" and after.send_after:
                self._print(f"   approved; it is sent in {after.send_after - desk.clock():.0f} s "
                            "(approval.undo; ↩️ Undo on its Telegram card stops it)")
        elif answer in ("e", "edit"):
            self._print("   New text; end with a line containing only '.':")
            body = await _terminal(_read_block)
            after = await desk.edit(op, draft.id, draft.version, body)
            if after is not None and after.status == "ready":
                self._print(f"   v{after.version} saved; the running draftgate puts it on "
                            "the card (Telegram), where it waits for a decision")
        elif answer in ("g", "regenerate"):
            instruction = await _terminal(_ask, "   Instruction for the model (optional): ")
            await desk.regenerate(op, draft.id, draft.version, instruction.strip())
        elif answer in ("r", "reject"):
            reason = await _terminal(_ask, "   Reason (optional): ")
            await desk.reject(op, draft.id, draft.version, reason.strip())
        else:
            self._print("   left pending")

    async def review_fyi(self, draft: Draft) -> None:
        """An FYI (triage said notify): draft a reply after all, or dismiss it."""
        if self._shown_last != (draft.id, draft.version):
            self._show(draft)
        answer = (await _terminal(
            _ask, "   [d]raft a reply, dismiss [x], Enter = later: ")).strip().lower()
        try:
            if answer in ("d", "draft"):
                if await self.desk.draft_reply(self.op, draft.id, draft.version):
                    self._print("   drafting a reply; its card follows")
            elif answer in ("x", "dismiss"):
                await self.desk.dismiss(self.op, draft.id, draft.version)
            else:
                self._print("   left pending")
        except DraftgateError as exc:  # budget spent, model hold, pipeline gone
            self._print(f"   {exc}")

    async def review_send(self, draft: Draft) -> None:
        """A reply whose send failed or whose outcome is unknown: offer Retry."""
        self._show(draft)
        if draft.status == "send_unknown":
            self._print(f"   ❓ send outcome unknown: {draft.error}. Check the mailbox first: "
                        "Retry asks again, then sends only if it is not found.")
        else:
            self._print(f"   ❌ send failed: {draft.error}. Nothing was sent.")
        unknown = draft.status == "send_unknown"
        answer = (await _terminal(_ask, "   [c] check again, [m] mark as sent, [t] send again "
                                  "(may duplicate), Enter = later: " if unknown else
                                  "   [t] retry the send, Enter = later: ")).strip().lower()
        if unknown and answer in ("c", "m"):
            await self._unknown_send(draft, answer)
        elif answer in ("t", "retry"):
            try:
                after = await self.desk.retry_send(self.op, draft.id)
            except DraftgateError as exc:
                self._print(f"   {exc}")
                return
            if after is not None:
                await self.update(after)
        else:
            self._print("   left as it is")

    async def _unknown_send(self, draft: Draft, answer: str) -> None:
        """Check again (asks the mailbox, never sends) or Mark as sent."""
        try:
            if answer == "m":
                after = await self.desk.mark_sent(self.op, draft.id)
            else:
                after, note = await self.desk.check_send(self.op, draft.id)
                self._print(f"   {note}")
        except DraftgateError as exc:
            self._print(f"   {exc}")
            return
        if after is not None:
            await self.update(after)

    async def update(self, draft: Draft) -> None:
        who = draft.decided_by or "?"
        text = {
            "sent": f"✅ Sent by {who} · #{draft.id} v{draft.version} ({draft.sent_id})",
            "rejected": f"🗑 Rejected by {who} · #{draft.id} v{draft.version}",
            "dismissed": f"👋 Dismissed by {who} · #{draft.id} v{draft.version}",
            "send_failed": f"⚠️ Send failed · #{draft.id}: {draft.error}",
            "send_unknown": f"❓ Send outcome unknown · #{draft.id}: {draft.error}",
        }.get(draft.status, f"#{draft.id} v{draft.version}: {draft.status}")
        self._print("   " + text)

    async def notify(self, text: str, *, retry_draft: Draft | None = None) -> None:
        if retry_draft is not None and retry_draft.status in REPLAYABLE_STATUSES:
            text += (f" Replay it with: draftgate replay {shlex.quote(retry_draft.pipeline)} "
                     f"{shlex.quote(retry_draft.item_id)}")
        self._print(f"🔔 {text}")


async def _terminal(fn: Any, *args: Any) -> str:
    """``fn(*args)``, a blocking terminal read, in a daemon thread. A stop (Ctrl-C,
    SIGTERM) cancels the wait and the process exits at once: with asyncio.to_thread the
    executor's thread, still blocked in input(), would keep it alive until Enter."""
    loop = asyncio.get_running_loop()
    answer: asyncio.Future = loop.create_future()

    def settle(result: Any, exc: BaseException | None) -> None:
        if answer.done():  # cancelled by a stop
            return
        if exc is not None:
            answer.set_exception(exc)
        else:
            answer.set_result(result)

    def read() -> None:
        try:
            result, exc = fn(*args), None
        except BaseException as e:  # handed to the awaiting task
            result, exc = None, e
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits any more
            loop.call_soon_threadsafe(settle, result, exc)

    threading.Thread(target=read, name="console-prompt", daemon=True).start()
    return await answer


def _ask(prompt: str) -> str:
    try:
        return input(prompt)
    except EOFError:
        return ""


def _read_block() -> str:
    lines = []
    while True:
        try:
            line = input()
        except EOFError:
            break
        if line.strip() == ".":
            break
        lines.append(line)
    return "\n".join(lines)

