"""Pure card rendering, callback data and prompt parsing (no Telegram, no store)."""

from __future__ import annotations

import pytest

from bot.approvals import cards
from bot.models import Draft, Message
from tests.fakes.telegram import ParseError, parse_html


def _draft(body="Hi Alice, thanks.", status="awaiting", **msg) -> Draft:
    m = dict(from_name="Alice Buyer", from_addr="alice@customer.example",
             reply_to="alice@customer.example", subject="Where is my order?",
             date="2026-11-29T10:02:00+00:00", body="Hi, where is my order #1234?")
    m.update(msg)
    return Draft(id=1234, key="support|k|1|v1", pipeline="support", scope="s", item_id="1",
                 recipe="v1", status=status, message=Message(**m), body=body, version=2)


@pytest.mark.parametrize("data, expected", [
    ("ap:1234:2", cards.Callback("ap", 1234, 2)),
    ("ed:1:1", cards.Callback("ed", 1, 1)),
    ("rg:99:3", cards.Callback("rg", 99, 3)),
    ("rj:7:1", cards.Callback("rj", 7, 1)),
    ("rt:7:4", cards.Callback("rt", 7, 4)),
    ("ft:7:4", cards.Callback("ft", 7, 4)),
    ("rp:7:4", cards.Callback("rp", 7, 4)),
])
def test_parse_callback_accepts_what_we_make(data, expected):
    """Every action we put on a button parses back to its draft id and version."""
    assert cards.parse_callback(data) == expected
    assert cards.callback_data(expected.action, expected.draft_id, expected.version) == data


@pytest.mark.parametrize("data", [
    None, "", "ap", "ap:", "ap:1", "ap:1:", "ap::1", "ap:x:1", "ap:1:y", "ap:-1:1",
    "ap:1:1:1", "ap:1.0:1", "AP:1:1", "zz:1:1", "approve:1:1", " ap:1:1", "ap:1:1\n",
    "ap:0:1", "ap:1:0", "ap:１:1", "ap:" + "9" * 19 + ":1", "ap:1:" + "1" * 10,
    "ap:1:1" + "x" * 60, "é" * 33, "x" * 65, "ap:%d:1" % (10**17),
    "ap:01:01", "ap:01:1", "ap:1:01", "ap:00:1", "rp:007:1", "ap:1:1\r", "ap:+1:1",
])
def test_parse_callback_refuses_hostile_data(data):
    """Oversized, unknown, non-numeric or malformed data is refused with a notice."""
    if data == "ap:%d:1" % (10**17):
        assert cards.parse_callback(data).draft_id == 10**17  # 18 digits: still ours
        return
    with pytest.raises(cards.BadCallback) as info:
        cards.parse_callback(data)
    assert 0 < len(str(info.value)) <= 200


def test_callback_data_never_exceeds_64_bytes():
    """The largest id and version we can encode still fit Telegram's 64 bytes."""
    data = cards.callback_data("ap", 10**18 - 1, 10**9 - 1)
    assert len(data.encode()) <= 64


def test_card_shows_sender_subject_excerpt_draft_and_buttons():
    card = cards.render_card(_draft())
    visible = parse_html(card.text)
    assert visible.startswith("📨 support · #1234 v2")
    assert "From: Alice Buyer <alice@customer.example>" in visible
    assert "Subject: Where is my order?" in visible
    assert "Received: Sun 29 Nov 10:02" in visible
    assert "» Hi, where is my order #1234?" in visible
    assert visible.endswith("Draft:\nHi Alice, thanks.")
    datas = [d for row in card.buttons for _, d in row]
    assert datas == ["ap:1234:2", "ed:1234:2", "rg:1234:2", "rj:1234:2", "lt:1234:2"]
    assert not card.cut


def test_hostile_email_text_is_escaped():
    """Tags and entities in the email or the model's text show as text, never as markup."""
    d = _draft(body="<b>bold</b> &amp; <script>x</script>", from_name="<i>Eve</i>",
               subject="</blockquote><a href='x'>")
    card = cards.render_card(d)
    visible = parse_html(card.text)
    assert "<b>bold</b> &amp; <script>x</script>" in visible
    assert "From: <i>Eve</i> <alice@customer.example>" in visible


@pytest.mark.parametrize("size", [4000, 20_000])
@pytest.mark.parametrize("alphabet", ["<&_", "<", "&", "_", "é&", "😀<"])
def test_huge_card_is_cut_valid_and_marked(size, alphabet):
    """A 20,000-character email of '<', '&' and '_' (or emoji) gives a valid card of at
    most 4096 units with a visible cut marker and the Full text button."""
    text = (alphabet * size)[:size]
    d = _draft(body=text)
    d.message.body = text
    d.message.subject = text
    d.message.from_name = text
    card = cards.render_card(d)
    assert cards.units(card.text) <= cards.MAX_TEXT
    visible = parse_html(card.text)  # raises on a broken entity or tag
    assert card.cut
    assert "cut; tap 📄 Full text" in visible
    assert card.buttons[-1] == [("📄 Full text", "ft:1234:2")]
    assert visible.count("Draft:") == 1
    # Most of the card is still the draft.
    draft_part = visible.split("Draft:\n", 1)[1]
    assert len(draft_part) > 300


