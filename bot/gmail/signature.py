"""``drafter.signature: gmail`` (issue 28): the account's own signature, from Gmail's
``users.settings.sendAs`` (the default send-as address's), as plain text. Fetched on
first use and again once a day; if Gmail cannot be asked, the last one fetched stays in
use (none yet: no signature), and it is asked again after an hour."""

from __future__ import annotations

import logging
import os
from typing import Callable

from ..config.load import Settings
from ..errors import describe_error
from ..mail.mime import html_to_text
from .client import GmailClient

log = logging.getLogger("draftgate.gmail")

REFRESH = 86400.0  # a fetched signature is used this long, then fetched again
RETRY = 3600.0  # after a failed fetch


def pick(send_as: list[dict]) -> str:
    """The default send-as address's signature (else the primary's), as plain text."""
    chosen = next((s for s in send_as if s.get("isDefault")), None) or next(
        (s for s in send_as if s.get("isPrimary")), None) or {}
    markup = str(chosen.get("signature") or "")
    return html_to_text(markup).strip() if markup else ""


class Signatures:
    """The signature of each Gmail account, cached: ``await get(account)``."""

    def __init__(self, settings: Settings, clock: Callable[[], float]):
        self.settings, self.clock = settings, clock
        self._cache: dict[str, tuple[float, str]] = {}  # account -> (next fetch, text)
        self.fetches = 0  # sendAs.list calls made (tests, logs)

    async def get(self, account: str) -> str:
        now = self.clock()
        due, text = self._cache.get(account, (0.0, ""))
        if now < due:
            return text
        client = GmailClient(account, self.settings.gmail_accounts[account],
                             base_dir=self.settings.base_dir, workers=1,
                             config_file=os.path.abspath(self.settings.file))
        try:
            self.fetches += 1
            answer = await client.aread(
                lambda s: s.users().settings().sendAs().list(userId="me"), "settings.sendAs.list")
            text = pick(list(answer.get("sendAs") or []))
            self._cache[account] = (now + REFRESH, text)
            log.info("gmail %s: signature fetched (%d characters)", account, len(text))
        except Exception as exc:
            log.warning("gmail %s: could not fetch the signature (%s); %s", account,
                        describe_error(exc), "keeping the last one" if text else "none for now")
            self._cache[account] = (now + RETRY, text)
        finally:
            await client.aclose()
        return text
