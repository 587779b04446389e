"""The grounding check wired to a draft (issue 24): which texts its request was given,
and what is kept with the version so the card, ``pending --json``, the audit and a
later edit can use it. The check informs; it never changes the draft."""

from __future__ import annotations

from typing import Any

from ..config.load import PipelineConfig
from ..drafters.prompt import load_prompt
from ..errors import DrafterSetupError
from ..models import Draft, DraftRequest

#: Keys of ``Draft.used``: the claims no source supports, as the draft wrote them, and
#: the normalised keys of its sources (an edited version is checked against them).
UNSUPPORTED, SOURCE_KEYS = "unsupported", "source_keys"


def request_sources(p: PipelineConfig, request: DraftRequest) -> list[str]:
    """Every text the model was given for ``request``: the email, the thread, the
    examples, the passages, the operator's instruction, the prompt, the signature."""
    m, ctx = request.message, request.context
    # The model saw at most max_input characters of the email (bot.drafters.prompt);
    # a claim found only past that is no source of the draft, and a 60 kB mail checked
    # whole cost 0.4 s of CPU per draft.
    texts = [m.subject, m.body[:p.drafter.max_input], m.date, m.from_name, m.from_addr, m.slot, request.instruction,
             p.drafter.signature if request.signature is None else request.signature]
    texts += [f"{t.sender}\n{t.date}\n{t.text}" for t in ctx.thread]
    texts += [f"{e.original}\n{e.reply}" for e in ctx.examples]
    texts += [f"{ps.heading}\n{ps.text}" for ps in ctx.passages]
    texts += list(request.style_notes)  # approved instructions, like the prompt
    try:
        texts.append(load_prompt(p))
    except DrafterSetupError:
        pass  # the drafter read it a moment ago; a file gone since then is no claim's fault
    return texts


def check(p: PipelineConfig, request: DraftRequest, body: str,
          used: dict[str, Any]) -> dict[str, Any]:
    """``used`` with the claims of ``body`` that the request's sources do not support
    (unchanged when the pipeline's ``grounding`` is off)."""
    if p.drafter.grounding == "off":
        return used
    # Imported here: its patterns take 50 ms to compile, which only a process that
    # drafts pays (not `status` or `pending`).
    from .grounding import source_keys, unsupported_by

    keys = source_keys(request_sources(p, request))
    return {**used, UNSUPPORTED: unsupported_by(body, keys), SOURCE_KEYS: sorted(keys)}


def recheck(grounding: str, used: dict[str, Any], body: str) -> dict[str, Any]:
    """``used`` for an edited ``body``: checked against the sources of the version it
    replaces (an edit adds no source)."""
    if grounding == "off" or SOURCE_KEYS not in used:
        return used
    from .grounding import unsupported_by

    return {**used, UNSUPPORTED: unsupported_by(body, set(used[SOURCE_KEYS]))}


def for_edit(settings, before: Draft | None, body: str) -> dict[str, Any] | None:
    """What to store as the edited version's ``used`` (None: keep it as it is)."""
    if before is None or not settings.has_pipeline(before.pipeline):
        return None
    grounding = settings.pipeline(before.pipeline).drafter.grounding
    return recheck(grounding, before.used, body) if SOURCE_KEYS in before.used else None
