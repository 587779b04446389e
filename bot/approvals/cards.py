"""Telegram approval cards, pure: rendering, callback data and prompt parsing.

No I/O and no python-telegram-bot types here, so every rule is tested by table:

* A card is Telegram HTML. Every piece of email or model text goes through
  :func:`html.escape`; our own tags wrap already-escaped text, so a cut can never
  fall inside an entity or a tag.
* Lengths are counted on the HTML we send (in UTF-16 units, as Telegram counts),
  which is never less than what Telegram counts after parsing, so a card is never
  "message is too long".
* ``callback_data`` is ``<action>:<draft id>:<version>``, at most 64 bytes.
"""

from __future__ import annotations

import html
import re
from dataclasses import dataclass
from datetime import datetime

from .. import scheduler
from ..clock import hhmm
from ..models import REPLAYABLE_STATUSES, Draft, Message, Status, unsupported_line, used_line
from ..redact import scrub

MAX_TEXT = 4096  # Telegram's limit for one message
MAX_CALLBACK_BYTES = 64
CUT_MARKER = "\n\n✂️ … (cut; tap 📄 Full text for the whole draft as a file)"

APPROVE, EDIT, REGENERATE, REJECT, RETRY, FULL_TEXT = "ap", "ed", "rg", "rj", "rt", "ft"
REPLAY = "rp"  # on a failure notice: the same operation as /replay
DRAFT_REPLY, DISMISS = "dr", "dm"  # on an FYI card (triage said notify)
CHECK_SEND, MARK_SENT = "ck", "ms"  # on a card whose send's outcome is unknown
UNDO = "un"  # on an approved card whose send waits (the undo window, a later time)
# 🕘 Later opens the choices (and ⬅️ Back closes them); each choice approves with a time.
LATER, LATER_BACK = "lt", "lb"
FILES = "fl"  # 📎 Files: the mail's attachments as documents
# 📎 Attach: a page of the pipeline's files (pick one), the next page, back to the card.
ATTACH, ATTACH_NEXT, ATTACH_BACK = "at", "fn", "fb"
ATTACH_PICKS = ("qa", "qb", "qc", "qd", "qe", "qf")  # the first to sixth file shown
ATTACH_PAGE = len(ATTACH_PICKS)
LATER_CHOICES = {"lh": "hour", "lm": "tomorrow", "lw": "monday"}  # scheduler.later's names
CONFIRM = "ac"  # Send anyway: on the question an Approve asks under grounding: confirm
# Send anyway on the question a 🕘 Later choice asks: the data carries the choice, so the
# confirmed approval keeps its send time (the question is a message apart from the card).
CONFIRM_LATER = {"ah": "hour", "am": "tomorrow", "aw": "monday"}
ACTIONS = (APPROVE, EDIT, REGENERATE, REJECT, RETRY, FULL_TEXT, REPLAY, DRAFT_REPLY, DISMISS,
           CHECK_SEND, MARK_SENT, CONFIRM, *CONFIRM_LATER, UNDO, LATER, LATER_BACK, *LATER_CHOICES,
           FILES, ATTACH, ATTACH_NEXT, ATTACH_BACK, *ATTACH_PICKS)
#: A send that waits longer than this after its approval is a scheduled one (🕘 Later,
#: the sending hours): its card names the time; a shorter wait is the undo window.
UNDO_WINDOW_MAX = 600.0
# Canonical numbers only (no leading zeros): data we did not make byte for byte is refused.
_CALLBACK = re.compile(r"(?P<action>[a-z]{2}):(?P<id>[1-9][0-9]{0,17}):"
                       r"(?P<version>[1-9][0-9]{0,8})")

# Budgets, in escaped UTF-16 units, so the draft always keeps most of the card.
_FIELD = {"name": 120, "addr": 160, "subject": 300, "date": 60, "excerpt": 600, "error": 400,
          "reason": 300, "used": 300}

Button = tuple[str, str]  # (label, callback_data)


class BadCallback(ValueError):
    """Callback data we did not make, or cannot use. ``str(exc)`` is the notice."""


@dataclass(frozen=True)
class Callback:
    action: str
    draft_id: int
    version: int


@dataclass
class Card:
    text: str  # Telegram HTML
    buttons: list[list[Button]]
    cut: bool = False


