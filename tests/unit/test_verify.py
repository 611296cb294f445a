"""The evidence log's formats: proofs for any tree (hypothesis), checkpoints, leaf encoding v1,
and proof bundles made by worker/evidence_log.py and checked by evq/verify.py."""

from __future__ import annotations

import base64
import datetime
import hashlib
import json
import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from evq.verify import (
    EMPTY_ROOT,
    Checkpoint,
    Verifier,
    VerifyError,
    encode_leaf,
    leaf_hash,
    parse_checkpoint,
    verify_bundle,
    verify_checkpoint,
    verify_consistency,
    verify_consistency_proof,
    verify_inclusion,
)
from evq.worker.evidence_log import (
    MemoryTree,
    Signer,
    bundle,
    dumps,
    entry,
    generate_key,
    json_value,
    pruned_entry,
    row_leaf,
    sign_checkpoint,
    sign_note,
)

_TREES: dict[int, MemoryTree] = {}


def _tree(size: int) -> MemoryTree:
    """One tree of ``size`` leaves per size, each leaf the hash of its index."""
    if size not in _TREES:
        _TREES[size] = MemoryTree(leaf_hash(i.to_bytes(8, "big")) for i in range(size))
    return _TREES[size]


def _flip(data: bytes, bit: int) -> bytes:
    out = bytearray(data)
    out[bit // 8 % len(out)] ^= 1 << bit % 8
    return bytes(out)


# --- Any proof the producer makes verifies; any one-bit change fails ------------------------


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 300).flatmap(lambda n: st.tuples(st.just(n), st.integers(0, n - 1))), st.data())
def test_an_inclusion_proof_verifies_and_any_one_bit_change_fails(size_index, data):
    size, index = size_index
    tree = _tree(size)
    leaf, root, proof = tree.node(0, index), tree.root(), tree.inclusion_proof(index)
    verify_inclusion(leaf, index, size, proof, root)
    # One bit of the leaf, of the root or of one hash of the proof.
    parts = [leaf, root, *proof]
    which = data.draw(st.integers(0, len(parts) - 1))
    parts[which] = _flip(parts[which], data.draw(st.integers(0, 255)))
    with pytest.raises(VerifyError):
        verify_inclusion(parts[0], index, size, parts[2:], parts[1])
    # One bit of the index. (Not of the size: trees whose paths to a leaf have the same shape
    # take the same proof, so the size is bound by the signed checkpoint, not by the proof.)
    with pytest.raises(VerifyError):
        verify_inclusion(leaf, index ^ (1 << data.draw(st.integers(0, 9))), size, proof, root)


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 300).flatmap(lambda n: st.tuples(st.integers(1, n), st.just(n))), st.data())
def test_a_consistency_proof_verifies_and_any_one_bit_change_fails(sizes, data):
    old, new = sizes
    tree = _tree(new)
    root1, root2, proof = tree.root(old), tree.root(new), tree.consistency_proof(old, new)
    verify_consistency_proof(old, new, proof, root1, root2)
    parts = [root1, root2, *proof]
    which = data.draw(st.integers(0, len(parts) - 1))
    parts[which] = _flip(parts[which], data.draw(st.integers(0, 255)))
    with pytest.raises(VerifyError):
        verify_consistency_proof(old, new, parts[2:], parts[0], parts[1])


def test_the_frontier_stores_every_complete_subtree_once():
    tree = _tree(300)
    # 300 leaves: level l holds floor(300 / 2**l) complete subtrees.
    assert len(tree.nodes) == sum(300 >> level for level in range(9))
    assert tree.node(8, 0) == tree.root(256)


# --- Checkpoints ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def keys():
    skey, vkey = generate_key("log.example/evq")
    other_skey, other_vkey = generate_key("log.example/evq")  # the same name, another key
    return Signer(skey), vkey, Signer(other_skey), other_vkey


def test_a_checkpoint_round_trips_in_the_c2sp_format(keys):
    signer, vkey, _, _ = keys
    root = hashlib.sha256(b"root").digest()
    note = sign_checkpoint(signer, 42, root)
    text = f"log.example/evq\n42\n{base64.b64encode(root).decode()}\n"
    assert note.startswith(text + "\n\u2014 log.example/evq ")
    assert verify_checkpoint(note, vkey) == Checkpoint("log.example/evq", 42, root)
    with_ext = sign_checkpoint(signer, 0, EMPTY_ROOT, ["time 1700000000"])
    assert verify_checkpoint(with_ext, vkey).extensions == ("time 1700000000",)


