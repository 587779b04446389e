"""OAuth for Microsoft accounts with MSAL: the token cache file, the scopes the pipelines
need, and ``draftgate auth microsoft`` (the device-code flow: it prints a URL and a
code, so it works on a headless server).

The token file is MSAL's serialized token cache (access, refresh and id tokens). It is
a secret: written with mode 0600 through a temporary file and an atomic rename, when
the flow creates it and whenever a refresh changes it, and every token in it is given
to :mod:`bot.redact` as soon as it is read or received, so no log line shows one.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from pathlib import Path
from typing import Any

from .. import redact
from ..config.microsoft import MicrosoftAccount
from ..errors import AuthError
from ..gmail.auth import token_path_problem, write_token

log = logging.getLogger("draftgate.microsoft")

READ, READ_WRITE, SEND = "Mail.Read", "Mail.ReadWrite", "Mail.Send"
#: MSAL adds offline_access (the refresh token), openid and profile to every request.
RESERVED = ("offline_access", "openid", "profile")


def auth_command(account: str, config_file: str | os.PathLike | None = None) -> str:
    config = f" -c {config_file}" if config_file else ""
    return f"draftgate auth microsoft --account {account}{config}"


def auth_error(account: str, what: str, config_file: str | os.PathLike | None = None
               ) -> AuthError:
    """The one message a user sees for a missing or dead token: what and what to run."""
    return AuthError(f"Microsoft account {account!r}: {what}; run "
                     f"`{auth_command(account, config_file)}`")


def required_scopes(settings: Any, account: str) -> list[str]:
    """The smallest set the account's pipelines need: Mail.Read for a source,
    Mail.ReadWrite for microsoft_draft (a draft is written), Mail.ReadWrite and
    Mail.Send for microsoft_reply (createReply writes a draft, then it is sent)."""
    need: set[str] = set()
    for p in getattr(settings, "pipelines", []):
        if getattr(p.source, "type", None) == "microsoft" and p.source.account == account:
            need.add(READ)
        stype = getattr(p.sender, "type", None)
        if stype in ("microsoft_reply", "microsoft_draft") and p.sender.account == account:
            need.add(READ_WRITE)
            if stype == "microsoft_reply":
                need.add(SEND)
    if READ_WRITE in need:
        need.discard(READ)
    return sorted(need) or [READ_WRITE, SEND]


def missing_scopes(granted: list[str], required: list[str]) -> list[str]:
    have = {s.rsplit("/", 1)[-1].lower() for s in granted}
    if "mail.readwrite" in have:
        have.add("mail.read")
    return [s for s in required if s.lower() not in have]


def _register(cache_text: str, who: str) -> None:
    """Every secret in an MSAL cache: each access, refresh and id token."""
    try:
        data = json.loads(cache_text)
    except ValueError:
        return
    for kind in ("AccessToken", "RefreshToken", "IdToken"):
        for entry in (data.get(kind) or {}).values() if isinstance(data, dict) else ():
            if isinstance(entry, dict):
                redact.register(entry.get("secret"), f"{who} {kind}")


def register_file(path: str | os.PathLike, who: str) -> None:
    """Register the tokens of a token file (unreadable files are skipped)."""
    try:
        _register(Path(path).read_text(encoding="utf-8"), who)
    except OSError:
        pass


class Tokens:
    """An account's MSAL public client and token cache: an access token for Graph,
    from the cache while it is valid, refreshed with the refresh token when not (the
    file rewritten in place). MSAL is synchronous: callers run :meth:`token` in a
    thread; a lock keeps two refreshes from racing on the file."""

    def __init__(self, account: MicrosoftAccount, path: str | os.PathLike,
                 config_file: str | os.PathLike | None = None):
        self.account, self.path, self.config_file = account, Path(path), config_file
        self._lock = threading.Lock()
        self._app: Any = None
        self._cache: Any = None

    def app(self) -> Any:
        import msal

        if self._app is None:
            self._cache = msal.SerializableTokenCache()
            try:
                text = self.path.read_text(encoding="utf-8")
            except FileNotFoundError:
                text = ""
            except OSError as exc:
                raise auth_error(self.account.name, f"token file {self.path} is unreadable "
                                 f"({exc.strerror or exc})", self.config_file) from None
            if text:
                _register(text, f"microsoft {self.account.name}")
                try:
                    self._cache.deserialize(text)
                except ValueError:
                    raise auth_error(self.account.name, f"token file {self.path} is not an "
                                     f"MSAL token cache", self.config_file) from None
            self._app = public_client(self.account, self._cache)
        return self._app

    def scopes(self) -> list[str]:
        """The scopes granted, as recorded in the cache's access and refresh tokens."""
        self.app()
        found: set[str] = set()
        for kind in ("AccessToken", "RefreshToken"):
            for entry in self._cache.search(kind):
                found.update(str(entry.get("target", "")).split())
        return sorted(found)

    def token(self, scopes: list[str], force: bool = False) -> str:
        """An access token for ``scopes`` (raises AuthError naming the command to run);
        ``force``: a new one even if the cached one looks valid (Graph refused it)."""
        with self._lock:
            app = self.app()
            accounts = app.get_accounts()
            if not accounts:
                what = (f"token file {self.path} not found" if not self.path.exists()
                        else f"token file {self.path} holds no account")
                raise auth_error(self.account.name, what, self.config_file)
            try:
                result = app.acquire_token_silent(scopes, account=accounts[0],
                                                  force_refresh=force)
            except Exception as exc:  # requests' errors: the authority is unreachable
                raise AuthError(f"Microsoft account {self.account.name!r}: cannot reach "
                                f"{self.account.authority_host} to refresh the token "
                                f"({type(exc).__name__})") from None
            if not result or "access_token" not in result:
                reason = (result or {}).get("error_description") or "token expired or revoked"
                raise auth_error(self.account.name, redact.scrub(str(reason).splitlines()[0]),
                                 self.config_file)
            self._save()
            return result["access_token"]

    def _save(self) -> None:
        if self._cache is not None and self._cache.has_state_changed:
            text = self._cache.serialize()
            _register(text, f"microsoft {self.account.name}")
            write_token(self.path, text)
            self._cache.has_state_changed = False
            log.info("microsoft %s: token refreshed; %s rewritten", self.account.name, self.path)


