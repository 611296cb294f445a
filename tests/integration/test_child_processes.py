"""Children the tests start can always be stopped, however the suite itself was launched.

A suite started in the background (`pytest &`, `nohup`, some CI runners) inherits SIGINT as
ignored, and an ignored signal stays ignored across exec: a child started with a plain
``subprocess.Popen`` then shrugs off the SIGINT a test sends it, outlives the test, and its
unread pipe fails some later test under ``filterwarnings = error``. These tests put the pytest
process in exactly that state and start real children.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
from collections.abc import Iterator

from tests.support import spawn, stop

SLEEPER = [sys.executable, "-c", "import sys, time; print('up', flush=True); time.sleep(600)"]


@contextlib.contextmanager
def launched_in_background() -> Iterator[None]:
    """SIGINT ignored in this process while the block runs, as under `pytest &`."""
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def test_a_plain_popen_child_inherits_sigint_ignored() -> None:
    """The fault itself: without spawn() the child's SIGINT disposition is SIG_IGN."""
    probe = [sys.executable, "-c", "import signal; print(signal.getsignal(signal.SIGINT) is signal.SIG_IGN)"]
    with launched_in_background():
        plain = subprocess.run(probe, capture_output=True, text=True, timeout=60)
        child = spawn(probe, stdout=subprocess.PIPE, text=True)
    out, _ = child.communicate(timeout=60)
    assert plain.stdout.strip() == "True"
    assert out.strip() == "False"


def test_a_spawned_devsmtp_stops_on_sigint_even_when_the_suite_ignores_it() -> None:
    with launched_in_background():
        proc = spawn(
            [sys.executable, "-m", "evq.ops.dev.smtp", "--host", "127.0.0.1", "--port", "0"],
            stderr=subprocess.PIPE,
            text=True,
        )
    try:
        assert proc.stderr is not None
        assert "127.0.0.1:" in proc.stderr.readline()  # listening, its Ctrl-C handler in place
    finally:
        code = stop(proc, signal.SIGINT, grace=30)
    assert code == 0
    assert proc.stderr.closed


def test_a_child_that_ignores_the_signal_is_killed_and_its_pipes_closed() -> None:
    """A child that ignores SIGINT itself (or hangs on shutdown) still ends: SIGKILL after the grace."""
    stubborn = [
        sys.executable,
        "-c",
        "import signal, time; signal.signal(signal.SIGINT, signal.SIG_IGN); print('up', flush=True); time.sleep(600)",
    ]
    proc = spawn(stubborn, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline() == "up\n"
    assert stop(proc, signal.SIGINT, grace=0.5) == -signal.SIGKILL
    assert proc.stdin.closed and proc.stdout.closed and proc.stderr.closed


def test_stopping_a_child_that_already_exited_only_closes_its_pipes() -> None:
    proc = spawn([sys.executable, "-c", "print('done')"], stdout=subprocess.PIPE, text=True)
    proc.wait(timeout=60)
    assert stop(proc) == 0
    assert proc.stdout.closed


def test_sigterm_stops_a_spawned_child_started_with_sigterm_ignored_by_the_parent() -> None:
    previous = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        proc = spawn(SLEEPER, stdout=subprocess.PIPE, text=True)
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert proc.stdout is not None and proc.stdout.readline() == "up\n"
    assert stop(proc, grace=30) == -signal.SIGTERM
