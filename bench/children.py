"""The parent's side of the benchmark's worker processes: start them, wait until every one is
ready, tell them all to go at once, and collect each one's JSON line (bench/child.py is the
other side). Start-up is never timed; a child that hangs is killed, not waited for."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from evq.worker.errors import EvqError


@dataclass
class ChildResult:
    started: float  # wall clock, time.time(), when it was told to go
    finished: float
    rss_mb: float
    detail: dict[str, Any]


def child_environment() -> tuple[str, dict[str, str]]:
    """The folder to start a child in and its environment, such that the child imports the same
    `evq` as this process: the folder holding this process's evq package (a source checkout's
    root, or site-packages), first on the child's path. Nothing inside evq goes on the path: a
    folder like ops/ there would make its rooms (app, web, cli) top-level modules."""
    import evq

    home = str(Path(evq.__file__).resolve().parent.parent)
    path = [home, *(p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != home)]
    return home, {**os.environ, "PYTHONPATH": os.pathsep.join(path)}


class Child:
    """A worker process that prepares, says ready, runs on 'go', and reports one JSON line."""

    def __init__(self, spec: dict[str, Any], *, env: dict[str, str] | None = None):
        self.log = tempfile.NamedTemporaryFile(prefix="evq-bench-", suffix=".log", delete=False)
        cwd, default_env = child_environment()
        env = default_env if env is None else env
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "bench.child", json.dumps(spec)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
            cwd=cwd,
            env=env,
            text=True,
        )

    def wait_ready(self, timeout: float = 60) -> None:
        line = self._readline(timeout)
        if line.strip() != "ready":
            raise self._failed(f"did not become ready (said {line.strip()[:200]!r})")

    def go(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()

    def result(self, timeout: float = 600) -> ChildResult:
        line = self._readline(timeout)
        try:
            self.proc.wait(timeout=30)
            data = json.loads(line)
        except (ValueError, subprocess.TimeoutExpired):
            raise self._failed(f"gave no result (said {line.strip()[:200]!r})") from None
        if self.proc.returncode != 0:
            raise self._failed(f"exited {self.proc.returncode}")
        self._cleanup()
        return ChildResult(data["started"], data["finished"], data["rss_mb"], data.get("detail", {}))

    def stop(self) -> None:
        self.proc.terminate()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._cleanup()

    def _readline(self, timeout: float) -> str:
        """The next line of the protocol ('ready' or a JSON object); a library's chatter is skipped."""
        assert self.proc.stdout is not None
        # A stuck child must fail the benchmark, not hang it.
        timer = _Watchdog(timeout, self.proc.kill)
        try:
            while line := self.proc.stdout.readline():
                if line.strip() == "ready" or line.startswith("{"):
                    return line
            return ""
        finally:
            timer.cancel()

    def _failed(self, what: str) -> EvqError:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        tail = Path(self.log.name).read_text(errors="replace")[-2000:]
        self.kill()
        return EvqError(f"benchmark worker process {what}", context={"log_tail": tail})

    def _cleanup(self) -> None:
        self.log.close()
        Path(self.log.name).unlink(missing_ok=True)


class _Watchdog:
    def __init__(self, seconds: float, action: Callable[[], None]):
        self._timer = threading.Timer(seconds, action)
        self._timer.daemon = True
        self._timer.start()

    def cancel(self) -> None:
        self._timer.cancel()


def run_children(specs: Sequence[dict[str, Any]]) -> list[ChildResult]:
    """Start every child, wait until all are ready, start them together, collect."""
    children = [Child(spec) for spec in specs]
    try:
        for child in children:
            child.wait_ready()
        for child in children:
            child.go()
        return [child.result() for child in children]
    finally:
        for child in children:
            child.kill()


def span(results: Sequence[ChildResult]) -> float:
    """Seconds from the first child's go to the last child's finish."""
    return max(r.finished for r in results) - min(r.started for r in results)


def evq_worker_spec(
    url: str,
    *,
    concurrency: int,
    batch_size: int,
    delay: float = 0.0,
    listen: str = "off",
    poll_interval: float = 1.0,
    drain: bool = True,
) -> dict[str, Any]:
    return {
        "kind": "evq",
        "url": url,
        "drain": drain,
        "settings": {
            "adapter": "null",
            "null_delay": delay,
            "concurrency": concurrency,
            "batch_size": batch_size,
            "listen": listen,
            "poll_interval": poll_interval,
            "log_format": "json",
        },
    }
