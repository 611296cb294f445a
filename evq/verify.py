"""Check an evq proof bundle offline, with nothing but the bundle and the log's public key:

    python3 -m evq.verify BUNDLE --key 'NAME+HASH+KEY'    (or --key FILE holding that line)

The whole verifier, for someone who does not trust evq: it imports only the standard library
and ``cryptography`` (Ed25519), nothing of evq, and runs the same copied anywhere alone
(``python3 verify.py BUNDLE --key KEY``). What it checks (docs/evidence-log.md has each byte):

- the Merkle tree of RFC 9162 §2.1 (= RFC 6962): leaf hash SHA-256(0x00 || leaf), node hash
  SHA-256(0x01 || left || right), inclusion and consistency proofs by §2.1.3.2 and §2.1.4.2;
- checkpoints: C2SP tlog-checkpoint text (origin, size, base64 root, extensions) in a C2SP
  signed note, Ed25519, keys as golang.org/x/mod/sumdb/note writes them; origin = key name;
- leaf encoding v1: 0x01 || UTF-8 canonical JSON of {"row": {...}, "table": name};
- bundle v1: JSON {"format", "checkpoint", "entries": [{"leaf_index", "proof", "table",
  "row"} or, content pruned, {"leaf_index", "proof", "leaf_hash"}], "consistency"?:
  {"checkpoint": older note, "proof"}}, hashes in standard base64.

Making all this (proofs from stored hashes, keys, signing, bundles) is worker/evidence_log.py.
"""

from __future__ import annotations

import argparse
import base64
import binascii
import hashlib
import json
import os
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

HASH_SIZE = 32
EMPTY_ROOT = hashlib.sha256(b"").digest()  # MTH of no leaves (RFC 9162 §2.1.1)
LEAF_VERSION = 1
BUNDLE_FORMAT = "evq-proof-bundle/v1"
ALG_ED25519 = 0x01  # the signature type byte of C2SP signed-note
MAX_SIGNATURES = 100  # as golang.org/x/mod/sumdb/note: a note with more is malformed


class VerifyError(Exception):
    """What was given is malformed or does not verify; the message says which and why."""


# --- The Merkle tree: hashing and the two proofs -------------------------------------------


def leaf_hash(leaf: bytes) -> bytes:
    return hashlib.sha256(b"\x00" + leaf).digest()


def node_hash(left: bytes, right: bytes) -> bytes:
    return hashlib.sha256(b"\x01" + left + right).digest()


def tree_hash(leaf_hashes: Sequence[bytes]) -> bytes:
    """MTH: the root of the tree whose leaves have these hashes, in order."""
    n = len(leaf_hashes)
    if n <= 1:
        return leaf_hashes[0] if n else EMPTY_ROOT
    k = 1 << ((n - 1).bit_length() - 1)  # the largest power of two below n
    return node_hash(tree_hash(leaf_hashes[:k]), tree_hash(leaf_hashes[k:]))


def _check_hashes(*hashes: bytes) -> None:
    if any(len(h) != HASH_SIZE for h in hashes):
        raise VerifyError(f"a hash (the leaf's or one in the proof) is not {HASH_SIZE} bytes")


def verify_inclusion(leaf: bytes, index: int, size: int, proof: Sequence[bytes], root: bytes) -> None:
    """RFC 9162 §2.1.3.2: ``proof`` shows that the leaf hash ``leaf`` is leaf number ``index``
    of the tree of ``size`` leaves whose root is ``root``. Raises VerifyError if not."""
    if not 0 <= index < size:
        raise VerifyError(f"leaf index {index} is not in a tree of {size} leaves")
    _check_hashes(leaf, *proof)
    fn, sn, r = index, size - 1, leaf
    for p in proof:
        if sn == 0:
            raise VerifyError("the inclusion proof is longer than the tree is deep")
        if fn & 1 or fn == sn:
            r = node_hash(p, r)
            while fn and not fn & 1:
                fn, sn = fn >> 1, sn >> 1
        else:
            r = node_hash(r, p)
        fn, sn = fn >> 1, sn >> 1
    if sn != 0:
        raise VerifyError("the inclusion proof is shorter than the tree is deep")
    if r != root:
        raise VerifyError("the leaf and its inclusion proof do not lead to the tree's root")


