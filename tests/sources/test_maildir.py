"""The maildir source: .eml folders and Maildirs, read-only, ids from Message-ID."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pytest

from bot.config.load import PipelineConfig, Settings
from bot.errors import ConfigError, SourceError
from bot.mail import mime
from bot.sources import maildir
from bot.stages import FetchContext, Source
from tests._stage import pipeline

CORPUS = Path(__file__).parents[1] / "corpus"


def _pipeline(tmp_path: Path, filters: dict | None = None, **source) -> PipelineConfig:
    return pipeline(source={"type": "maildir", **source}, filters=filters,
                    sender={"type": "outbox", "path": "out", "from": "s@shop.example"},
                    base_dir=tmp_path)


def _settings(tmp_path: Path) -> Settings:
    return Settings(file="draftgate.yaml", base_dir=tmp_path, store="sqlite:///x.db", pipelines=[])


class _Seen:
    """Stands in for the store's seen marks."""

    def __init__(self, seen=()):
        self.seen = set(seen)
        self.asked: list[list[str]] = []

    async def unseen(self, ids):
        self.asked.append(list(ids))
        return {i for i in ids if i not in self.seen}

    def ctx(self, scheduled_for: float = 0.0) -> FetchContext:
        return FetchContext("support", "maildir", scheduled_for, None, self.unseen)


def _source(tmp_path, folder="inbox", **opts) -> maildir.MaildirSource:
    return maildir.create(_pipeline(tmp_path, path=folder, **opts), _settings(tmp_path))


def _copy(names, dest: Path):
    dest.mkdir(parents=True, exist_ok=True)
    for name in names:
        shutil.copy(CORPUS / name, dest / (Path(name).stem + ".eml"))


def _snapshot(folder: Path):
    return sorted((str(p.relative_to(folder)), p.stat().st_mtime_ns, p.read_bytes())
                  for p in folder.rglob("*") if p.is_file())


async def test_eml_folder_items_keyed_by_message_id(tmp_path):
    """Each file is one item; the id is its Message-ID, or a hash without one."""
    _copy(["latin1.eml", "html_only.eml", "no_subject_date_id.eml"], tmp_path / "inbox")
    src = _source(tmp_path)
    assert isinstance(src, Source) and src.scope == "maildir"
    result = await src.fetch(_Seen().ctx())
    ids = {i.item_id: i for i in result.items}
    raw_no_id = (CORPUS / "no_subject_date_id.eml").read_bytes()
    assert set(ids) == {"<latin1-1@cliente.example>", "<html@example.net>", mime.stable_id(raw_no_id)}
    assert ids["<latin1-1@cliente.example>"].message.subject == "Pedido atrasado - ¿dónde está?"
    assert ids["<html@example.net>"].message.source_id == "html_only.eml"
    assert all(i.skip_reason is None for i in result.items)
    assert result.cursor is None


async def test_unparseable_file_is_a_skipped_item_and_the_rest_continue(tmp_path):
    _copy(["no_sender.eml", "latin1.eml"], tmp_path / "inbox")
    result = await _source(tmp_path).fetch(_Seen().ctx())
    by_file = {i.message.source_id: i for i in result.items}
    assert by_file["latin1.eml"].skip_reason is None
    assert by_file["no_sender.eml"].skip_reason.startswith("unparseable: no usable sender")
    assert by_file["no_sender.eml"].item_id == mime.stable_id((CORPUS / "no_sender.eml").read_bytes())


async def test_seen_messages_are_not_returned(tmp_path):
    """Only ids the store has not seen come back, so a second tick admits nothing."""
    _copy(["latin1.eml", "html_only.eml"], tmp_path / "inbox")
    src = _source(tmp_path)
    seen = _Seen({"<latin1-1@cliente.example>"})
    result = await src.fetch(seen.ctx())
    assert [i.item_id for i in result.items] == ["<html@example.net>"]
    seen.seen.add("<html@example.net>")
    assert (await src.fetch(seen.ctx())).items == []


