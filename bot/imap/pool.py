"""One IMAP connection per account in this process, shared by the stages that use it
(the source, the sender's Sent-folder check and append, thread context).

:func:`acquire` hands out the account's :class:`ImapClient` and counts its users;
:func:`release` closes the connection when the last one lets go. Keyed by the event
loop too: a connection belongs to the loop that opened it.
"""

from __future__ import annotations

import asyncio

from ..config.imap import ImapAccount
from .client import ImapClient

_clients: dict[tuple[int, str], tuple[ImapClient, int]] = {}


def _key(account: ImapAccount) -> tuple[int, str]:
    try:
        loop = id(asyncio.get_running_loop())
    except RuntimeError:
        loop = 0
    return loop, account.name


def acquire(account: ImapAccount) -> ImapClient:
    key = _key(account)
    client, users = _clients.get(key, (None, 0))
    if client is None or client.account != account:
        client, users = ImapClient(account), 0
    _clients[key] = (client, users + 1)
    return client


async def release(client: ImapClient) -> None:
    for key, (c, users) in list(_clients.items()):
        if c is client:
            if users > 1:
                _clients[key] = (c, users - 1)
                return
            del _clients[key]
    await client.close()
