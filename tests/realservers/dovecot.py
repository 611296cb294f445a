"""A throwaway Debian Dovecot serving the journal maildir over IMAP, for the SMTP witness.

``dovecot -F -c FILE`` runs a complete Dovecot (master, imap-login, auth, imap) from a
configuration file of its own, in the foreground as a child of the test, with its own
base and state directories and log, listening only on free loopback ports: IMAPS
(implicit TLS) and IMAP with STARTTLS required, both with a certificate of the tests'
private CA. One user from a passwd-file, whose mail is the maildir Postfix delivers
``journal@evq.test`` to (tests/realservers/postfix.py), read as the ``postfix`` user that
owns it. Dovecot's own services run as the Debian package's users (``dovecot``,
``dovenull``), as a packaged Dovecot does. Root is needed (the master drops privileges).

``stop()`` ends it; ``pause()``/``resume()`` stop and continue its whole process group
(a hung server: connections are taken by the kernel, nothing answers).
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.realservers.certs import PrivateCA

USER = "journal"
PASSWORD = "Dc-journal-s3cret-lantern-77"  # a known secret the tests hunt for in outputs
MAILBOX = "INBOX"

_CONF = """\
protocols = imap
listen = 127.0.0.1
base_dir = {d}/run
state_dir = {d}/state
instance_name = evq-journal-{tag}
log_path = {d}/dovecot.log
default_internal_user = dovecot
default_internal_group = dovecot
default_login_user = dovenull
first_valid_uid = 1
first_valid_gid = 1
ssl = required
ssl_cert = <{cert}
ssl_key = <{key}
ssl_min_protocol = TLSv1.2
disable_plaintext_auth = yes
auth_mechanisms = plain login
auth_verbose = yes
mail_location = maildir:{maildir}:INDEX={d}/index:CONTROL={d}/control
mail_uid = {uid}
mail_gid = {gid}
passdb {{
  driver = passwd-file
  args = scheme=PLAIN username_format=%u {d}/users
}}
userdb {{
  driver = static
  args = uid={uid} gid={gid} home={d}/home
}}
service imap-login {{
  inet_listener imap {{
    address = 127.0.0.1
    port = {imap}
  }}
  inet_listener imaps {{
    address = 127.0.0.1
    port = {imaps}
    ssl = yes
  }}
}}
service anvil {{
  chroot =
}}
service stats {{
  unix_listener stats-reader {{
    mode = 0600
  }}
  unix_listener stats-writer {{
    mode = 0666
  }}
}}
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Dovecot:
    maildir: Path
    ca: PrivateCA
    root: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="evq-dovecot-")))
    ports: dict[str, int] = field(default_factory=dict)
    process: subprocess.Popen | None = None

    @property
    def log_path(self) -> Path:
        return self.root / "dovecot.log"

    def url(self, port: str = "imaps", *, user: str = USER, mailbox: str = MAILBOX) -> str:
        scheme = "imaps" if port == "imaps" else "imap"
        return f"{scheme}://{user}@127.0.0.1:{self.ports[port]}/{mailbox}"

    def start(self) -> None:
        dovecot = shutil.which("dovecot", path="/usr/sbin:/usr/bin:/sbin")
        if dovecot is None:
            raise RuntimeError("dovecot is not installed")
        d = self.root
        d.chmod(0o755)
        owner = pwd.getpwnam("postfix")  # the maildir's owner (Postfix's virtual agent writes it)
        for sub in ("run", "state", "index", "control", "home"):
            (d / sub).mkdir(parents=True, exist_ok=True)
        for sub in ("index", "control", "home"):
            os.chown(d / sub, owner.pw_uid, owner.pw_gid)
        # Postfix creates the maildir on first delivery; Dovecot may be asked before that.
        for sub in ("new", "cur", "tmp"):
            (self.maildir / sub).mkdir(parents=True, exist_ok=True)
            os.chown(self.maildir / sub, owner.pw_uid, owner.pw_gid)
        os.chown(self.maildir, owner.pw_uid, owner.pw_gid)
        users = d / "users"
        users.write_text(f"{USER}:{{PLAIN}}{PASSWORD}\n")
        auth = pwd.getpwnam("dovecot")  # the auth service reads it as default_internal_user
        os.chown(users, auth.pw_uid, auth.pw_gid)
        users.chmod(0o600)
        self.ports = {"imaps": _free_port(), "imap": _free_port()}
        config = d / "dovecot.conf"
        config.write_text(
            _CONF.format(
                d=d,
                tag=d.name,
                cert=self.ca.server_cert,
                key=self.ca.server_key,
                maildir=self.maildir,
                uid=owner.pw_uid,
                gid=owner.pw_gid,
                **self.ports,
            )
        )
        self._stderr = open(d / "stderr", "wb")  # closed by stop()
        # Its own session: pause() stops the whole group (master and every service), and a
        # test run's end never leaves one behind (stop() ends the group it started).
        self.process = subprocess.Popen(
            [dovecot, "-F", "-c", str(config)],
            stdout=subprocess.DEVNULL,
            stderr=self._stderr,
            start_new_session=True,
        )
        until = time.monotonic() + 30
        while not all(self._listening(p) for p in self.ports.values()):
            if self.process.poll() is not None or time.monotonic() > until:
                tail = self.log_tail()
                self.stop()
                raise RuntimeError(f"dovecot does not listen on {self.ports}: {tail}")
            time.sleep(0.05)

    def pause(self) -> None:
        assert self.process is not None
        os.killpg(self.process.pid, signal.SIGSTOP)

    def resume(self) -> None:
        assert self.process is not None
        os.killpg(self.process.pid, signal.SIGCONT)

    def stop(self) -> None:
        process = self.process
        if process is not None and process.poll() is None:
            try:
                os.killpg(process.pid, signal.SIGCONT)
                process.terminate()
                process.wait(15)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                pass
            # Whatever of its group is left (a service the master did not reap in time).
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.process = None
        stderr = getattr(self, "_stderr", None)
        if stderr is not None:
            stderr.close()

    def remove(self) -> None:
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)

    def _listening(self, port: int) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return True
        except OSError:
            return False

    def log(self) -> str:
        parts = []
        for name in ("dovecot.log", "stderr"):
            path = self.root / name
            if path.exists():
                parts.append(path.read_text(errors="replace"))
        return "\n".join(parts)

    def log_tail(self) -> str:
        return "\n".join(self.log().splitlines()[-20:])