def test_a_checkpoint_is_refused_unless_its_key_signed_it_unchanged(keys):
    signer, vkey, other, other_vkey = keys
    root = hashlib.sha256(b"root").digest()
    note = sign_checkpoint(signer, 42, root)
    forged = sign_checkpoint(other, 42, root)  # another key under the same name
    assert Verifier(vkey).key_hash != Verifier(other_vkey).key_hash
    with pytest.raises(VerifyError, match="not signed by"):
        verify_checkpoint(forged, vkey)
    with pytest.raises(VerifyError, match="does not verify"):
        verify_checkpoint(note.replace("\n42\n", "\n43\n"), vkey)
    with pytest.raises(VerifyError, match="malformed note"):
        verify_checkpoint(note + "trailing garbage\n", vkey)
    with pytest.raises(VerifyError, match="malformed note"):
        verify_checkpoint(note + "\n", vkey)
    # A signature by an unknown key beside the known one is ignored, as the spec says.
    both = note + forged.split("\n\n", 1)[1]
    assert verify_checkpoint(both, vkey).size == 42
    # Another log's name under the same key.
    renamed = sign_note(Checkpoint("other.example/log", 42, root).text(), signer)
    with pytest.raises(VerifyError, match=r"for log 'other\.example/log'"):
        verify_checkpoint(renamed, vkey)


@pytest.mark.parametrize(
    "text",
    [
        "log\n01\nAAAA\n",
        "log\n+1\n" + base64.b64encode(EMPTY_ROOT).decode() + "\n",
        "log\n\uff11\n" + base64.b64encode(EMPTY_ROOT).decode() + "\n",
        "log\n1\n" + base64.b64encode(b"short").decode() + "\n",
        "log\n1\n" + base64.b64encode(EMPTY_ROOT).decode().rstrip("=") + "\n",
        "log\n1\n" + base64.b64encode(EMPTY_ROOT).decode() + "\n\nextension after a blank line\n",
        "log\n1\n",
        "\n1\n" + base64.b64encode(EMPTY_ROOT).decode() + "\n",
    ],
)
def test_malformed_checkpoint_text_is_refused(text):
    with pytest.raises(VerifyError, match=r"malformed checkpoint|base64"):
        parse_checkpoint(text)


def test_consistency_between_two_signed_checkpoints(keys):
    signer, vkey, other, _ = keys
    tree = _tree(20)
    old, new = sign_checkpoint(signer, 7, tree.root(7)), sign_checkpoint(signer, 20, tree.root(20))
    first, second = verify_consistency(old, new, tree.consistency_proof(7, 20), vkey)
    assert (first.size, second.size) == (7, 20)
    with pytest.raises(VerifyError):
        verify_consistency(new, old, tree.consistency_proof(7, 20), vkey)  # history cannot shrink
    rewritten = sign_checkpoint(signer, 20, _tree(21).root(20)[::-1])  # a root that does not extend the old one
    with pytest.raises(VerifyError):
        verify_consistency(old, rewritten, tree.consistency_proof(7, 20), vkey)
    with pytest.raises(VerifyError, match="not signed by"):
        verify_consistency(sign_checkpoint(other, 7, tree.root(7)), new, tree.consistency_proof(7, 20), vkey)
    empty = sign_checkpoint(signer, 0, EMPTY_ROOT)
    assert verify_consistency(empty, new, [], vkey)[0].size == 0


# --- Leaf encoding v1 ----------------------------------------------------------------------

ROW = {
    "id": 9007199254740993,  # above 2**53: written exactly
    "step_id": 42,
    "kind": "provider_response",
    "detail": {"b": [1, 2.5, None], "a": "caf\u00e9"},
    "ok": True,
    "note": None,
    "latency_ms": 12.0,
    "at": datetime.datetime(2024, 5, 1, 14, 34, 56, 789, tzinfo=datetime.timezone(datetime.timedelta(hours=2))),
    "lease_token": uuid.UUID("12345678-9abc-def0-1234-56789abcdef0"),
    "raw": b"\x00\xffsig",
    "reasons": ("a", "b"),
}


def test_leaf_encoding_v1_is_exactly_what_the_docs_say():
    want = (
        b"\x01"
        + '{"row":{"at":"2024-05-01T12:34:56.000789Z","detail":{"a":"caf\u00e9","b":[1,2.5,null]},'
        '"id":9007199254740993,"kind":"provider_response","latency_ms":12,"lease_token":'
        '"12345678-9abc-def0-1234-56789abcdef0","note":null,"ok":true,"raw":"AP9zaWc=",'
        '"reasons":["a","b"],"step_id":42},"table":"evidence"}'.encode()
    )
    assert row_leaf("evidence", ROW) == want
    # The verifier recomputes it from the row as a bundle carries it (JSON, read back).
    carried = json.loads(json.dumps(entry("evidence", ROW, 0, [])["row"]))
    assert encode_leaf("evidence", carried) == want


