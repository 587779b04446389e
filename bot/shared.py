"""One client per key in this process, shared by the stages that use it (a source, its
sender, thread context) and closed when the last user lets go: IMAP connections and
Microsoft Graph clients are pooled this way (``bot.imap.pool``, ``bot.microsoft.client``)."""

from __future__ import annotations

from typing import Any, Awaitable, Callable, Generic, Hashable, TypeVar

C = TypeVar("C")


class Shared(Generic[C]):
    """Clients by key, each with its count of users."""

    def __init__(self) -> None:
        self._clients: dict[Hashable, tuple[Any, int]] = {}

    def acquire(self, key: Hashable, make: Callable[[], C],
                fits: Callable[[C], bool] = lambda c: True) -> C:
        """The client under ``key`` (a new one from ``make`` if there is none, or the one
        there does not ``fit`` any more), with one more user."""
        client, users = self._clients.get(key, (None, 0))
        if client is None or not fits(client):
            client, users = make(), 0
        self._clients[key] = (client, users + 1)
        return client

    def release(self, client: C) -> bool:
        """One user fewer; True when it was the last (the caller closes the client)."""
        for key, (c, users) in list(self._clients.items()):
            if c is client:
                if users > 1:
                    self._clients[key] = (c, users - 1)
                    return False
                del self._clients[key]
        return True


class Lease(Generic[C]):
    """One user's hold on a shared client (a source's, a sender's): taken at first use
    with ``acquire``, handed back by :meth:`close` with ``release``."""

    def __init__(self, acquire: Callable[[], C], release: Callable[[C], Awaitable[None]]) -> None:
        self._acquire, self._release = acquire, release
        self._client: C | None = None

    @property
    def client(self) -> C:
        if self._client is None:
            self._client = self._acquire()
        return self._client

    async def close(self) -> None:
        if self._client is not None:
            client, self._client = self._client, None
            await self._release(client)
