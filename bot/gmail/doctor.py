"""``draftgate doctor`` checks for Gmail: every configured account answers getProfile
with its token, and the token's granted scopes cover what its pipelines need."""

from __future__ import annotations

import os
from typing import Any

from ..errors import DraftgateError
from . import auth
from .client import GmailClient


async def check(settings: Any) -> list[tuple[str, bool, str]]:
    """One ``(name, ok, detail)`` per check, for every account in gmail.accounts."""
    results: list[tuple[str, bool, str]] = []
    for name, account in sorted(settings.gmail_accounts.items()):
        client = GmailClient(name, account, base_dir=settings.base_dir, workers=1,
                             read_attempts=1, timeout=15.0,
                             config_file=os.path.abspath(settings.file))
        try:
            try:
                profile = await client.aread(lambda s: s.users().getProfile(userId="me"),
                                             "getProfile")
                results.append((f"gmail:{name} profile", True,
                                f"{profile.get('emailAddress', '?')} reachable at "
                                f"{client.api_endpoint}"))
            except DraftgateError as exc:
                results.append((f"gmail:{name} profile", False, str(exc)))
            required = auth.required_scopes(settings, name)
            granted = auth.granted_scopes(client.token_file)
            missing = auth.missing_scopes(granted, required)
            if missing:
                command = auth.auth_command(name, client.token_file, client.config_file)
                results.append((f"gmail:{name} scopes", False,
                                f"token lacks {_short(missing)} (needed by the pipelines: "
                                f"{_short(required)}); run `{command}`"))
            else:
                results.append((f"gmail:{name} scopes", True,
                                f"granted {_short(granted)}; pipelines need {_short(required)}"))
        finally:
            client.close()
    return results


def _short(scopes: list[str]) -> str:
    return ", ".join(s.rsplit("/", 1)[-1] for s in scopes) or "none"
