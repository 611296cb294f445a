"""The documentation is a site (mkdocs.yml, docs/) that builds strictly: a link to a page or an anchor
that does not exist, or a page the nav leaves out, fails here, and so in CI (issue 33)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]


def _build(project: Path, site: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        # Not --quiet: it hides the warnings that --strict counts, and the build passes whatever is broken.
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(project / "mkdocs.yml"), "-d", str(site)],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _nav_pages(nav: list) -> list[str]:
    pages: list[str] = []
    for entry in nav:
        for value in entry.values() if isinstance(entry, dict) else [entry]:
            pages += _nav_pages(value) if isinstance(value, list) else [value]
    return pages


def test_the_docs_site_builds_strictly_with_every_page_in_its_nav(tmp_path):
    done = _build(ROOT, tmp_path / "site")
    assert done.returncode == 0, done.stderr[-4000:]
    config = yaml.load((ROOT / "mkdocs.yml").read_text(), Loader=yaml.BaseLoader)
    pages = _nav_pages(config["nav"])
    on_disk = {
        os.path.relpath(os.path.join(folder, name), ROOT / "docs")
        for folder, _, names in os.walk(ROOT / "docs", followlinks=True)  # docs/cli-schema is a link
        for name in names
        if name.endswith(".md")
    }
    assert sorted(pages) == sorted(on_disk)
    for page in pages:
        # A folder's index.md or README.md is that folder's page; any other page gets a folder of its own.
        path = Path(page)
        folder = path.parent if path.name in ("index.md", "README.md") else path.with_suffix("")
        assert (tmp_path / "site" / folder / "index.html").is_file(), page


def test_a_broken_link_a_broken_anchor_or_a_page_left_out_fails_the_build(tmp_path):
    """The check above is a proof only if a broken site fails it: a copy of the docs with each fault."""
    project = tmp_path / "project"
    shutil.copytree(ROOT / "docs", project / "docs")  # the cli-schema link copied as its files
    shutil.copy(ROOT / "mkdocs.yml", project / "mkdocs.yml")
    index = project / "docs" / "index.md"
    index.write_text(index.read_text() + "\n[gone](no-such-page.md) [moved](guides/retention.md#no-such-section)\n")
    (project / "docs" / "left-out.md").write_text("# Left out of the nav\n")
    done = _build(project, tmp_path / "site")
    assert done.returncode != 0
    assert "no-such-page.md" in done.stderr and "#no-such-section" in done.stderr and "left-out.md" in done.stderr
