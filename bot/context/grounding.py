"""What a draft asserts that its sources do not say (DESIGN.md, "Grounding").

The check reads, it never changes: :func:`unsupported` takes the draft's text and the
texts the model was given (the email, the thread, examples, passages, the prompt, the
signature) and returns the draft's checkable claims found in none of them, as the
draft wrote them ("14 days", "€25"), for the card, ``pending --json`` and the audit.

A claim is an amount of money, a percentage, a duration, a date, a weekday, a time of
day, a phone number, an email address, a URL, an order / tracking / reference number
or another number of two digits or more. Each is normalised to keys that do not
depend on how it is written ("14 days" = "fourteen days" = "vierzehn Tage" =
"2 weeks"; "€25" = "25 EUR" = "25,00 €"; "12.03.2026" = "12 March 2026"; "5 pm" =
"17:00" = "17 Uhr"), and the sources are read into the same keys. A claim is
supported when each of its parts has a key in the sources (a range "3-5 business
days" when the sources say that range, or both ends).

Reading errs toward the human: a number it cannot place is a claim, so a doubt is
shown on the card rather than passed over.
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import re
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Iterable, Iterator

from .numbers import NUMBER, canonical, value

_I = re.IGNORECASE


@dataclass(frozen=True)
class Claim:
    """One checkable claim: its text as written and the keys each of its parts may
    be found under (supported when every part has one in the sources)."""

    text: str
    kind: str
    parts: tuple[frozenset[str], ...]


# -- patterns, tried in this order; a span taken by one is not read again -----------
# Every repetition that a failed match would retry from each later position is bounded
# (a label of 63, a local part of 64, a reference's digit or letter within 40), and a
# number starts where its digits start (numbers.DIGITS): a hostile email of 8,000
# digits, dots or hyphens is read in milliseconds, not seconds (it took 24 s).
_URL = re.compile(r"\b(?:https?://|www\.)[^\s<>\"')\]]+"
                  r"|\b(?:[a-z0-9-]{1,63}\.){1,8}(?:com|de|org|net|io|eu|at|ch|shop|info|example)"
                  r"(?:/[^\s<>\"')\]]*)?(?![\w.-]{0,64}@)", _I)
_EMAIL = re.compile(r"\b[\w.+-]{1,64}@[\w-]{1,63}(?:\.[\w-]{1,63}){1,8}\b")
_MONTHS = {
    "january": 1, "jan": 1, "januar": 1, "jänner": 1, "february": 2, "feb": 2, "februar": 2,
    "march": 3, "mar": 3, "märz": 3, "maerz": 3, "april": 4, "apr": 4, "may": 5, "mai": 5,
    "june": 6, "jun": 6, "juni": 6, "july": 7, "jul": 7, "juli": 7, "august": 8, "aug": 8,
    "september": 9, "sep": 9, "sept": 9, "october": 10, "oct": 10, "oktober": 10, "okt": 10,
    "november": 11, "nov": 11, "december": 12, "dec": 12, "dezember": 12, "dez": 12}
_MONTH = "(?:" + "|".join(sorted(_MONTHS, key=len, reverse=True)) + r")\.?"
_DATE = re.compile(
    r"\b(?P<iso>\d{4})-(?P<im>\d{1,2})-(?P<id>\d{1,2})(?!\d)"
    r"|\b(?P<dd>\d{1,2})\.(?P<dm>\d{1,2})\.(?P<dy>\d{4}|\d{2}(?!\d))?"
    r"|\b(?P<sa>\d{1,2})/(?P<sb>\d{1,2})(?:/(?P<sy>\d{4}|\d{2}))?\b"
    rf"|\b(?P<nd>\d{{1,2}})(?:st|nd|rd|th|\.)?\s+(?:of\s+)?(?P<nm>{_MONTH})(?:,?\s+(?P<ny>\d{{4}}))?"
    rf"|\b(?P<mm>{_MONTH})\s+(?P<md>\d{{1,2}})(?:st|nd|rd|th)?\b(?:,?\s+(?P<my>\d{{4}}))?", _I)
_PHONE = re.compile(r"(?<![\w.,])(?:\+|00|0|\()[\d()][\d ()./-]{5,}\d(?![\w])")
_CURRENCY = {"€": "EUR", "eur": "EUR", "euro": "EUR", "euros": "EUR", "$": "USD",
             "usd": "USD", "dollar": "USD", "dollars": "USD", "£": "GBP", "gbp": "GBP",
             "pound": "GBP", "pounds": "GBP", "chf": "CHF", "franken": "CHF"}
_CUR_BEFORE = r"(?:€|\$|£|\bEUR|\bUSD|\bGBP|\bCHF)"
_CUR_AFTER = r"(?:€|\$|£|EUR\b|USD\b|GBP\b|CHF\b|euros?\b|dollars?\b|pounds?\b|Franken\b)"
_MONEY = re.compile(rf"(?P<c1>{_CUR_BEFORE})\s?(?P<a1>{NUMBER})(?:,-)?"
                    rf"|(?P<a2>{NUMBER})(?:,-)?\s?(?P<c2>{_CUR_AFTER})", _I)
_PERCENT = re.compile(rf"(?P<a>{NUMBER})\s?(?:%|percent\b|per cent\b|prozent\b)", _I)
_CLOCK = r"(?P<{h}>\d{{1,2}})(?:[:.](?P<{m}>\d{{2}}))?"
_TIME = re.compile(
    _CLOCK.format(h="h1", m="m1") + r"\s?(?:-|–|to|bis|until)\s?" + _CLOCK.format(h="h2", m="m2")
    + r"\s?(?P<sfx>a\.?m\.?|p\.?m\.?|uhr|h\b)"
    + r"|(?P<h>\d{1,2})[:.](?P<m>\d{2})\s?(?P<s>a\.?m\.?|p\.?m\.?|uhr|h\b)"
    + r"|(?P<hh>\d{1,2}):(?P<mi>\d{2})\b"
    + r"|\b(?P<bh>\d{1,2})\s?(?P<bs>a\.?m\.?|p\.?m\.?|uhr)(?!\w)", _I)
_UNITS = [
    ("bday", r"(?:business|working|work|bank)[ -]days?|(?:werk|arbeits|geschäfts|bankarbeits)"
             r"tag(?:e|en)?|werktags?"),
    ("day", r"(?:calendar[ -])?days?|(?:kalender)?tag(?:e|en|es)?"),
    ("week", r"weeks?|wochen?"), ("month", r"months?|monat(?:e|en|s)?"),
    ("hour", r"hours?|hrs?|stunden?"), ("minute", r"minutes?|mins?|minuten?"),
    ("year", r"years?|jahr(?:e|en|es)?")]
_UNIT = "|".join(f"(?P<u_{name}>{p})" for name, p in _UNITS)
_DURATION = re.compile(rf"(?P<a>{NUMBER})(?:\s?(?:-|–|to|bis|or|oder)\s?(?P<b>{NUMBER}))?"
                       rf"[\s-]?(?:{_UNIT})\b", _I)
_REF = re.compile(r"#\s?[A-Z0-9][A-Z0-9-]{2,}|\b(?=[A-Z0-9-]{0,40}\d)(?=[A-Z0-9-]{0,40}[A-Z])"
                  r"[A-Z0-9]+(?:-[A-Z0-9]+)*\b", _I)
_NUM = re.compile(rf"{NUMBER}", _I)
_WEEKDAYS = {
    "monday": 0, "montag": 0, "tuesday": 1, "dienstag": 1, "wednesday": 2, "mittwoch": 2,
    "thursday": 3, "donnerstag": 3, "friday": 4, "freitag": 4, "saturday": 5, "samstag": 5,
    "sonnabend": 5, "sunday": 6, "sonntag": 6}
_WEEKDAY = re.compile(r"\b(" + "|".join(_WEEKDAYS) + r")s?\b", _I)
# Only in sources: "Mo–Fr", "Mon-Fri", "Monday to Friday" say every day between.
_DAY_ABBR = {"mo": 0, "mon": 0, "di": 1, "tue": 1, "tues": 1, "mi": 2, "wed": 2, "do": 3,
             "thu": 3, "thurs": 3, "fr": 4, "fri": 4, "sa": 5, "sat": 5, "so": 6, "sun": 6}
_DAY_ANY = "|".join([*_WEEKDAYS, *_DAY_ABBR])
_DIGIT_RUN = re.compile(r"(?<![A-Za-z0-9-])[A-Za-z0-9-]*[0-9][A-Za-z0-9-]*")
_DAY_RANGE = re.compile(rf"\b({_DAY_ANY})\.?\s?(?:-|–|to|bis|through)\s?({_DAY_ANY})\b\.?", _I)


def _money(m: re.Match) -> list[frozenset[str]] | None:
    cur = _CURRENCY[(m["c1"] or m["c2"]).lower()]
    n = value(m["a1"] or m["a2"])
    return None if n is None else [frozenset({f"money:{canonical(n)}:{cur}"})]


def _percent(m: re.Match) -> list[frozenset[str]] | None:
    n = value(m["a"])
    return None if n is None else [frozenset({f"pct:{canonical(n)}"})]


def _date(m: re.Match) -> list[frozenset[str]] | None:
    if m["iso"]:
        year, pairs = m["iso"], [(m["im"], m["id"])]
    elif m["dd"]:
        year, pairs = m["dy"], [(m["dm"], m["dd"])]
    elif m["sa"]:  # day/month or month/day: either reading may be the one meant
        year, pairs = m["sy"], [(m["sb"], m["sa"]), (m["sa"], m["sb"])]
    elif m["nd"]:
        year, pairs = m["ny"], [(str(_MONTHS[m["nm"].rstrip(".").lower()]), m["nd"])]
    else:
        year, pairs = m["my"], [(str(_MONTHS[m["mm"].rstrip(".").lower()]), m["md"])]
    keys = set()
    for month, day in pairs:
        mo, d = int(month), int(day)
        if 1 <= mo <= 12 and 1 <= d <= 31:
            keys.add(_date_key(year, mo, d))
    return [frozenset(keys)] if keys else None


def _date_key(year: str | None, month: int, day: int) -> str:
    if not year:
        return f"date:{month:02d}-{day:02d}"
    y = int(year) + (2000 if len(year) == 2 else 0)
    return f"date:{y}-{month:02d}-{day:02d}"


def _time_key(hour: str, minute: str | None, suffix: str | None) -> str | None:
    h, mi = int(hour), int(minute or 0)
    s = (suffix or "").lower().replace(".", "")
    if s == "pm" and h < 12:
        h += 12
    elif s == "am" and h == 12:
        h = 0
    return f"time:{h:02d}:{mi:02d}" if h < 24 and mi < 60 else None


def _time(m: re.Match) -> list[frozenset[str]] | None:
    if m["h1"]:
        sfx = m["sfx"]
        start, end = _time_key(m["h1"], m["m1"], sfx), _time_key(m["h2"], m["m2"], sfx)
        if sfx.lower().startswith("p") and int(m["h1"]) > int(m["h2"]):
            start = _time_key(m["h1"], m["m1"], "am")  # "9-5 pm": from 9 am
        keys = [start, end]
    elif m["h"]:
        keys = [_time_key(m["h"], m["m"], m["s"])]
    elif m["hh"]:
        keys = [_time_key(m["hh"], m["mi"], None)]
    else:
        keys = [_time_key(m["bh"], None, m["bs"])]
    return None if None in keys else [frozenset({k}) for k in keys if k]


def _duration_keys(n: int, unit: str) -> set[str]:
    """``n`` ``unit`` under every key it equals: two weeks are 14 days, 48 hours 2 days."""
    keys = {f"dur:{n}:{unit}"}
    if unit == "week":
        keys.add(f"dur:{n * 7}:day")
    elif unit == "day" and n % 7 == 0:
        keys.add(f"dur:{n // 7}:week")
    elif unit == "hour" and n % 24 == 0:
        keys.add(f"dur:{n // 24}:day")
    elif unit == "day":
        keys.add(f"dur:{n * 24}:hour")
    elif unit == "year":
        keys.add(f"dur:{n * 12}:month")
    elif unit == "month" and n % 12 == 0:
        keys.add(f"dur:{n // 12}:year")
    return keys


def _duration(m: re.Match) -> list[frozenset[str]] | None:
    unit = next(name for name, _ in _UNITS if m[f"u_{name}"])
    a = value(m["a"])
    b = value(m["b"]) if m["b"] else None
    if a is None or a != a.to_integral_value() or (m["b"] and b is None):
        return None
    if b is None:
        return [frozenset(_duration_keys(int(a), unit))]
    span = f"dur:{int(a)}-{int(b)}:{unit}"
    return [frozenset(_duration_keys(int(a), unit) | {span}),
            frozenset(_duration_keys(int(b), unit) | {span})]


def _phone(m: re.Match) -> list[frozenset[str]] | None:
    digits = re.sub(r"\D", "", m.group(0))
    return [frozenset({f"phone:{digits[-8:]}"})] if len(digits) >= 7 else None


def _ref(m: re.Match) -> list[frozenset[str]] | None:
    return [frozenset({"ref:" + re.sub(r"[^A-Z0-9]", "", m.group(0).upper())})]


def _number(m: re.Match) -> list[frozenset[str]] | None:
    n = value(m.group(0))
    if n is None or n < 10 and n == n.to_integral_value():
        return None  # one digit ("2 items", "option 3") is no claim worth a flag
    return [frozenset({f"num:{canonical(n)}"})]


_READERS = [
    ("email", _EMAIL, lambda m: [frozenset({"email:" + m.group(0).lower()})]),
    ("url", _URL, lambda m: [frozenset({"url:" + _url(m.group(0))})]),
    ("date", _DATE, _date), ("time", _TIME, _time), ("phone", _PHONE, _phone),
    ("money", _MONEY, _money), ("percent", _PERCENT, _percent),
    ("duration", _DURATION, _duration),
    ("weekday", _WEEKDAY, lambda m: [frozenset({f"wd:{_WEEKDAYS[m.group(1).lower()]}"})]),
    ("reference", _REF, _ref), ("number", _NUM, _number)]
#: What a source is read with: plain numbers are read on their own, all of them
#: (:func:`_read_keys`), which covers what the "number" reader would add.
_SOURCE_READERS = [r for r in _READERS if r[0] != "number"]


def _url(text: str) -> str:
    u = re.sub(r"^(?:https?://)?(?:www\.)?", "", text.rstrip(".,;:!?").lower())
    return u.rstrip("/")


def claims(text: str) -> list[Claim]:
    """The checkable claims of ``text`` in reading order, each once."""
    found = [(m.start(), Claim(" ".join(m.group(0).split()).rstrip(".,;:"), kind, tuple(parts)))
             for kind, m, parts in _read(text, _READERS)]
    seen: set[tuple[frozenset[str], ...]] = set()
    out = []
    for _, c in sorted(found, key=lambda f: f[0]):
        if c.parts not in seen:
            seen.add(c.parts)
            out.append(c)
    return out


def _read(text: str, readers: list) -> Iterator[tuple[str, re.Match, list[frozenset[str]]]]:
    """Each match of ``readers`` in ``text`` that reads as a claim (kind, match, parts),
    in the readers' order; a span taken by one is not read again."""
    taken = bytearray(len(text))
    for kind, pattern, read in readers:
        for m in pattern.finditer(text):
            start, end = m.span()
            if end == start or any(taken[start:end]):
                continue
            parts = read(m)
            if not parts:
                continue
            taken[start:end] = b"\x01" * (end - start)
            yield kind, m, parts


