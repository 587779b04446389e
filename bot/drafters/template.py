"""Drafter ``template``: fills a template file with the message's fields, offline.

::

    drafter: {model: template, prompt: templates/reply.txt}

Fields: ``{from_name}``, ``{first_name}``, ``{from_addr}``, ``{subject}``, ``{date}``,
``{excerpt}`` (the start of the body on one line), ``{quote}`` (the same excerpt
wrapped at 72 columns, each line starting with ``> ``), ``{slot}``, ``{instruction}``,
``{thread}`` (the thread's earlier messages, one ``> From (date): text`` line each,
when ``drafter.thread`` gives any) and ``{knowledge}`` (the most relevant passages of
``drafter.knowledge``, each under its file name and heading; empty without one). Past
replies (``drafter.examples``) are for models; the card counts only what the
template's fields used.
``{{`` and ``}}`` are literal braces.

Only the template has fields. Substitution is one pass with a fixed table: text from
the email (a subject of ``"{instruction}"`` or ``"{0.__class__}"``) is inserted as is
and never expanded, there is no attribute or index access, and an unknown or
malformed field is left visible in the draft (the operator sees it on the card)
instead of failing. The template is read when drafting, so editing it takes effect on
the next draft without a restart. A reply with no visible text is never offered: a
template without text (or one that cannot be read) is a setup error the operators
are told about, one whose fields are all empty for a message fails that message.
"""

from __future__ import annotations

import asyncio
import re
import textwrap
from datetime import datetime
from pathlib import Path

from ..config.load import Checker, ModelConfig, PipelineConfig, Settings
from ..errors import ConfigError, DrafterError, DrafterSetupError
from ..models import Context, DraftRequest, DraftResult, Message
from .prompt import has_visible_text

FIELDS = ("from_name", "first_name", "from_addr", "subject", "date", "excerpt", "quote",
          "slot", "instruction", "thread", "knowledge")
EXCERPT_CHARS = 300
_FIELD = re.compile(r"\{\{|\}\}|\{([A-Za-z_][A-Za-z0-9_]*)\}")


def render(template: str, values: dict[str, str]) -> str:
    """Substitute ``{name}`` fields from ``values`` in one pass; unknown fields stay."""

    def one(m: re.Match) -> str:
        token = m.group(0)
        if token == "{{":
            return "{"
        if token == "}}":
            return "}"
        return values.get(m.group(1), token)

    return _FIELD.sub(one, template)


def fields_for(message: Message, instruction: str = "", context: Context | None = None
               ) -> dict[str, str]:
    """The template fields for ``message`` (and the draft's context)."""
    context = context or Context()
    name = message.from_name.strip()
    excerpt = _excerpt(message.body)
    return {
        "from_name": name or message.from_addr or message.reply_to,
        "first_name": _first_name(name),
        "from_addr": message.reply_to or message.from_addr,
        "subject": message.subject or "(no subject)",
        "date": _human_date(message.date),
        "excerpt": excerpt,
        "quote": textwrap.fill(excerpt, width=72, initial_indent="> ", subsequent_indent="> ",
                               break_long_words=False, break_on_hyphens=False) or ">",
        "slot": message.slot,
        "instruction": instruction.strip(),
        "thread": "\n".join(f"> {t.sender} ({_human_date(t.date)}): {_excerpt(t.text)}"
                            for t in context.thread),
        "knowledge": "\n\n".join(f"{p.name}:\n{p.text}" for p in context.passages),
    }


class TemplateDrafter:
    """Drafts by filling the pipeline's template. Costs no tokens."""

    name = "template"

    def __init__(self, path: Path, *, where: str = "drafter.prompt"):
        self.path = path
        self._where = where

    async def draft(self, request: DraftRequest) -> DraftResult:
        template = await asyncio.to_thread(self._read)
        values = fields_for(request.message, request.instruction, request.context)
        body = render(template, values).strip()
        if not has_visible_text(body):
            # An empty card could be approved and sent as an empty email.
            if not has_visible_text(render(template, {})):
                raise DrafterSetupError(f"{self._where}: the template {self.path} has no text, "
                                        f"so every reply would be empty; write the reply in it")
            raise DrafterError(f"{self._where}: the template {self.path} gives an empty reply "
                               f"for this message (its fields are empty here); put text in the "
                               f"template around the fields")
        if values["instruction"] and "{instruction}" not in template:
            # Regenerate with an instruction: a template cannot follow it, so it is
            # carried as a visible note for the operator to act on when editing.
            body += f"\n\n[Note: {values['instruction']}]"
        ctx = request.context  # a template uses only the fields it has
        used = Context(ctx.thread if "{thread}" in template else [], [],
                       ctx.passages if "{knowledge}" in template else [],
                       thread_left_out=ctx.thread_left_out).used()
        return DraftResult(body=body + "\n", tokens_in=0, tokens_out=0,
                           model=f"template:{self.path.name}", used=used)

    async def close(self) -> None:
        return None

    def _read(self) -> str:
        try:
            return self.path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            # Every item would fail alike: the setup, not the item (it waits, uncounted).
            reason = (exc.strerror if isinstance(exc, OSError) and exc.strerror else
                      "not UTF-8 text" if isinstance(exc, UnicodeDecodeError) else str(exc))
            raise DrafterSetupError(f"{self._where}: cannot read template {self.path}: "
                                    f"{reason}; fix the file or drafter.prompt") from exc


def create(model: ModelConfig, pipeline: PipelineConfig, settings: Settings) -> TemplateDrafter:
    """Check the template drafter's options and build it (no I/O)."""
    errors: list[str] = []  # the model's own keys were checked at load
    ck = Checker(pipeline.file, errors)
    # max_input, signature and language are for model drafters; they are allowed here
    # (switching a pipeline to `model: template` for a test must not break it) and do
    # nothing.
    prompt = pipeline.drafter.prompt
    if prompt is None and not errors:
        ck.error("drafter.prompt", "missing; the template drafter needs a template file, e.g. "
                                   "prompt: templates/reply.txt (fields: "
                                   + ", ".join("{" + f + "}" for f in FIELDS) + ")")
    if errors or prompt is None:  # a missing prompt is one of the errors
        raise ConfigError(errors)
    return TemplateDrafter(pipeline.path(prompt), where=f"{pipeline.file}: drafter.prompt")


def _first_name(name: str) -> str:
    if "," in name:  # "Buyer, Alice"
        name = name.split(",", 1)[1]
    words = [w for w in name.replace('"', " ").split() if any(c.isalpha() for c in w)]
    return words[0] if words else "there"


def _human_date(iso: str) -> str:
    if not iso:
        return ""
    try:
        return datetime.fromisoformat(iso).strftime("%a %d %b %Y %H:%M")
    except ValueError:
        return iso


def _excerpt(body: str) -> str:
    text = " ".join(body.split())
    if len(text) <= EXCERPT_CHARS:
        return text
    cut = text[:EXCERPT_CHARS].rsplit(" ", 1)[0] or text[:EXCERPT_CHARS]
    return cut + " …"