def public_client(account: MicrosoftAccount, cache: Any) -> Any:
    import functools

    import msal
    import requests

    session = requests.Session()
    # Passed with every request: requests lets REQUESTS_CA_BUNDLE replace a session's
    # own verify, so a ca_file set on the account would be ignored where it is set.
    session.request = functools.partial(  # type: ignore[method-assign]
        session.request, timeout=account.timeout, verify=account.ca_file or True)
    return msal.PublicClientApplication(
        account.client_id, authority=account.authority, token_cache=cache, http_client=session,
        # The authority is the one configured (login.microsoftonline.com, or a test's):
        # tenant discovery at <authority>/v2.0/.well-known/openid-configuration only.
        instance_discovery=False)


def device_flow(account: MicrosoftAccount, path: str | os.PathLike, scopes: list[str],
                out: Any) -> list[str]:
    """Run the device-code flow, printing MSAL's message (URL and code) to ``out``;
    write the token cache 0600 at ``path``. Returns the scopes granted."""
    import msal

    problem = token_path_problem(path)
    if problem:
        raise AuthError(f"--token {path}: {problem}")
    cache = msal.SerializableTokenCache()
    app = public_client(account, cache)
    flow = app.initiate_device_flow(scopes=scopes)
    if "user_code" not in flow:
        raise AuthError("the sign-in service refused the device-code flow: "
                        f"{flow.get('error')}: {flow.get('error_description', '')}".strip()
                        + "; check the app registration's 'Allow public client flows' (README)")
    print(flow["message"], file=out, flush=True)
    result = app.acquire_token_by_device_flow(flow)
    if "access_token" not in result:
        raise AuthError(f"sign-in failed: {result.get('error')}: "
                        f"{redact.scrub(str(result.get('error_description', '')))}")
    text = cache.serialize()
    _register(text, f"microsoft {account.name}")
    write_token(path, text)
    granted = str(result.get("scope") or " ".join(scopes)).split()
    return granted