def source_keys(texts: Iterable[str]) -> set[str]:
    """Every key the sources support: their claims' keys, and more loosely every
    number and every token with a digit in it (an order number said without "#"), and
    the days of a range of weekdays ("Mo–Fr")."""
    keys: set[str] = set()
    for text in texts:
        if text:
            keys |= _text_keys(text)
    for k in [k for k in keys if k.startswith("date:") and k.count("-") == 2]:
        keys.add("date:" + k[10:])  # "12 March" is supported by "12 March 2026"
        with contextlib.suppress(ValueError):  # and "Thursday" by the date it falls on
            keys.add(f"wd:{datetime.date.fromisoformat(k[5:]).weekday()}")
    return keys


#: The keys of recently read texts, by a digest of the text: the prompt, the
#: signature, the style notes, examples and passages come back draft after draft, and
#: reading them again was most of the check's cost (~0.7 ms a draft). Bounded (least
#: recently used out), thread-safe (checks run in worker threads); a digest rather than
#: the text itself, so a long text is not kept alive by the cache.
_CACHE_SIZE = 1024
_cache: OrderedDict[bytes, frozenset[str]] = OrderedDict()
_cache_lock = threading.Lock()


def _text_keys(text: str) -> frozenset[str]:
    """:func:`_read_keys` of ``text``, from the cache when it was read lately."""
    digest = hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest()
    with _cache_lock:
        found = _cache.get(digest)
        if found is not None:
            _cache.move_to_end(digest)
            return found
    found = _read_keys(text)
    with _cache_lock:
        _cache[digest] = found
        while len(_cache) > _CACHE_SIZE:
            _cache.popitem(last=False)
    return found


