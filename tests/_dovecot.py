"""A real Dovecot (IMAP + LMTP) for the tests, and an SMTP server that delivers into it.

:class:`Dovecot` writes its own configuration into a fresh folder (free ports on
127.0.0.1, a passwd-file with the test users, a maildir per user, no TLS) and runs
``dovecot -F`` until :meth:`Dovecot.stop`. Without Dovecot the tests skip, naming the
install line; under ``CI=true`` they fail instead, as the PostgreSQL tests do.

:class:`SmtpRelay` is a real SMTP server (aiosmtpd) in the test process: every message
it accepts is delivered over LMTP into the recipients' Dovecot mailboxes, so a reply
draftgate sends lands where a person would find it. ``fail`` makes it break at one
exact point: ``"drop"`` (deliver, then cut the connection before the 250 is sent),
``"451"`` (refuse the DATA with a temporary error, nothing delivered), ``"550"``
(refuse it for good).
"""

from __future__ import annotations

import asyncio
import os
import pwd
import shutil
import smtplib
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import pytest

INSTALL = "apt-get install -y dovecot-imapd dovecot-lmtpd"
PASSWORD = "test-secret-pw"
USERS = ("support@shop.test", "alice@customer.test")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def require_dovecot() -> str:
    """The dovecot binary, or skip (fail under CI=true) with the install line."""
    found = shutil.which("dovecot") or next(
        (p for p in ("/usr/sbin/dovecot",) if os.path.exists(p)), None)
    if found and os.path.exists("/usr/lib/dovecot/lmtp"):
        return found
    msg = f"the IMAP tests need a real Dovecot: {INSTALL}"
    if os.environ.get("CI") == "true":
        pytest.fail("CI=true but " + msg)
    pytest.skip(msg)