def test_leaf_encoding_tells_rows_apart():
    base = {"id": 1, "v": "1"}
    leaves = {
        encode_leaf("evidence", base),
        encode_leaf("decisions", base),
        encode_leaf("evidence", {"id": 1, "v": 1}),
        encode_leaf("evidence", {"id": 1, "v": None}),
        encode_leaf("evidence", {"id": 1}),
        encode_leaf("evidence", {"id": 1, "v": "1", "w": None}),
        encode_leaf("evidence", {"id": 1, "v": ["1"]}),
        encode_leaf("evidence", {"id": 1, "v": {"1": None}}),
        encode_leaf("evidence", {"id": 1, "v": True}),
    }
    assert len(leaves) == 9


@pytest.mark.parametrize(
    "value",
    [
        datetime.datetime(2024, 5, 1, 12, 0),  # no time zone: no instant
        datetime.date(2024, 5, 1),
        object(),
        {1: "not a string key"},
    ],
)
def test_values_without_a_v1_form_are_refused(value):
    with pytest.raises(TypeError):
        json_value(value)


@pytest.mark.parametrize("table", ["", "Evidence", "evidence\n", "a-b", 'x"y', "x" * 64])
def test_a_table_name_is_a_lowercase_sql_identifier(table):
    with pytest.raises(VerifyError):
        encode_leaf(table, {"id": 1})


def test_rows_with_numbers_or_strings_json_cannot_carry_are_refused():
    for row in ({"x": float("nan")}, {"x": float("inf")}, {"x": "\ud800"}):
        with pytest.raises(VerifyError):
            encode_leaf("evidence", row)


def test_a_timestamp_is_rfc3339_utc_with_microseconds():
    from evq.worker.evidence_log import timestamp

    utc = datetime.UTC
    assert timestamp(datetime.datetime(1, 1, 1, tzinfo=utc)) == "0001-01-01T00:00:00.000000Z"
    assert timestamp(datetime.datetime(2024, 2, 29, 23, 59, 59, 999999, tzinfo=utc)) == "2024-02-29T23:59:59.999999Z"


# --- Bundles -------------------------------------------------------------------------------

ROWS = [
    ("decisions", {"id": 1, "run_id": "r1", "step_id": "s1", "rationale": {"why": "welcome"}}),
    ("evidence", {"id": 1, "step_id": 7, "kind": "attempt_started", "at": "2024-05-01T12:00:00.000000Z"}),
    ("evidence", {"id": 2, "step_id": 7, "kind": "provider_response", "latency_ms": 3.25}),
    ("evidence", {"id": 3, "step_id": 8, "kind": "attempt_started"}),
    ("evidence", {"id": 4, "step_id": 7, "kind": "operator_resolved", "note": "checked \u2713"}),
]


def make_log(signer: Signer, old_size: int = 2):
    """A log of ROWS, a bundle for step 7's rows (the second pruned) at its full size,
    with the proof that it extends the log at ``old_size``."""
    tree = MemoryTree(leaf_hash(row_leaf(t, r)) for t, r in ROWS)
    old = sign_checkpoint(signer, old_size, tree.root(old_size))
    new = sign_checkpoint(signer, tree.size, tree.root())
    entries = [
        entry(*ROWS[1], 1, tree.inclusion_proof(1)),
        pruned_entry(tree.node(0, 2), 2, tree.inclusion_proof(2)),
        entry(*ROWS[4], 4, tree.inclusion_proof(4)),
    ]
    return bundle(new, entries, (old, tree.consistency_proof(old_size))), tree


def test_a_bundle_round_trips(keys):
    signer, vkey, _, _ = keys
    made, _ = make_log(signer)
    result = verify_bundle(dumps(made), vkey)
    assert result.ok, result.verdicts
    assert [v.what for v in result.verdicts] == [
        "checkpoint",
        "entry 1 (leaf 1, evidence row)",
        "entry 2 (leaf 2, content pruned)",
        "entry 3 (leaf 4, evidence row)",
        "consistency",
    ]
    assert [v.pruned for v in result.verdicts] == [False, False, True, False, False]
    assert result.checkpoint is not None and result.checkpoint.size == 5
    assert verify_bundle(made, vkey).ok  # a parsed bundle too


def _broken(made, path, value):
    copy = json.loads(json.dumps(made))
    *parents, last = path
    target = copy
    for key in parents:
        target = target[key]
    target[last] = value
    return copy


