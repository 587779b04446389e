"""Awkward and broken mail served by the fake Gmail never stops a tick: every message
ends drafted or skipped with a reason, and a reply to a hostile Subject stays clean."""

from __future__ import annotations

import base64
import email
import email.policy

from bot.models import Status
from tests.support.desk import op
from tests.support.fixtures import gmail_world

H = "From: Bob <bob@customer.example>\r\nTo: support@example.com\r\n"


def _b64(text: bytes) -> str:
    return base64.b64encode(text).decode()


CORPUS: dict[str, bytes] = {
    "plain": (H + "Subject: plain\r\nMessage-ID: <c1@x>\r\n\r\nHello\r\n").encode(),
    "html_only": (H + "Subject: html\r\nContent-Type: text/html; charset=utf-8\r\n\r\n"
                  "<html><head><style>p{}</style></head><body><p>Hi <b>there</b></p>"
                  "<script>alert(1)</script></body></html>\r\n").encode(),
    "alternative": (H + "Subject: alt\r\nMIME-Version: 1.0\r\nContent-Type: multipart/alternative;"
                    " boundary=XX\r\n\r\n--XX\r\nContent-Type: text/plain\r\n\r\nplain part\r\n"
                    "--XX\r\nContent-Type: text/html\r\n\r\n<p>html part</p>\r\n--XX--\r\n").encode(),
    "nested": (H + "Subject: nested\r\nContent-Type: multipart/mixed; boundary=A\r\n\r\n--A\r\n"
               "Content-Type: multipart/related; boundary=B\r\n\r\n--B\r\nContent-Type: "
               "multipart/alternative; boundary=C\r\n\r\n--C\r\nContent-Type: text/plain\r\n\r\n"
               "deep text\r\n--C--\r\n--B--\r\n--A\r\nContent-Type: application/pdf\r\n"
               "Content-Disposition: attachment; filename=invoice.pdf\r\n"
               "Content-Transfer-Encoding: base64\r\n\r\n" + _b64(b"%PDF-1.4 x" * 50) +
               "\r\n--A--\r\n").encode(),
    "bad_charset": (H + "Subject: charset\r\nContent-Type: text/plain; charset=x-no-such-cs\r\n"
                    "\r\n").encode() + "caf\u00e9 na\u00efve".encode("latin-1") + b"\r\n",
    "lying_charset": (H + "Subject: lies\r\nContent-Type: text/plain; charset=us-ascii\r\n\r\n"
                      ).encode() + "\u00fcber \u20ac".encode("utf-8") + b"\r\n",
    "quoted_printable": (H + "Subject: qp\r\nContent-Type: text/plain; charset=utf-8\r\n"
                         "Content-Transfer-Encoding: quoted-printable\r\n\r\n"
                         "Gr=C3=BC=C3=9Fe, a long line=\r\n continues\r\n").encode(),
    "base64_body": (H + "Subject: b64\r\nContent-Type: text/plain; charset=utf-8\r\n"
                    "Content-Transfer-Encoding: base64\r\n\r\n" +
                    _b64("Grüße aus Köln".encode()) + "\r\n").encode(),
    "broken_base64": (H + "Subject: broken b64\r\nContent-Type: text/plain\r\n"
                      "Content-Transfer-Encoding: base64\r\n\r\n!!!not*base64***\r\n").encode(),
    "no_body": (H + "Subject: empty\r\n\r\n").encode(),
    "no_headers_but_from": b"From: carol@customer.example\r\n\r\nJust text\r\n",
    "huge_5mb": (H + "Subject: huge\r\nContent-Type: text/plain\r\n\r\n").encode()
                + (b"x" * 99 + b"\n") * 52_000,
    "subject_crlf_encoded_word": (H + "Subject: =?utf-8?q?Hi=0D=0ABcc:_victim@evil.example?=\r\n"
                                  "Message-ID: <inject@x>\r\n\r\nhello\r\n").encode(),
    "subject_8bit": H.encode() + "Subject: Größe ✓\r\n\r\nbody\r\n".encode(),
    "iso2022jp": (H + "Subject: =?ISO-2022-JP?B?GyRCJDMkcyRLJEEkTxsoQg==?=\r\n"
                  "Content-Type: text/plain; charset=ISO-2022-JP\r\n\r\n").encode()
                 + "こんにちは".encode("iso2022_jp") + b"\r\n",
    "attachment_only": (H + "Subject: scan\r\nContent-Type: multipart/mixed; boundary=Q\r\n\r\n"
                        "--Q\r\nContent-Type: image/png\r\nContent-Disposition: attachment; "
                        "filename=scan.png\r\nContent-Transfer-Encoding: base64\r\n\r\n"
                        + _b64(b"\x89PNG....") + "\r\n--Q--\r\n").encode(),
    "unterminated_multipart": (H + "Subject: cut\r\nContent-Type: multipart/mixed; boundary=Z"
                               "\r\n\r\n--Z\r\nContent-Type: text/plain\r\n\r\nhalf a mess").encode(),
    "no_sender": b"Subject: who?\r\nTo: support@example.com\r\n\r\nnobody to answer\r\n",
    "bad_from": b"From: not an address at all\r\nSubject: x\r\n\r\nbody\r\n",
    "garbage": bytes(range(256)) * 20,
}


