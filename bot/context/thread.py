"""Which earlier messages of a thread a new mail may be answered with: one rule for
every source (Gmail, IMAP, maildir).

Anyone can write ``References: <someone else's Message-ID>`` (and Gmail threads by
References and subject), so a thread as the mailbox sees it may hold another
customer's mail. Thread context holds only the messages the new mail's sender took
part in: they wrote it, or it was sent or copied to them (our own replies to them
included). The rest is left out, and the card says how many (``Context.used``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Iterable

from ..drafters.prompt import split_quoted
from ..models import Message, ThreadMessage

log = logging.getLogger("draftgate.context")


def thread_message(m: Message, ours: bool) -> ThreadMessage:
    """An earlier message as the model sees it: its sender, date and new text (what it
    quoted of the thread before it is there already)."""
    sender = f"{m.from_name} <{m.from_addr}>" if m.from_name else m.from_addr
    return ThreadMessage(sender or "unknown", m.date, split_quoted(m.body or "")[0].strip(), ours)


def took_part(earlier: Message, sender: str) -> bool:
    """Whether ``sender`` wrote ``earlier`` or was among its recipients."""
    who = {a.strip().lower() for a in (earlier.from_addr, earlier.reply_to, *earlier.to,
                                       *earlier.cc) if a}
    return bool(sender and sender.strip()) and sender.strip().lower() in who


@dataclass(frozen=True)
class Thread:
    """A source's answer to ``thread(message, limit)``: the earlier messages given,
    oldest first, and how many it found but left out (the sender took no part)."""

    messages: list[ThreadMessage] = field(default_factory=list)
    left_out: int = 0


def participants_only(found: Iterable[tuple[Message, bool]], sender: str,
                      where: str = "") -> Thread:
    """``found`` (earlier message, ours?) in order, without those ``sender`` took no
    part in (see the module docstring); how many were left out is logged for ``where``."""
    kept, left_out = [], 0
    for m, ours in found:
        if took_part(m, sender):
            kept.append(thread_message(m, ours))
        else:
            left_out += 1
    if left_out:
        log.info("%s: %d earlier message(s) of the thread left out of the context: the "
                 "sender took no part in them", where or "thread", left_out)
    return Thread(kept, left_out)
