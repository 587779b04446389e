"""Which Gmail labels make a message work for a ``gmail`` source: label-only queries
matched by labels, the labels whose addition brings mail in, and the ids a history
page names (see :mod:`bot.sources.gmail`)."""

from __future__ import annotations

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
