"""parse_email on a corpus of awkward real-world shapes (tests/corpus/)."""

from __future__ import annotations

import base64
import json
import random
import time
from pathlib import Path

import pytest

from bot.mail.mime import UnparseableMessage, html_to_text, parse_email, stable_id

CORPUS = Path(__file__).parents[1] / "corpus"


def _parse(name: str, **kw):
    return parse_email((CORPUS / name).read_bytes(), **kw)


# file, field, expected value (== for strings/lists/bools, "in" for ~substring)
CASES = [
    ("latin1.eml", "from_name", "José García"),
    ("latin1.eml", "subject", "Pedido atrasado - ¿dónde está?"),
    ("latin1.eml", "body", "Hola, mi pedido no ha llegado. ¿Dónde está? Gracias, José."),
    ("latin1.eml", "date", "2026-11-29T10:02:00+01:00"),
    ("windows1252_as_latin1.eml", "body", "It costs 5 € — “really”."),
    ("windows1252_as_latin1.eml", "subject", "“Smart” quotes"),
    ("iso2022jp.eml", "subject", "注文について"),
    ("iso2022jp.eml", "from_name", "山田太郎"),
    ("iso2022jp.eml", "body", "お世話になっております。注文の件です。"),
    ("unknown_charset.eml", "body", "Hello été café"),
    ("utf8_labelled_ascii.eml", "body", "Grüße — café"),
    ("unknown_charset.eml", "subject", "Qapla'"),
    ("bogus_codec_charset.eml", "body", "hello ÿþ world"),
    ("nested_multipart.eml", "body",
     "Hi, where is my order #1234? The box in the photo is damaged. Café au lait."),
    ("nested_multipart.eml", "attachments", ["image/png", "invoice.pdf", "message/rfc822"]),
    ("nested_multipart.eml", "references", ["<a@x>", "<b@x>"]),
    ("html_only.eml", "body", "Hello there,\n\nI need a refund & an invoice.\n\nThanks"),
    ("empty_plain_alternative.eml", "body", "Name: Kim Lee\n\nMessage: Can I change my delivery address?"),
    ("empty_plain_alternative.eml", "reply_to", "kim@customer.example"),
    ("empty_plain_alternative.eml", "from_addr", "form@shop-site.example"),
    ("no_body.eml", "body", ""),
    ("no_subject_date_id.eml", "subject", ""),
    ("no_subject_date_id.eml", "date", ""),
    ("no_subject_date_id.eml", "message_id", ""),
    ("no_subject_date_id.eml", "body", "Just a line."),
    ("quoted_printable.eml", "body", "Softbreak and € sign and a long line that goes on and on."),
    ("base64.eml", "body", "Grüße aus Köln\nZeile zwei"),
    ("broken_base64.eml", "from_addr", "b64@example.com"),
    ("encoded_subject.eml", "subject", "Factura nº 42 — ¿urgente? (segunda parte)"),
    ("encoded_subject.eml", "from_name", "Ana María"),
    ("header_injection.eml", "subject", "Hi Bcc: evil@x"),
    ("header_injection.eml", "reply_to", "victim@ok.example"),
    ("header_raw_crlf.eml", "subject", "Hi"),
    ("attachments_only.eml", "attachments", ["résumé.bin", "notes.txt"]),
    ("attachments_only.eml", "body", ""),
    ("reply_to_only.eml", "reply_to", "help@example.com"),
    ("reply_to_only.eml", "from_addr", ""),
    ("raw_8bit_headers.eml", "from_name", "José Peña"),
    ("raw_8bit_headers.eml", "subject", "Café olé"),
    ("raw_8bit_headers.eml", "body", "No charset declared: café"),
    ("in_reply_to_only.eml", "references", ["<parent@example.com>"]),
    ("in_reply_to_only.eml", "date", ""),
    ("mailing_list.eml", "headers", {"List-Unsubscribe": "<https://mailer.example/u?x=1>",
                                     "List-Id": "Deals <deals.mailer.example>",
                                     "Precedence": "bulk"}),
    ("auto_reply.eml", "headers", {"Auto-Submitted": "auto-replied", "X-Autoreply": "yes"}),
]


@pytest.mark.parametrize("name,field,expected", CASES,
                         ids=[f"{c[0]}:{c[1]}" for c in CASES])
