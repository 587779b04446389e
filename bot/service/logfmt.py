"""Log formats (``logging.format: text | json``, ``--log-format``) and the structured
fields a log line carries: pipeline, draft id, item id, run id.

The fields live in a context variable, so every line logged while a tick, a drafting
call or a send runs carries them, third-party loggers' lines too, without each call
passing them. The text form keeps its messages as they are (they name the pipeline and
draft already); the JSON form writes one object per line::

    {"time": "2026-12-01T10:05:00.123Z", "level": "INFO", "logger": "draftgate.engine",
     "message": "support #12 sent (...)", "pipeline": "support", "draft_id": 12,
     "item_id": "...", "run_id": 40}

Both pass :mod:`bot.redact`: secrets hidden, a stranger's text escaped (JSON escapes
every control and non-ASCII character as ``\\uXXXX``, so no line can be forged).
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import sys
import time
from contextvars import ContextVar
from typing import Any, Awaitable, Callable, Iterator, TypeVar

from .. import redact
from ..models import Draft

FIELDS = ("pipeline", "draft_id", "item_id", "run_id")
# (key, value) pairs, immutable: a task copies the context it was created in.
_fields: ContextVar[tuple[tuple[str, Any], ...]] = ContextVar("draftgate_log_fields", default=())


def _merged(fields: dict[str, Any]) -> tuple[tuple[str, Any], ...]:
    return tuple({**dict(_fields.get()), **fields}.items())


@contextlib.contextmanager
def scope(**fields: Any) -> Iterator[None]:
    """Lines logged inside carry ``fields`` (pipeline=..., run_id=...)."""
    token = _fields.set(_merged(fields))
    try:
        yield
    finally:
        _fields.reset(token)


def bind(**fields: Any) -> None:
    """Add ``fields`` to the current scope (until the enclosing :func:`scope` ends)."""
    _fields.set(_merged(fields))


F = TypeVar("F", bound=Callable[..., Awaitable[Any]])


def about_draft(fn: F) -> F:
    """A method whose first argument after ``self`` (or ``self, pipeline``) is a Draft:
    its lines carry the draft's pipeline, id and item id."""

    @functools.wraps(fn)
    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        d = next((a for a in args if isinstance(a, Draft)), None)
        if d is None:
            return await fn(*args, **kwargs)
        with scope(pipeline=d.pipeline, draft_id=d.id, item_id=d.item_id):
            return await fn(*args, **kwargs)

    return wrapper  # type: ignore[return-value]


def about_pipeline(fn: F) -> F:
    """A method whose first argument after ``self`` is a pipeline's name: its lines
    carry it (and a run id, once :func:`bind` adds one)."""

    @functools.wraps(fn)
    async def wrapper(self: Any, name: str, *args: Any, **kwargs: Any) -> Any:
        with scope(pipeline=name):
            return await fn(self, name, *args, **kwargs)

    return wrapper  # type: ignore[return-value]


class JsonFormatter(redact.LogFormatter):
    """One JSON object per record, on one line."""

    def format(self, record: logging.LogRecord) -> str:
        try:
            message = record.getMessage()
        except Exception:
            message = f"{record.msg} [log arguments that do not fit: {record.args!r}]"
        out: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
                    + f".{int(record.msecs):03d}Z",
            "level": record.levelname, "logger": record.name,
            "message": redact.scrub(message)}
        for key, value in _fields.get():
            out[key] = value if isinstance(value, int) else redact.scrub(str(value))
        for key in FIELDS:  # given with extra={...}
            if key in record.__dict__:
                value = record.__dict__[key]
                out[key] = value if isinstance(value, int) else redact.scrub(str(value))
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            out["exception"] = redact.scrub(record.exc_text)
        if record.stack_info:
            out["stack"] = redact.scrub(record.stack_info)
        return json.dumps(out, ensure_ascii=True, default=str)


def formatter(fmt: str) -> logging.Formatter:
    """The formatter for ``fmt`` (text or json). Text written to journald has no time
    of its own: the journal stamps every line already."""
    if fmt == "json":
        return JsonFormatter()
    stamp = "" if _to_journal() else "%(asctime)s "
    return redact.LogFormatter(stamp + "%(levelname)s %(name)s: %(message)s")


def _to_journal() -> bool:
    """stderr is the journal stream systemd names in ``$JOURNAL_STREAM`` (device:inode)."""
    try:
        st = os.fstat(sys.stderr.fileno())
    except (AttributeError, OSError, ValueError):
        return False
    return os.environ.get("JOURNAL_STREAM", "") == f"{st.st_dev}:{st.st_ino}"