# -- callback data --------------------------------------------------------------------------

def callback_data(action: str, draft_id: int, version: int) -> str:
    data = f"{action}:{draft_id}:{version}"
    if action not in ACTIONS or len(data.encode()) > MAX_CALLBACK_BYTES:
        raise ValueError(f"cannot encode callback {data!r}")
    return data


def parse_callback(data: str | None) -> Callback:
    """``"ap:1234:2"`` -> Callback. Raises :class:`BadCallback` with a short notice for
    anything else (missing, oversized, unknown action, non-numeric or non-canonical
    parts such as ``ap:01:1``: only what :func:`callback_data` writes is accepted)."""
    if not data:
        raise BadCallback("This button has no data; use the latest card.")
    if len(data.encode("utf-8", "replace")) > MAX_CALLBACK_BYTES:
        raise BadCallback("This button is not one of ours.")
    m = _CALLBACK.fullmatch(data)
    if not m:
        raise BadCallback("This button is not one of ours.")
    if m["action"] not in ACTIONS:
        raise BadCallback("Unknown action; use the latest card.")
    cb = Callback(m["action"], int(m["id"]), int(m["version"]))
    if callback_data(cb.action, cb.draft_id, cb.version) != data:
        raise BadCallback("This button is not one of ours.")
    return cb


# -- text helpers -----------------------------------------------------------------------------

def units(text: str) -> int:
    """Length as Telegram counts it (UTF-16 code units)."""
    return len(text.encode("utf-16-le")) // 2


def clip(text: str, budget: int, *, ellipsis: str = "…") -> tuple[str, bool]:
    """Escape ``text`` and cut it so the escaped result (plus ``ellipsis``) fits in
    ``budget`` UTF-16 units. Cuts between characters of the original, so never inside
    an entity. Returns (escaped text, was it cut)."""
    escaped = html.escape(text, quote=False)
    if units(escaped) <= budget:
        return escaped, False
    room = budget - units(ellipsis)
    used = 0
    end = 0
    for i, ch in enumerate(text):
        cost = units(html.escape(ch, quote=False))
        if used + cost > room:
            break
        used += cost
        end = i + 1
    # Prefer a whitespace boundary when one is close, so words are not chopped.
    space = max(text.rfind(" ", 0, end), text.rfind("\n", 0, end))
    if space > end - 80 and space > 0:
        end = space
    return html.escape(text[:end].rstrip(), quote=False) + ellipsis, True


def _one_line(text: str) -> str:
    return " ".join(text.split())


def actor_name(actor: str | None) -> str:
    """``"tg:42 (Anna)"`` -> ``"Anna"``; other actors are shown as they are."""
    if not actor:
        return "someone"
    m = re.fullmatch(r"tg:\d+ \((.*)\)", actor, re.S)
    return m.group(1) if m and m.group(1).strip() else actor


def _received(date: str) -> str:
    if not date:
        return "unknown"
    try:
        return datetime.fromisoformat(date).strftime("%a %d %b %H:%M")
    except ValueError:
        return date


def tag(draft: Draft) -> str:
    return f"#{draft.id} v{draft.version}"


# -- cards ------------------------------------------------------------------------------------

def _header(draft: Draft) -> list[str]:
    m = draft.message
    lines = [f"📨 <b>{clip(draft.pipeline, 80)[0]}</b> · {tag(draft)}"]
    if draft.scope == "followup" and draft.triage_reason:  # its line, made when queued
        lines.append(clip(_one_line(draft.triage_reason), _FIELD["reason"])[0])
    if m.kind == "slot":
        lines.append(f"<b>Slot:</b> {clip(m.slot, _FIELD['date'])[0]}")
        if m.subject:
            lines.append(f"<b>Topic:</b> {clip(_one_line(m.subject), _FIELD['subject'])[0]}")
        return lines + _used(draft)
    addr = clip(m.from_addr, _FIELD["addr"])[0]
    sender = f"{clip(_one_line(m.from_name), _FIELD['name'])[0]} &lt;{addr}&gt;" if m.from_name \
        else addr
    lines.append(f"<b>From:</b> {sender or 'unknown'}")
    if m.reply_to and m.reply_to != m.from_addr:
        lines.append(f"<b>Reply goes to:</b> {clip(m.reply_to, _FIELD['addr'])[0]}")
    subject = clip(_one_line(m.subject), _FIELD["subject"])[0] or "(no subject)"
    lines.append(f"<b>Subject:</b> {subject}")
    lines.append(f"<b>Received:</b> {clip(_received(m.date), _FIELD['date'])[0]}")
    if m.attachments:
        lines.append(clip(attachments_line(m), _FIELD["excerpt"])[0])
    if draft.attached:  # files an operator attached to the reply: part of what is approved
        names = " · ".join(p.replace("\\", "/").rsplit("/", 1)[-1] for p in draft.attached)
        lines.append(f"<b>Attached to the reply:</b> 📎 {clip(names, _FIELD['excerpt'])[0]}")
    original = _one_line(m.body)
    if original:
        lines.append(f"<blockquote>» {clip(original, _FIELD['excerpt'])[0]}</blockquote>")
    return lines + _used(draft)