def test_any_change_to_a_bundle_fails_where_it_was_made(keys):
    signer, vkey, other, other_vkey = keys
    made, tree = make_log(signer)
    one_bit = base64.b64encode(bytes([tree.inclusion_proof(1)[0][0] ^ 1]) + tree.inclusion_proof(1)[0][1:]).decode()
    cases = {
        "entry 1": [
            _broken(made, ["entries", 0, "row", "kind"], "attempt_startet"),
            _broken(made, ["entries", 0, "row", "extra"], None),
            _broken(made, ["entries", 0, "table"], "decisions"),
            _broken(made, ["entries", 0, "leaf_index"], 2),
            _broken(made, ["entries", 0, "proof", 0], one_bit),
            _broken(made, ["entries", 0, "proof"], made["entries"][0]["proof"][:-1]),
        ],
        "entry 2": [_broken(made, ["entries", 1, "leaf_hash"], base64.b64encode(bytes(32)).decode())],
        "consistency": [
            _broken(made, ["consistency", "proof", 0], one_bit),
            _broken(made, ["consistency", "checkpoint"], sign_checkpoint(signer, 2, tree.root(3))),
        ],
        "checkpoint": [
            _broken(made, ["checkpoint"], sign_checkpoint(other, 5, tree.root())),
            _broken(made, ["checkpoint"], made["checkpoint"].replace("\n5\n", "\n6\n")),
        ],
    }
    for where, broken in cases.items():
        for b in broken:
            result = verify_bundle(dumps(b), vkey)
            failed = [v.what.split(" (")[0] for v in result.verdicts if not v.ok]
            assert not result.ok and where in failed, (where, result.verdicts)
    # The right bundle under another key: nothing is trusted.
    result = verify_bundle(dumps(made), other_vkey)
    assert not result.ok and all(not v.ok for v in result.verdicts)


@pytest.mark.parametrize(
    "text",
    [
        "not json",
        "[]",
        '{"format": "evq-proof-bundle/v2", "checkpoint": "", "entries": []}',
        '{"format": "evq-proof-bundle/v1", "checkpoint": "x", "entries": [], "entries": []}',
        '{"format": "evq-proof-bundle/v1", "checkpoint": "x", "entries": [], "note": "unchecked"}',
        '{"format": "evq-proof-bundle/v1", "checkpoint": "x", "entries": [NaN]}',
    ],
)
def test_a_malformed_bundle_is_refused(keys, text):
    result = verify_bundle(text, keys[1])
    assert not result.ok and result.verdicts[0].what == "bundle"


def test_a_bundle_that_proves_nothing_is_not_verified(keys):
    signer, vkey, _, _ = keys
    made = bundle(sign_checkpoint(signer, 0, EMPTY_ROOT), [])
    result = verify_bundle(dumps(made), vkey)
    assert not result.ok and result.verdicts[-1].detail.startswith("it proves nothing")


def test_the_producer_refuses_what_the_verifier_would(keys):
    signer = keys[0]
    with pytest.raises(ValueError):
        sign_checkpoint(signer, 1, b"short")
    with pytest.raises(ValueError):
        sign_checkpoint(signer, 1, EMPTY_ROOT, ["two\nlines"])
    with pytest.raises(ValueError):
        sign_note("no final newline", signer)
    with pytest.raises(ValueError):
        generate_key("has space")
    with pytest.raises(ValueError):
        MemoryTree().inclusion_proof(0)


def test_the_docs_examples_are_true():
    """docs/evidence-log.md's checkpoint verifies under its key, its example leaf is the leaf,
    and the log it shows (the checkpoint's root) is make_log's."""
    import re
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "evidence-log.md").read_text()
    vkey = re.search(r"`(log\.example/evq\+[0-9a-f]{8}\+\S+)`", doc).group(1)
    note = re.search(r"```\n(log\.example/evq\n5\n.*?\n)```", doc, flags=re.S).group(1)
    checkpoint = verify_checkpoint(note, vkey)
    assert checkpoint.root == MemoryTree(leaf_hash(row_leaf(t, r)) for t, r in ROWS).root()
    assert f"--key '{vkey}'" in doc and f"root {base64.b64encode(checkpoint.root).decode()}" in doc
    row = {"id": 1, "kind": "attempt_started", "at": datetime.datetime.fromisoformat("2024-05-01 14:00:00+02:00")}
    leaf = row_leaf("evidence", row)
    assert leaf[:1] == b"\x01" and f"leaf `0x01` followed by\n`{leaf[1:].decode()}`" in doc