class Dovecot:
    """See the module docstring."""

    def __init__(self, tls: bool = False):
        self.binary = require_dovecot()
        self.tls = tls  # a CA of its own (ca.pem) and an imaps port beside STARTTLS
        # Not in pytest's tmp_path: that is 0700 root's, and as root the mail processes
        # run as an unprivileged user that must reach its maildir.
        self.root = Path(tempfile.mkdtemp(prefix="draftgate-dovecot-"))
        self.root.chmod(0o755)
        self.imap_port, self.lmtp_port = free_port(), free_port()
        self.imaps_port = free_port() if tls else 0
        self.proc: subprocess.Popen | None = None

    def _identity(self) -> tuple[str, str, int, int]:
        """(internal user, login user, mail uid, mail gid)."""
        if os.geteuid() == 0:
            nobody = pwd.getpwnam("nobody")
            internal = "dovecot" if _has_user("dovecot") else "nobody"
            login = "dovenull" if _has_user("dovenull") else "nobody"
            return internal, login, nobody.pw_uid, nobody.pw_gid
        me = pwd.getpwuid(os.geteuid())
        return me.pw_name, me.pw_name, me.pw_uid, me.pw_gid

    def _config(self) -> str:
        internal, login, uid, gid = self._identity()
        r = self.root
        return f"""
protocols = imap lmtp
listen = 127.0.0.1
base_dir = {r}/run
state_dir = {r}/state
log_path = {r}/dovecot.log
{self._ssl()}
disable_plaintext_auth = no
auth_mechanisms = plain login
default_internal_user = {internal}
default_internal_group = {internal}
default_login_user = {login}
first_valid_uid = 1
mail_location = maildir:{r}/mail/%u
imap_idle_notify_interval = 1 secs
passdb {{
  driver = passwd-file
  args = scheme=PLAIN username_format=%u {r}/passwd
}}
userdb {{
  driver = static
  args = uid={uid} gid={gid} home={r}/mail/%u
}}
service imap-login {{
  inet_listener imap {{
    address = 127.0.0.1
    port = {self.imap_port}
  }}
  inet_listener imaps {{
    address = 127.0.0.1
    port = {self.imaps_port}
  }}
}}
service lmtp {{
  inet_listener lmtp {{
    address = 127.0.0.1
    port = {self.lmtp_port}
  }}
}}
protocol lmtp {{
  postmaster_address = postmaster@shop.test
}}
namespace inbox {{
  inbox = yes
  separator = /
  mailbox Sent {{
    special_use = \\Sent
    auto = subscribe
  }}
  mailbox Drafts {{
    special_use = \\Drafts
    auto = subscribe
  }}
}}
"""

    def _ssl(self) -> str:
        if not self.tls:
            return "ssl = no"
        _certificates(self.root)
        return (f"ssl = yes\nssl_cert = <{self.root}/server.pem\n"
                f"ssl_key = <{self.root}/server.key")

    @property
    def ca_file(self) -> Path:
        return self.root / "ca.pem"

    def start(self) -> "Dovecot":
        _, _, uid, gid = self._identity()
        (self.root / "mail").mkdir()
        os.chown(self.root / "mail", uid, gid)
        (self.root / "passwd").write_text(
            "".join(f"{u}:{{PLAIN}}{PASSWORD}::::::\n" for u in USERS))
        conf = self.root / "dovecot.conf"
        conf.write_text(self._config())
        self.proc = subprocess.Popen([self.binary, "-F", "-c", str(conf)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                err = self.proc.stderr.read().decode(errors="replace") if self.proc.stderr else ""
                raise RuntimeError(f"dovecot exited: {err} {self.log()}")
            if _answers(self.imap_port) and _answers(self.lmtp_port):
                return self
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"dovecot did not listen within 20 s: {self.log()}")

    def log(self) -> str:
        p = self.root / "dovecot.log"
        return p.read_text(errors="replace")[-4000:] if p.exists() else ""

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        if self.proc is not None and self.proc.stderr:
            self.proc.stderr.close()
        shutil.rmtree(self.root, ignore_errors=True)

    # -- helpers the tests use --------------------------------------------------------

    def deliver(self, raw: bytes, to: str = USERS[0]) -> None:
        """Put ``raw`` into ``to``'s INBOX over LMTP, as a mail server would."""
        with smtplib.LMTP("127.0.0.1", self.lmtp_port, timeout=10) as lmtp:
            lmtp.sendmail("sender@outside.test", [to], raw)

    def imap(self, user: str = USERS[0]):
        """A blocking stdlib IMAP client logged in as ``user`` (for test assertions)."""
        import imaplib

        c = imaplib.IMAP4("127.0.0.1", self.imap_port, timeout=10)
        c.login(user, PASSWORD)
        return c

    def messages(self, user: str, folder: str = "INBOX", dates: list | None = None
                 ) -> list[bytes]:
        """Every message in ``user``'s ``folder``, oldest first (their INTERNALDATEs
        appended to ``dates`` if given)."""
        c = self.imap(user)
        try:
            typ, _ = c.select(f'"{folder}"', readonly=True)
            if typ != "OK":
                return []
            _, data = c.uid("SEARCH", None, "ALL")
            out = []
            for uid in (data[0] or b"").split():
                _, parts = c.uid("FETCH", uid, "(INTERNALDATE BODY.PEEK[])")
                head, raw = next(p for p in parts if isinstance(p, tuple))
                out.append(raw)
                if dates is not None:
                    dates.append(head.split(b'INTERNALDATE ')[1].split(b'"')[1].decode())
            return out
        finally:
            c.logout()

    def append(self, raw: bytes, folder: str, user: str = USERS[0], ago: float = 0) -> None:
        """Put ``raw`` into ``folder`` (created if missing) with IMAP APPEND, arrived
        ``ago`` seconds ago."""
        import imaplib

        c = self.imap(user)
        try:
            c.create(f'"{folder}"')  # NO when it exists: fine
            c.append(f'"{folder}"', None, imaplib.Time2Internaldate(time.time() - ago)
                     if ago else None, raw)
        finally:
            c.logout()

    def recreate(self, folder: str, user: str = USERS[0]) -> None:
        """Delete ``folder`` and make it again with the same messages: a new
        UIDVALIDITY, as a server rebuild or a restore from backup gives. (Not INBOX:
        Dovecot cannot delete that one.)"""
        dates: list[str] = []
        msgs = self.messages(user, folder, dates)
        c = self.imap(user)
        try:
            assert c.delete(f'"{folder}"')[0] == "OK"
            assert c.create(f'"{folder}"')[0] == "OK"
            for raw, when in zip(msgs, dates, strict=True):  # arrival times kept
                c.append(f'"{folder}"', None, f'"{when}"', raw)
        finally:
            c.logout()

    def uidvalidity(self, folder: str, user: str = USERS[0]) -> int:
        c = self.imap(user)
        try:
            _, data = c.status(f'"{folder}"', "(UIDVALIDITY)")
            return int(data[0].split(b"UIDVALIDITY ")[1].rstrip(b")"))
        finally:
            c.logout()


def _certificates(folder: Path) -> None:
    """ca.pem (a test CA) and server.pem/server.key for 127.0.0.1, signed by it."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "draftgate test CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
          .public_key(ca_key.public_key()).serial_number(1)
          .not_valid_before(now - datetime.timedelta(days=1))
          .not_valid_after(now + datetime.timedelta(days=2))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .sign(ca_key, hashes.SHA256()))
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
            .issuer_name(ca_name).public_key(key.public_key()).serial_number(2)
            .not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=2))
            .add_extension(x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    pem = serialization.Encoding.PEM
    (folder / "ca.pem").write_bytes(ca.public_bytes(pem))
    (folder / "server.pem").write_bytes(cert.public_bytes(pem))
    (folder / "server.key").write_bytes(key.private_bytes(
        pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    (folder / "server.key").chmod(0o600)


def _has_user(name: str) -> bool:
    try:
        pwd.getpwnam(name)
        return True
    except KeyError:
        return False


def _answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return True
    except OSError:
        return False


class SmtpRelay:
    """See the module docstring."""

    def __init__(self, dovecot: Dovecot):
        self.dovecot = dovecot
        self.port = free_port()
        self.fail: str | None = None  # None | "drop" | "451" | "550"
        self.accepted: list[bytes] = []  # what reached DATA (whatever became of it)
        self.delivered: list[bytes] = []
        self.logins: list[str] = []
        # Like Gmail's or Fastmail's SMTP: file each accepted message in the sender's Sent.
        self.files_sent = False
        # Set ``hold`` to a threading.Event: DATA waits for it (``holding`` says it does).
        self.hold = None
        self.holding = threading.Event()
        self.got_data = asyncio.Event()
        self._controller = None

    def start(self) -> "SmtpRelay":
        from aiosmtpd.controller import Controller
        from aiosmtpd.smtp import AuthResult

        relay = self

        class Handler:
            async def handle_DATA(self, server, session, envelope):
                raw = envelope.original_content or envelope.content
                relay.accepted.append(raw)
                relay._loop.call_soon_threadsafe(relay.got_data.set)
                if relay.hold is not None:
                    relay.holding.set()
                    await asyncio.to_thread(relay.hold.wait, 30)
                if relay.fail == "451":
                    return "451 4.3.0 Try again later (test fault)"
                if relay.fail == "550":
                    return "550 5.7.1 Relaying denied for this sender (test fault)"
                await asyncio.to_thread(relay._deliver, envelope.rcpt_tos, raw)
                if relay.fail == "drop":
                    server.transport.abort()  # delivered, but the client never hears 250
                    return "250 OK (never seen)"
                return "250 2.0.0 OK queued"

        def authenticator(server, session, envelope, mechanism, auth_data):
            ok = auth_data.password.decode() == PASSWORD
            if ok:
                relay.logins.append(auth_data.login.decode())
            return AuthResult(success=ok, handled=False, auth_data=auth_data)

        self._loop = asyncio.get_running_loop()
        self._controller = Controller(Handler(), hostname="127.0.0.1", port=self.port,
                                      authenticator=authenticator, auth_require_tls=False)
        self._controller.start()
        return self

    def _deliver(self, rcpts: list[str], raw: bytes) -> None:
        local = [r for r in rcpts if r in USERS]
        if local:
            with smtplib.LMTP("127.0.0.1", self.dovecot.lmtp_port, timeout=10) as lmtp:
                lmtp.sendmail("support@shop.test", local, raw)
        if self.files_sent:
            self.dovecot.append(raw, "Sent")
        self.delivered.append(raw)

    def stop(self) -> None:
        if self._controller is not None:
            self._controller.stop()


def kick(dovecot: Dovecot, user: str = USERS[0]) -> str:
    """Disconnect every IMAP session of ``user`` (as a server restart or a proxy does)."""
    doveadm = shutil.which("doveadm") or "/usr/bin/doveadm"
    r = subprocess.run([doveadm, "-c", str(dovecot.root / "dovecot.conf"), "kick", user],
                       capture_output=True, text=True, timeout=20)
    return r.stdout + r.stderr