def _read_keys(text: str) -> frozenset[str]:
    """The keys one source text supports (before :func:`source_keys` adds what its
    dates imply, which needs every text's keys)."""
    keys: set[str] = set()
    # The claims' keys, but for plain numbers: the last reader, and every number is
    # read below anyway (one scan for them, not two).
    for _, _, parts in _read(text, _SOURCE_READERS):
        for part in parts:
            keys |= part
    for m in _NUM.finditer(text):
        n = value(m.group(0))
        if n is not None:
            keys.add(f"num:{canonical(n)}")
    # Every run of [A-Za-z0-9-] with a digit in it, whole (one scan, no test per word).
    for token in _DIGIT_RUN.findall(text):
        keys.add("ref:" + token.replace("-", "").upper())
    for a, b in _DAY_RANGE.findall(text):
        first, last = _day(a), _day(b)
        for i in range(7):
            day = (first + i) % 7
            keys.add(f"wd:{day}")
            if day == last:
                break
    return frozenset(keys)


def _day(name: str) -> int:
    n = name.lower()
    return _WEEKDAYS[n] if n in _WEEKDAYS else _DAY_ABBR[n]


def unsupported(draft: str, sources: Iterable[str]) -> list[str]:
    """The claims of ``draft`` that none of ``sources`` supports, as written."""
    return unsupported_by(draft, source_keys(sources))


def unsupported_by(draft: str, keys: set[str]) -> list[str]:
    """The claims of ``draft`` without a key in ``keys`` (:func:`source_keys`)."""
    return [c.text for c in claims(draft)
            if not all(part & keys or _dated_without_year(part, keys) for part in c.parts)]


def _dated_without_year(part: frozenset[str], keys: set[str]) -> bool:
    """A date with a year is supported by the same day said without one."""
    return any(k.startswith("date:") and k.count("-") == 2 and "date:" + k[10:] in keys
               and not any(s.startswith("date:") and s.endswith(k[9:]) and s.count("-") == 2
                           for s in keys)
               for k in part)
