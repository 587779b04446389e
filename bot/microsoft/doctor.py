"""``draftgate doctor`` for Microsoft accounts: the token (refreshed if it must be),
the scopes the pipelines need, the signed-in mailbox, and each folder the pipelines
read (plus Sent Items and Drafts, where a reply is looked up). Nothing is sent."""

from __future__ import annotations

import asyncio
from typing import Any
from urllib.parse import quote

from ..errors import DraftgateError
from .auth import Tokens, missing_scopes, required_scopes
from .client import GraphClient


async def check(settings: Any) -> list[tuple[str, bool, str]]:
    """One ``(name, ok, detail)`` per check, for every account in microsoft.accounts."""
    results: list[tuple[str, bool, str]] = []
    for name, account in sorted(settings.microsoft_accounts.items()):
        tokens = Tokens(account, settings.resolve(account.token_file), settings.file)
        client = GraphClient(account, tokens)
        try:
            results += await _account(settings, name, account, tokens, client)
        finally:
            await client.close()
    return results


def _folders(settings: Any, name: str, account: Any) -> list[str]:
    folders = [p.source.folder or account.folder for p in settings.pipelines
               if getattr(p.source, "type", None) == "microsoft" and p.source.account == name]
    return list(dict.fromkeys(folders or [account.folder])) + ["sentitems", "drafts"]


async def _account(settings: Any, name: str, account: Any, tokens: Tokens,
                   client: GraphClient) -> list[tuple[str, bool, str]]:
    label = f"microsoft:{name}"
    try:
        me = await client.get_json("me?$select=mail,userPrincipalName")
    except DraftgateError as exc:
        return [(f"{label} token", False, str(exc))]
    granted = await asyncio.to_thread(tokens.scopes)
    out = [(f"{label} token", True, f"signed in as {me.get('mail') or me.get('userPrincipalName')}"
                                    f" at {account.graph_endpoint}")]
    missing = missing_scopes(granted, required_scopes(settings, name))
    out.append((f"{label} scopes", not missing,
                "granted: " + ", ".join(s for s in granted if s.startswith("Mail.")) if not missing
                else f"missing {', '.join(missing)}; run `draftgate auth microsoft --account "
                     f"{name} -c {settings.file}`"))
    for folder in _folders(settings, name, account):
        try:
            info = await client.get_json(f"me/mailFolders/{quote(folder, safe='')}")
            out.append((f"{label} folder {folder}", True,
                        f"{info.get('displayName', folder)}: {info.get('totalItemCount', '?')} "
                        f"message(s)"))
        except DraftgateError as exc:
            out.append((f"{label} folder {folder}", False,
                        f"{exc}; use a well-known name (inbox, archive, ...) or a folder id"))
    return out