def verify_consistency_proof(size1: int, size2: int, proof: Sequence[bytes], root1: bytes, root2: bytes) -> None:
    """RFC 9162 §2.1.4.2: ``proof`` shows that the tree of ``size1`` leaves with root ``root1``
    is the first ``size1`` leaves of the tree of ``size2`` leaves with root ``root2``."""
    if not 0 < size1 <= size2:
        raise VerifyError(f"no consistency proof goes from {size1} to {size2} leaves")
    if size1 == size2:
        if proof:
            raise VerifyError("a consistency proof between equal sizes must be empty")
        if root1 != root2:
            raise VerifyError(f"two different roots for the same {size1} leaves")
        return
    if not proof:
        raise VerifyError("the consistency proof is empty")
    _check_hashes(*proof)
    path = list(proof)
    if size1 & (size1 - 1) == 0:  # a power of two: the old root is a node of the new tree
        path.insert(0, root1)
    fn, sn = size1 - 1, size2 - 1
    while fn & 1:
        fn, sn = fn >> 1, sn >> 1
    fr = sr = path[0]
    for c in path[1:]:
        if sn == 0:
            raise VerifyError("the consistency proof is longer than the tree is deep")
        if fn & 1 or fn == sn:
            fr, sr = node_hash(c, fr), node_hash(c, sr)
            while fn and not fn & 1:
                fn, sn = fn >> 1, sn >> 1
        else:
            sr = node_hash(sr, c)
        fn, sn = fn >> 1, sn >> 1
    if sn != 0:
        raise VerifyError("the consistency proof is shorter than the tree is deep")
    if fr != root1:
        raise VerifyError(f"the consistency proof does not lead to the old root (size {size1})")
    if sr != root2:
        raise VerifyError(f"the consistency proof does not lead to the new root (size {size2})")


# --- Signed notes and checkpoints ----------------------------------------------------------


def b64decode(text: str) -> bytes:
    """Standard base64 with padding, in its one canonical spelling."""
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise VerifyError(f"not base64: {text[:60]!r}") from None
    if base64.b64encode(raw).decode() != text:
        raise VerifyError(f"not canonical base64: {text[:60]!r}")
    return raw


def key_hash(name: str, key: bytes) -> int:
    """A note key's id: the first 4 bytes of SHA-256(name || "\\n" || type byte || public key)."""
    return int.from_bytes(hashlib.sha256(name.encode() + b"\n" + key).digest()[:4], "big")


def valid_key_name(name: str) -> bool:
    return bool(name) and "+" not in name and not any(c.isspace() or c < " " for c in name)


class Verifier:
    """A note verifier key, ``name+hexhash+base64(0x01 || 32-byte Ed25519 public key)``."""

    def __init__(self, vkey: str):
        name, _, rest = vkey.partition("+")
        hash16, _, key64 = rest.partition("+")
        if not valid_key_name(name) or not re.fullmatch(r"[0-9a-fA-F]{8}", hash16):
            raise VerifyError("not a verifier key: want name+hexhash+base64key")
        key = b64decode(key64)
        if len(key) != 33 or key[0] != ALG_ED25519:
            raise VerifyError("not an Ed25519 verifier key (type byte 0x01 and 32 bytes)")
        if int(hash16, 16) != key_hash(name, key):
            raise VerifyError("the verifier key's hash does not match its name and key")
        self.name, self.key_hash = name, int(hash16, 16)
        self.id = f"{name}+{self.key_hash:08x}"
        self.vkey = f"{self.id}+{key64}"
        try:
            # Imported here: `pip install evq` has no cryptography (the `evidence` extra brings it).
            from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
        except ImportError:
            raise VerifyError("checking a signature needs the cryptography package: pip install cryptography") from None
        self._key: Ed25519PublicKey = Ed25519PublicKey.from_public_bytes(key[1:])

    def verify(self, message: bytes, signature: bytes) -> bool:
        from cryptography.exceptions import InvalidSignature

        try:
            self._key.verify(signature, message)
        except InvalidSignature:
            return False
        return True

    def __repr__(self) -> str:
        return f"Verifier({self.vkey!r})"


