"""`evq serve` and `evq mcp` refuse to start with a clear error, in the contract's shape."""

from __future__ import annotations

import socket

from tests.acceptance.conftest import Evq


def test_serve_and_mcp_refuse_a_database_without_the_schema(empty_db_url):
    evq = Evq(empty_db_url)
    assert evq.json("serve", "--port", "0", expect=5)["error"]["code"] == "E_SCHEMA_MISMATCH"
    assert evq.json("mcp", expect=5)["error"]["code"] == "E_SCHEMA_MISMATCH"


def test_serve_names_a_taken_port(db_url):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        out = Evq(db_url).json("serve", "--port", str(port), expect=2)
    assert out["error"]["code"] == "E_INVALID_ARG" and str(port) in out["error"]["message"]