world = gmail_world  # the fixture: an opened GmailWorld (support/fixtures.py)


async def test_awkward_corpus_never_stops_a_tick(world):
    """Every corpus message ends drafted (a card awaits) or skipped with a reason."""
    assert len(CORPUS) >= 15
    await world.tick()
    ids = {name: world.fake.add_message(raw) for name, raw in CORPUS.items()}
    counts = await world.tick()
    run = (await world.store.recent_runs("support", 1))[0]
    assert run.status == "ok", run.error_text
    outcome: dict[str, tuple[str, str | None]] = {}
    for name, gid in ids.items():
        (d,) = await world.store.item_drafts("support", gid)
        outcome[name] = (d.status, d.error)
        assert d.status in (Status.AWAITING, Status.SKIPPED), (name, d.status, d.error)
        if d.status == Status.SKIPPED:
            assert d.error, name
    skipped = {n for n, (s, _) in outcome.items() if s == Status.SKIPPED}
    assert {"no_sender", "bad_from", "garbage"} <= skipped
    assert "no usable sender" in outcome["no_sender"][1]
    assert outcome["plain"][0] == outcome["huge_5mb"][0] == Status.AWAITING
    huge = (await world.store.item_drafts("support", ids["huge_5mb"]))[0]
    assert huge.message.body_truncated and len(huge.message.body) <= 200_000
    nested = (await world.store.item_drafts("support", ids["nested"]))[0]
    assert nested.message.body == "deep text" and nested.message.attachments == ["invoice.pdf"]
    html = (await world.store.item_drafts("support", ids["html_only"]))[0]
    assert html.message.body == "Hi there"
    assert counts.fetched == len(CORPUS)


async def test_reply_to_a_hostile_subject_adds_no_header(world):
    """A Subject that decodes to CR/LF + Bcc: the reply has one Subject line, no Bcc."""
    await world.tick()
    gid = world.fake.add_message(CORPUS["subject_crlf_encoded_word"])
    await world.tick()
    (d,) = await world.store.item_drafts("support", gid)
    assert (await world.desk.approve(op("op"), d.id, d.version)).status == "sent"
    (raw,) = world.fake.received_raw
    m = email.message_from_bytes(raw, policy=email.policy.default)
    assert m["Bcc"] is None and m["Cc"] is None
    assert "\n" not in m["Subject"] and m["Subject"].startswith("Re: Hi")
    assert [a.addr_spec for a in m["To"].addresses] == ["bob@customer.example"]
    assert b"\r\nBcc:" not in raw


async def test_an_html_bomb_holds_up_no_other_mail(world):
    """1.5 MB of unclosed tags used to keep a pool thread parsing for hours: the tick
    never ended and nothing was admitted. Both messages are drafted in one tick."""
    await world.tick()
    bomb = world.fake.add_message((H + "Subject: bomb\r\nMessage-ID: <bomb@x>\r\n"
                                   "Content-Type: text/html\r\n\r\n<p>Hi</p>").encode()
                                  + b"<a " * 500_000)
    plain = world.fake.add_message(CORPUS["plain"])
    await world.tick()
    assert (await world.store.recent_runs("support", 1))[0].status == "ok"
    for gid, body in ((bomb, "Hi"), (plain, "Hello")):
        (d,) = await world.store.item_drafts("support", gid)
        assert (d.status, d.message.body) == (Status.AWAITING, body)