SIGNATURE_PREFIX = "\u2014 "  # em dash, space


def open_note(note: str | bytes, verifier: Verifier) -> str:
    """The text of a C2SP signed note that ``verifier``'s key signed. Signatures by other
    keys are ignored, as the spec says (one with the same name but another key included);
    a bad signature by this key, or none at all, rejects the note."""
    try:
        msg = note.decode() if isinstance(note, bytes) else note.encode().decode()
    except UnicodeError:
        raise VerifyError("malformed note: not UTF-8") from None
    if any(c < " " and c != "\n" for c in msg):
        raise VerifyError("malformed note: a control character")
    split = msg.rfind("\n\n")
    text, block = msg[: split + 1], msg[split + 2 :]
    if split < 0 or not block.endswith("\n"):
        raise VerifyError("malformed note: no signature lines after a blank line, each ending in a newline")
    lines = block[:-1].split("\n")
    if len(lines) > MAX_SIGNATURES:
        raise VerifyError(f"malformed note: more than {MAX_SIGNATURES} signatures")
    signed, others = False, []
    for line in lines:
        name, _, sig64 = line.removeprefix(SIGNATURE_PREFIX).partition(" ")
        if not line.startswith(SIGNATURE_PREFIX) or not valid_key_name(name) or not sig64:
            raise VerifyError(f"malformed note: not a signature line: {line[:80]!r}")
        sig = b64decode(sig64)
        if len(sig) < 5:
            raise VerifyError(f"malformed note: a signature too short: {line[:80]!r}")
        signer = f"{name}+{int.from_bytes(sig[:4], 'big'):08x}"
        if signer != verifier.id:
            others.append(signer)
        elif not verifier.verify(text.encode(), sig[4:]):
            raise VerifyError(f"the signature by {verifier.id} does not verify: the note was changed")
        else:
            signed = True
    if not signed:
        by = f" (it is signed by {', '.join(map(repr, others))})" if others else ""
        raise VerifyError(f"the note is not signed by {verifier.id}{by}")
    return text


@dataclass(frozen=True)
class Checkpoint:
    """A tree head: the log's name (origin), its size and its root hash."""

    origin: str
    size: int
    root: bytes
    extensions: tuple[str, ...] = ()

    def text(self) -> str:
        """The note text, as the C2SP tlog-checkpoint format writes it."""
        lines = [self.origin, str(self.size), base64.b64encode(self.root).decode(), *self.extensions]
        return "".join(line + "\n" for line in lines)


def parse_checkpoint(text: str) -> Checkpoint:
    lines = text[:-1].split("\n") if text.endswith("\n") else []
    if len(lines) < 3 or "" in lines:
        raise VerifyError("malformed checkpoint: want origin, size and root lines (and extensions), none empty")
    origin, size, root64, *extensions = lines
    if not re.fullmatch(r"0|[1-9][0-9]*", size):
        raise VerifyError(f"malformed checkpoint: tree size {size[:40]!r}")
    root = b64decode(root64)
    if len(root) != HASH_SIZE:
        raise VerifyError("malformed checkpoint: the root is not a SHA-256 hash")
    return Checkpoint(origin, int(size), root, tuple(extensions))