async def test_maildir_reads_new_and_cur_ignores_tmp_and_dotfiles(tmp_path):
    box = tmp_path / "Mail" / "INBOX"
    _copy(["latin1.eml"], box / "new")
    _copy(["html_only.eml"], box / "cur")
    _copy(["base64.eml"], box / "tmp")
    shutil.copy(CORPUS / "encoded_subject.eml", box / "cur" / ".hidden")
    os.rename(box / "cur" / "html_only.eml", box / "cur" / "1700000000.M1P2.host:2,S")
    src = _source(tmp_path, "Mail/INBOX")
    ids = sorted(i.item_id for i in (await src.fetch(_Seen().ctx())).items)
    assert ids == ["<html@example.net>", "<latin1-1@cliente.example>"]


async def test_message_moved_from_new_to_cur_keeps_its_id(tmp_path):
    """A mail client flagging a message as read renames it; it is still the same item."""
    box = tmp_path / "box"
    _copy(["no_subject_date_id.eml"], box / "new")
    (box / "cur").mkdir()
    src = _source(tmp_path, "box")
    first = [i.item_id for i in (await src.fetch(_Seen().ctx())).items]
    os.rename(box / "new" / "no_subject_date_id.eml", box / "cur" / "no_subject_date_id.eml:2,S")
    second = [i.item_id for i in (await src.fetch(_Seen().ctx())).items]
    assert first == second and len(first) == 1


async def test_fetch_never_modifies_the_folder(tmp_path):
    box = tmp_path / "box"
    _copy(["latin1.eml", "no_sender.eml"], box / "new")
    _copy(["html_only.eml"], box / "cur")
    before = _snapshot(box)
    await _source(tmp_path, "box").fetch(_Seen().ctx())
    assert _snapshot(box) == before


async def test_two_copies_of_one_message_give_one_item(tmp_path):
    _copy(["latin1.eml"], tmp_path / "inbox")
    shutil.copy(CORPUS / "latin1.eml", tmp_path / "inbox" / "copy.eml")
    result = await _source(tmp_path).fetch(_Seen().ctx())
    assert [i.item_id for i in result.items] == ["<latin1-1@cliente.example>"]


async def test_max_body_truncates(tmp_path):
    _copy(["latin1.eml"], tmp_path / "inbox")
    item = (await _source(tmp_path, max_body="10").fetch(_Seen().ctx())).items[0]
    assert item.message.body == "Hola, mi p" and item.message.body_truncated


async def test_missing_folder_is_a_source_error_naming_the_path(tmp_path):
    with pytest.raises(SourceError, match=r"pipelines/support.yaml: source.path: .*nowhere does not exist"):
        await _source(tmp_path, "nowhere").fetch(_Seen().ctx())


async def test_a_changed_file_is_identified_again(tmp_path):
    """The id cache follows the file's mtime and size."""
    _copy(["no_subject_date_id.eml"], tmp_path / "inbox")
    src = _source(tmp_path)
    first = (await src.fetch(_Seen().ctx())).items[0].item_id
    (tmp_path / "inbox" / "no_subject_date_id.eml").write_bytes(
        (CORPUS / "latin1.eml").read_bytes())
    second = (await src.fetch(_Seen().ctx())).items[0].item_id
    assert first != second == "<latin1-1@cliente.example>"


async def test_max_age_skips_old_mail_from_the_scheduled_time(tmp_path):
    """A first run on an old mailbox: mail dated before max_age is skipped with a reason
    (measured from the tick's scheduled time); mail without a Date uses the file time."""
    _copy(["latin1.eml", "no_subject_date_id.eml"], tmp_path / "inbox")
    latin1_date = 1_795_942_920.0  # Sun, 29 Nov 2026 10:02:00 +0100
    os.utime(tmp_path / "inbox" / "no_subject_date_id.eml", (latin1_date - 3600, latin1_date - 3600))
    src = _source(tmp_path, max_age="7d")
    fresh = await src.fetch(_Seen().ctx(scheduled_for=latin1_date + 86400))
    reasons = {i.message.source_id: i.skip_reason for i in fresh.items}
    assert reasons == {"latin1.eml": None, "no_subject_date_id.eml": None}
    later = await src.fetch(_Seen().ctx(scheduled_for=latin1_date + 8 * 86400))
    reasons = {i.message.source_id: i.skip_reason for i in later.items}
    assert reasons["latin1.eml"] == "older than source.max_age (7d): dated 2026-11-29T10:02:00+01:00"
    assert reasons["no_subject_date_id.eml"].startswith(
        "older than source.max_age (7d): dated file time 2026-11-29T08:02:00")


