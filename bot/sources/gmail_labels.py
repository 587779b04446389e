"""Which Gmail labels make a message work for a ``gmail`` source: label-only queries
matched by labels, the labels whose addition brings mail in, and the ids a history
page names (see :mod:`bot.sources.gmail`)."""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger("draftgate.sources.gmail")

# Our own sent mail and drafts, spam, trash, chats: never work.
NEVER = {"SENT", "DRAFT", "SPAM", "TRASH", "CHAT"}

_LABEL_TERMS = {"in:inbox": "INBOX", "is:unread": "UNREAD", "is:starred": "STARRED",
                "is:important": "IMPORTANT", "category:primary": "CATEGORY_PERSONAL",
                "category:social": "CATEGORY_SOCIAL", "category:promotions": "CATEGORY_PROMOTIONS",
                "category:updates": "CATEGORY_UPDATES", "category:forums": "CATEGORY_FORUMS"}


def entering_labels(query: str, label_id: str | None) -> set[str]:
    """Labels whose addition can bring mail into the pipeline after it arrived: its
    own label, and the labels the query asks for (INBOX for ``in:inbox``: mail marked
    "not spam" or moved back from the archive)."""
    out = {_LABEL_TERMS[t] for t in query.lower().split() if t in _LABEL_TERMS}
    return out | {label_id} if label_id else out


def history_ids(resp: dict, entering: set[str]) -> list[str]:
    """Ids of one history.list page that may now be work: messages added, and messages
    given one of the ``entering`` labels. Each is still matched against the query (and
    the seen marks make a second label change, or an old message, harmless)."""
    out = []
    for h in resp.get("history", []) or []:
        changes = [a for a in h.get("messagesAdded", []) or []]
        changes += [a for a in h.get("labelsAdded", []) or []
                    if set(a.get("labelIds") or ()) & entering]
        for change in changes:
            m = change.get("message") or {}
            if m.get("id") and not set(m.get("labelIds") or []) & NEVER:
                out.append(str(m["id"]))
    return out


def label_terms(query: str) -> tuple[set[str], set[str]] | None:
    """(labels required, labels forbidden) when ``query`` is only an AND of label terms
    such as ``in:inbox -category:promotions``; None when it needs Gmail's search."""
    need: set[str] = set()
    forbid: set[str] = set()
    for term in query.lower().split():
        neg = term.startswith("-")
        label = _LABEL_TERMS.get(term[1:] if neg else term)
        if label is None:
            return None
        (forbid if neg else need).add(label)
    return need, forbid


def by_labels(items: list[Any], resources: list[dict], terms: tuple[set[str], set[str]],
              account: str, query: str) -> list[Any]:
    """The items whose labels match a query of label terms only (:func:`label_terms`)."""
    need, forbid = terms
    found = {str(r.get("id")) for r in resources
             if need <= set(r.get("labelIds") or []) and
             not forbid & set(r.get("labelIds") or [])}
    missed = [it.item_id for it in items if it.item_id not in found]
    if missed:
        log.info("gmail %s: %d of %d new message(s) do not match the query %r: %s",
                 account, len(missed), len(items), query, ", ".join(missed))
    return [it for it in items if it.item_id in found]


def bounded(keep: list[tuple[str, int]], account: str, query: str,
            most: int) -> list[tuple[str, int]]:
    """The ids to search for again, oldest first, at most ``most`` (the oldest over
    it are dropped, logged)."""
    keep.sort(key=lambda e: e[1])
    if len(keep) > most:
        over, keep = keep[:-most], keep[-most:]
        log.warning("gmail %s: more than %d messages to search for again; dropped the "
                    "oldest, not returned by the query %r: %s", account, most, query,
                    ", ".join(gid for gid, _ in over))
    return keep
