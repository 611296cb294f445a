"""The schema checks read the revisions from the files' text, not through Alembic (whose import
is most of a short command's start-up): what they read must be what Alembic walks."""

from __future__ import annotations

from alembic.script import ScriptDirectory

from evq.adapters.postgres.database import alembic_config, head_revision, revision_graph


def test_the_revision_graph_read_from_the_files_is_alembics():
    script = ScriptDirectory.from_config(alembic_config("postgresql://unused/x"))
    assert revision_graph() == {r.revision: r.down_revision for r in script.walk_revisions()}
    assert head_revision() == script.get_current_head()
