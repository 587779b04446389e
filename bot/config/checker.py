"""Reading one YAML mapping with every problem collected: :class:`Checker` and the
duration, size and URL rules that every part of the configuration shares."""

from __future__ import annotations

import re
import reprlib
from typing import Any, Callable

DURATION_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
CLOCK_RE = re.compile(r"^\s*\d{1,2}:\d{2}(:\d{2})?\s*$")  # 9:00, 09:30:00
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(b|kb|mb|gb)?\s*$", re.I)
_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, None: 1}
_SIZES = {"b": 1, "kb": 1000, "mb": 1000**2, "gb": 1000**3, None: 1}


def parse_duration(value: Any) -> float:
    """``"5m"`` -> 300.0; a bare number is seconds. Raises ValueError."""
    if isinstance(value, bool):
        raise ValueError("expected a duration like 30s, 5m, 1h or 2d")
    if isinstance(value, (int, float)):
        return float(value)
    m = DURATION_RE.match(str(value))
    if not m and CLOCK_RE.match(str(value)):
        raise ValueError(f"expected a duration like 30s, 5m, 1h or 2d, got {shown(value)}: a "
                         f"value with ':' is not a duration (write 90s or 1.5m; for a time "
                         f"of day use a cron schedule such as '0 9 * * *')")
    if not m:
        raise ValueError(f"expected a duration like 30s, 5m, 1h or 2d, got {shown(value)}")
    return float(m.group(1)) * _UNITS[m.group(2)]


def parse_size(value: Any) -> int:
    """``"200kB"`` -> 200000; a bare number is bytes. Raises ValueError."""
    if isinstance(value, bool):
        raise ValueError("expected a size like 200kB or 5MB")
    if isinstance(value, int):
        return value
    m = _SIZE.match(str(value))
    if not m:
        raise ValueError(f"expected a size like 200kB or 5MB, got {shown(value)}")
    return int(float(m.group(1)) * _SIZES[(m.group(2) or "").lower() or None])


