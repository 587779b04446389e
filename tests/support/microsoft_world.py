"""A deployment reading the fake Microsoft Graph (tests/fakes/microsoft.py) and
replying through it, with the real MSAL, the real Graph client (httpx), the real
SQLite store and Engine (template drafter, console channel)."""

from __future__ import annotations

import io as _io
from pathlib import Path

from tests.fakes.microsoft import FakeGraph

CLIENT_ID = "11111111-2222-3333-4444-555555555555"


def customer_mail(n: int, sender: str = "Alice Buyer <alice@customer.test>", refs: str = "",
                  to: str = "support@contoso.test") -> bytes:
    head = (f"From: {sender}\r\nTo: {to}\r\nSubject: Where is my order #{n}?\r\n"
            f"Message-ID: <order-{n}@customer.test>\r\n")
    head += f"References: {refs}\r\nIn-Reply-To: {refs.split()[-1]}\r\n" if refs else ""
    return (head + "Date: Thu, 03 Dec 2026 10:00:00 +0000\r\n\r\n"
            f"Hi, where is my order #{n}? It was due Friday.\r\n").encode()


def account_yaml(fake: FakeGraph, root: Path, extra: str = "") -> str:
    return (f"microsoft:\n  accounts:\n    office:\n      client_id: {CLIENT_ID}\n"
            f"      tenant: common\n      token_file: {root}/office-token.json\n"
            f"      address: support@contoso.test\n"
            f"      graph_endpoint: {fake.graph_endpoint}\n      authority_host: {fake.base}\n"
            f"      ca_file: {fake.ca_file}\n      backoff: 0s\n"
            + "".join(f"      {line}\n" for line in extra.splitlines() if line))


def write_deployment(root: Path, fake: FakeGraph, *,
                     sender: str = "{type: microsoft_reply, account: office}",
                     source_extra: str = "", account_extra: str = "", thread: int = 0,
                     pipeline_extra: str = "") -> Path:
    (root / "pipelines").mkdir(exist_ok=True)
    (root / "reply.txt").write_text("Hi {first_name},\n\nthanks for writing about {subject}.\n"
                                    "{thread}\n")
    (root / "draftgate.yaml").write_text(
        f"store: sqlite:///{root}/state.db\npipelines: pipelines/*.yaml\n"
        + account_yaml(fake, root, account_extra))
    (root / "pipelines" / "office.yaml").write_text(
        f"name: office\nschedule: 5m\nsource: {{type: microsoft, account: office"
        f"{source_extra}}}\ndrafter: {{model: template, prompt: reply.txt, thread: {thread}}}\n"
        f"approval: {{channel: console}}\nsender: {sender}\n{pipeline_extra}")
    return root / "draftgate.yaml"


def sign_in(fake: FakeGraph, config: Path) -> None:
    """``draftgate auth microsoft`` in-process, the device code approved by the fake."""
    from bot.cli.auth_microsoft import run_cli

    class Args:
        account, config_ = "office", None
        token = None

    args = Args()
    args.config = str(config)  # type: ignore[attr-defined]
    fake.auto_approve = True
    try:
        assert run_cli(args, out=_io.StringIO()) == 0
    finally:
        fake.auto_approve = False


class MicrosoftWorld:
    def __init__(self, root: Path, fake: FakeGraph, *, auto_approve: bool = True, **deployment):
        self.root, self.fake = root, fake
        self.config = write_deployment(root, fake, **deployment)
        self.auto_approve = auto_approve
        self.engine = self.store = None

    async def open(self, sign: bool = True) -> "MicrosoftWorld":
        import asyncio

        from tests.support.desk import open_console_world

        if sign:
            await asyncio.to_thread(sign_in, self.fake, self.config)
        await open_console_world(self)
        return self

    async def close(self) -> None:
        from tests.support.desk import close_console_world

        await close_console_world(self)

    async def tick(self):
        return await self.engine.tick("office")

    async def drafts(self, item_id: str):
        return await self.store.item_drafts("office", item_id)