@pytest.mark.parametrize("n", range(4070, 4100))
def test_card_around_the_limit_is_never_too_long(n):
    """Right at the boundary the card is either whole or cut, never over the limit."""
    d = _draft(body="a&" * (n // 2) + "b" * (n % 2))
    card = cards.render_card(d)
    assert cards.units(card.text) <= cards.MAX_TEXT
    parse_html(card.text)


def test_clip_never_cuts_inside_an_entity():
    for budget in range(1, 60):
        escaped, cut = cards.clip("&<>&&<<" * 10, budget)
        assert cards.units(escaped) <= budget or escaped == "…"
        parse_html(escaped)


@pytest.mark.parametrize("status, expect, retry", [
    ("sent", "✅ Sent by Anna at", False),
    ("rejected", "🗑 Rejected by Anna at", False),
    ("send_failed", "❌ Send failed (approved by Anna", True),
    ("send_unknown", "❓ Send outcome unknown", True),
    ("approved", "⏳ Approved by Anna", False),
    ("queued", "🔁 Regenerating · #1234 v2", False),
    ("expired", "⌛ Expired", False),
])
def test_status_cards(status, expect, retry):
    """After a decision the card says who did what; only failed sends keep a button."""
    d = _draft(status=status)
    d.decided_by = "tg:42 (Anna)"
    d.decided_at = d.updated_at = 1_700_000_000.0
    card = cards.render_status(d)
    visible = parse_html(card.text)
    assert visible.startswith(expect)
    if retry and status == "send_unknown":  # it may have arrived: ask, or say so, first
        assert card.buttons == [[("🔎 Check again", "ck:1234:2"), ("✅ Mark as sent", "ms:1234:2")],
                                [("⚠️ Send again (may duplicate)", "rt:1234:2")]]
    elif retry:
        assert card.buttons == [[("🔁 Retry send", "rt:1234:2")]]
    else:
        assert card.buttons == []


def test_sent_card_reads_like_the_design():
    d = _draft(status="sent")
    d.decided_by, d.updated_at = "tg:42 (Anna)", 1_700_000_000.0  # 22:13 UTC
    first = parse_html(cards.render_status(d).text).split("\n")[0]
    assert first == "✅ Sent by Anna at 22:13 · #1234 v2"


@pytest.mark.parametrize("text, expected", [
    ("📨 support · #77 v2\nFrom: x", (77, 2)),
    ("✅ Sent by A at 10:00 · #77 v2\n\n📨 support · #77 v2\nFrom: x", (77, 2)),
    ("📨 support · #77 v2\nDraft:\n📨 evil · #1 v1", (77, 2)),
    ("✏️ Anna, reply with the new text for #12 v3.", None),
    ("hello #12 v3", None),
    ("", None),
    (None, None),
])
def test_parse_card_header(text, expected):
    """A card's header names its draft; prompts are never recognised by their text."""
    assert cards.parse_card_header(text) == expected


def test_prompt_records_parse_back_and_nothing_else_does():
    for kind in (cards.PROMPT_EDIT, cards.PROMPT_REGENERATE, cards.PROMPT_REJECT):
        assert cards.parse_prompt_record(cards.prompt_record(kind, 1234, 2)) == (kind, 1234, 2)
    for record in (None, "", "card:1:1", "edit:01:1", "edit:1:1 ", "✏️ reply with the new "
                   "text for #12 v3."):
        assert cards.parse_prompt_record(record) is None


def test_card_of_a_real_card_names_its_draft():
    visible = parse_html(cards.render_card(_draft(body="📨 evil · #1 v1")).text)
    assert cards.parse_card_header(visible) == (1234, 2)


@pytest.mark.parametrize("text", ["a<b", "<x>y</x>", "<b>unclosed", "a & b", "&nbsp;", "</b>",
                                  "<b><i>x</b></i>"])
def test_fake_rejects_html_telegram_rejects(text):
    """The fake is as strict as Telegram, so a passing card test means a valid card."""
    with pytest.raises(ParseError):
        parse_html(text)


@pytest.mark.parametrize("status, button", [
    ("send_failed", ("🔁 Retry send #1234", "rt:1234:2")),
    ("send_unknown", ("🔁 Retry send #1234", "rt:1234:2")),
    ("failed", ("♻️ Replay #1234", "rp:1234:2")),
    ("skipped", ("♻️ Replay #1234", "rp:1234:2")),
    ("rejected", ("♻️ Replay #1234", "rp:1234:2")),
    ("expired", ("♻️ Replay #1234", "rp:1234:2")),
    ("awaiting", None),
    ("sent", None),
])
def test_a_notice_offers_what_moves_its_draft_on(status, button):
    assert cards.notice_button(_draft(status=status)) == button


def test_a_notice_shows_code_not_backticks_and_escapes_the_rest():
    text = "Check `schedule` in <a.yaml> & `x<y`; a lone ` stays"
    out = cards.notice_html(text)
    assert out == ("Check <code>schedule</code> in &lt;a.yaml&gt; &amp; <code>x&lt;y</code>; "
                   "a lone ` stays")
    assert parse_html(out) == "Check schedule in <a.yaml> & x<y; a lone ` stays"
    huge = cards.notice_html("`a` " + "<" * 5000)
    assert cards.units(parse_html(huge)) <= cards.MAX_TEXT


@pytest.mark.parametrize("votes, quorum, line", [
    ((), 1, None),
    (("tg:42 (Anna)",), 1, None),
    ((), 2, "👥 needs 2 approvals"),
    (("tg:42 (Anna)",), 2, "✅ 1/2 · Anna"),
    (("tg:42 (Anna)", "tg:43 (<Bo>)"), 3, "✅ 2/3 · Anna, <Bo>"),
])
def test_a_quorum_card_says_who_approved_this_version_so_far(votes, quorum, line):
    """Under the header, escaped; the header stays the first line (replies find it)."""
    card = cards.render_card(_draft(), votes, quorum)
    lines = parse_html(card.text).split("\n")
    assert lines[0] == "📨 support · #1234 v2"
    assert cards.parse_card_header(card.text) == (1234, 2)
    if line is None:
        assert not lines[1].startswith(("✅", "👥"))
    else:
        assert lines[1] == line
    assert cards.render_status(_draft(), votes, quorum).text == card.text
