"""What the mailbox providers (``imap``, ``microsoft``) share in the deployment and
pipeline files: the ``accounts`` section, the source's reading keys and the account a
source or sender names."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Callable, TypeVar

from .checker import Checker, closest, parse_duration, parse_size


class Accounts(dict):
    """The valid accounts by name, and ``names``: every account written (valid or not)."""

    names: set[str] = set()


def parse_section(ck: Checker, raw: Any, path: str,
                  account: Callable[[Checker, str, dict, str], Any]) -> Accounts:
    """``imap:`` or ``microsoft:`` -> the valid accounts by name (``account`` parses one
    entry, or gives None), with ``names``: every name written (a pipeline naming one with
    errors is told so); each problem recorded in ``ck``."""
    section = ck.mapping(raw, path)
    ck.unknown(section, {"accounts"}, path)
    out: dict[str, Any] = {}
    accounts = ck.mapping(section.get("accounts"), f"{path}.accounts")
    for name, acc in accounts.items():
        parsed = account(ck, str(name), ck.mapping(acc, f"{path}.accounts.{name}"),
                         f"{path}.accounts.{name}")
        if parsed is not None:
            out[str(name)] = parsed
    found = Accounts(out)
    found.names = {str(n) for n in accounts}
    return found


def unknown_keys(ck: Checker, data: dict, known: tuple[str, ...], path: str,
                 secrets: tuple[str, ...], why: str) -> None:
    """An error for each key of an account that is not ``known``; a key of ``secrets``
    is refused with ``why`` (what to do instead of writing a secret in the YAML)."""
    for key in data:
        if key in secrets:
            ck.error(f"{path}.{key}", why)
        elif key not in known:
            hint = closest(str(key), known)
            ck.error(f"{path}.{key}", "unknown key" + (f"; did you mean {hint!r}?" if hint else "")
                     + f" Known keys: {', '.join(known)}")


def known_account(ck: Checker, account: Any, path: str, accounts: Any, settings_file: str,
                  kind: str, section: str) -> None:
    """An error at ``path`` unless ``account`` is one of ``accounts`` (``kind``: the
    provider's name for the message; ``section``: its deployment section)."""
    names = getattr(accounts, "names", accounts)
    if account is not None and account not in names:
        ck.error(path, f"unknown {kind} account {account!r}; add it under "
                       f"{section}.accounts in {settings_file}")
    elif account is not None and account not in accounts:  # written, with errors
        ck.error(path, f"{kind} account {account!r} cannot be used until the errors of "
                       f"{section}.accounts.{account} in {settings_file} are fixed")


@dataclass(frozen=True)
class SourceOptions:
    """A mailbox source's ``source:`` keys; each provider's subclass sets the default
    ``batch`` and its ``type``."""

    account: str
    folder: str = ""  # default: the account's folder
    backfill: int = 0
    max_body: int | None = None
    resync_window: float = 30 * 86400.0
    batch: int = 50
    type: str = ""


SOURCE_KEYS = {f.name for f in fields(SourceOptions)}
S = TypeVar("S", bound=SourceOptions)


def parse_source(cls: type[S], ck: Checker, raw: dict, accounts: Any, settings_file: str,
                 provider: tuple[str, str], *, max_backfill: int | None, max_batch: int,
                 batch_what: str) -> S:
    """``source:`` of type ``cls``, checked; ``provider``: its name in messages and its
    deployment section (``("IMAP", "imap")``), ``max_*``: the limits of its keys."""
    default = cls(account="")
    account = ck.get(raw, "account", "source", str)
    known_account(ck, account, "source.account", accounts, settings_file, *provider)
    backfill = ck.get(raw, "backfill", "source", int, default=0)
    if backfill is not None and (backfill < 0 or max_backfill is not None
                                 and backfill > max_backfill):
        ck.error("source.backfill", "expected 0 or a positive number of messages" +
                 (f" up to {max_backfill}" if max_backfill is not None else ""))
    batch = ck.get(raw, "batch", "source", int, default=default.batch)
    if batch is not None and not 1 <= batch <= max_batch:
        ck.error("source.batch", f"expected a number of {batch_what} from 1 to {max_batch}, "
                                 f"got {batch}")
        batch = default.batch
    return cls(
        account=account or "",
        folder=ck.get(raw, "folder", "source", str, default="") or "",
        backfill=backfill or 0,
        max_body=ck.convert(raw, "max_body", "source", parse_size, default=None),
        resync_window=ck.convert(raw, "resync_window", "source", parse_duration,
                                 default=default.resync_window) or default.resync_window,
        batch=batch or default.batch)


@dataclass(frozen=True)
class SenderOptions:
    """A mailbox sender's ``sender:`` keys: the account it sends with, and its type."""

    account: str
    type: str = ""


SENDER_KEYS = {f.name for f in fields(SenderOptions)}


def sender_account(ck: Checker, raw: dict, accounts: Any, settings_file: str,
                   source_account: Any, provider: tuple[str, str]) -> str:
    """The account a ``sender:`` names (default: its source's), checked."""
    account = ck.get(raw, "account", "sender", str, default=source_account)
    if not account:
        article = "an" if provider[1][0] in "aeiou" else "a"
        ck.error("sender.account",
                 f"missing; expected the name of {article} {provider[1]}.accounts entry")
    known_account(ck, account or None, "sender.account", accounts, settings_file, *provider)
    return account or ""
