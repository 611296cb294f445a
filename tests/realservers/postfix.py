"""A throwaway instance of Debian's Postfix, configured the way production relays are.

``postfix -c DIR`` runs a complete Postfix (master, smtpd, cleanup, qmgr, virtual)
from a configuration directory of its own, with its own queue, data directory and
mail log, listening only on free loopback ports; the machine's own Postfix (if any)
and port 25 are never touched. What it enforces is what the issue met in the field:

- ``smtpd_helo_restrictions = reject_non_fqdn_helo_hostname`` with Postfix's default
  ``smtpd_delay_reject = yes``, so a bad HELO name is refused at RCPT time (504 5.5.2);
- STARTTLS and implicit TLS (smtps) with a certificate of a private CA;
- Cyrus SASL (PLAIN/LOGIN against a sasldb made by ``saslpasswd2``), offered even
  before TLS on the plain port (``smtpd_tls_auth_only = no``), as careless relays do;
- a refused recipient (550 5.1.1 from ``check_recipient_access``);
- a listener with ``smtpd_recipient_limit = 2`` (452 4.5.3 for the third RCPT);
- a listener that requires a client certificate signed by the private CA.

Everything it accepts for ``@evq.test`` or ``@example.net`` is delivered to one maildir, so a test counts
what the server really received (``delivered``), each message with its
``Delivered-To`` header; but ``journal@evq.test`` (``JOURNAL``) and its subaddresses
(``journal+<tag>@evq.test``, ``recipient_delimiter = +``) have a maildir of their own,
``mail/journal/``, which tests/realservers/dovecot.py serves over IMAP (the SMTP witness).
Postfix's virtual agent writes each delivery's envelope recipient above its Received: line
(``X-Original-To``, ``Delivered-To``), which is where the witness looks for its tag.
Postfix needs root (master binds and drops to ``postfix``).
"""

from __future__ import annotations

import email
import email.policy
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tests.realservers.certs import PrivateCA, make_private_ca

DOMAIN = "evq.test"  # special-use (RFC 6761): evq needs EVQ_INTERNAL_DOMAINS for it
PUBLIC_DOMAIN = "example.net"  # served too, for tests that must not depend on that setting
REFUSED_LOCAL = "refused"
USERNAME = "evq"
PASSWORD = "Pf-s3cret-horse-staple-42"  # a known secret the tests hunt for in outputs
RECIPIENT_LIMIT = 2
HOSTNAME = "mx.evq.test"
JOURNAL = f"journal@{DOMAIN}"  # delivered to mail/journal/ (the SMTP witness's mailbox)

_MASTER = """\
{plain}  inet n - n - - smtpd
{smtps}  inet n - n - - smtpd
  -o smtpd_tls_wrappermode=yes
{limited}  inet n - n - - smtpd
  -o smtpd_recipient_limit={limit}
{ccert}  inet n - n - - smtpd
  -o smtpd_tls_security_level=encrypt
  -o smtpd_tls_req_ccert=yes
pickup    unix  n - n 60 1 pickup
cleanup   unix  n - n - 0 cleanup
qmgr      unix  n - n 300 1 qmgr
tlsmgr    unix  - - n 1000? 1 tlsmgr
rewrite   unix  - - n - - trivial-rewrite
bounce    unix  - - n - 0 bounce
defer     unix  - - n - 0 bounce
trace     unix  - - n - 0 bounce
verify    unix  - - n - 1 verify
flush     unix  n - n 1000? 0 flush
proxymap  unix  - - n - - proxymap
showq     unix  n - n - - showq
error     unix  - - n - - error
retry     unix  - - n - - error
discard   unix  - - n - - discard
virtual   unix  - n n - - virtual
anvil     unix  - - n - 1 anvil
scache    unix  - - n - 1 scache
postlog   unix-dgram n - n - 1 postlogd
"""

