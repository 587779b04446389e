"""A clock the test moves by hand (the engine, reminders and the digest read it)."""

from __future__ import annotations


class Clock:
    """Returns ``t`` when called; the test sets ``t`` to move time."""

    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t
