"""One IMAP connection per account in this process, shared by the stages that use it
(the source, the sender's Sent-folder check and append, thread context).

:func:`acquire` hands out the account's :class:`ImapClient` and counts its users;
:func:`release` closes the connection when the last one lets go. Keyed by the event
loop too: a connection belongs to the loop that opened it.
"""

from __future__ import annotations

import asyncio

from ..config.imap import ImapAccount
from ..shared import Lease, Shared
from .client import ImapClient

_clients: Shared[ImapClient] = Shared()


def _key(account: ImapAccount) -> tuple[int, str]:
    try:
        loop = id(asyncio.get_running_loop())
    except RuntimeError:
        loop = 0
    return loop, account.name


def acquire(account: ImapAccount) -> ImapClient:
    return _clients.acquire(_key(account), lambda: ImapClient(account),
                            lambda c: c.account == account)


async def release(client: ImapClient) -> None:
    if _clients.release(client):
        await client.close()


def lease(account: ImapAccount) -> Lease[ImapClient]:
    """A stage's hold on ``account``'s connection: acquired at first use, released by
    its ``close()``."""
    return Lease(lambda: acquire(account), release)