_MAIN = """\
compatibility_level = 3.6
queue_directory = {d}/queue
data_directory = {d}/data
maillog_file = {d}/maillog
maillog_file_prefixes = {d}
mail_owner = postfix
setgid_group = postdrop
inet_interfaces = 127.0.0.1
inet_protocols = ipv4
myhostname = {hostname}
mydomain = {domain}
mydestination =
mynetworks =
relay_domains =
alias_maps =
alias_database =
local_recipient_maps =
biff = no
default_transport = discard
notify_classes =
virtual_mailbox_domains = {domain}, {public_domain}
virtual_mailbox_base = {d}/mail
virtual_mailbox_maps = regexp:{d}/etc/mailboxes
recipient_delimiter = +
virtual_uid_maps = static:{uid}
virtual_gid_maps = static:{gid}
virtual_minimum_uid = 1
smtpd_helo_required = yes
smtpd_helo_restrictions = reject_non_fqdn_helo_hostname
smtpd_recipient_restrictions = check_recipient_access regexp:{d}/etc/refuse, reject_unauth_destination
smtpd_relay_restrictions =
smtpd_sasl_auth_enable = yes
smtpd_sasl_type = cyrus
smtpd_sasl_path = smtpd
cyrus_sasl_config_path = {d}/etc/sasl
smtpd_tls_auth_only = no
smtpd_tls_security_level = may
smtpd_tls_chain_files = {server_key}, {server_cert}
smtpd_tls_CAfile = {ca_file}
smtpd_tls_loglevel = 1
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Postfix:
    # Not pytest's tmp_path: its parents are 0700, and Postfix's daemons, running as
    # the postfix user, must reach their queue and data directories.
    root: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="evq-postfix-")))
    ca: PrivateCA = field(init=False)
    ports: dict[str, int] = field(default_factory=dict)

    @property
    def config_dir(self) -> Path:
        return self.root / "etc"

    @property
    def maillog(self) -> Path:
        return self.root / "maillog"

    def start(self) -> None:
        postfix = shutil.which("postfix", path="/usr/sbin:/usr/bin:/sbin")
        if postfix is None:
            raise RuntimeError("postfix is not installed")
        d = self.root
        d.chmod(0o755)
        for sub in ("etc/sasl", "queue", "data", "mail", "tls"):
            (d / sub).mkdir(parents=True, exist_ok=True)
        self.ca = make_private_ca(d / "tls")
        user = pwd.getpwnam("postfix")
        for path in (self.ca.server_key,):
            os.chown(path, 0, user.pw_gid)
            os.chmod(path, 0o640)
        os.chown(d / "data", user.pw_uid, user.pw_gid)
        os.chown(d / "mail", user.pw_uid, user.pw_gid)
        self.ports = {name: _free_port() for name in ("plain", "smtps", "limited", "ccert")}
        (d / "etc/master.cf").write_text(
            _MASTER.format(limit=RECIPIENT_LIMIT, **{k: f"127.0.0.1:{v}" for k, v in self.ports.items()})
        )
        (d / "etc/main.cf").write_text(
            _MAIN.format(
                d=d,
                hostname=HOSTNAME,
                domain=DOMAIN,
                public_domain=PUBLIC_DOMAIN,
                uid=user.pw_uid,
                gid=user.pw_gid,
                server_key=self.ca.server_key,
                server_cert=self.ca.server_cert,
                ca_file=self.ca.ca_file,
            )
        )
        # The journal and each of its +subaddresses (evq's tagged journal recipients) share a maildir.
        local, domain = JOURNAL.split("@")
        (d / "etc/mailboxes").write_text(f"/^{local}(\\+[^@]*)?@{domain.replace('.', '[.]')}$/ journal/\n/./ inbox/\n")
        (d / "etc/refuse").write_text(f"/^{REFUSED_LOCAL}(\\+[^@]*)?@/ 550 5.1.1 no such user here\n")
        sasldb = d / "etc/sasldb2"
        (d / "etc/sasl/smtpd.conf").write_text(
            f"pwcheck_method: auxprop\nauxprop_plugin: sasldb\nmech_list: PLAIN LOGIN\nsasldb_path: {sasldb}\n"
        )
        # The realm is the server's name, so the client logs in as the bare user name.
        subprocess.run(
            ["saslpasswd2", "-c", "-p", "-f", str(sasldb), "-u", HOSTNAME, USERNAME],
            input=PASSWORD.encode(),
            check=True,
            capture_output=True,
        )
        os.chown(sasldb, 0, user.pw_gid)
        os.chmod(sasldb, 0o640)
        done = subprocess.run([postfix, "-c", str(self.config_dir), "start"], capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"postfix did not start: {done.stderr}{self._log_tail()}")
        until = time.monotonic() + 30
        while not all(self._listening(p) for p in self.ports.values()):
            if time.monotonic() > until:
                self.stop()
                raise RuntimeError(f"postfix does not listen on {self.ports}{self._log_tail()}")
            time.sleep(0.05)

    def stop(self) -> None:
        subprocess.run(["postfix", "-c", str(self.config_dir), "stop"], capture_output=True)
        # master waits for its children; a test run must not leave an instance behind.
        pid_file = self.root / "queue/pid/master.pid"
        until = time.monotonic() + 15
        while pid_file.exists() and time.monotonic() < until:
            try:
                os.kill(int(pid_file.read_text().split()[0]), 0)
            except (ProcessLookupError, ValueError, IndexError):
                break
            time.sleep(0.05)
        shutil.rmtree(self.root, ignore_errors=True)

    def _listening(self, port: int) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return True
        except OSError:
            return False

    def _log_tail(self) -> str:
        try:
            return "\n" + "\n".join(self.maillog.read_text(errors="replace").splitlines()[-15:])
        except OSError:
            return ""

    # -- what the server saw ----------------------------------------------------

    def log(self) -> str:
        return self.maillog.read_text(errors="replace") if self.maillog.exists() else ""

    def messages(self, mailbox: str = "inbox") -> list[email.message.EmailMessage]:
        out = []
        # A reader of the maildir (the journal's IMAP server) may have moved them to cur/.
        for sub in ("new", "cur"):
            folder = self.root / "mail" / mailbox / sub
            if folder.is_dir():
                for path in sorted(folder.iterdir()):
                    out.append(email.message_from_bytes(path.read_bytes(), policy=email.policy.default))
        return out

    def journaled_raw(self, needle: bytes, *, expect: int, timeout: float = 20.0) -> list[Path]:
        """The journal's message files whose bytes hold ``needle``, once ``expect`` are there."""
        until = time.monotonic() + timeout
        while True:
            found = [
                path
                for sub in ("new", "cur")
                if (self.root / "mail/journal" / sub).is_dir()
                for path in sorted((self.root / "mail/journal" / sub).iterdir())
                if needle in path.read_bytes()
            ]
            if len(found) >= expect or time.monotonic() > until:
                return found
            time.sleep(0.05)

    def journaled(self, message_id: str, *, expect: int, timeout: float = 20.0) -> list[email.message.EmailMessage]:
        """The journal's copies of one Message-ID, once ``expect`` of them have arrived."""
        until = time.monotonic() + timeout
        while True:
            found = [m for m in self.messages("journal") if m["Message-ID"] == message_id]
            if len(found) >= expect or time.monotonic() > until:
                return found
            time.sleep(0.05)

    def delivered(self, message_id: str, *, expect: int, timeout: float = 20.0) -> list[email.message.EmailMessage]:
        """The deliveries of one Message-ID, once ``expect`` of them have arrived (delivery
        is asynchronous: qmgr hands accepted mail to the virtual agent). Returns what is
        there when the time is up, so a test asserting a count sees the real number."""
        return self.delivered_where(lambda m: m["Message-ID"] == message_id, expect=expect, timeout=timeout)

    def delivered_where(
        self, match: Callable[[email.message.EmailMessage], bool], *, expect: int, timeout: float = 20.0
    ) -> list[email.message.EmailMessage]:
        until = time.monotonic() + timeout
        while True:
            found = [m for m in self.messages() if match(m)]
            if len(found) >= expect or time.monotonic() > until:
                return found
            time.sleep(0.05)

    def log_lines(self) -> list[str]:
        return self.log().splitlines()

    def wait_log(
        self, match: Callable[[str], bool], *, after: int = 0, expect: int = 1, timeout: float = 10.0
    ) -> list[str]:
        """Log lines from line ``after`` on that match, once ``expect`` of them are there.

        Postfix's daemons log through postlogd over a datagram socket, so a line may land a
        moment after the SMTP reply it belongs to. Returns what is there when the time is up."""
        until = time.monotonic() + timeout
        while True:
            found = [line for line in self.log_lines()[after:] if match(line)]
            if len(found) >= expect or time.monotonic() > until:
                return found
            time.sleep(0.05)

    def sessions_for(self, message_id: str, *, expect: int = 0) -> list[str]:
        """The cleanup log lines of each message Postfix queued with this Message-ID
        (waiting for ``expect`` of them)."""
        return self.wait_log(
            lambda line: "/cleanup[" in line and f"message-id={message_id}" in line,
            expect=expect,
            timeout=10.0 if expect else 0.0,
        )
