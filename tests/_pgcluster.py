"""A private PostgreSQL server for a test that kills it: initdb and pg_ctl from
/usr/lib/postgresql/*/bin into a temporary folder, on a free port of 127.0.0.1.

initdb refuses to run as root, so as root the cluster runs as the ``postgres`` user
(``runuser``). Where the binaries are missing the test is skipped with the reason;
under ``CI=true`` it fails instead, so CI never passes by skipping it.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

import pytest


def _required() -> bool:
    return os.environ.get("CI") == "true" or os.environ.get("DRAFTGATE_REQUIRE_PG") == "1"


def _unavailable(why: str) -> None:
    if _required():
        pytest.fail(f"CI=true: a private PostgreSQL cluster is needed: {why}")
    pytest.skip(why)


def _bin_dir() -> Path:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"),
                   key=lambda p: int(Path(p).parent.parent.name) if
                   Path(p).parent.parent.name.isdigit() else 0)
    if not found:
        _unavailable("no PostgreSQL server binaries in /usr/lib/postgresql/*/bin "
                     "(apt install postgresql)")
    return Path(found[-1]).parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Cluster:
    """One initdb'd data folder; :meth:`start` and :meth:`kill` as often as needed."""

    def __init__(self) -> None:
        self.bin = _bin_dir()
        self.port = _free_port()
        self.root = Path(tempfile.mkdtemp(prefix="dg-pg-"))
        self.data = self.root / "data"
        self.log = self.root / "server.log"
        self._user: str | None = None
        if os.geteuid() == 0:
            if shutil.which("runuser") is None:
                _unavailable("running as root without runuser: initdb refuses root")
            self._user = "postgres"
            try:
                shutil.chown(self.root, user="postgres")
            except (LookupError, PermissionError) as exc:
                _unavailable(f"running as root and cannot hand the cluster to the postgres "
                             f"user: {exc}")
            self.root.chmod(0o755)
        self._run("initdb", "-D", str(self.data), "-A", "trust", "-U", "postgres",
                  "--no-sync", "-E", "UTF8")

    @property
    def dsn(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, tool: str, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        cmd = [str(self.bin / tool), *args]
        if self._user is not None:
            cmd = ["runuser", "-u", self._user, "--", *cmd]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        if check and done.returncode != 0:
            _unavailable(f"{tool} failed ({done.returncode}): {done.stderr.strip()[-500:]}")
        return done

    def start(self) -> None:
        opts = (f"-p {self.port} -c listen_addresses=127.0.0.1 -c fsync=off "
                f"-c unix_socket_directories={self.root}")
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-o", opts,
                  "-w", "-t", "60", "start")

    def kill(self) -> None:
        """Stop the server at once (immediate mode: no shutdown checkpoint, clients cut off)."""
        self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")

    def close(self) -> None:
        self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop", check=False)
        shutil.rmtree(self.root, ignore_errors=True)


@pytest.fixture
def pg_cluster():
    cluster = Cluster()
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.close()