def _used(draft: Draft) -> list[str]:
    """What the draft used, one line (file names and headings are outside text: escaped)."""
    lines = [line for line in (used_line(draft.used), unsupported_line(draft.used)) if line]
    return [clip(_one_line(line), _FIELD["used"])[0] for line in lines]


def _with_body(top: list[str], draft: Draft, label: str = "Draft:") -> tuple[str, bool]:
    head = "\n".join(top) + f"\n\n<b>{label}</b>\n"
    room = MAX_TEXT - units(head)
    body = draft.body or "(empty)"
    escaped, cut = clip(body, room, ellipsis="")
    if cut:
        escaped, cut = clip(body, room - units(CUT_MARKER), ellipsis="")
        escaped += html.escape(CUT_MARKER, quote=False)
    return head + escaped, cut


def _decision_buttons(draft: Draft, cut: bool, attach: bool = False) -> list[list[Button]]:
    rows = [[("✅ Approve & send", callback_data(APPROVE, draft.id, draft.version)),
             ("✏️ Edit", callback_data(EDIT, draft.id, draft.version))],
            [("🔁 Regenerate", callback_data(REGENERATE, draft.id, draft.version)),
             ("🗑 Reject", callback_data(REJECT, draft.id, draft.version))],
            [("🕘 Later", callback_data(LATER, draft.id, draft.version))]]
    if draft.message.attachments:
        rows[-1].append(("📎 Files", callback_data(FILES, draft.id, draft.version)))
    if attach:
        rows[-1].append(("📎 Attach", callback_data(ATTACH, draft.id, draft.version)))
    if cut:
        rows.append([("📄 Full text", callback_data(FULL_TEXT, draft.id, draft.version))])
    return rows


def attachments_line(m: Message) -> str:
    """``📎 invoice.pdf 120 kB · photo.jpg 2.1 MB`` (plain text: clip escapes it)."""
    sizes = list(m.attachment_sizes) + [-1] * (len(m.attachments) - len(m.attachment_sizes))
    return "📎 " + " · ".join(name + (f" {size_text(n)}" if n >= 0 else "")
                              for name, n in zip(m.attachments, sizes, strict=False))


def size_text(n: int) -> str:
    """``120 kB``, ``2.1 MB``: bytes as a person reads them (decimal units)."""
    if n >= 1_000_000:
        return f"{n / 1_000_000:.1f} MB"
    if n >= 1000:
        return f"{n / 1000:.0f} kB"
    return f"{n} B"


def attach_buttons(draft: Draft, names: list[str], page: int) -> list[list[Button]]:
    """Page ``page`` of the files 📎 Attach offers, one button each, then ▶ More (when
    there are more) and ⬅️ Back."""
    shown = names[page * ATTACH_PAGE:(page + 1) * ATTACH_PAGE]
    rows: list[list[Button]] = [[(f"📎 {name}"[:60], callback_data(pick, draft.id, draft.version))]
                                for pick, name in zip(ATTACH_PICKS, shown, strict=False)]
    last = [("⬅️ Back", callback_data(ATTACH_BACK, draft.id, draft.version))]
    if (page + 1) * ATTACH_PAGE < len(names):
        last.insert(0, ("▶ More", callback_data(ATTACH_NEXT, draft.id, draft.version)))
    return rows + [last]


