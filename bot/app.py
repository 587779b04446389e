"""The composition root: a store, the engine, the operator desk and the approval
channels, put together once, for `draftgate run`, `review`, `demo` and tests.

Commands and channels reach state only through the desk this builds
(:class:`bot.desk.desk.OperatorDesk`); nothing above here opens the store itself.
"""

from __future__ import annotations

import contextlib
from typing import Any, AsyncIterator

from .config.load import Settings
from .desk.desk import OperatorDesk
from .desk.operator import SYSTEM
from .engine.engine import Engine
from .stages import ApprovalChannel
from .store import Store, StoreMissing, SweepResult, create_store
from .store.copy import migrate_store, safe_url  # noqa: F401  (draftgate migrate-store)

__all__ = ["App", "OperatorDesk", "StoreMissing", "channels", "migrate_store", "open_desk",
           "safe_url", "store_of", "store_of_url"]


def channels(settings: Settings, *, demo: bool = False,
             console: Any = None) -> dict[str, ApprovalChannel]:
    """The approval channels the pipelines use, by name (the console always without
    Telegram). ``console``: a console channel made by the caller (``review``)."""
    from .approvals.console import ConsoleChannel

    found: dict[str, ApprovalChannel] = {}
    used = {p.approval.channel for p in settings.pipelines}
    if console is not None:
        found["console"] = console
    elif "console" in used or settings.telegram is None:
        found["console"] = ConsoleChannel(auto_approve=demo)
    if settings.telegram is not None and console is None:
        from .approvals.telegram import channel as telegram

        found["telegram"] = telegram.create(settings)
    return found


def store_of(settings: Settings) -> Store:
    """The configured store, not opened yet."""
    return create_store(settings.store)


def store_of_url(url: str) -> Store:
    """The store at ``url``, not opened (a bad URL: StoreError or ValueError)."""
    return create_store(url)


@contextlib.asynccontextmanager
async def open_desk(settings: Settings) -> AsyncIterator[OperatorDesk]:
    """A desk on the existing store, for a command that reads or changes what is there
    (no engine: no sends, no drafting). A store that does not exist is reported (a typo
    in ``store:`` must not look like "never run") and nothing is created."""
    store = store_of(settings)
    try:
        await store.open(create=False)
    except StoreMissing as exc:
        raise StoreMissing(f"{exc} (`store:` in {settings.file})") from None
    try:
        yield OperatorDesk(settings, store)
    finally:
        await store.close()


class App:
    """Store, engine, desk and channels of one process. ``async with App(...)`` opens
    the store and starts; or call :meth:`open`, :meth:`start`, :meth:`close`."""

    def __init__(self, settings: Settings, channel_map: dict[str, ApprovalChannel] | None = None,
                 *, store: Store | None = None, create: bool = True, **engine_options: Any):
        self.settings = settings
        self.store = store if store is not None else store_of(settings)
        self._owns_store = store is None
        self._create = create
        self.engine = Engine(settings, self.store, channel_map if channel_map is not None
                             else channels(settings), **engine_options)
        self.desk = OperatorDesk(settings, self.store, self.engine)
        self._started = False

    async def open(self) -> "App":
        if self._owns_store:
            try:
                await self.store.open(create=self._create)
            except StoreMissing as exc:
                raise StoreMissing(f"{exc} (`store:` in {self.settings.file})") from None
        return self

    async def start(self) -> "App":
        """Bind the channels to the desk, recover from a crash, start the channels,
        and put right cards a crash left showing an old state."""
        running = self.engine.channels.running()
        for ch in running:
            if (bind := getattr(ch, "bind", None)) is not None:
                bind(self.desk)  # recovery may update its cards already
        await self.engine.start()
        for ch in running:
            await ch.start(self.desk)
        self._started = True
        await self.engine.channels.resync_cards()
        self.engine.start_due()
        return self

    async def post_unposted(self) -> int:
        """Post every card that waits to be posted (from before a restart)."""
        return await self.engine.post_unposted()

    async def sweep(self) -> SweepResult:
        """The daily sweep, as draftgate itself."""
        return await self.desk.sweep(SYSTEM)

    async def run_forever(self, stop: Any) -> None:
        await self.engine.run_forever(stop, self.sweep)

    async def close(self) -> None:
        try:
            await self.engine.stop()
        finally:
            if self._owns_store:
                await self.store.close()

    async def __aenter__(self) -> "App":
        await self.open()
        try:
            return await self.start()
        except BaseException:
            await self.close()
            raise

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
