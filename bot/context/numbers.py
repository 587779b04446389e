"""Numbers as people write them, in English and German: digits with either decimal
mark ("25,00", "1,234.50", "1.234,50") and number words ("fourteen", "twenty-five",
"vierzehn", "fünfundzwanzig"), for :mod:`bot.context.grounding`."""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

_EN_UNITS = ("zero one two three four five six seven eight nine ten eleven twelve thirteen "
             "fourteen fifteen sixteen seventeen eighteen nineteen").split()
_EN_TENS = "twenty thirty forty fifty sixty seventy eighty ninety".split()
_DE_UNITS = ("null eins zwei drei vier fünf sechs sieben acht neun zehn elf zwölf dreizehn "
             "vierzehn fünfzehn sechzehn siebzehn achtzehn neunzehn").split()
_DE_TENS = "zwanzig dreißig vierzig fünfzig sechzig siebzig achtzig neunzig".split()
#: German forms of one (a number word too: "eine Woche" is a week, said with a number).
_DE_ONE = ("ein", "eine", "einen", "einem", "einer")

WORDS: dict[str, int] = {w: i for i, w in enumerate(_EN_UNITS)}
WORDS.update({w: 20 + 10 * i for i, w in enumerate(_EN_TENS)})
WORDS.update({w: i for i, w in enumerate(_DE_UNITS)})
WORDS.update({w: 20 + 10 * i for i, w in enumerate(_DE_TENS)})
WORDS.update({"dreissig": 30, "fuenf": 5, "zwoelf": 12, "fuenfzehn": 15, "fuenfzig": 50,
              "hundred": 100, "hundert": 100, "thousand": 1000, "tausend": 1000,
              "sechzehn": 16, "siebzehn": 17, "sechzig": 60, "siebzig": 70})
WORDS.update({w: 1 for w in _DE_ONE})
for _i, _t in enumerate(_EN_TENS):
    for _u in range(1, 10):
        WORDS[f"{_t}-{_EN_UNITS[_u]}"] = WORDS[f"{_t} {_EN_UNITS[_u]}"] = 20 + 10 * _i + _u
for _i, _t in enumerate(_DE_TENS):
    for _u, _w in enumerate(("ein zwei drei vier fünf sechs sieben acht neun").split(), 1):
        WORDS[f"{_w}und{_t}"] = 20 + 10 * _i + _u



def _trie(words: list[str]) -> str:
    """One pattern matching any of ``words``, written as a trie: a flat alternation of
    300 words is tried word by word at every position (the grounding check spent most
    of its time there); a trie tries one branch per character. The optional tail is
    greedy, so the longest word wins ("twenty-five" over "twenty")."""
    root: dict = {}
    for w in words:
        node = root
        for ch in w:
            node = node.setdefault(ch, {})
        node[""] = {}

    def build(node: dict) -> str:
        alts = [re.escape(ch) + build(child) for ch, child in sorted(node.items()) if ch]
        if not alts:
            return ""
        body = alts[0] if len(alts) == 1 else "(?:" + "|".join(alts) + ")"
        return f"(?:{body})?" if "" in node else body

    return "(?:" + build(root) + ")"


#: One number word (the longest that fits, so "twenty-five" wins over "twenty").
WORD = _trie(list(WORDS))
#: A number in digits: "25", "25,00", "1.234,50", "1,234.50", "1 234" (thin groups).
DIGITS = r"(?<!\d)(?:\d{1,3}(?:[.,\u202f\u00a0 ]\d{3})+(?:[.,]\d{1,2})?(?!\d)|\d+(?:[.,]\d{1,2}(?!\d))?)"
#: Either form.
NUMBER = rf"(?:{DIGITS}|\b{WORD}\b)"


def value(text: str) -> Decimal | None:
    """The number ``text`` writes (digits or a number word), None when it is none."""
    t = text.strip().lower()
    if t in WORDS:
        return Decimal(WORDS[t])
    t = re.sub(r"[\u202f\u00a0 ]", "", t)
    if "," in t and "." in t:  # the last mark is the decimal one
        dec = "," if t.rfind(",") > t.rfind(".") else "."
        t = t.replace("." if dec == "," else ",", "").replace(dec, ".")
    elif "," in t or "." in t:
        mark = "," if "," in t else "."
        head, _, tail = t.rpartition(mark)
        if len(tail) == 3 and head.replace(mark, "").isdigit():
            t = head.replace(mark, "") + tail  # a thousands mark: "1.500", "1,500"
        else:
            t = head.replace(mark, "") + "." + tail
    try:
        return Decimal(t)
    except InvalidOperation:
        return None


def canonical(n: Decimal) -> str:
    """``n`` written one way: "25" for 25.00, "19.9" for 19,90."""
    s = format(n.normalize(), "f")
    return s.rstrip("0").rstrip(".") if "." in s else s
