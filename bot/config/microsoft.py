"""``microsoft.accounts`` in the deployment file, and the ``microsoft`` source and
``microsoft_reply`` / ``microsoft_draft`` senders of a pipeline, parsed once into the
frozen objects below.

::

    microsoft:
      accounts:
        office:
          client_id: 00000000-0000-0000-0000-000000000000   # the app registration
          tenant: common            # or organizations, consumers, the tenant id or domain
          token_file: secrets/office-token.json   # written by `draftgate auth microsoft`
          address: support@contoso.example        # the mailbox's address (skip_own)

The token file is MSAL's token cache, written by ``draftgate auth microsoft`` (the
device-code flow) and refreshed in place; no secret is written in the YAML.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, fields
from typing import Any

from . import mailbox
from .checker import Checker, parse_duration

_PROVIDER = ("Microsoft", "microsoft")

GRAPH = "https://graph.microsoft.com/v1.0/"
AUTHORITY = "https://login.microsoftonline.com/"
_GUID = re.compile(r"^[0-9a-fA-F]{8}-([0-9a-fA-F]{4}-){3}[0-9a-fA-F]{12}$")
_TENANT = re.compile(r"^(common|organizations|consumers|[0-9a-fA-F-]{36}|[A-Za-z0-9.-]+\.[A-Za-z]+)$")


@dataclass(frozen=True)
class MicrosoftAccount:
    name: str
    client_id: str
    tenant: str = "common"
    token_file: str = ""  # default: secrets/<name>-microsoft-token.json
    address: str = ""  # the mailbox's address: its own mail is never answered (skip_own)
    folder: str = "inbox"
    graph_endpoint: str = GRAPH
    authority_host: str = AUTHORITY
    ca_file: str = ""  # a private CA (a proxy, tests); TLS is always verified
    timeout: float = 30.0  # seconds, each HTTP call
    read_attempts: int = 4  # reads only; a send is never repeated
    backoff: float = 1.0  # seconds, doubled per read attempt
    max_wait: float = 60.0  # the longest Retry-After waited out inside a tick

    @property
    def authority(self) -> str:
        return self.authority_host.rstrip("/") + "/" + self.tenant


_ACCOUNT_KEYS = tuple(f.name for f in fields(MicrosoftAccount) if f.name != "name")


def parse_accounts(ck: Checker, raw: Any, path: str = "microsoft") -> mailbox.Accounts:
    """``microsoft:`` -> name -> account for the valid ones, and ``names``: every name
    written (a pipeline naming one with errors is told so)."""
    return mailbox.parse_section(ck, raw, path, _account)


def _unknown(ck: Checker, data: dict, path: str) -> None:
    mailbox.unknown_keys(ck, data, _ACCOUNT_KEYS, path, ("client_secret", "password", "secret"),
                         "secrets do not belong in YAML; draftgate uses the device-code flow "
                         "of a public client: register the app with 'Allow public client "
                         "flows' (README) and run `draftgate auth microsoft`")


def _url(ck: Checker, acc: dict, key: str, path: str, default: str, https: bool) -> str:
    value = ck.get(acc, key, path, str, default=default) or default
    pattern = r"^https://[^/\s]+" if https else r"^https?://[^/\s]+"
    if not re.match(pattern, value):
        ck.error(f"{path}.{key}", f"expected an {'https' if https else 'http(s)'} URL like "
                                  f"{default}, got {value!r}")
    return value if value.endswith("/") else value + "/"


def _account(ck: Checker, name: str, acc: dict, path: str) -> MicrosoftAccount | None:
    before = len(ck.errors)
    _unknown(ck, acc, path)
    client_id = ck.get(acc, "client_id", path, str)
    if client_id is not None and not _GUID.match(client_id):
        ck.error(f"{path}.client_id", f"expected the app registration's Application (client) "
                                      f"ID, a GUID like 00000000-0000-0000-0000-000000000000, "
                                      f"got {client_id!r}")
    tenant = ck.get(acc, "tenant", path, str, default="common") or "common"
    if not _TENANT.match(tenant):
        ck.error(f"{path}.tenant", f"expected common, organizations, consumers, a tenant id "
                                   f"(GUID) or a domain like contoso.onmicrosoft.com, got "
                                   f"{tenant!r}")
    address = ck.get(acc, "address", path, str, default="") or ""
    if address and "@" not in address:
        ck.error(f"{path}.address", f"expected an email address, got {address!r}")
    seconds = {}
    for key, zero_ok in (("timeout", False), ("backoff", True), ("max_wait", True)):
        value = ck.convert(acc, key, path, parse_duration, default=None)
        if value is not None and (value < 0 or (value == 0 and not zero_ok)):
            ck.error(f"{path}.{key}", f"expected a duration {'of 0 or more' if zero_ok else 'above 0'}"
                                      f" like 30s, got {acc[key]!r}")
        elif value is not None:
            seconds[key] = value
    attempts = ck.get(acc, "read_attempts", path, int, default=MicrosoftAccount.read_attempts)
    if attempts is not None and attempts < 1:
        ck.error(f"{path}.read_attempts", f"expected a whole number of at least 1, got {attempts}")
    graph = _url(ck, acc, "graph_endpoint", path, GRAPH, https=False)
    authority = _url(ck, acc, "authority_host", path, AUTHORITY, https=True)
    strings = {key: ck.get(acc, key, path, str, default="") or "" for key in ("folder", "ca_file")}
    token_file = ck.get(acc, "token_file", path, str, default="") or \
        f"secrets/{name}-microsoft-token.json"
    if len(ck.errors) != before or client_id is None:
        return None
    return MicrosoftAccount(
        name=name, client_id=client_id, tenant=tenant, token_file=token_file, address=address,
        folder=strings["folder"] or "inbox", ca_file=strings["ca_file"], graph_endpoint=graph,
        authority_host=authority, read_attempts=attempts or 1, **seconds)


# -- pipeline stages ---------------------------------------------------------------------------

@dataclass(frozen=True)
class MicrosoftSourceOptions(mailbox.SourceOptions):
    """``folder``: a well-known name like inbox, or an id."""

    batch: int = 20  # requests per JSON $batch (Graph allows 20)
    type: str = "microsoft"


@dataclass(frozen=True)
class MicrosoftSenderOptions(mailbox.SenderOptions):
    type: str = "microsoft_reply"  # or microsoft_draft


def parse_source(ck: Checker, raw: dict, accounts: Any, settings_file: str
                 ) -> MicrosoftSourceOptions:
    return mailbox.parse_source(MicrosoftSourceOptions, ck, raw, accounts, settings_file,
                                _PROVIDER, max_backfill=1000, max_batch=20,
                                batch_what="requests")


def parse_sender(ck: Checker, raw: dict, accounts: Any, settings_file: str,
                 source_account: Any) -> MicrosoftSenderOptions:
    account = mailbox.sender_account(ck, raw, accounts, settings_file, source_account, _PROVIDER)
    return MicrosoftSenderOptions(account, raw["type"])
