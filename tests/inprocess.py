"""`evq` run inside the test's own process, for commands that only read arguments and the
environment, talk to the database and print: the same ``main()`` the console script runs,
with stdin, stdout, stderr and the environment swapped for the call (click's CliRunner
isolation), and the process-wide state a command sets up (logging, registered secrets) put
back afterwards, so the next test starts as it would in a fresh process.

A child process costs about 0.3 s of CPU to start (Python, click, the store) and there are
hundreds of such calls in the suite; the result is the same CompletedProcess either way.
Whatever is about a process stays a real child: `worker`, `serve`, `mcp`, `demo`, `bench`
and `db` (signals, ports, children, exit under SIGTERM, alembic's own logging), and every
call a test makes with ``Evq(..., process=True)`` (tests/acceptance/test_contract.py runs
each command for real to prove stdout carries exactly one JSON object).
"""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
import traceback
from collections.abc import Mapping, Sequence

# The nouns whose commands are argument parsing, one store call and printing.
IN_PROCESS = frozenset({"enqueue", "steps", "runs", "keys", "providers", "schema", "prune"})


def can_run(args: Sequence[str]) -> bool:
    if not args or args[0] not in IN_PROCESS:
        return False
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return True
    return False  # an async test: the command's asyncio.run() cannot nest in its loop


def run(argv: list[str], args: Sequence[str], input: str | None, env: Mapping[str, str]) -> subprocess.CompletedProcess:
    import structlog
    from click.testing import CliRunner

    from evq.ops.cli import enqueue as cli_enqueue
    from evq.ops.cli import main
    from evq.worker import secret_scrub as scrub
    from tests.child import constants

    # Exactly ``env``, as a child would get it: variables it lacks are unset for the call.
    overrides: dict[str, str | None] = {k: None for k in os.environ if k not in env}
    overrides.update(env)
    root = logging.getLogger()
    saved = (
        structlog.get_config(),
        list(root.handlers),
        root.level,
        set(scrub._secrets),
        scrub._pattern,
        scrub._detect,
    )
    code: int
    # The warnings a process says once: a fresh process has said none.
    cli_enqueue._said.clear()
    try:
        # A documented constant the env names is handed to the settings as tests/child.py does.
        with CliRunner().isolation(input=input, env=overrides) as (out, err, _), constants(env):
            try:
                main(list(args))
                code = 0
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            except Exception:  # as an uncaught exception ends a child: traceback, exit 1
                sys.stderr.write(traceback.format_exc())
                code = 1
            sys.stdout.flush()
            sys.stderr.flush()
            stdout = out.getvalue().decode("utf-8", "replace")
            stderr = err.getvalue().decode("utf-8", "replace")
    finally:
        config, handlers, level, secrets, pattern, detect = saved
        structlog.configure(**config)
        root.handlers[:] = handlers
        root.setLevel(level)
        with scrub._lock:
            scrub._secrets.clear()
            scrub._secrets.update(secrets)
            scrub._detect = detect
            scrub._pattern = pattern
    return subprocess.CompletedProcess(argv, code, stdout, stderr)
