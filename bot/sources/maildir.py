"""Source ``maildir``: a folder of ``.eml`` files, or a Maildir (``cur/`` and ``new/``,
what mbsync or offlineimap write).

::

    source: {type: maildir, path: mail/inbox, max_body: 200kB, max_age: 7d}

Read-only: files are never moved, renamed or flagged, so another mail client can own
the folder. The item id is the Message-ID (a hash of the file's bytes when it has
none), so a message moved from ``new/`` to ``cur/`` keeps its id. Only messages the
store has not seen are parsed; a file that cannot be parsed (or whose parsing takes
more than :data:`bot.mail.mime.PARSE_CPU_LIMIT` of CPU time) becomes a skipped item with
the reason, and the tick goes on. File I/O runs off the event loop.

``max_age`` (optional) keeps a first run on an old mailbox from drafting years of
mail: a message whose Date (or, without one, file time) is older than that, measured
from the tick's scheduled time, is recorded as skipped with the reason. ``max_body``
cuts the parsed body (the filter of the same name skips big mail instead); a file is
read only as far as such a body needs (:func:`raw_limit`), so an 80 MB attachment
costs neither its size nor the parser's multiple of it in memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import email.parser
import email.policy
import hashlib
import logging
import os
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from ..config.load import PipelineConfig, Settings
from ..config.options import MaildirSourceOptions, expect
from ..context.thread import Thread, participants_only
from ..errors import SourceError
from ..mail import mime
from ..mail.attachments import files_of
from ..models import FetchResult, Item, Message
from ..scheduler import duration_text
from .filters import too_big

log = logging.getLogger("draftgate.sources.maildir")

_HEAD_BYTES = 65536  # enough for the header block of nearly every message
_CHUNK = 1 << 20  # files are hashed in pieces, never held whole for an id
_THREAD_MAX_BODY = 20_000  # characters of an earlier message read for context
# Parsing holds about 8 times the bytes it reads. A message is read up to this many
# bytes: enough for any body of max_body characters that comes before the message's
# attachments (text parts come first in what mail clients write), never the whole of
# an 80 MB attachment.
_RAW_FLOOR = 2 << 20


def raw_limit(max_body: int) -> int:
    """How many bytes of a message file are read to parse a body of ``max_body``."""
    return max(_RAW_FLOOR, 8 * max_body + _HEAD_BYTES)


@dataclass(frozen=True)
class _File:
    path: Path
    name: str  # relative to the source folder, shown as source_id
    stamp: tuple[int, int]  # (mtime_ns, size): the id cache is valid while unchanged


class MaildirSource:
    """Reads ``.eml`` files or a Maildir without modifying them."""

    scope = "maildir"

    def __init__(self, pipeline: PipelineConfig):
        options = expect(pipeline.source, MaildirSourceOptions)
        self.folder = pipeline.path(options.path)
        self.max_body = options.max_body
        self.max_age = options.max_age
        # filters.max_body: a file bigger than this is skipped from its size alone,
        # without reading it into memory.
        self.skip_above = pipeline.filters.max_body
        self._where = f"{pipeline.file}: source.path"
        # path -> (stamp, item id): saves re-reading every file on every tick.
        self._ids: dict[Path, tuple[tuple[int, int], str]] = {}
        # path -> (stamp, body digest), for files that share a Message-ID.
        self._digests: dict[Path, tuple[tuple[int, int], str]] = {}

    async def fetch(self, ctx) -> FetchResult:
        """The messages in the folder that the store has not seen yet."""
        listed = await asyncio.to_thread(self._identify)
        by_id: dict[str, _File] = {}
        shared: list[tuple[_File, str]] = []
        for f, item_id in listed:
            if item_id in by_id:
                shared.append((f, item_id))
            else:
                by_id[item_id] = f  # files come oldest first: the oldest holds the id
        reasons: dict[str, str] = {}
        if shared:
            for item_id, (f, reason) in (await asyncio.to_thread(self._different, by_id, shared)).items():
                by_id[item_id] = f
                reasons[item_id] = reason
        fresh = await ctx.unseen(list(by_id)) if by_id else set()
        todo = [(item_id, f) for item_id, f in by_id.items() if item_id in fresh]
        # Oldest first, at most ctx.limit: only those are read and parsed now. The
        # others stay unseen in the folder, so the next tick takes them (no cursor).
        limit = getattr(ctx, "limit", None)
        more = limit is not None and len(todo) > limit
        if more:
            todo = todo[:limit]
        items = await asyncio.to_thread(self._parse_all, todo, ctx.progress, ctx.scheduled_for)
        for item in items:
            if item.item_id in reasons and item.skip_reason is None:
                item.skip_reason = reasons[item.item_id]
        return FetchResult(items, cursor=None, more=more)

    async def close(self) -> None:
        return None

    async def thread(self, message: Message, limit: int) -> Thread:
        """The files of the folder that ``message`` answers, by its References (or
        In-Reply-To), that its sender took part in (:mod:`bot.context.thread`): the
        newest ``limit``, oldest first."""
        refs = [r for r in message.references if r != message.message_id]
        if not refs or limit < 1:
            return Thread()
        return await asyncio.to_thread(self._thread, refs, limit, message.from_addr)

    def _thread(self, refs: list[str], limit: int, sender: str) -> Thread:
        by_id = {item_id: f for f, item_id in self._identify()}
        found = []
        for ref in refs:  # References lists the thread oldest first
            f = by_id.get(ref)
            if f is None:
                continue
            try:
                m = mime.parse_email(_read_head(f.path, raw_limit(_THREAD_MAX_BODY)),
                                     max_body=_THREAD_MAX_BODY, source_id=f.name)
            except (OSError, mime.UnparseableMessage):
                continue
            found.append((m, False))
        result = participants_only(found, sender, self._where)
        return Thread(result.messages[-limit:], result.left_out)

    # -- runs in a worker thread -------------------------------------------------
    def _files(self) -> list[_File]:
        if not self.folder.is_dir():
            what = "is not a folder" if self.folder.exists() else "does not exist"
            raise SourceError(f"{self._where}: {self.folder} {what}; create it or point "
                              f"source.path at a folder of .eml files or a Maildir")
        maildir = (self.folder / "cur").is_dir() or (self.folder / "new").is_dir()
        out: list[_File] = []
        try:
            if maildir:
                # tmp/ holds messages still being written by the delivery agent.
                candidates = [p for sub in ("new", "cur") if (self.folder / sub).is_dir()
                              for p in (self.folder / sub).iterdir()]
            else:
                candidates = [p for p in self.folder.iterdir() if p.suffix.lower() == ".eml"]
        except OSError as exc:
            raise SourceError(f"{self._where}: cannot list {self.folder}: {exc.strerror or exc}") from exc
        for p in candidates:
            if p.name.startswith("."):
                continue
            try:
                st = p.stat()
            except OSError:
                continue  # gone between listing and stat (another client moved it)
            if not os.path.isfile(p):
                continue
            out.append(_File(p, str(p.relative_to(self.folder)), (st.st_mtime_ns, st.st_size)))
        out.sort(key=lambda f: (f.stamp[0], f.name))
        return out

    def _identify(self) -> list[tuple[_File, str]]:
        result = []
        files = self._files()
        alive = set()
        for f in files:
            alive.add(f.path)
            cached = self._ids.get(f.path)
            if cached and cached[0] == f.stamp:
                result.append((f, cached[1]))
                continue
            item_id = _item_id(f)
            self._ids[f.path] = (f.stamp, item_id)
            result.append((f, item_id))
        for gone in set(self._ids) - alive:
            del self._ids[gone]
        return result

    def _different(self, by_id: dict[str, _File], shared: list[tuple[_File, str]]
                   ) -> dict[str, tuple[_File, str]]:
        """Files whose Message-ID an older file already has. A copy with the same body
        (another delivery of the same mail, with other Received headers) is the same
        message and stays out. A different body under the same Message-ID (a broken
        mailer, a forged id) must not vanish: it becomes its own item, id
        ``<Message-ID>#<body hash>`` (stable, so it is admitted once), recorded as
        skipped with the reason; replay drafts it."""
        out: dict[str, tuple[_File, str]] = {}
        for f, item_id in shared:
            first = by_id[item_id]
            digest = self._digest(f)
            if digest is None or digest == self._digest(first):
                continue
            own_id = f"{item_id}#{digest[:12]}"
            if own_id not in by_id and own_id not in out:
                out[own_id] = (f, f"same Message-ID {item_id} as {first.name} but a different "
                                  f"body; not drafted on its own (replay it to draft a reply)")
        return out

    def _digest(self, f: _File) -> str | None:
        cached = self._digests.get(f.path)
        if cached and cached[0] == f.stamp:
            return cached[1]
        try:
            digest = _body_digest(f.path)
        except OSError:
            return None
        self._digests[f.path] = (f.stamp, digest)
        return digest

    def _parse_all(self, todo: list[tuple[str, _File]], progress, now: float) -> list[Item]:
        items = []
        for done, (item_id, f) in enumerate(todo, 1):
            item = self._parse(item_id, f)
            if self.max_age is not None and item.skip_reason is None:
                item.skip_reason = self._too_old(item.message, f, now, self.max_age)
            items.append(item)
            if progress is not None:
                progress(done, len(todo))
        return items

    async def attachment_files(self, message: Message) -> list[tuple[str, bytes]]:
        """The attachments of a mail this source admitted (📎 Files), from its file."""
        path = (self.folder / message.source_id).resolve()
        if not path.is_relative_to(self.folder.resolve()):
            raise SourceError(f"{message.source_id} is not in {self.folder}")
        try:
            raw = await asyncio.to_thread(path.read_bytes)
        except OSError as exc:
            raise SourceError(f"cannot read {message.source_id}: {exc.strerror or exc}") from None
        return files_of(raw)

    def _parse(self, item_id: str, f: _File) -> Item:
        if self.skip_above is not None and f.stamp[1] > self.skip_above:
            return self._too_big(item_id, f, self.skip_above)
        try:
            raw = _read_head(f.path, raw_limit(self.max_body))
        except OSError as exc:
            return _skipped(item_id, f, f"cannot read {f.name}: {exc.strerror or exc}")
        try:
            message = mime.parse_email(raw, max_body=self.max_body, source_id=f.name)
            if len(raw) < f.stamp[1]:  # only the first bytes were read (see raw_limit)
                message.size, message.body_truncated = f.stamp[1], True
                if message.attachment_sizes:  # the rest is (mostly) the last one, in base64
                    message.attachment_sizes[-1] += (f.stamp[1] - len(raw)) * 3 // 4
        except mime.UnparseableMessage as exc:  # no sender, or too slow to parse
            return _skipped(item_id, f, f"unparseable: {exc}", size=len(raw))
        except Exception as exc:  # never let one message stop the tick
            log.exception("maildir %s: parse failed for %s", self.folder, f.name)
            return _skipped(item_id, f, f"unparseable ({type(exc).__name__})", size=len(raw))
        return Item(item_id, message)


    def _too_big(self, item_id: str, f: _File, limit: int) -> Item:
        """Skipped from the file size alone; the headers (read from the first bytes)
        still show who wrote and about what."""
        reason = too_big(f.stamp[1], limit)
        try:
            with open(f.path, "rb") as fh:
                head = fh.read(_HEAD_BYTES)
            message = mime.parse_email(head, max_body=min(self.max_body, 2000), source_id=f.name)
        except (OSError, mime.UnparseableMessage):
            return _skipped(item_id, f, reason, size=f.stamp[1])
        message.size = f.stamp[1]
        message.body_truncated = True  # only the first bytes were read
        return Item(item_id, message, skip_reason=reason)

    def _too_old(self, message: Message, f: _File, now: float, max_age: float) -> str | None:
        when = f.stamp[0] / 1e9
        if message.date:
            with contextlib.suppress(ValueError, OverflowError):
                when = datetime.fromisoformat(message.date).timestamp()
        if now - when > max_age:
            dated = message.date or "file time " + datetime.fromtimestamp(when, timezone.utc).isoformat()
            return f"older than source.max_age ({duration_text(max_age)}): dated {dated}"
        return None


def _item_id(f: _File) -> str:
    """Message-ID from the header block; a hash of the whole file without one. An
    unreadable file gets an id from its name, so it is reported (skipped) once and
    picked up under its real id once it can be read."""
    try:
        with open(f.path, "rb") as fh:
            head = fh.read(_HEAD_BYTES)
            mid = _message_id(head)
            if mid:
                return mid
            # mime.stable_id of the whole file, hashed piece by piece.
            h = hashlib.sha256(head)
            for chunk in iter(lambda: fh.read(_CHUNK), b""):
                h.update(chunk)
            return "sha256:" + h.hexdigest()[:32]
    except OSError:
        return f"unreadable:{f.name}"


def _read_head(path: Path, limit: int) -> bytes:
    """The first ``limit`` bytes of ``path`` (all of a smaller file)."""
    with open(path, "rb") as fh:
        return fh.read(limit)


def _body_digest(path: Path) -> str:
    """sha256 of what follows the header block (the first empty line)."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        tail = b""
        in_body = False
        for chunk in iter(lambda: fh.read(_CHUNK), b""):
            if in_body:
                h.update(chunk)
                continue
            data = tail + chunk
            ends = [i + len(sep) for sep in (b"\r\n\r\n", b"\n\n") if (i := data.find(sep)) >= 0]
            if ends:
                in_body = True
                h.update(data[min(ends):])
            else:
                tail = data[-3:]
    return h.hexdigest()


def _message_id(head: bytes) -> str:
    try:
        msg = email.parser.BytesHeaderParser(policy=email.policy.compat32).parsebytes(head)
    except Exception:
        return ""
    # The same cleaning parse_email applies, so the id matches Message.message_id.
    return mime.message_id_of(msg)


def _skipped(item_id: str, f: _File, reason: str, size: int = 0) -> Item:
    return Item(item_id, Message(kind="email", source_id=f.name, size=size), skip_reason=reason)


def create(pipeline: PipelineConfig, settings: Settings) -> MaildirSource:
    """Build the source from its checked ``source:`` options (no I/O)."""
    return MaildirSource(pipeline)
