"""Pipeline ``filters:``, applied to every fetched message before any drafting.

Pure: :func:`skip_reason` looks only at the parsed message and the options, and
returns a reason a human can read in ``/status`` ("mailing list (List-Unsubscribe
header)") or ``None`` to draft it. The options, their meaning and defaults:
:class:`bot.config.options.FilterOptions`.

Schedule slots (``kind == "slot"``) have no sender and are never filtered.
"""

from __future__ import annotations

import fnmatch

from ..config.options import FilterOptions
from ..models import Message

_LIST_PRECEDENCE = ("bulk", "list", "junk")


def skip_reason(message: Message, filters: FilterOptions, *,
                own_addresses: list[str]) -> str | None:
    """Why ``message`` should be skipped, or ``None`` to draft it."""
    if message.kind != "email":
        return None
    sender = (message.from_addr or message.reply_to).lower()
    headers = {k.lower(): v for k, v in message.headers.items()}

    reason = own_reason(message, filters, own_addresses=own_addresses)
    if reason:
        return reason

    if filters.skip_auto_replies:
        auto = headers.get("auto-submitted", "").strip().lower()
        if auto and not auto.startswith("no"):
            return f"automatic message (Auto-Submitted: {auto[:40]})"
        for name in ("x-autoreply", "x-autorespond"):
            if name in headers:
                return f"automatic reply ({_canonical(name)} header)"
        if headers.get("precedence", "").strip().lower() == "auto_reply":
            return "automatic reply (Precedence: auto_reply)"

    if filters.skip_mailing_lists:
        for name in ("list-unsubscribe", "list-id"):
            if name in headers:
                return f"mailing list ({_canonical(name)} header)"
        precedence = headers.get("precedence", "").strip().lower()
        if precedence in _LIST_PRECEDENCE:
            return f"mailing list (Precedence: {precedence})"

    for pattern in filters.skip_senders:
        for addr in {sender, message.reply_to.lower()} - {""}:
            if fnmatch.fnmatchcase(addr, pattern.strip().lower()):
                return f"sender {addr} matches filters.skip_senders {pattern!r}"

    for rx in filters.skip_subjects:
        if rx.search(message.subject):
            return f"subject matches filters.skip_subjects {rx.pattern!r}"

    if filters.max_body is not None:
        size = message.size or len(message.body.encode("utf-8"))
        if size > filters.max_body:
            return too_big(size, filters.max_body)
    return None


def too_big(size: int, limit: int) -> str:
    """The reason for a message over ``filters.max_body`` (also given by a source that
    can tell from the file size, without reading the message)."""
    return f"body of {size} bytes exceeds filters.max_body ({_human(limit)})"


def own_reason(message: Message, filters: FilterOptions, *, own_addresses: list[str]) -> str | None:
    """The ``skip_own`` rule alone (on by default): why ``message`` is our own mail, or
    ``None``. A source that learns an own address the configuration does not name (the
    Gmail account's address from its profile) applies it with this, so the item is
    still recorded as skipped with the same reason rather than dropped."""
    if message.kind != "email" or not filters.skip_own:
        return None
    own = {a.strip().lower() for a in [*own_addresses, *filters.own_addresses] if a and a.strip()}
    for addr in (message.from_addr, message.reply_to):
        if addr and addr.lower() in own:
            return f"sent from our own address {addr}"
    return None


def _canonical(name: str) -> str:
    return "-".join(part.capitalize() for part in name.split("-"))


def _human(size: int) -> str:
    for unit, scale in (("MB", 1000**2), ("kB", 1000)):
        if size >= scale:
            return f"{size / scale:g}{unit}"
    return f"{size} bytes"
