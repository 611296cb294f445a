"""Issue 13: `evq enqueue --file /dev/zero` (or any endless or huge stdin) read until memory ran out;
every read of request input is now bounded by EVQ_MAX_INPUT_BYTES and refused beyond it with
E_INVALID_ARG naming the limit. Driven for real: the CLI as a subprocess under an address-space
limit, reading the real /dev/zero. (`evq mcp`'s lines: tests/web/test_mcp_wire.py; HTTP bodies
have EVQ_SERVE_MAX_BODY: tests/web/test_http_api.py.)"""

from __future__ import annotations

import json
import resource
import subprocess

import pytest

from tests import contract
from tests.acceptance.conftest import Evq
from tests.support import request, rows

# Far more than evq needs to start and read its 64 MiB, far less than reading /dev/zero until
# the kernel says no: without a bound the command dies of MemoryError (E_INTERNAL) here.
ADDRESS_SPACE = 1 << 30
DEFAULT_LIMIT = 64 * 1024 * 1024


def _address_space_limit() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))


def _nothing_written(db_url: str) -> None:
    assert rows(db_url, "SELECT count(*)::int AS n FROM steps_now") == [{"n": 0}]


@pytest.mark.parametrize("source", ["file", "stdin"])
def test_enqueue_from_dev_zero_is_refused_naming_the_limit_within_bounded_memory(db_url, admin_key, source):
    evq = Evq(db_url, api_key=admin_key)
    args = ("enqueue", "--file", "/dev/zero" if source == "file" else "-", "-o", "json")
    with open("/dev/zero", "rb") as zero:
        done = subprocess.run(
            evq.cmd(*args),
            stdin=zero if source == "stdin" else subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=120,
            env=evq.env,
            preexec_fn=_address_space_limit,
        )
    assert done.returncode == 2, (done.returncode, done.stdout[-500:], done.stderr[-2000:])
    out = json.loads(done.stdout)
    contract.check(args[:-2], out)
    assert out["error"]["code"] == "E_INVALID_ARG"
    field = out["error"]["context"]["fields"][0]
    assert field["field"] == "--file"
    assert str(DEFAULT_LIMIT) in field["message"] and "EVQ_MAX_INPUT_BYTES" in field["message"], field
    _nothing_written(db_url)


def test_json_lines_over_the_limit_are_refused_whole_and_under_it_enqueued(db_url, admin_key, tmp_path):
    evq = Evq(db_url, api_key=admin_key, EVQ_MAX_INPUT_BYTES="4096")
    many = tmp_path / "many.jsonl"
    many.write_text("".join(json.dumps(request(run_id="bound", step_id=f"s{i}")) + "\n" for i in range(20)))
    assert many.stat().st_size > 4096
    out = evq.json("enqueue", "--file", str(many), expect=2)
    assert "4096 bytes" in out["error"]["context"]["fields"][0]["message"], out
    _nothing_written(db_url)
    few = tmp_path / "few.jsonl"
    few.write_text("".join(json.dumps(request(run_id="bound", step_id=f"s{i}")) + "\n" for i in range(2)))
    evq.json("enqueue", "--file", str(few))
    assert rows(db_url, "SELECT count(*)::int AS n FROM steps_now") == [{"n": 2}]