def verify_checkpoint(note: str | bytes, vkey: str | Verifier) -> Checkpoint:
    """The checkpoint in a signed note, once its signature by ``vkey`` verifies; its origin
    must be the key's name (one key, one log)."""
    verifier = vkey if isinstance(vkey, Verifier) else Verifier(vkey)
    checkpoint = parse_checkpoint(open_note(note, verifier))
    if checkpoint.origin != verifier.name:
        raise VerifyError(f"the checkpoint is for log {checkpoint.origin!r}, not {verifier.name!r}")
    return checkpoint


def verify_consistency(
    old: str | bytes, new: str | bytes, proof: Sequence[bytes], vkey: str | Verifier
) -> tuple[Checkpoint, Checkpoint]:
    """Both checkpoints are signed by ``vkey`` and the newer extends the older (history only grew)."""
    first, second = verify_checkpoint(old, vkey), verify_checkpoint(new, vkey)
    if first.size > 0:
        verify_consistency_proof(first.size, second.size, proof, first.root, second.root)
    elif first.root != EMPTY_ROOT or proof:  # every log extends the empty one, with no proof
        raise VerifyError("a checkpoint of 0 leaves has the empty root and needs no proof")
    return first, second


# --- Leaf encoding v1 ----------------------------------------------------------------------


def _number(x: float) -> str:
    """ECMAScript's Number::toString, as RFC 8785 writes numbers: the shortest digits that
    read back as x (Python's repr finds them), placed as ECMAScript places them."""
    if x != x or x in (float("inf"), float("-inf")):
        raise VerifyError("NaN and infinity are not JSON numbers")
    if x == 0:
        return "0"
    mantissa, _, exponent = repr(abs(x)).partition("e")
    whole, _, fraction = mantissa.partition(".")
    digits = (whole + fraction).lstrip("0")
    n = len(whole) + int(exponent or 0) - (len(whole + fraction) - len(digits))  # x = 0.DIGITS * 10**n
    digits = digits.rstrip("0")
    k = len(digits)
    if k <= n <= 21:
        text = digits + "0" * (n - k)
    elif 0 < n <= 21:
        text = digits[:n] + "." + digits[n:]
    elif -6 < n <= 0:
        text = "0." + "0" * -n + digits
    else:
        text = digits[0] + ("." + digits[1:] if k > 1 else "") + f"e{n - 1:+d}"
    return ("-" if x < 0 else "") + text


def canonical_json(value: Any) -> str:
    """RFC 8785's canonical JSON, except that integers are written exactly at any size (a row's
    64-bit ids would not survive a double): no whitespace, object members sorted by the UTF-16
    code units of their names, strings escaped only where JSON must (", \\ and controls)."""
    if value is None or isinstance(value, bool):
        return {None: "null", True: "true", False: "false"}[value]
    if isinstance(value, int):
        return str(int(value))
    if isinstance(value, float):
        return _number(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, list | tuple):
        return "[" + ",".join(canonical_json(v) for v in value) + "]"
    if isinstance(value, Mapping):
        if not all(isinstance(k, str) for k in value):
            raise VerifyError("an object's member name is not a string")
        names = sorted(value, key=lambda k: k.encode("utf-16-be", "surrogatepass"))
        return "{" + ",".join(f"{json.dumps(k, ensure_ascii=False)}:{canonical_json(value[k])}" for k in names) + "}"
    raise VerifyError(f"{type(value).__name__} is not a JSON value")


def encode_leaf(table: str, row: Mapping[str, Any]) -> bytes:
    """A row's leaf, encoding v1: 0x01 || UTF-8(canonical_json({"row": row, "table": table})),
    where the table's name is a lowercase SQL identifier."""
    if not isinstance(table, str) or not re.fullmatch(r"[a-z_][a-z0-9_]{0,62}", table):
        raise VerifyError("a leaf's table name is a lowercase SQL identifier")
    if not isinstance(row, Mapping):
        raise VerifyError("a leaf's row is a JSON object")
    try:
        return bytes([LEAF_VERSION]) + canonical_json({"row": row, "table": table}).encode()
    except UnicodeError:
        raise VerifyError("the row holds a string that is not valid Unicode") from None


