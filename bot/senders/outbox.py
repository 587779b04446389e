"""Sender ``outbox``: writes each approved reply as an RFC 5322 ``.eml`` file.

::

    sender: {type: outbox, path: outbox, from: "Support <support@example.com>"}

One file per draft key, never two. The file name comes from the key; the content is
written to a temporary file, fsynced, then hard-linked to its final name. ``link``
fails if the name exists, so two sends of the same key (a retry, two processes) end
with exactly one complete file, and the second send returns the same id. A reader (or
a crash) never sees a half-written ``.eml`` under the final name.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import hashlib
import logging
import os
import re
import tempfile
from pathlib import Path

from ..config.load import PipelineConfig, Settings
from ..config.options import OutboxSenderOptions, expect
from ..errors import SendFailed
from ..mail.reply import build_reply
from ..models import Draft, SendResult

log = logging.getLogger("draftgate.outbox")


def file_name(key: str) -> str:
    """The outbox file name for draft ``key`` (readable pipeline, hashed rest)."""
    pipeline = re.sub(r"[^A-Za-z0-9_.-]", "_", key.split("|", 1)[0])[:40] or "draft"
    return f"{pipeline}-{hashlib.sha256(key.encode('utf-8')).hexdigest()[:24]}.eml"


class OutboxSender:
    """Writes replies into a folder, exactly once per draft key."""

    name = "outbox"

    def __init__(self, pipeline: PipelineConfig):
        options = expect(pipeline.sender, OutboxSenderOptions)
        self.folder = pipeline.path(options.path)
        self.from_addr = options.from_addr
        self._where = f"{pipeline.file}: sender.path"

    async def send(self, draft: Draft) -> SendResult:
        try:
            data = build_reply(draft, self.from_addr).as_bytes()
        except ValueError as exc:
            raise SendFailed(f"cannot build the reply: {exc}") from exc
        name = await asyncio.to_thread(self._write_once, file_name(draft.key), data)
        return SendResult(sent_id=name)

    async def check(self, draft: Draft) -> str | None:
        name = file_name(draft.key)
        exists = await asyncio.to_thread((self.folder / name).exists)
        return name if exists else None

    async def close(self) -> None:
        return None

    def _write_once(self, name: str, data: bytes) -> str:
        final = self.folder / name
        if final.exists():
            return name
        tmp = None
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".eml", dir=self.folder)
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            if not self._publish(tmp, final, data):
                return name  # sent already (a retry, or another process got there first)
        except OSError as exc:
            # Nothing is under the final name (link and O_EXCL are atomic), so this
            # certainly did not go out.
            raise SendFailed(f"{self._where}: cannot write to {self.folder}: "
                             f"{exc.strerror or exc}") from exc
        finally:
            if tmp is not None:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
        _fsync_dir(self.folder)
        return name

    def _publish(self, tmp: str, final: Path, data: bytes) -> bool:
        """Give the complete file its final name; False if that name exists."""
        try:
            os.link(tmp, final)
            return True
        except FileExistsError:
            return False
        except OSError as exc:
            if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EXDEV, errno.EMLINK):
                raise
        try:
            self._write_exclusive(final, data)  # a filesystem without hard links
            return True
        except FileExistsError:
            return False

    @staticmethod
    def _write_exclusive(final: Path, data: bytes) -> None:
        # Not atomic like link(): a crash mid-write can leave a short file, which
        # check() would count as sent. Only used where hard links are unavailable.
        fd = os.open(final, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())


def _fsync_dir(folder: Path) -> None:
    """Make the new directory entry durable too; best effort (not every OS allows it)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        log.debug("cannot fsync %s", folder)
    finally:
        os.close(fd)


def create(pipeline: PipelineConfig, settings: Settings) -> OutboxSender:
    """Build the sender from its checked ``sender:`` options (no I/O)."""
    return OutboxSender(pipeline)
