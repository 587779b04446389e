"""A deployment reading a real Dovecot over IMAP and replying through the test's SMTP
server, with the real SQLite store and Engine (template drafter, console channel)."""

from __future__ import annotations

import os
from pathlib import Path

from tests._dovecot import PASSWORD, USERS, Dovecot, SmtpRelay

PASSWORD_ENV = "DG_TEST_IMAP_PASSWORD"


def order_mail(n: int, sender: str = "Alice Buyer <alice@customer.test>", refs: str = "",
               message_id: str | None = None) -> bytes:
    mid = message_id if message_id is not None else f"<order-{n}@customer.test>"
    head = f"From: {sender}\r\nTo: {USERS[0]}\r\nSubject: Where is my order #{n}?\r\n"
    head += f"Message-ID: {mid}\r\n" if mid else ""
    head += f"References: {refs}\r\nIn-Reply-To: {refs.split()[-1]}\r\n" if refs else ""
    return (head + "Date: Thu, 03 Dec 2026 10:00:00 +0000\r\n\r\n"
            f"Hi, where is my order #{n}? It was due Friday.\r\n").encode()


def write_deployment(root: Path, dovecot: Dovecot, relay: SmtpRelay | None, *,
                     sender: str = "{type: smtp_reply, account: shop}",
                     source_extra: str = "", account_extra: str = "",
                     folder: str = "INBOX", thread: int = 0) -> Path:
    (root / "pipelines").mkdir(exist_ok=True)
    (root / "reply.txt").write_text("Hi {first_name},\n\nthanks for writing about {subject}.\n"
                                    "{thread}\n")
    smtp = (f"      smtp: {{host: 127.0.0.1, port: {relay.port}, security: plain}}\n"
            if relay else "")
    (root / "draftgate.yaml").write_text(
        f"store: sqlite:///{root}/state.db\npipelines: pipelines/*.yaml\n"
        f"imap:\n  accounts:\n    shop:\n      host: 127.0.0.1\n      port: {dovecot.imap_port}\n"
        f"      security: plain\n      allow_plain: true\n      username: {USERS[0]}\n"
        f"      password_env: {PASSWORD_ENV}\n      folder: {folder}\n{smtp}"
        + "".join(f"      {line}\n" for line in account_extra.splitlines() if line))
    (root / "pipelines" / "shop.yaml").write_text(
        f"name: shop\nschedule: 5m\nsource: {{type: imap, account: shop{source_extra}}}\n"
        f"drafter: {{model: template, prompt: reply.txt, thread: {thread}}}\n"
        f"approval: {{channel: console}}\nsender: {sender}\n")
    return root / "draftgate.yaml"


def env() -> dict[str, str]:
    return {**os.environ, PASSWORD_ENV: PASSWORD}


class ImapWorld:
    def __init__(self, root: Path, dovecot: Dovecot, relay: SmtpRelay | None = None, *,
                 auto_approve: bool = True, **deployment):
        self.root, self.dovecot, self.relay = root, dovecot, relay
        self.config = write_deployment(root, dovecot, relay, **deployment)
        self.auto_approve = auto_approve
        self.engine = self.store = None

    async def open(self) -> "ImapWorld":
        from tests.support.desk import open_console_world

        os.environ[PASSWORD_ENV] = PASSWORD
        await open_console_world(self)
        return self

    async def close(self) -> None:
        from tests.support.desk import close_console_world

        try:
            await close_console_world(self)
        finally:
            os.environ.pop(PASSWORD_ENV, None)

    async def tick(self):
        return await self.engine.tick("shop")

    async def drafts(self, item_id: str):
        return await self.store.item_drafts("shop", item_id)