# --- Proof bundles -------------------------------------------------------------------------


@dataclass(frozen=True)
class Verdict:
    """One finding: ``what`` was checked (the bundle, its checkpoint, an entry, the consistency)."""

    what: str
    ok: bool
    detail: str
    leaf_index: int | None = None
    table: str | None = None
    leaf_hash: bytes | None = None
    pruned: bool = False


@dataclass(frozen=True)
class BundleResult:
    ok: bool
    checkpoint: Checkpoint | None
    verdicts: tuple[Verdict, ...]


def _strict_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    # Two values under one name would let another reader show what this one did not check.
    if len({k for k, _ in pairs}) != len(pairs):
        raise VerifyError("a name appears twice in one JSON object")
    return dict(pairs)


BUNDLE_FIELDS = {"format", "checkpoint", "entries", "consistency"}


def load_bundle(data: str | bytes) -> dict[str, Any]:
    """A bundle's JSON, refusing what two JSON readers could read differently."""

    def refuse(constant: str) -> None:
        raise VerifyError(f"{constant} is not JSON")

    try:
        text = data.decode() if isinstance(data, bytes) else data
        bundle = json.loads(text, object_pairs_hook=_strict_object, parse_constant=refuse)
    except (ValueError, RecursionError) as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise VerifyError(f"the bundle is not JSON: {e}") from None
    return _check_bundle(bundle)


def _check_bundle(bundle: Any) -> dict[str, Any]:
    if not isinstance(bundle, Mapping) or bundle.get("format") != BUNDLE_FORMAT:
        raise VerifyError(f"not a bundle of format {BUNDLE_FORMAT!r}")
    if not set(bundle) <= BUNDLE_FIELDS:
        raise VerifyError(f"the bundle holds fields nothing checks: {sorted(set(bundle) - BUNDLE_FIELDS)}")
    if not isinstance(bundle.get("checkpoint"), str) or not isinstance(bundle.get("entries"), list):
        raise VerifyError("the bundle needs a checkpoint (a signed note) and a list of entries")
    return dict(bundle)


def _hashes(value: Any) -> list[bytes]:
    if not isinstance(value, list) or not all(isinstance(h, str) for h in value):
        raise VerifyError("a proof is a list of base64 hashes")
    return [b64decode(h) for h in value]


def _entry(position: int, entry: Any, checkpoint: Checkpoint | None) -> Verdict:
    what, index, table, leaf = f"entry {position}", None, None, None
    try:
        keys = set(entry) if isinstance(entry, dict) else set()
        if keys not in ({"leaf_index", "proof", "table", "row"}, {"leaf_index", "proof", "leaf_hash"}):
            raise VerifyError("an entry holds leaf_index, proof and either table and row, or leaf_hash")
        index = entry["leaf_index"]
        if not isinstance(index, int) or isinstance(index, bool):
            raise VerifyError("leaf_index is not an integer")
        pruned = "leaf_hash" in keys
        if pruned:
            what = f"entry {position} (leaf {index}, content pruned)"
            if not isinstance(entry["leaf_hash"], str):
                raise VerifyError("leaf_hash is not base64")
            leaf = b64decode(entry["leaf_hash"])
        else:
            leaf = leaf_hash(encode_leaf(entry["table"], entry["row"]))
            table = entry["table"]
            what = f"entry {position} (leaf {index}, {table} row)"
        if checkpoint is None:
            raise VerifyError("not checked: the bundle has no checkpoint signed by the key")
        verify_inclusion(leaf, index, checkpoint.size, _hashes(entry["proof"]), checkpoint.root)
    except VerifyError as e:
        return Verdict(what, False, str(e), index, table, leaf)
    detail = "a leaf with this hash is in the log; its content was pruned" if pruned else "the row is in the log"
    return Verdict(what, True, detail, index, table, leaf, pruned)