def later_of(action: str) -> str | None:
    """The 🕘 Later choice (``hour``...) a tap approves with: one on the card, or Send
    anyway on the question it asked; None: an Approve without one."""
    return LATER_CHOICES.get(action) or CONFIRM_LATER.get(action)


def later_buttons(draft: Draft) -> list[list[Button]]:
    """The choices 🕘 Later opens on the card: each approves with that send time."""
    return [[(scheduler.LATER[name], callback_data(action, draft.id, draft.version))
             for action, name in LATER_CHOICES.items()],
            [("⬅️ Back", callback_data(LATER_BACK, draft.id, draft.version))]]


def _is_fyi(draft: Draft) -> bool:
    """An FYI card's draft: triage said notify and nothing was drafted (yet)."""
    return draft.status == Status.NOTIFIED or (draft.triage == "notify" and not draft.body
                                        and draft.status in (Status.DISMISSED, Status.EXPIRED))


def render_fyi(draft: Draft, status: str | None = None) -> Card:
    """An FYI card: the email, the triage's reason, no draft. Waiting (``status``
    None): buttons Draft a reply and Dismiss; otherwise ``status`` on top, no buttons."""
    reason = clip(_one_line(draft.triage_reason or ""), _FIELD["reason"])[0] or "no reason given"
    lines = ([status, ""] if status else []) + _header(draft) + [
        "", f"🔔 <b>FYI, no reply drafted.</b> Triage: {reason}"]
    if status:
        return Card("\n".join(lines), [])
    lines.append("Tap ✍️ Draft a reply to get a draft to approve, or 👋 Dismiss.")
    return Card("\n".join(lines), [[
        ("✍️ Draft a reply", callback_data(DRAFT_REPLY, draft.id, draft.version)),
        ("👋 Dismiss", callback_data(DISMISS, draft.id, draft.version))]])


def quorum_line(votes: list[str] | tuple[str, ...], quorum: int) -> str | None:
    """``✅ 1/2 · Anna`` under a card's header (escaped HTML); None at quorum 1."""
    if quorum <= 1:
        return None
    if not votes:
        return f"👥 needs {quorum} approvals"
    names = ", ".join(actor_name(v) for v in votes)
    return f"✅ {len(votes)}/{quorum} · {clip(names, _FIELD['name'] * 2)[0]}"


def render_card(draft: Draft, votes: list[str] | tuple[str, ...] = (), quorum: int = 1,
                attach: bool = False) -> Card:
    """The card an operator decides on, with its buttons (for ``post``); with a quorum,
    who approved this version so far."""
    if draft.status == Status.NOTIFIED:
        return render_fyi(draft)
    top = _header(draft)
    if (line := quorum_line(votes, quorum)) is not None:
        top.insert(1, line)
    text, cut = _with_body(top, draft)
    return Card(text, _decision_buttons(draft, cut, attach), cut)


def status_line(draft: Draft, tz: str = "UTC") -> str | None:
    """What happened to the draft, for the top of its card (escaped HTML), or None
    while it waits for a decision."""
    who = clip(actor_name(draft.decided_by), _FIELD["name"])[0]
    at = hhmm(draft.decided_at)
    error = clip(_one_line(scrub(draft.error or "")), _FIELD["error"])[0]
    s, t = draft.status, tag(draft)
    if s in (Status.AWAITING, Status.NOTIFIED):
        return None
    if s == Status.SENT:
        return f"✅ Sent by {who} at {hhmm(draft.updated_at or draft.decided_at)} · {t}"
    if s == Status.APPROVED and draft.send_after is not None:
        return f"{deferred_line(draft, tz)}\nApproved by {who} at {at} · {t}"
    if s in (Status.APPROVED, Status.SENDING):
        return f"⏳ Approved by {who} at {at} · sending… · {t}"
    if s == Status.REJECTED:
        reason = f"\nReason: {error}" if error else ""
        return f"🗑 Rejected by {who} at {at} · {t}{reason}"
    if s == Status.SEND_FAILED:
        return (f"❌ Send failed (approved by {who} at {at}) · {t}\n{error or 'no reason given'}"
                f"\nNothing was sent. Retry sends this version.")
    if s == Status.SEND_UNKNOWN:
        return (f"❓ Send outcome unknown (approved by {who} at {at}) · {t}\n"
                f"{error or 'interrupted'}\nCheck again asks the mailbox; Mark as sent if it "
                f"arrived; Send again may send it a second time.")
    if s in (Status.QUEUED, Status.DRAFTING):  # no body yet: a first draft an operator asked for
        return f"🔁 Regenerating · {t} …" if draft.body else f"✍️ Drafting a reply · {t} …"
    if s == Status.DISMISSED:
        return f"👋 Dismissed by {who} at {at} · {t}"
    if s == Status.READY:
        return f"⏳ {t} is ready; updating the card…"
    if s == Status.CANCELLED:
        return f"🚫 Cancelled · {t}\n{error}"
    if s == Status.EXPIRED:
        return f"⌛ Expired without a decision · {t}"
    if s == Status.FAILED:
        return f"⚠️ Drafting failed · {t}\n{error}"
    return f"{html.escape(s)} · {t}"


