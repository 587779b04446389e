"""A pipeline's ``followup:`` section (issue 28): nudge a customer who never answered
our reply. Parsed once at load into :class:`FollowupOptions`, the instruction's file
read then (a missing file is a load error, not a surprise days later)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .checker import Checker, parse_duration

#: What the model is asked when the pipeline names no ``followup.prompt`` file.
DEFAULT_INSTRUCTION = (
    "Write a short, friendly follow-up to our reply below: the customer has not answered "
    "it. Ask whether they still need help or whether our answer solved it. Do not repeat "
    "the whole reply and do not invent anything new.")


@dataclass(frozen=True)
class FollowupOptions:
    after: float  # seconds without an answer from the recipient before a follow-up
    working_days: bool  # count Mon-Fri only (whole days), by the pipeline's timezone
    max: int  # follow-ups per reply at most
    instruction: str  # for the model: the prompt file's text, or DEFAULT_INSTRUCTION
    prompt: str | None = None  # the file it came from, as written


def parse_followup(ck: Checker, raw: Any, base: Path) -> FollowupOptions | None:
    """``followup: {after: 3d, working_days: true, max: 2, prompt: prompts/followup.md}``."""
    if raw is None:
        return None
    data = ck.mapping(raw, "followup")
    ck.unknown(data, {"after", "working_days", "max", "prompt"}, "followup")
    after = ck.convert(data, "after", "followup", parse_duration, default=3 * 86400.0)
    if after is not None and after < 3600:
        ck.error("followup.after", f"expected a duration of at least 1h like 3d, got "
                                   f"{data['after']!r}")
    working = ck.get(data, "working_days", "followup", bool, default=True)
    if working and after is not None and after % 86400:
        ck.error("followup.after", f"working_days counts whole days: expected a duration "
                                   f"like 3d, got {data['after']!r} (or set working_days: false)")
    most = ck.get(data, "max", "followup", int, default=1)
    if most is not None and not 1 <= most <= 10:
        ck.error("followup.max", f"expected a whole number of follow-ups from 1 to 10, got {most}")
    prompt = ck.get(data, "prompt", "followup", str, default=None)
    instruction = DEFAULT_INSTRUCTION
    if prompt:
        found = Path(prompt).expanduser()
        found = found if found.is_absolute() else base / found
        try:
            instruction = found.read_text(encoding="utf-8").strip() or DEFAULT_INSTRUCTION
        except OSError as exc:
            ck.error("followup.prompt", f"cannot read {prompt} (looked for {found}): "
                                        f"{exc.strerror or exc}")
    return FollowupOptions(after or 3 * 86400.0, bool(working), most or 1, instruction, prompt)