@pytest.mark.parametrize("opts,expected", [
    ({}, "pipelines/support.yaml: source.path: missing"),
    ({"path": "x", "max_age": "a week"}, "pipelines/support.yaml: source.max_age: expected a duration"),
    ({"path": 3}, "pipelines/support.yaml: source.path: expected a string"),
    ({"path": "x", "max_body": "huge"}, "pipelines/support.yaml: source.max_body: expected a size"),
    ({"path": "x", "query": "in:inbox"}, "pipelines/support.yaml: source.query: unknown key"),
])
def test_create_reports_bad_options(tmp_path, opts, expected):
    with pytest.raises(ConfigError) as err:
        maildir.create(_pipeline(tmp_path, **opts), _settings(tmp_path))
    assert err.value.errors[0].startswith(expected), err.value.errors


def test_create_does_no_io(tmp_path):
    """validate builds every source; a folder that does not exist yet is fine there."""
    src = _source(tmp_path, "not/yet/there")
    assert src.folder == tmp_path / "not/yet/there"


async def test_demo_inbox(tmp_path):
    """The shipped demo inbox: five messages to draft, three skipped with a reason
    (with the filters pipelines/demo.yaml uses)."""
    from bot.config.load import Checker
    from bot.config.options import parse_filters
    from bot.sources.filters import skip_reason

    repo = Path(__file__).resolve().parents[2]
    src = maildir.create(_pipeline(repo, path="demo/inbox"), _settings(repo))
    items = (await src.fetch(_Seen().ctx())).items
    import yaml

    demo = yaml.safe_load((repo / "pipelines" / "demo.yaml").read_text(encoding="utf-8"))
    reasons = {i.message.source_id: skip_reason(i.message, parse_filters(Checker("demo.yaml"), demo["filters"]),
                                        own_addresses=[])
               for i in items}
    assert reasons == {
        "01-order-question.eml": None,
        "02-html-only.eml": None,
        "03-latin1-accents.eml": None,
        "04-no-subject.eml": None,
        "05-large-body.eml": "body of 337446 bytes exceeds filters.max_body (200kB)",
        "06-newsletter.eml": "mailing list (List-Unsubscribe header)",
        "07-noreply-notification.eml":
            "sender noreply@parcelcarrier.example matches filters.skip_senders 'noreply@*'",
        "08-prompt-injection.eml": None,
    }
    by_name = {i.message.source_id: i.message for i in items}
    assert by_name["03-latin1-accents.eml"].from_name == "François Lévêque"
    assert by_name["02-html-only.eml"].body.startswith("Hello,\n\nThe rain jacket")
    assert by_name["04-no-subject.eml"].subject == ""


async def test_another_message_under_the_same_message_id_is_skipped_visibly(tmp_path):
    """A second file with the same Message-ID but another body used to be dropped
    without a word. It is its own item now, skipped with the reason, admitted once; a
    copy with the same body (other Received headers) is still the same message."""
    inbox = tmp_path / "inbox"
    _copy(["latin1.eml"], inbox)
    raw = (CORPUS / "latin1.eml").read_bytes()
    os.utime(inbox / "latin1.eml", ns=(1_000_000_000, 1_000_000_000))  # the oldest
    (inbox / "relayed.eml").write_bytes(b"Received: from relay.example\n" + raw)
    (inbox / "other.eml").write_bytes(raw.replace(b"Hola, mi pedido", b"Otra cosa: mi pedido"))
    result = await _source(tmp_path).fetch(_Seen().ctx())
    by_file = {i.message.source_id: i for i in result.items}
    assert set(by_file) == {"latin1.eml", "other.eml"}
    assert by_file["latin1.eml"].item_id == "<latin1-1@cliente.example>"
    assert by_file["latin1.eml"].skip_reason is None
    other = by_file["other.eml"]
    assert re.fullmatch(r"<latin1-1@cliente\.example>#[0-9a-f]{12}", other.item_id)
    assert other.skip_reason == ("same Message-ID <latin1-1@cliente.example> as latin1.eml but "
                                 "a different body; not drafted on its own (replay it to draft "
                                 "a reply)")
    assert other.message.body.startswith("Otra cosa")  # kept whole, for a replay

    # Stable across ticks and processes: once seen, nothing comes back.
    seen = _Seen({i.item_id for i in result.items})
    assert (await _source(tmp_path).fetch(seen.ctx())).items == []


