"""The `evq admin` group: the commands that run and look after an installation (the database
schema, the servers, the demo, the benchmark); each one's body is in its own module."""

from __future__ import annotations

from evq.ops.cli.table import table_group

admin = table_group("admin")