def scheduled(draft: Draft) -> bool:
    """Does the approved ``draft`` wait for a chosen time (🕘 Later, the sending hours)
    rather than its undo window?"""
    return _window(draft) > UNDO_WINDOW_MAX


def _window(draft: Draft) -> float:
    return (draft.send_after or 0.0) - (draft.decided_at or draft.updated_at or 0.0)


def deferred_line(draft: Draft, tz: str = "UTC") -> str:
    """An approved draft whose send waits: ``📤 Sending in 10 s · ↩️ Undo`` (its undo
    window), or ``🕘 Sends Mon 09:00 · ↩️ Cancel`` (by the pipeline's clock ``tz``)."""
    if scheduled(draft):
        return f"🕘 Sends {scheduler.local_label(draft.send_after or 0.0, tz)} · ↩️ Cancel"
    return f"📤 Sending in {max(0, round(_window(draft)))} s · ↩️ Undo"


def render_status(draft: Draft, votes: list[str] | tuple[str, ...] = (), quorum: int = 1,
                  tz: str = "UTC", attach: bool = False) -> Card:
    """The card after (or while) something happened: a status line on top, no decision
    buttons; Retry for a send that failed or whose outcome is unknown. (Waiting for a
    decision: the card, with ``votes`` of ``quorum``.)"""
    line = status_line(draft, tz)
    if line is None:
        return render_card(draft, votes, quorum, attach)
    if _is_fyi(draft):
        return render_fyi(draft, line)
    if draft.status in (Status.QUEUED, Status.DRAFTING):
        return Card(line + "\n\n" + "\n".join(_header(draft)), [])
    text, cut = _with_body([line, ""] + _header(draft), draft)
    buttons: list[list[Button]] = []
    if draft.status == Status.SEND_FAILED:
        buttons = [[("🔁 Retry send", callback_data(RETRY, draft.id, draft.version))]]
    elif draft.status == Status.SEND_UNKNOWN:
        buttons = unknown_send_buttons(draft)
    elif draft.status == Status.APPROVED and draft.send_after is not None:
        buttons = [[("↩️ Cancel" if scheduled(draft) else "↩️ Undo",
                     callback_data(UNDO, draft.id, draft.version))]]
    return Card(text, buttons, cut)


def unknown_send_buttons(draft: Draft) -> list[list[Button]]:
    """Check again, Mark as sent, and Send again (which says it may duplicate)."""
    return [[("🔎 Check again", callback_data(CHECK_SEND, draft.id, draft.version)),
             ("✅ Mark as sent", callback_data(MARK_SENT, draft.id, draft.version))],
            [("⚠️ Send again (may duplicate)", callback_data(RETRY, draft.id, draft.version))]]


def confirm_question(draft: Draft, claims: list[str], later: str | None = None) -> Card:
    """What Approve asks under ``grounding: confirm`` when the version makes claims its
    sources do not support: the claims (escaped, cut) and one button, Send anyway,
    for this version only (a tap on it after an edit is refused as an old version).
    ``later``: the 🕘 Later choice that asked, which its button carries."""
    listed = clip(" · ".join(claims), _FIELD["used"])[0]
    when = f" (🕘 {scheduler.LATER[later]})" if later else ""
    text = (f"⚠️ {tag(draft)} says what its sources do not support: {listed}\n"
            f"Send anyway?{when} Nothing counts until you tap ⚠️ Send anyway; Edit on the card "
            "changes the text instead.")
    action = CONFIRM if later is None else {v: k for k, v in CONFIRM_LATER.items()}[later]
    return Card(text, [[(f"⚠️ Send anyway{when}", callback_data(action, draft.id, draft.version))]])