async def test_a_file_over_filters_max_body_is_skipped_from_its_size_without_reading_it(
        tmp_path, monkeypatch):
    """A 400 MB .eml used to be read whole (and parsed, ~10x in memory) before the
    filter skipped it."""
    inbox = tmp_path / "inbox"
    _copy(["latin1.eml"], inbox)
    head = (CORPUS / "latin1.eml").read_bytes()
    (inbox / "huge.eml").write_bytes(head.replace(b"<latin1-1@", b"<huge@") + b"x" * 3_000_000)
    src = maildir.create(_pipeline(tmp_path, {"max_body": "1MB"}, path="inbox"), _settings(tmp_path))
    read = []
    real = maildir._read_head
    monkeypatch.setattr(maildir, "_read_head",
                        lambda path, limit: read.append(path.name) or real(path, limit))
    items = {i.message.source_id: i for i in (await src.fetch(_Seen().ctx())).items}
    size = (inbox / "huge.eml").stat().st_size
    assert items["huge.eml"].skip_reason == f"body of {size} bytes exceeds filters.max_body (1MB)"
    assert items["huge.eml"].item_id == "<huge@cliente.example>"
    assert items["huge.eml"].message.from_addr == "jose@cliente.example"  # shown in status
    assert items["huge.eml"].message.size == size
    assert items["latin1.eml"].skip_reason is None
    assert read == ["latin1.eml"]


async def test_the_id_of_a_big_file_without_message_id_is_its_hash_read_in_pieces(tmp_path):
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    raw = b"From: a@b.example\nSubject: hi\n\n" + b"0123456789" * 300_000
    (inbox / "big.eml").write_bytes(raw)
    [item] = (await _source(tmp_path).fetch(_Seen().ctx())).items
    assert item.item_id == mime.stable_id(raw)


def _deployment(tmp_path: Path) -> Path:
    """draftgate.yaml and one maildir pipeline over tmp_path/inbox: template drafts,
    console cards, an outbox sender."""
    (tmp_path / "pipelines").mkdir()
    (tmp_path / "reply.txt").write_text("Hi {first_name},\n\nthanks for writing.\n")
    (tmp_path / "pipelines" / "support.yaml").write_text(
        "name: support\nschedule: 5m\nsource: {type: maildir, path: inbox}\n"
        "drafter: {model: template, prompt: reply.txt}\napproval: {channel: console}\n"
        "sender: {type: outbox, path: out, from: 'Shop <support@shop.example>'}\n")
    cfg = tmp_path / "draftgate.yaml"
    cfg.write_text(f"store: sqlite:///{tmp_path}/state.db\npipelines: pipelines/*.yaml\n")
    return cfg


HTML_BOMB = (b"From: Mallory <mallory@customer.example>\r\nMessage-ID: <bomb@customer.example>\r\n"
             b"Subject: hello\r\nContent-Type: text/html\r\n\r\n<p>Hello</p>" + b"<a " * 500_000)


def test_an_html_bomb_next_to_a_normal_mail_holds_nothing_up(tmp_path, capsys):
    """1.5 MB of unclosed tags used to take html.parser hours, in the thread that
    parses every new file of the tick: the other mail waited and nothing was admitted.
    Now both are drafted in the same tick."""
    from bot.__main__ import main
    from tests._proc import sqlite_rows

    inbox = tmp_path / "inbox"
    _copy(["latin1.eml"], inbox)
    (inbox / "bomb.eml").write_bytes(HTML_BOMB)
    assert main(["run", "--once", "-c", str(_deployment(tmp_path))]) == 0
    rows = sqlite_rows(tmp_path / "state.db",
                       "SELECT item_id, status FROM drafts ORDER BY item_id")
    assert rows == [("<bomb@customer.example>", "awaiting"),
                    ("<latin1-1@cliente.example>", "awaiting")]