class Checker:
    """Collects config errors with their file and path while reading a mapping."""

    _MISSING = object()

    def __init__(self, file: str, errors: list[str] | None = None):
        self.file = file
        self.errors = errors if errors is not None else []

    def error(self, path: str, message: str) -> None:
        if len(message) > MESSAGE_LIMIT:  # a value quoted whole (the callers cut with shown())
            message = message[:MESSAGE_LIMIT] + "…"
        self.errors.append(f"{self.file}: {path}: {message}" if path else f"{self.file}: {message}")

    def timezone(self, data: dict, key: str, path: str) -> str:
        """``data[key]``, an IANA time zone name (default UTC); an unknown one is an
        error naming the closest known zone."""
        name = self.get(data, key, path, str, default="UTC")
        if not name or name == "UTC":
            return "UTC"
        from zoneinfo import ZoneInfo, ZoneInfoNotFoundError, available_timezones

        try:
            ZoneInfo(name)
            return name
        except (ZoneInfoNotFoundError, ValueError, OSError):
            known = {z.lower(): z for z in available_timezones() | {"UTC"}}
            hint = known.get(closest(name.lower(), sorted(known)) or "")
            self.error(f"{path}.{key}" if path else key,
                       f"unknown time zone {shown(name)}" + (f"; did you mean {hint!r}?" if hint else
                                                        "") + " Use an IANA name such as "
                       "Europe/Berlin, America/New_York or UTC")
            return "UTC"

    def mapping(self, value: Any, path: str) -> dict:
        if value is None:
            return {}
        if not isinstance(value, dict):
            self.error(path, f"expected a mapping (key: value lines), got {kind_of(value)}")
            return {}
        return value

    def get(self, data: dict, key: str, path: str, kind: type | tuple, *,
            default: Any = _MISSING, choices: tuple | None = None) -> Any:
        """``data[key]`` checked against ``kind``; records an error and returns the
        default (or None) when missing or wrong."""
        full = f"{path}.{key}" if path else key
        if key not in data or data[key] is None:
            if default is self._MISSING:
                self.error(full, f"missing; expected {_describe(kind, choices)}")
                return None
            return default
        value = data[key]
        kinds = kind if isinstance(kind, tuple) else (kind,)
        if isinstance(value, str) and str not in kinds and (int in kinds or float in kinds):
            # A quoted number ("8443") is still the number the user meant.
            text = value.strip().replace("_", "")
            if re.fullmatch(r"[+-]?\d+", text) and int in kinds:
                value = int(text)
            elif float in kinds and re.fullmatch(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?", text):
                value = float(text)
        ok = isinstance(value, kinds) and not (isinstance(value, bool) and bool not in kinds)
        if float in kinds and isinstance(value, int) and not isinstance(value, bool):
            ok = True
        if not ok:
            self.error(full, f"expected {_describe(kind, choices)}, got {kind_of(value)} {shown(value)}")
            return default if default is not self._MISSING else None
        if choices is not None and value not in choices:
            self.error(full, f"expected one of {', '.join(map(str, choices))}, got {shown(value)}")
            return default if default is not self._MISSING else None
        return value

    def convert(self, data: dict, key: str, path: str, fn: Callable[[Any], Any],
                default: Any = _MISSING) -> Any:
        full = f"{path}.{key}" if path else key
        if key not in data or data[key] is None:
            if default is self._MISSING:
                self.error(full, "missing")
                return None
            return default
        try:
            return fn(data[key])
        except (ValueError, TypeError) as exc:
            self.error(full, str(exc))
            return default if default is not self._MISSING else None

    def unknown(self, data: dict, known: set[str] | tuple, path: str) -> None:
        for key in data:
            if key not in known:
                full = f"{path}.{shown(key, quote=False)}" if path else shown(key, quote=False)
                hint = closest(str(key), known)
                self.error(full, "unknown key" + (f"; did you mean {hint!r}?" if hint else
                                                   f"; expected one of {', '.join(sorted(known))}"))

    def env_name(self, data: dict, key: str, path: str, default: Any = _MISSING) -> Any:
        """The name of an environment variable (never its value), like OPENAI_API_KEY."""
        value = self.get(data, key, path, str, default=default)
        if isinstance(value, str) and not _ENV_NAME.match(value):
            self.error(f"{path}.{key}" if path else key,
                       f"expected the name of an environment variable, like "
                       f"{_ENV_EXAMPLES.get(key, 'MY_SECRET')}, got {shown(value)}")
            return default if default is not self._MISSING else None
        return value

    def url(self, data: dict, key: str, path: str, default: Any = _MISSING, *,
            credentials_ok: bool = False) -> Any:
        """An http:// or https:// URL with a host (and, if given, a valid port)."""
        value = self.get(data, key, path, str, default=default)
        if isinstance(value, str):
            problem = url_problem(value, credentials_ok=credentials_ok)
            if problem:
                self.error(f"{path}.{key}" if path else key, problem)
                return default if default is not self._MISSING else None
        return value

    def str_list(self, data: dict, key: str, path: str, default: list | None = None) -> list[str]:
        value = self.get(data, key, path, (list, str), default=default if default is not None else [])
        if isinstance(value, str):
            return [value]
        out = []
        for i, v in enumerate(value or []):
            if not isinstance(v, (str, int)) or isinstance(v, bool):
                self.error(f"{path}.{key}[{i}]", f"expected a string, got {kind_of(v)}")
            else:
                out.append(str(v))
        return out


_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_ENV_EXAMPLES = {"token_env": "TELEGRAM_BOT_TOKEN", "api_key_env": "OPENAI_API_KEY",
                 "secret_env": "WEBHOOK_SECRET"}


def url_problem(value: str, *, credentials_ok: bool = False) -> str | None:
    """Why ``value`` is not a usable http(s) URL, or None. The URL is shown with any
    credentials in it hidden. ``credentials_ok``: a user and password in it are fine
    (a self-hosted Bot API behind a proxy that wants a login)."""
    import urllib.parse

    from ..redact import redact_url

    expected = f"expected an http:// or https:// URL, got {redact_url(value, keep_user=False)!r}"
    try:
        parts = urllib.parse.urlsplit(value)
        port = parts.port
    except ValueError as exc:
        return f"{expected} ({exc})"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return expected
    if any(c.isspace() for c in value):
        return f"{expected} (it contains a space; write %20)"
    if port == 0:
        return f"{expected} (port 0)"
    if (parts.username or parts.password) and not credentials_ok:
        return "do not put credentials in the URL; name an environment variable instead"
    return None


#: The longest error message (a quoted value is cut well before: :func:`shown`).
MESSAGE_LIMIT = 600
_SHOWN = reprlib.Repr()
_SHOWN.maxlevel, _SHOWN.maxstring, _SHOWN.maxother = 2, 80, 80
_SHOWN.maxlist = _SHOWN.maxtuple = _SHOWN.maxdict = _SHOWN.maxset = 4


def shown(value: Any, *, quote: bool = True) -> str:
    """``value`` as an error quotes it (``repr``, or ``str`` without ``quote``), cut
    BEFORE it is formatted: a few lines of nested YAML aliases make a list whose whole
    repr takes minutes and megabytes."""
    if isinstance(value, str) and not quote:
        return value if len(value) <= 80 else value[:80] + "…"
    return _SHOWN.repr(value)


def kind_of(value: Any) -> str:
    return {dict: "a mapping", list: "a list", str: "a string", bool: "true/false",
            int: "a number", float: "a number", type(None): "nothing"}.get(type(value), type(value).__name__)


def _describe(kind: type | tuple, choices: tuple | None) -> str:
    if choices:
        return "one of " + ", ".join(map(str, choices))
    kinds = kind if isinstance(kind, tuple) else (kind,)
    names = {str: "a string", int: "a whole number", float: "a number", bool: "true or false",
             dict: "a mapping", list: "a list"}
    return " or ".join(names.get(k, k.__name__) for k in kinds)


def closest(word: str, options) -> str | None:
    import difflib
    match = difflib.get_close_matches(word, list(options), n=1, cutoff=0.7)
    return match[0] if match else None