def notice_button(draft: Draft) -> Button | None:
    """The button under an ops notice about ``draft``: what can move it on."""
    if draft.status in (Status.SEND_FAILED, Status.SEND_UNKNOWN):
        return f"🔁 Retry send #{draft.id}", callback_data(RETRY, draft.id, draft.version)
    if draft.status in REPLAYABLE_STATUSES:
        return f"♻️ Replay #{draft.id}", callback_data(REPLAY, draft.id, draft.version)
    return None


_CODE_SPAN = re.compile(r"`([^`\n]+)`")


def notice_html(text: str, budget: int = MAX_TEXT - 96) -> str:
    """An ops notice as Telegram HTML: escaped and cut to fit, with `code` spans shown
    as code rather than between literal backticks."""
    body, _ = clip(text, budget, ellipsis="\n… (cut)")
    return _CODE_SPAN.sub(r"<code>\1</code>", body)


def full_text(draft: Draft) -> str:
    """The whole draft and the whole original, for the 📄 Full text document."""
    m = draft.message
    parts = [f"{draft.pipeline} #{draft.id} v{draft.version}", "",
             "=== Draft ===", draft.body, "",
             "=== Original ===", f"From: {m.from_name} <{m.from_addr}>".strip(),
             f"Subject: {m.subject}", f"Received: {m.date}", "", m.body]
    return "\n".join(parts)


# -- prompts (ForceReply) and replies to cards ---------------------------------------------
# A prompt is recognised by its message id, which the channel records in the store when
# it sends the prompt (so a reply still finds its draft after a restart). Its text is
# never trusted: a notice can quote outside text that reads like a prompt.

PROMPT_EDIT, PROMPT_REGENERATE, PROMPT_REJECT, PROMPT_CARD = "edit", "regenerate", "reject", "card"
PROMPT_KINDS = (PROMPT_EDIT, PROMPT_REGENERATE, PROMPT_REJECT)
_PROMPT_RECORD = re.compile(r"(edit|regenerate|reject):([1-9][0-9]{0,17}):([1-9][0-9]{0,8})")
# A card's header line; the first match wins, so text quoted further down the card
# (the email excerpt, the draft) can never stand in for it. It only names a candidate:
# the channel then checks that the message is that draft's recorded card.
_CARD_HEADER = re.compile(r"^📨 [^\n]* · #(\d{1,18}) v(\d{1,9})$", re.M)


def prompt_text(kind: str, draft: Draft, who: str) -> str:
    """The ForceReply prompt (HTML; ``who`` is already escaped or a mention)."""
    t = tag(draft)
    if kind == PROMPT_EDIT:
        return f"✏️ {who}, reply with the new text for {t}."
    if kind == PROMPT_REGENERATE:
        return (f"🔁 {who}, reply with an instruction for regenerating {t} "
                f"(e.g. “shorter, mention the refund”), or /skip to regenerate as is.")
    if kind == PROMPT_REJECT:
        return f"🗑 {who}, reply with a reason for rejecting {t}, or /skip to reject without one."
    raise ValueError(kind)


def prompt_record(kind: str, draft_id: int, version: int) -> str:
    """What the store keeps for a prompt message (see :func:`parse_prompt_record`)."""
    if kind not in PROMPT_KINDS:
        raise ValueError(kind)
    return f"{kind}:{draft_id}:{version}"


def parse_prompt_record(record: str | None) -> tuple[str, int, int] | None:
    """(kind, draft id, version) from a stored prompt record; None if it is not one."""
    m = _PROMPT_RECORD.fullmatch(record or "")
    return (m.group(1), int(m.group(2)), int(m.group(3))) if m else None


def parse_card_header(text: str | None) -> tuple[int, int] | None:
    """(draft id, version) a card's text names in its header line, or None."""
    m = _CARD_HEADER.search(text or "")
    return (int(m.group(1)), int(m.group(2))) if m else None