def test_corpus_field(name, field, expected):
    """Each awkward message yields the text a human would read."""
    assert getattr(_parse(name), field) == expected


@pytest.mark.parametrize("name", ["no_sender.eml", "bad_from.eml", "garbage.bin"])
def test_no_usable_sender_is_the_only_error(name):
    """Without a From or Reply-To address there is nobody to reply to: a clear reason."""
    with pytest.raises(UnparseableMessage, match="no usable sender"):
        _parse(name)


def test_every_corpus_message_is_clean_and_serialisable():
    """No CR/LF in any header field, no control characters, and every message
    round-trips through JSON and UTF-8 (it is stored as the draft's payload)."""
    for path in sorted(CORPUS.iterdir()):
        try:
            m = parse_email(path.read_bytes(), source_id=path.name)
        except UnparseableMessage:
            continue
        for field in ("subject", "from_name", "from_addr", "reply_to", "message_id", "date"):
            value = getattr(m, field)
            assert "\r" not in value and "\n" not in value, (path.name, field)
        assert all("\n" not in v for v in m.headers.values())
        assert all(" " not in a and "@" in a for a in [m.reply_to] + m.to + m.cc)
        assert "\x00" not in m.body
        json.dumps(m.to_dict(), ensure_ascii=False).encode("utf-8")


def test_forwarded_message_text_is_not_taken_as_the_body():
    """An attached message/rfc822 is listed, its text is not the sender's words."""
    m = _parse("nested_multipart.eml")
    assert "SECRET FORWARDED" not in m.body
    assert "ATTACHED TEXT" not in _parse("attachments_only.eml").body


def test_five_megabyte_body_is_cut_fast():
    """A 5 MB message is truncated to max_body, flagged, and parsed quickly."""
    raw = (b"From: a@b.example\r\nSubject: big\r\n\r\n"
           + (b"word " * 12 + b"\r\n") * 85_000)
    assert len(raw) > 5_000_000
    start = time.perf_counter()
    m = parse_email(raw, max_body=200_000)
    assert time.perf_counter() - start < 2.0
    assert len(m.body) == 200_000 and m.body_truncated
    assert m.size == len(raw)


def test_huge_html_and_base64_bodies_are_cut():
    html = (b"From: a@b.example\r\nContent-Type: text/html\r\n\r\n"
            + b"<p>word <b>x</b></p>\r\n" * 300_000)
    m = parse_email(html, max_body=5000)
    assert m.body_truncated and 0 < len(m.body) <= 5000
    b64 = (b"From: a@b.example\r\nContent-Transfer-Encoding: base64\r\n\r\n"
           + base64.encodebytes(b"y" * 2_000_000))
    m = parse_email(b64, max_body=1000)
    assert m.body == "y" * 1000 and m.body_truncated


def test_small_body_is_not_flagged_truncated():
    assert not _parse("latin1.eml").body_truncated


def test_stable_id_depends_only_on_bytes():
    raw = (CORPUS / "no_subject_date_id.eml").read_bytes()
    assert stable_id(raw) == stable_id(bytes(raw))
    assert stable_id(raw) != stable_id(raw + b"x")
    assert stable_id(raw).startswith("sha256:")


def test_html_to_text_drops_scripts_and_keeps_paragraphs():
    text = html_to_text("<style>x{}</style><div>a</div><script>b()</script><p>c&amp;d</p>")
    assert text == "a\n\nc&d"


HTML_HEAD = b"From: a@b.example\r\nContent-Type: text/html; charset=utf-8\r\n\r\n"
# Markup that html.parser needed quadratic time for (the first four), and more shapes
# a hostile or broken mailer can send; each is repeated to 1.5 MB.
BOMBS = {
    "unclosed tags": "<a ",
    "unclosed quoted attributes": '<a href="',
    "unclosed single-quoted attributes": "<img alt='x ",
    "end tags": "</",
    "unclosed comments": "<!--",
    "nested comments": "<!-- <!-- ",
    "closed nested comments": "<!-- <!-- -->",
    "unquoted attributes": "<a b=",
    "named end tags": "</a ",
    "bogus comments": "<!",
    "processing instructions": "<?",
    "empty end tags": "</>",
    "unclosed script": "<script>",
    "unclosed style": "<style>x",
    "script elements": "<script></script>",
    "tiny tags": "<b>",
    "paragraphs": "<p>x</p>",
    "entity-like text": "&a",
    "numeric entities": "&#1;",
    "lone brackets": "<<",
}