def verify_bundle(bundle: str | bytes | Mapping[str, Any], vkey: str | Verifier) -> BundleResult:
    """Check a bundle against the log's verifier key: the checkpoint's signature, every entry's
    leaf (recomputed from its row) and inclusion proof, and the consistency proof when present.
    ``ok`` only when all of it verifies. A key that is no verifier key raises VerifyError."""
    verifier = vkey if isinstance(vkey, Verifier) else Verifier(vkey)
    try:
        b = load_bundle(bundle) if isinstance(bundle, str | bytes) else _check_bundle(bundle)
    except VerifyError as e:
        return BundleResult(False, None, (Verdict("bundle", False, str(e)),))
    verdicts: list[Verdict] = []
    checkpoint = None
    try:
        checkpoint = verify_checkpoint(b["checkpoint"], verifier)
        root64 = base64.b64encode(checkpoint.root).decode()
        verdicts.append(
            Verdict("checkpoint", True, f"{checkpoint.size} leaves, root {root64}, signed by {verifier.id}")
        )
    except VerifyError as e:
        verdicts.append(Verdict("checkpoint", False, str(e)))
    verdicts += [_entry(i, entry, checkpoint) for i, entry in enumerate(b["entries"], 1)]
    if "consistency" in b:
        try:
            c = b["consistency"]
            if not isinstance(c, dict) or set(c) != {"checkpoint", "proof"} or not isinstance(c["checkpoint"], str):
                raise VerifyError("consistency holds an older checkpoint (a signed note) and a proof")
            old, new = verify_consistency(c["checkpoint"], b["checkpoint"], _hashes(c["proof"]), verifier)
            verdicts.append(Verdict("consistency", True, f"the log at {new.size} leaves extends the log at {old.size}"))
        except VerifyError as e:
            verdicts.append(Verdict("consistency", False, str(e)))
    if not b["entries"] and "consistency" not in b:
        verdicts.append(Verdict("bundle", False, "it proves nothing: no entries and no consistency proof"))
    return BundleResult(all(v.ok for v in verdicts), checkpoint, tuple(verdicts))


# --- The command line ----------------------------------------------------------------------

EXIT_CODES = """exit status:
  0  everything in the bundle verifies
  1  something does not: a row, a proof, the checkpoint's signature, the consistency,
     or the bundle is malformed (each line above says which)
  2  the command could not check: bad arguments, an unreadable file, or a key that is
     not a verifier key"""


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python3 -m evq.verify",
        description="Check an evq proof bundle offline against the log's public (verifier) key.",
        epilog=EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("bundle", help="the proof bundle, a JSON file (- reads standard input)")
    parser.add_argument("--key", required=True, help="the log's verifier key (name+hash+key), or a file holding it")
    args = parser.parse_args(argv)
    try:
        key = args.key
        if os.path.isfile(key):
            with open(key, encoding="utf-8") as f:
                key = f.read().strip()
        verifier = Verifier(key)
        if args.bundle == "-":
            data = sys.stdin.buffer.read()
        else:
            with open(args.bundle, "rb") as f:
                data = f.read()
    except (OSError, UnicodeError, VerifyError) as e:
        print(f"cannot check: {e}", file=sys.stderr)
        return 2
    result = verify_bundle(data, verifier)
    for v in result.verdicts:
        print(f"{v.what}: {'OK' if v.ok else 'FAILED'}: {v.detail}")
    entries = [v for v in result.verdicts if v.what.startswith("entry")]
    if result.ok and result.checkpoint:
        print(f"VERIFIED: {len(entries)} entries in log {result.checkpoint.origin} at {result.checkpoint.size} leaves")
    else:
        failed = sum(not v.ok for v in result.verdicts)
        print(f"NOT VERIFIED: {failed} of {len(result.verdicts)} checks failed")
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
