"""`python -m evq.verify BUNDLE --key KEY` as an outsider runs it: a real subprocess with no
EVQ_* variable and no database, and evq/verify.py copied alone into an empty folder."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from evq.verify import Verifier
from evq.worker.evidence_log import Signer, dumps, generate_key, sign_checkpoint
from tests.unit.test_verify import make_log

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def log():
    skey, vkey = generate_key("log.example/evq")
    other_skey, other_vkey = generate_key("log.example/evq")
    made, tree = make_log(Signer(skey))
    return made, tree, vkey, Signer(other_skey), other_vkey


def _clean_env(home: Path) -> dict[str, str]:
    # Only what finds Python and this checkout: no EVQ_*, no database URL, no PG* variable.
    return {"PATH": os.environ["PATH"], "PYTHONPATH": str(ROOT), "HOME": str(home)}


def _verify(tmp_path: Path, made, key: str, *extra: str) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "bundle.json"
    path.write_text(dumps(made) if isinstance(made, dict) else made)
    return subprocess.run(
        [sys.executable, "-m", "evq.verify", str(path), "--key", key, *extra],
        capture_output=True,
        text=True,
        timeout=60,
        env=_clean_env(tmp_path),
        cwd=tmp_path,
    )


def test_a_good_bundle_verifies(tmp_path, log):
    made, _, vkey, _, _ = log
    done = _verify(tmp_path, made, vkey)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("checkpoint: OK: 5 leaves, root ")
    assert lines[1] == "entry 1 (leaf 1, evidence row): OK: the row is in the log"
    assert (
        lines[2] == "entry 2 (leaf 2, content pruned): OK: a leaf with this hash is in the log; its content was pruned"
    )
    assert lines[3] == "entry 3 (leaf 4, evidence row): OK: the row is in the log"
    assert lines[4] == "consistency: OK: the log at 5 leaves extends the log at 2"
    assert lines[5] == "VERIFIED: 3 entries in log log.example/evq at 5 leaves"


def test_the_key_may_be_a_file(tmp_path, log):
    made, _, vkey, _, _ = log
    (tmp_path / "log.pub").write_text(vkey + "\n")
    assert _verify(tmp_path, made, str(tmp_path / "log.pub")).returncode == 0


def test_a_tampered_row_is_refused(tmp_path, log):
    made, _, vkey, _, _ = log
    tampered = json.loads(json.dumps(made))
    tampered["entries"][2]["row"]["note"] = "checked twice"
    done = _verify(tmp_path, tampered, vkey)
    assert done.returncode == 1
    assert (
        "entry 3 (leaf 4, evidence row): FAILED: the leaf and its inclusion proof do not lead to the tree's root"
        in done.stdout
    )
    assert "entry 1 (leaf 1, evidence row): OK" in done.stdout
    assert done.stdout.splitlines()[-1] == "NOT VERIFIED: 1 of 5 checks failed"


def test_a_tampered_proof_is_refused(tmp_path, log):
    made, _, vkey, _, _ = log
    tampered = json.loads(json.dumps(made))
    tampered["entries"][0]["proof"][1] = tampered["entries"][0]["proof"][0]
    done = _verify(tmp_path, tampered, vkey)
    assert done.returncode == 1 and "entry 1 (leaf 1, evidence row): FAILED" in done.stdout


def test_a_checkpoint_signed_by_another_key_is_refused(tmp_path, log):
    made, tree, vkey, other, _ = log
    forged = dict(made, checkpoint=sign_checkpoint(other, tree.size, tree.root()))
    done = _verify(tmp_path, forged, vkey)
    assert done.returncode == 1
    assert f"checkpoint: FAILED: the note is not signed by {Verifier(vkey).id} (it is signed by" in done.stdout
    assert (
        "entry 1 (leaf 1, evidence row): FAILED: not checked: the bundle has no checkpoint signed by the key"
        in done.stdout
    )


def test_a_wrong_key_is_refused(tmp_path, log):
    made, _, _, _, other_vkey = log
    done = _verify(tmp_path, made, other_vkey)
    assert done.returncode == 1
    assert f"checkpoint: FAILED: the note is not signed by {Verifier(other_vkey).id}" in done.stdout


@pytest.mark.parametrize(
    ("key", "bundle", "message"),
    [
        ("not-a-key", None, "cannot check: not a verifier key"),
        ("VKEY", "missing.json", "cannot check: [Errno 2] No such file or directory"),
    ],
)
def test_what_cannot_be_checked_exits_2(tmp_path, log, key, bundle, message):
    made, _, vkey, _, _ = log
    (tmp_path / "bundle.json").write_text(dumps(made))
    done = subprocess.run(
        [sys.executable, "-m", "evq.verify", bundle or "bundle.json", "--key", vkey if key == "VKEY" else key],
        capture_output=True,
        text=True,
        timeout=60,
        env=_clean_env(tmp_path),
        cwd=tmp_path,
    )
    assert done.returncode == 2 and done.stderr.startswith(message), done.stderr


def test_help_documents_the_exit_codes(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "evq.verify", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        env=_clean_env(tmp_path),
    )
    assert done.returncode == 0
    assert "0  everything in the bundle verifies" in done.stdout and "\n  2  the command could not check" in done.stdout


def test_the_module_runs_alone_outside_evq(tmp_path, log):
    """A third party copies evq/verify.py and nothing else; -I ignores PYTHONPATH and the user's site."""
    made, _, vkey, _, _ = log
    alone = tmp_path / "alone"
    alone.mkdir()
    shutil.copy(ROOT / "evq" / "verify.py", alone / "verify.py")
    (alone / "bundle.json").write_text(dumps(made))
    done = subprocess.run(
        [sys.executable, "-I", "verify.py", "bundle.json", "--key", vkey],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": os.environ["PATH"], "HOME": str(tmp_path)},
        cwd=alone,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines()[-1].startswith("VERIFIED: 3 entries")


def test_the_verifier_imports_only_the_standard_library_and_cryptography():
    import ast

    tree = ast.parse((ROOT / "evq" / "verify.py").read_text())
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, "a relative import"
            imported.add((node.module or "").split(".")[0])
    assert imported - set(sys.stdlib_module_names) == {"cryptography"}
