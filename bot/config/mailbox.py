"""What the mailbox sources (``imap``, ``microsoft``) and their senders share in the
pipeline file: which account they name, and the source's reading keys."""

from __future__ import annotations

from typing import Any

from .checker import Checker, parse_duration, parse_size


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


def source_fields(ck: Checker, raw: dict, default: Any, *, max_backfill: int | None,
                  max_batch: int, batch_what: str) -> dict[str, Any]:
    """``backfill``, ``batch``, ``folder``, ``max_body`` and ``resync_window`` of a
    mailbox source, checked; ``default``: the options' defaults."""
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
    return dict(
        folder=ck.get(raw, "folder", "source", str, default="") or "",
        backfill=backfill or 0,
        max_body=ck.convert(raw, "max_body", "source", parse_size, default=None),
        resync_window=ck.convert(raw, "resync_window", "source", parse_duration,
                                 default=default.resync_window) or default.resync_window,
        batch=batch or default.batch)
