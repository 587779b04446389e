"""``gmail.accounts``: each account a typed object, made once at load time."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from .checker import Checker, closest, parse_duration


@dataclass(frozen=True)
class GmailAccount:
    """One ``gmail.accounts.NAME`` entry (None: the client's default)."""

    token_file: str = ""
    address: str = ""
    api_endpoint: str | None = None
    batch_endpoint: str | None = None
    timeout: float | None = None  # seconds
    backoff: float | None = None
    read_attempts: int | None = None
    max_wait: float | None = None


_TEXT = ("token_file", "address", "api_endpoint", "batch_endpoint")


_GMAIL_ACCOUNT_KEYS = ("token_file", "address", "api_endpoint", "batch_endpoint", "timeout",
                       "backoff", "read_attempts", "max_wait")


def parse_account(ck: Checker, raw: Any, path: str) -> GmailAccount:
    """One ``gmail.accounts.NAME`` entry, checked and typed; durations in seconds."""
    acc = ck.mapping(raw, path)
    for key in acc:
        if key not in _GMAIL_ACCOUNT_KEYS:
            hint = closest(str(key), _GMAIL_ACCOUNT_KEYS)
            known = f"known keys: {', '.join(_GMAIL_ACCOUNT_KEYS)}"
            ck.error(f"{path}.{key}", f"unknown key; did you mean {hint!r}? {known.capitalize()}"
                     if hint else f"unknown key; {known}")
    out = dict(acc)
    ck.get(acc, "token_file", path, str)
    address = ck.get(acc, "address", path, str, default=None)
    if address is not None and "@" not in address:
        ck.error(f"{path}.address", f"expected an email address like support@example.com, "
                                    f"got {address!r}")
    for key, like in (("api_endpoint", "https://gmail.googleapis.com/"),
                      ("batch_endpoint", "https://gmail.googleapis.com/batch/gmail/v1")):
        endpoint = ck.get(acc, key, path, str, default=None)
        if endpoint is not None and not re.match(r"^https?://[^/\s]+", endpoint):
            ck.error(f"{path}.{key}", f"expected an http(s) URL like {like}, got {endpoint!r}")
    for key, zero_ok in (("timeout", False), ("backoff", True), ("max_wait", True)):
        seconds = ck.convert(acc, key, path, parse_duration, default=None)
        if seconds is None:
            out.pop(key, None)  # absent or reported: the client's default
        elif seconds < 0 or (seconds == 0 and not zero_ok):
            least = "of 0 or more" if zero_ok else "above 0"
            ck.error(f"{path}.{key}", f"expected a duration {least} like 30s, got {acc[key]!r}")
        else:
            out[key] = seconds
    attempts = ck.get(acc, "read_attempts", path, int, default=None)
    if attempts is not None and attempts < 1:
        ck.error(f"{path}.read_attempts", f"expected a whole number of at least 1, got {attempts}")
    given: dict[str, Any] = {k: out[k] for k in _GMAIL_ACCOUNT_KEYS
                             if k in out and out[k] is not None}
    try:
        kwargs: dict[str, Any] = {k: (str(v) if k in _TEXT else v) for k, v in given.items()}
        return GmailAccount(**kwargs)
    except TypeError:  # a value of the wrong kind, reported above
        return GmailAccount(token_file=str(acc.get("token_file") or ""))


