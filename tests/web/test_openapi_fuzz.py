"""schemathesis against /openapi.json, over real HTTP: whatever it sends, no 500, every
answer (status, content type, body) is one the document describes, and no operation answers
without the key."""

from __future__ import annotations

import os
import subprocess
import sys

import httpx
import psycopg
import pytest

from tests.acceptance.conftest import make_key
from tests.support import unknown_steps, with_store
from tests.web.support import serving

CHECKS = ",".join(
    (
        "not_a_server_error",
        "status_code_conformance",
        "content_type_conformance",
        "response_schema_conformance",
        "response_headers_conformance",
    )
)


@pytest.mark.slow
def test_schemathesis_finds_no_server_error_and_no_undocumented_answer(db_url, tmp_path):
    key = make_key(db_url, "fuzz", "admin", created_by=None)
    # Something to read back and to close: ids 1 and 2 exist, and run-1.
    with_store(db_url, lambda store: unknown_steps(store, 2))
    # A worker's heartbeat, fresh for longer than the run: GET /v1/health answers 200, healthy (with
    # no worker it answers 503, which this check counts as a server error whatever the document says).
    with psycopg.connect(db_url) as conn:
        conn.execute("INSERT INTO worker_heartbeats (owner, seen_at) VALUES ('fuzz', now() + interval '10 minutes')")
    # Known ids for the path parameters schemathesis cannot guess (a random run_id is always a 404).
    (tmp_path / "schemathesis.toml").write_text(
        '[[operations]]\ninclude-path = "/v1/runs/{run_id}"\nparameters = { "path.run_id" = "run-1" }\n'
    )
    with serving(db_url) as api:
        operations = sum(
            len(item)
            for item in httpx.get(f"{api.url}/openapi.json", headers={"Authorization": f"Bearer {key}"})
            .json()["paths"]
            .values()
        )
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "schemathesis.cli",
                "run",
                f"{api.url}/openapi.json",
                "--header",
                f"Authorization: Bearer {key}",
                "--checks",
                CHECKS,
                # Bounded so the suite stays quick; the seed keeps CI repeatable (EVQ_FUZZ_SEED for another).
                "--max-examples",
                "25",
                "--seed",
                os.environ.get("EVQ_FUZZ_SEED", "1"),
                "--report-dir",
                str(tmp_path),
            ],
            capture_output=True,
            text=True,
            timeout=600,
            cwd=tmp_path,
        )
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
    # Every operation the document lists was tested (none skipped as unreachable).
    assert f"Selected: {operations}/{operations}" in done.stdout, done.stdout[-3000:]
    assert f"Tested: {operations}" in done.stdout, done.stdout[-3000:]
    # A run's trace reached its success path too (not only 404s), so its 200 bodies were checked.
    missing = done.stdout.partition("Missing test data")[2].partition("💡")[0]  # the operations it lists
    assert "/v1/runs/" not in missing, done.stdout[-3000:]
