"""A one-line progress bar on stderr, shared by migrate-store and Gmail backfills."""

from __future__ import annotations

import sys
import time


class Bar:
    """Redrawn in place on a terminal: ``drafts [#####.....] 512/1024``. When stderr
    is not a terminal (a service's log), it prints a line per tenth instead."""

    def __init__(self, out=None, width: int = 30, *, tty: bool | None = None):
        self.out = out or sys.stderr
        self.width = width
        self._last = 0.0
        self._tty = bool(getattr(self.out, "isatty", lambda: False)()) if tty is None else tty
        self._tenth: dict[str, int] = {}

    def __call__(self, label: str, done: int, total: int) -> None:
        final = done >= total
        if not self._tty:
            tenth = 10 if total == 0 else int(10 * done / total)
            if tenth > self._tenth.get(label, -1):
                self._tenth[label] = tenth
                self.out.write(f"{label}: {done}/{total}\n")
                self.out.flush()
            return
        now = time.monotonic()
        if not final and now - self._last < 0.1:
            return
        self._last = now
        filled = self.width if total == 0 else int(self.width * done / total)
        bar = "#" * filled + "." * (self.width - filled)
        self.out.write(f"\r{label:<15} [{bar}] {done}/{total}")
        if final:
            self.out.write("\n")
        self.out.flush()
