"""evq/verify.py and worker/evidence_log.py against the reference implementations' own vectors:
transparency-dev/merkle for the Merkle tree, golang.org/x/mod's note package for signed notes
and keys, RFC 8785 for the JSON numbers (tests/data/tlog/README.md names each source)."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

from evq.verify import (
    EMPTY_ROOT,
    Verifier,
    VerifyError,
    canonical_json,
    leaf_hash,
    node_hash,
    open_note,
    tree_hash,
    verify_consistency_proof,
    verify_inclusion,
)
from evq.worker.evidence_log import Frontier, MemoryTree, Signer, consistency_proof, inclusion_proof, sign_note

DATA = Path(__file__).resolve().parents[1] / "data" / "tlog"
HASHES = json.loads((DATA / "hashes.json").read_text())
INCLUSION = json.loads((DATA / "inclusion.json").read_text())
CONSISTENCY = json.loads((DATA / "consistency.json").read_text())


def _b(text: str) -> bytes:
    # Go's encoding/json reads []byte as standard base64; "" is no bytes.
    return base64.b64decode(text)


def _reference_tree() -> list[bytes]:
    return [leaf_hash(bytes.fromhex(h)) for h in HASHES["leaf_inputs_hex"]]


# --- Hashing -------------------------------------------------------------------------------


def test_rfc6962_hasher_vectors():
    assert EMPTY_ROOT.hex() == HASHES["empty_root"]
    for case in HASHES["leaf"]:
        assert leaf_hash(bytes.fromhex(case["input_hex"])).hex() == case["hash"]
    for case in HASHES["node"]:
        assert node_hash(bytes.fromhex(case["left_hex"]), bytes.fromhex(case["right_hex"])).hex() == case["hash"]


def test_the_reference_tree_has_the_reference_roots_at_every_size():
    leaves = _reference_tree()
    tree = MemoryTree()
    assert tree.root().hex() == HASHES["root_hashes"][0]
    for size, want in enumerate(HASHES["root_hashes"][1:], 1):
        tree.append(leaves[size - 1])
        assert tree_hash(leaves[:size]).hex() == want
        assert tree.frontier.root().hex() == want  # from the right edge alone
        assert tree.root().hex() == want  # from stored complete subtrees
        assert Frontier.load(size, tree.node).root().hex() == want  # a frontier reloaded from storage


# --- Proof verification: every case gives the vector's answer -------------------------------


@pytest.mark.parametrize("case", INCLUSION, ids=[c["file"].removeprefix("testdata/inclusion/") for c in INCLUSION])
def test_inclusion_vector(case):
    args = (
        _b(case["leafHash"]),
        case["leafIdx"],
        case["treeSize"],
        [_b(p) for p in case["proof"] or []],
        _b(case["root"]),
    )
    if case["wantErr"]:
        with pytest.raises(VerifyError):
            verify_inclusion(*args)
    else:
        verify_inclusion(*args)


@pytest.mark.parametrize(
    "case", CONSISTENCY, ids=[c["file"].removeprefix("testdata/consistency/") for c in CONSISTENCY]
)
def test_consistency_vector(case):
    proof = [_b(p) for p in case["proof"] or []]
    args = (case["size1"], case["size2"], proof, _b(case["root1"]), _b(case["root2"]))
    if case["wantErr"]:
        with pytest.raises(VerifyError):
            verify_consistency_proof(*args)
    else:
        verify_consistency_proof(*args)


def test_the_vectors_hold_happy_paths_and_failures():
    for cases in (INCLUSION, CONSISTENCY):
        assert len(cases) == 98
        assert sum(not c["wantErr"] for c in cases) == 6  # a happy path per tree, and one edge case


# --- Proof generation gives the reference proofs -------------------------------------------


def test_generated_proofs_are_the_vectors_happy_paths():
    tree = MemoryTree(_reference_tree())
    checked = 0
    for case in INCLUSION:
        if not case["wantErr"] and case["file"].split("/")[2].isdigit():  # the reference tree's, 0 to 4
            want = [_b(p) for p in case["proof"] or []]
            assert tree.inclusion_proof(case["leafIdx"], case["treeSize"]) == want, case["file"]
            assert tree.root(case["treeSize"]) == _b(case["root"])
            checked += 1
    for case in CONSISTENCY:
        if not case["wantErr"] and case["file"].split("/")[2].isdigit():
            want = [_b(p) for p in case["proof"] or []]
            assert tree.consistency_proof(case["size1"], case["size2"]) == want, case["file"]
            checked += 1
    assert checked == 10  # inclusion 0-4 and consistency 0-4


def test_every_proof_of_the_reference_tree_verifies():
    leaves = _reference_tree()
    tree = MemoryTree(leaves)
    for size in range(1, 9):
        for index in range(size):
            verify_inclusion(leaves[index], index, size, inclusion_proof(index, size, tree.node), tree.root(size))
        for old in range(1, size + 1):
            proof = consistency_proof(old, size, tree.node)
            verify_consistency_proof(old, size, proof, tree.root(old), tree.root(size))


# --- Signed notes: golang.org/x/mod/sumdb/note's vectors ----------------------------------

PETER_VKEY = "PeterNeumann+c74f20a3+ARpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TW"
PETER_SKEY = "PRIVATE+KEY+PeterNeumann+c74f20a3+AYEKFALVFGyNhPJEMzD1QIDr+Y7hfZx09iUvxdXHKDFz"
ENOCH_VKEY = "EnochRoot+af0cfe78+ATtqJ7zOtqQtYqOo0CpvDXNlMhV3HeJDpjrASKGLWdop"
TEXT = "If you think cryptography is the answer to your problem,\nthen you don't know what your problem is.\n"
PETER_SIG = (
    "\u2014 PeterNeumann x08go/ZJkuBS9UG/SffcvIAQxVBtiFupLLr8pAcElZInNIuGUgYN1FFYC2pZSNXgKvqfqdngotpRZb6KE6RyyBwJnAM=\n"
)
ENOCH_SIG = (
    "\u2014 EnochRoot rwz+eBzmZa0SO3NbfRGzPCpDckykFXSdeX+MNtCOXm2/5n2tiOHp+vAF1aGrQ5ovTG01oOTGwnWLox33WWd1RvMc+QQ=\n"
)


def test_signing_is_byte_exact_with_the_reference():
    signer = Signer(PETER_SKEY)
    assert signer.vkey == PETER_VKEY
    assert sign_note(TEXT, signer) == TEXT + "\n" + PETER_SIG
    assert "AYEKFALV" not in repr(signer)  # the seed never shows


def test_the_reference_verifier_keys_parse_and_every_mangling_is_refused():
    for vkey in (PETER_VKEY, ENOCH_VKEY):
        v = Verifier(vkey)
        assert v.vkey == vkey and v.id == "+".join(vkey.split("+")[:2])
    b = PETER_VKEY
    for i in range(len(b) + 1):
        for j in range(i + 1, len(b) + 1):
            if (i, j) != (0, len(b)):
                with pytest.raises(VerifyError):
                    Verifier(b[i:j])
    for i in range(len(b)):
        with pytest.raises(VerifyError):
            Verifier(b[:i] + chr(ord(b[i]) + 1) + b[i + 1 :])
    # A key of the wrong length and an unknown algorithm, each with its hash adjusted to match.
    for bad in (
        "PeterNeumann+cc469956+ARpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TWBADKEY==",
        "PeterNeumann+173116ae+ZRpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TW",
    ):
        with pytest.raises(VerifyError):
            Verifier(bad)


def test_every_mangling_of_the_reference_signer_key_is_refused():
    b = PETER_SKEY
    for i in range(len(b) + 1):
        for j in range(i + 1, len(b) + 1):
            if (i, j) != (0, len(b)):
                with pytest.raises(ValueError):
                    Signer(b[i:j])
    for i in range(len(b)):
        with pytest.raises(ValueError):
            Signer(b[:i] + chr(ord(b[i]) + 1) + b[i + 1 :])


def test_open_verifies_the_known_key_and_ignores_others():
    peter, enoch = Verifier(PETER_VKEY), Verifier(ENOCH_VKEY)
    note = TEXT + "\n" + PETER_SIG + ENOCH_SIG
    assert open_note(note, peter) == TEXT
    assert open_note(note, enoch) == TEXT
    assert open_note((TEXT + "\n" + PETER_SIG + PETER_SIG + ENOCH_SIG).encode(), peter) == TEXT
    with pytest.raises(
        VerifyError, match=r"not signed by EnochRoot\+af0cfe78 \(it is signed by 'PeterNeumann\+c74f20a3'\)"
    ):
        open_note(TEXT + "\n" + PETER_SIG, enoch)


def test_open_refuses_what_the_reference_refuses():
    peter = Verifier(PETER_VKEY)
    bad = [
        TEXT,
        TEXT + "\n",
        TEXT + "\n" + PETER_SIG[:-1],
        "\x01" + TEXT + "\n" + PETER_SIG,
        b"\xff" + (TEXT + "\n" + PETER_SIG).encode(),
        TEXT
        + "\n\u2014 Bad Name x08go/ZJkuBS9UG/SffcvIAQxVBtiFupLLr8pAcElZInNIuGUgYN1FFYC2pZSNXgKvqfqdngotpRZb6KE6RyyBwJnAM=",
        TEXT + "\n" + PETER_SIG + "Unexpected line.\n",
        TEXT + "\n" + PETER_SIG * 101,
        # A signature of the known key that does not verify.
        TEXT + "\n" + PETER_SIG[:60] + "ABCD" + PETER_SIG[60:],
        # The known key's signature under another name, or with another key hash: no known signature.
        TEXT + "\n" + PETER_SIG.replace("PeterNeumann", "CarmenSandiego"),
        TEXT + "\n" + PETER_SIG.replace("x08g", "xxxx"),
        # The text changed after signing.
        TEXT.replace("cryptography", "cryptographY") + "\n" + PETER_SIG,
    ]
    for note in bad:
        with pytest.raises(VerifyError):
            open_note(note, peter)


# --- Canonical JSON: RFC 8785 ---------------------------------------------------------------

# RFC 8785, Appendix B: an IEEE 754 double (hex) and its serialization (NaN and Infinity are refused).
RFC8785_NUMBERS = [
    ("0000000000000000", "0"),
    ("8000000000000000", "0"),
    ("0000000000000001", "5e-324"),
    ("8000000000000001", "-5e-324"),
    ("7fefffffffffffff", "1.7976931348623157e+308"),
    ("ffefffffffffffff", "-1.7976931348623157e+308"),
    ("4340000000000000", "9007199254740992"),
    ("c340000000000000", "-9007199254740992"),
    ("4430000000000000", "295147905179352830000"),
    ("44b52d02c7e14af5", "9.999999999999997e+22"),
    ("44b52d02c7e14af6", "1e+23"),
    ("44b52d02c7e14af7", "1.0000000000000001e+23"),
    ("444b1ae4d6e2ef4e", "999999999999999700000"),
    ("444b1ae4d6e2ef4f", "999999999999999900000"),
    ("444b1ae4d6e2ef50", "1e+21"),
    ("3eb0c6f7a0b5ed8c", "9.999999999999997e-7"),
    ("3eb0c6f7a0b5ed8d", "0.000001"),
    ("41b3de4355555553", "333333333.3333332"),
    ("41b3de4355555554", "333333333.33333325"),
    ("41b3de4355555555", "333333333.3333333"),
    ("41b3de4355555556", "333333333.3333334"),
    ("41b3de4355555557", "333333333.33333343"),
    ("becbf647612f3696", "-0.0000033333333333333333"),
    ("43143ff3c1cb0959", "1424953923781206.2"),
]


@pytest.mark.parametrize(("ieee", "want"), RFC8785_NUMBERS)
def test_numbers_are_written_as_rfc_8785_writes_them(ieee, want):
    import struct

    assert canonical_json(struct.unpack(">d", bytes.fromhex(ieee))[0]) == want


@pytest.mark.parametrize("ieee", ["7fffffffffffffff", "7ff0000000000000", "fff0000000000000"])
def test_nan_and_infinity_are_refused(ieee):
    import struct

    with pytest.raises(VerifyError):
        canonical_json(struct.unpack(">d", bytes.fromhex(ieee))[0])


def test_members_sort_by_utf16_code_units_and_strings_escape_only_what_json_must():
    # RFC 8785 §3.2.3's point: U+1F602 (a surrogate pair, D83D DE02) sorts before U+FB33.
    value = {
        "\u20ac": "Euro",
        "1": "One",
        "\u0080": "Control\u007f",
        "\U0001f602": "Smiley",
        "\ufb33": "Dalet",
        "</script>": "x",
    }
    assert canonical_json(value) == (
        '{"1":"One","</script>":"x","\u0080":"Control\u007f","\u20ac":"Euro","\U0001f602":"Smiley","\ufb33":"Dalet"}'
    )
    assert canonical_json('"\\\b\f\n\r\t\x00\x1f/') == '"\\"\\\\\\b\\f\\n\\r\\t\\u0000\\u001f/"'
    assert canonical_json([None, True, False, 2**64 + 1, -7, 1.5]) == "[null,true,false,18446744073709551617,-7,1.5]"