@pytest.mark.parametrize("shape", BOMBS.values(), ids=BOMBS)
def test_html_bombs_turn_into_text_in_linear_time(shape):
    """1.5 MB of hostile markup costs a fraction of a second whatever its shape
    (html.parser took 55 s for 60 kB of "<a ", hours for 1.5 MB), and the text before
    it is kept."""
    markup = "<p>Where is my order?</p>" + shape * (1_500_000 // len(shape))
    # CPU time of this thread: the work done, whatever else the machine is doing.
    start = time.thread_time()
    text = html_to_text(markup)
    spent = time.thread_time() - start
    assert spent < 1.0, f"{spent:.2f}s of CPU time for {len(markup):,} characters"
    assert text.startswith("Where is my order?")
    # The same in a message, as the sources read it.
    assert parse_email(HTML_HEAD + markup.encode()).body.startswith("Where is my order?")


def test_html_beyond_what_is_read_is_cut_and_the_text_says_so():
    from bot.mail import mime

    markup = "<p>Hi, where is my order?</p>" + "<span></span>" * 200_000
    assert len(markup) > mime.MAX_HTML
    assert html_to_text(markup) == (f"Hi, where is my order?\n\n[HTML cut: only the first "
                                    f"{mime.MAX_HTML:,} characters of markup were read]")
    # A part longer than parse_email decodes (8 bytes per character of max_body).
    m = parse_email(HTML_HEAD + markup.encode(), max_body=1000)
    assert m.body == ("Hi, where is my order?\n\n[HTML cut: only the first 9,024 characters "
                      "of markup were read]")
    assert m.body_truncated


def test_a_message_that_takes_too_long_to_parse_is_unparseable_with_the_reason():
    raw = HTML_HEAD + b"<p>Hi</p>" * 100_000
    with pytest.raises(UnparseableMessage, match=r"^parsing took more than 0s of CPU time "
                                                 r"\(.+\); skipped so that the other mail "
                                                 r"goes on$"):
        parse_email(raw, cpu_limit=0)
    assert parse_email(raw).body.startswith("Hi\n\nHi")


def test_html_keeps_what_a_reader_sees():
    """Quotes open a value only after "=", comments end at the first "-->", the
    contents of script, style and title are never text, block elements and table
    cells keep words apart, entities are decoded."""
    cases = [
        ('<a title="x>y" href=\'a"b\'>link</a> <b class=x"y>bold</b>', "link bold"),
        ("<!--[if mso]><p>MSO only</p><![endif]--><![if !mso]>all<![endif]>", "all"),
        ("a<!-->b<!--->c<!-- x <!-- y -->d", "abcd"),
        ("<TITLE>t</TITLE><SCRIPT>if (a<b) x()</SCRIPT >a < b &lt;c&gt; &copy; &#8364;",
         "a < b <c> \u00a9 \u20ac"),
        ("<table><tr><td>a</td><td>b</td></tr></table><ul><li>x</li></ul>", "a b\n\nx"),
    ]
    for markup, text in cases:
        assert html_to_text(markup) == text, markup
    # A tag still open at the end hides the rest, as it did in the sender's mail client.
    assert html_to_text("kept <a href='never closed>lost") == "kept"


def test_mangled_messages_never_raise_anything_else():
    """Random byte damage to every corpus file: parse_email either returns a Message
    or raises UnparseableMessage, never anything else."""
    rng = random.Random(1234)
    files = [p.read_bytes() for p in sorted(CORPUS.iterdir())]
    for _ in range(2000):
        raw = bytearray(rng.choice(files))
        for _ in range(rng.randint(1, 12)):
            pos = rng.randrange(len(raw) or 1)
            op = rng.random()
            if op < 0.4 and raw:
                raw[pos] = rng.randrange(256)
            elif op < 0.7:
                del raw[pos:pos + rng.randint(1, 40)]
            else:
                raw[pos:pos] = rng.choice([b"\r\n", b"=?", b"?=", b"--", b"\x00", b":", b"<",
                                           b"; charset=idna", b"=?x?b?", b"\xff\xfe"])
        try:
            m = parse_email(bytes(raw))
        except UnparseableMessage:
            continue
        json.dumps(m.to_dict()).encode("utf-8")
        assert "\n" not in m.subject