def test_a_message_too_slow_to_parse_is_skipped_with_the_reason_in_status(
        tmp_path, capsys, monkeypatch):
    """No markup is that slow any more, so the limit is lowered to nothing: every
    message is over it, each is skipped with the reason, the tick itself is fine."""
    from bot.__main__ import main
    from tests._proc import sqlite_rows

    monkeypatch.setattr(mime, "PARSE_CPU_LIMIT", 0.0)
    inbox = tmp_path / "inbox"
    _copy(["latin1.eml"], inbox)
    (inbox / "bomb.eml").write_bytes(HTML_BOMB)
    cfg = str(_deployment(tmp_path))
    assert main(["run", "--once", "-c", cfg]) == 0
    reason = re.compile(r"unparseable: parsing took more than 0s of CPU time \(.+\); skipped "
                        r"so that the other mail goes on")
    rows = sqlite_rows(tmp_path / "state.db", "SELECT status, error FROM drafts")
    assert len(rows) == 2 and all(s == "skipped" and reason.fullmatch(e) for s, e in rows), rows
    capsys.readouterr()
    assert main(["status", "support", "-c", cfg]) == 0
    out = capsys.readouterr().out
    assert "healthy" in out.splitlines()[0] and "skipped 2" in out, out
    assert out.count("skipped <") == 2 and "unparseable: parsing took more than 0s of CPU" in out


def _big_mail(attachment_mb: int) -> bytes:
    """A customer's question with a scanned PDF of ``attachment_mb`` MB after it."""
    line = b"JVBERi0xLjQKJcOkw7zDtsOfCjIgMCBvYmoKPDwvTGVuZ3RoIDMgMCBSL0ZpbHRlci9GbGF0ZUR\r\n"
    return (b"From: Victoria <victoria@customer.example>\r\nTo: support@shop.example\r\n"
            b"Subject: Invoice attached\r\nMessage-ID: <big@customer.example>\r\n"
            b"MIME-Version: 1.0\r\nContent-Type: multipart/mixed; boundary=XX\r\n\r\n"
            b"--XX\r\nContent-Type: text/plain; charset=utf-8\r\n\r\n"
            b"Could you check the invoice I attached?\r\n"
            b"--XX\r\nContent-Type: application/pdf; name=scan.pdf\r\n"
            b"Content-Transfer-Encoding: base64\r\n\r\n"
            + line * (attachment_mb * (1 << 20) // len(line)) + b"--XX--\r\n")


def _peak_rss_of_one_tick(cfg: Path) -> int:
    """Peak resident memory (kB) of `draftgate run --once` in its own process."""
    import subprocess
    import sys

    probe = ("import resource, subprocess, sys\n"
             "r = subprocess.run([sys.executable, '-m', 'bot', 'run', '--once', '-c', sys.argv[1]],"
             " stdout=subprocess.DEVNULL)\n"
             "print(r.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n")
    out = subprocess.run([sys.executable, "-c", probe, str(cfg)], capture_output=True, text=True,
                         check=True, cwd=Path(__file__).resolve().parents[2]).stdout.split()
    assert out[0] == "0", out
    return int(out[1])


def test_a_40mb_mail_is_drafted_without_holding_its_size_many_times_in_memory(tmp_path):
    """A mail with a 40 MB attachment used to cost about 8 times its size to parse
    (an 81 MB one: 669 MB). Now the tick's peak memory grows by less than the file's
    own size over a tick with a small mail, and the question is still drafted, its
    size shown as the file's."""
    from tests._proc import sqlite_rows

    small, big = tmp_path / "small", tmp_path / "big"
    for where, raw in ((small, _big_mail(0)), (big, _big_mail(40))):
        where.mkdir()
        (where / "inbox").mkdir()
        (where / "inbox" / "mail.eml").write_bytes(raw)
    base, peak = (_peak_rss_of_one_tick(_deployment(small)), _peak_rss_of_one_tick(_deployment(big)))
    size_kb = (big / "inbox" / "mail.eml").stat().st_size // 1024
    print(f"peak RSS: small mail {base} kB, 40 MB mail {peak} kB (+{peak - base} kB)")
    assert peak - base < size_kb, (base, peak)
    [(status, body)] = sqlite_rows(big / "state.db", "SELECT status, body FROM drafts")
    assert status == "awaiting" and body.startswith("Hi Victoria")
