"""Knowledge files with limits (issue 22 finding 7): a file over
``drafter.knowledge_max_file`` or a symlink out of its folder is a `validate` error,
and a running service leaves it out of the index and names it in `status` and
/status; indexing is off the drafting path (a draft never waits for a long index
pass, and a pass a draft gave up on is not started again by every next draft).

The real CLI, the real engine and store, the fake model server (what the model was
given is read from the requests it recorded) and the fake Telegram for /status.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from pathlib import Path

import pytest

from bot.cli.main import main
from tests._pg import pg_url_fixture
from tests.support.context_world import KNOWLEDGE, Deployment, cli, eml

ZEBRA = "## Zebra crossing\n\nThe zebra code for the back door is ZEBRA-991.\n\n"
SECRET = "## Zebra crossing\n\nThe zebra passphrase is SECRET-PASSPHRASE-7.\n"


def _knowledge_block(req) -> str:
    """The KNOWLEDGE part of a model request ("" when none was given)."""
    _, user = req.texts()
    start = user.find("<<<KNOWLEDGE ")
    return "" if start < 0 else user[start:user.find("<<<END KNOWLEDGE", start)]


def _deployment_files(tmp_path: Path, drafter: str) -> Path:
    (tmp_path / "pipelines").mkdir()
    (tmp_path / "kb").mkdir()
    (tmp_path / "kb" / "returns.md").write_text(KNOWLEDGE)
    (tmp_path / "r.txt").write_text("Hi {first_name},\n{knowledge}\n")
    (tmp_path / "draftgate.yaml").write_text(f"store: sqlite:///{tmp_path}/s.db\n")
    (tmp_path / "pipelines" / "a.yaml").write_text(
        "name: a\nsource: {type: maildir, path: in}\nsender: {type: outbox, path: o, from: a@b.c}\n"
        f"drafter: {{model: template, prompt: r.txt, knowledge: [kb/*.md]{drafter}}}\n")
    return tmp_path / "draftgate.yaml"


def _link_out(tmp_path: Path) -> Path:
    """kb/secret.md, a symlink to a file outside kb/."""
    (tmp_path / "elsewhere").mkdir(exist_ok=True)
    (tmp_path / "elsewhere" / "secret.md").write_text(SECRET)
    os.symlink(tmp_path / "elsewhere" / "secret.md", tmp_path / "kb" / "secret.md")
    return tmp_path / "kb" / "secret.md"


def test_validate_names_a_knowledge_file_over_the_limit_and_a_link_out(tmp_path, capsys):
    cfg = _deployment_files(tmp_path, ", knowledge_max_file: 2kB")
    assert main(["validate", "-c", str(cfg)]) == 0, capsys.readouterr()
    capsys.readouterr()
    (tmp_path / "kb" / "big.md").write_text(ZEBRA * 60)  # 4,020 bytes
    link = _link_out(tmp_path)
    assert main(["validate", "-c", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert (f"pipelines/a.yaml: drafter.knowledge[0]: {tmp_path}/kb/big.md is left out of the "
            f"knowledge index: 4.02 kB, over drafter.knowledge_max_file (2 kB); shorten or "
            f"split it, or raise drafter.knowledge_max_file") in err
    assert (f"pipelines/a.yaml: drafter.knowledge[0]: {link} is left out of the knowledge "
            f"index: a link to {tmp_path}/elsewhere/secret.md, outside {tmp_path}/kb; copy the "
            f"file into the folder instead of linking it") in err
    assert "returns.md" not in err


def test_the_default_limit_is_2_mb_and_a_bad_limit_is_explained(tmp_path, capsys):
    cfg = _deployment_files(tmp_path, "")
    (tmp_path / "kb" / "huge.md").write_text("x" * 2_100_000)
    assert main(["validate", "-c", str(cfg)]) == 2
    assert "huge.md is left out of the knowledge index: 2.1 MB, over " \
           "drafter.knowledge_max_file (2 MB)" in capsys.readouterr().err
    (tmp_path / "kb" / "huge.md").unlink()
    for bad, said in (("lots", "expected a size like 200kB or 5MB, got 'lots'"),
                      ("0", "expected a size of at least 1 byte like 2MB or 500kB, got 0")):
        (tmp_path / "pipelines" / "a.yaml").write_text(
            (tmp_path / "pipelines" / "a.yaml").read_text().replace(
                "knowledge: [kb/*.md]", f"knowledge: [kb/*.md], knowledge_max_file: {bad}"))
        assert main(["validate", "-c", str(cfg)]) == 2
        assert f"pipelines/a.yaml: drafter.knowledge_max_file: {said}" in capsys.readouterr().err
        (tmp_path / "pipelines" / "a.yaml").write_text(
            (tmp_path / "pipelines" / "a.yaml").read_text().replace(
                f", knowledge_max_file: {bad}", ""))


async def test_a_running_service_leaves_big_files_and_links_out_and_status_names_them(
        tmp_path, fake, capsys):
    """The files go wrong after the service started (validate passed): the model is
    never given the big file, the link's target or a file that grew past the limit,
    and `draftgate status` names each with why."""
    (tmp_path / "kb").mkdir()
    (tmp_path / "kb" / "returns.md").write_text(KNOWLEDGE)
    w = await Deployment(tmp_path, fake, "openai", f"sqlite:///{tmp_path}/s.db",
                         drafter="knowledge: [kb/*.md], knowledge_max_file: 2kB").open()
    try:
        (tmp_path / "kb" / "big.md").write_text(ZEBRA * 60)
        _link_out(tmp_path)
        _, req = await w.draft("support", 1, eml(1, "Zebra", "What is the zebra code and "
                                                 "when is my refund paid?"))
        given = _knowledge_block(req)
        assert "returns.md › Refunds" in given
        assert "ZEBRA-991" not in given and "SECRET-PASSPHRASE" not in req.texts()[1]
        assert await cli(["status", "-c", w.config]) == 0
        out = capsys.readouterr().out
        assert ("knowledge file(s) left out of the index: kb/big.md (4.02 kB, over "
                "drafter.knowledge_max_file (2 kB)), kb/secret.md (a link to "
                f"{tmp_path}/elsewhere/secret.md, outside {tmp_path}/kb)") in out
        # A file that was indexed and then grew past the limit is dropped from the index.
        with (tmp_path / "kb" / "returns.md").open("a") as f:
            f.write("\n\n" + "More words about refunds. " * 80)
        await w.draft("support", 2, eml(2, "Refund", "When is my refund paid?"))  # a pass
        await _until(lambda: _indexed(w, "returns.md", False))
        _, req = await w.draft("support", 3, eml(3, "Refund", "When is my refund paid?"))
        assert "5 business days" not in req.texts()[1]
        assert await cli(["status", "-c", w.config]) == 0
        assert "kb/returns.md (" in capsys.readouterr().out
    finally:
        await w.close()


async def test_slash_status_names_a_knowledge_file_left_out(tmp_path, monkeypatch):
    from tests.fakes.telegram import FakeTelegram
    from tests.support.telegram_world import TOKEN_ENV, World, write_config

    with FakeTelegram() as tg:
        monkeypatch.setenv(TOKEN_ENV, tg.token)
        cfg = write_config(tmp_path, tg)
        support = tmp_path / "pipelines" / "support.yaml"
        support.write_text(support.read_text() + "drafter: {knowledge: [kb/*.md], "
                                                  "knowledge_max_file: 1kB}\n")
        (tmp_path / "kb").mkdir()
        (tmp_path / "kb" / "returns.md").write_text(KNOWLEDGE)
        w = await World(tmp_path, tg, cfg).start()
        try:
            (tmp_path / "kb" / "big.md").write_text(ZEBRA * 30)
            said = await w.say("/status")
            assert "knowledge file(s) left out of the index: kb/big.md (2.01 kB, over " \
                   "drafter.knowledge_max_file (1 kB))" in said
        finally:
            await w.stop()


# -- indexing off the drafting path -----------------------------------------------------------

pg_url = pg_url_fixture("kb")  # a fresh PostgreSQL schema per test


async def _until(check, timeout: float = 60.0) -> None:
    """Poll an async condition (store state: no event for it) until true."""
    deadline = time.monotonic() + timeout
    while not await check():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.05)


@pytest.mark.postgres
async def test_a_draft_never_waits_for_an_index_pass_and_a_stuck_pass_is_not_restarted(
        tmp_path, fake, pg_url, caplog):
    """The index cannot be written (its tables locked by another session, as a slow or
    huge index pass would hold it): drafts are made with what is indexed (nothing yet)
    without waiting for it (the draft that starts it gives it a few seconds, the next
    ones none), the pass is started once, not by every draft, and once it can write it
    finishes by itself and the next draft has the passage."""
    import asyncpg

    from bot.store.postgres import parse_pg_url

    caplog.set_level(logging.INFO, logger="draftgate.knowledge")
    (tmp_path / "kb").mkdir()
    (tmp_path / "kb" / "returns.md").write_text(KNOWLEDGE)
    w = await Deployment(tmp_path, fake, "openai", pg_url,
                         drafter="knowledge: [kb/*.md]").open()
    dsn, schema = parse_pg_url(pg_url)
    locker = await asyncpg.connect(dsn, server_settings={"search_path": schema})
    try:
        tx = locker.transaction()
        await tx.start()
        await locker.execute("LOCK TABLE knowledge_files, knowledge_passages IN EXCLUSIVE MODE")
        for n in (1, 2, 3):
            _, req = await asyncio.wait_for(w.draft("support", n, eml(
                n, "Refund", f"When is my refund {n} paid?")), 60)
            assert "5 business days" not in req.texts()[1]
        await tx.rollback()  # the index can be written again
        await _until(lambda: _indexed(w, "returns.md"))
        _, req = await w.draft("support", 4, eml(4, "Refund", "When is my refund paid?"))
        assert "5 business days" in _knowledge_block(req)
        passes = [r for r in caplog.records if "knowledge" in r.getMessage()
                  and "indexed" in r.getMessage()]
        assert len(passes) == 1, [r.getMessage() for r in passes]
    finally:
        await locker.close()
        await w.close()


async def _indexed(w: Deployment, name: str = "returns.md", wanted: bool = True) -> bool:
    """Whether the store's index holds (``wanted``) or no longer holds kb/``name``."""
    held = any(Path(p).name == name for p in await w.store.knowledge_files("support"))
    return held == wanted
