"""What the mailbox sources (``imap``, ``microsoft``) share: the folder they read and
its scope, the body limit, the pooled client they hold, their cursor's JSON, and a
downloaded message made an item."""

from __future__ import annotations

import json
import logging
from typing import Any, Callable, TypeVar

from ..config.mailbox import SourceOptions
from ..config.options import FilterOptions
from ..mail.mime import DEFAULT_MAX_BODY, UnparseableMessage, parse_email
from ..models import Item, Message
from ..shared import Lease
from . import filters as _filters

T = TypeVar("T")


def load_cursor(text: str | None, make: Callable[[dict], T], log: logging.Logger,
                kind: str) -> T | None:
    """The cursor ``make`` builds from the JSON ``text``; None on a first run, or (with a
    warning) when the text cannot be read: the source then starts as on a first run."""
    if not text:
        return None
    try:
        return make(json.loads(text))
    except (ValueError, KeyError, TypeError):
        log.warning("%s: unreadable cursor %r; starting as on a first run", kind, text[:80])
        return None


class MailboxSource:
    """The parts of a mailbox source that do not depend on its protocol."""

    kind = ""  # the scope's and the log lines' prefix
    log = logging.getLogger("draftgate.sources")

    def __init__(self, options: SourceOptions, account: Any, filters: FilterOptions,
                 clock: Callable[[], float], lease: Lease, own: list[str]):
        self.options, self.account, self.filters = options, account, filters
        self.folder = options.folder or account.folder
        self.scope = f"{self.kind}:{account.name}:{self.folder}"
        self.max_body = (filters.max_body if options.max_body is None else options.max_body) \
            or DEFAULT_MAX_BODY
        self.clock = clock
        self._lease = lease
        self._own = own  # the account's own addresses: its mail is never answered

    def _parsed(self, iid: str, stub: Message, raw: bytes, what: str,
                thread_id: str | None = None) -> Item:
        """The item ``iid`` of the message ``raw`` (``stub``: what is known of it without
        parsing; ``what``: how a log line names it; ``thread_id``: its thread, where the
        server tells it). A message that cannot be parsed is an item skipped with the
        reason: one message never stops the tick."""
        try:
            msg = parse_email(raw, max_body=self.max_body, source_id=stub.source_id)
        except UnparseableMessage as exc:
            return Item(iid, stub, skip_reason=f"unparseable message: {exc}")
        except Exception as exc:
            self.log.exception("%s %s: parse failed for %s", self.kind, self.account.name, what)
            return Item(iid, stub, skip_reason=f"unparseable message ({type(exc).__name__})")
        if thread_id is not None:
            msg.thread_id = thread_id
        return Item(iid, msg, skip_reason=_filters.own_reason(msg, self.filters,
                                                              own_addresses=self._own))

    async def close(self) -> None:
        await self._lease.close()

