"""The producer's half of the evidence log: what evq/verify.py checks, made.

- **Proofs from stored hashes.** A producer keeps the hash of every complete subtree it has
  built (``node(level, index)``: the hash of leaves ``index * 2**level`` up to
  ``(index + 1) * 2**level``) and serves inclusion and consistency proofs (RFC 9162 §2.1.3.1,
  §2.1.4.1) and roots from those alone, never reading every leaf. :class:`Frontier` appends
  leaves and returns the new complete subtrees to store; :class:`MemoryTree` keeps them in a
  dict (tests, small logs).
- **Keys and checkpoints.** :func:`generate_key` makes an Ed25519 note key pair in
  golang.org/x/mod/sumdb/note's formats; :class:`Signer` signs notes and checkpoints. The
  signer key is a secret: it is never printed, and :class:`Signer`'s repr shows only the
  public half.
- **Leaves and bundles.** :func:`json_value` turns what PostgreSQL returns into the JSON
  values leaf encoding v1 writes (timestamps, UUIDs, bytes); :func:`row_leaf` is a row's
  leaf; :func:`bundle` assembles a proof bundle v1.

docs/evidence-log.md gives every format.
"""

from __future__ import annotations

import base64
import datetime
import json
import re
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from evq.verify import (
    ALG_ED25519,
    BUNDLE_FORMAT,
    EMPTY_ROOT,
    HASH_SIZE,
    SIGNATURE_PREFIX,
    Checkpoint,
    VerifyError,
    b64decode,
    encode_leaf,
    key_hash,
    node_hash,
    valid_key_name,
)

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

# node(level, index): the hash of the complete subtree of leaves [index << level, (index + 1) << level).
NodeHash = Callable[[int, int], bytes]


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


# --- Proofs from complete subtrees ---------------------------------------------------------


def _split(n: int) -> int:
    """The largest power of two below n (n > 1): where RFC 9162 splits a tree of n leaves."""
    return 1 << ((n - 1).bit_length() - 1)


def range_hash(start: int, end: int, node: NodeHash) -> bytes:
    """MTH of leaves [start, end), for a range the RFC's recursion asks for: ``start`` is a
    multiple of the power of two at or above ``end - start``, so the range is complete
    subtrees of falling sizes, folded from the right."""
    if start == end:
        return EMPTY_ROOT
    if not 0 <= start < end or start % (1 << (end - start - 1).bit_length()):
        raise ValueError(f"[{start}, {end}) is not a range of the tree")
    hashes: list[bytes] = []
    position = start
    for level in reversed(range((end - start).bit_length())):
        if (end - start) >> level & 1:
            hashes.append(node(level, position >> level))
            position += 1 << level
    root = hashes.pop()
    while hashes:
        root = node_hash(hashes.pop(), root)
    return root


def tree_root(size: int, node: NodeHash) -> bytes:
    return range_hash(0, size, node)


def inclusion_proof(index: int, size: int, node: NodeHash) -> list[bytes]:
    """PATH(index, D[0:size]) of RFC 9162 §2.1.3.1, lowest sibling first."""
    if not 0 <= index < size:
        raise ValueError(f"leaf {index} is not in a tree of {size} leaves")
    proof: list[bytes] = []
    start, end = 0, size
    while end - start > 1:
        k = _split(end - start)
        if index < start + k:
            proof.append(range_hash(start + k, end, node))
            end = start + k
        else:
            proof.append(range_hash(start, start + k, node))
            start += k
    return proof[::-1]


def consistency_proof(size1: int, size2: int, node: NodeHash) -> list[bytes]:
    """PROOF(size1, D[0:size2]) of RFC 9162 §2.1.4.1 (SUBPROOF unrolled), lowest node first."""
    if not 0 < size1 <= size2:
        raise ValueError(f"no consistency proof goes from {size1} to {size2} leaves")
    proof: list[bytes] = []
    start, end, m, whole = 0, size2, size1, True
    while m != end - start:
        k = _split(end - start)
        if m <= k:
            proof.append(range_hash(start + k, end, node))
            end = start + k
        else:
            proof.append(range_hash(start, start + k, node))
            start, m, whole = start + k, m - k, False
    if not whole:
        proof.append(range_hash(start, end, node))
    return proof[::-1]


class Frontier:
    """The right edge of a growing tree: the roots of its complete subtrees, largest first
    (one per bit set in its size). That is all appending needs: each append returns the
    complete subtrees it finished, (level, index, hash), the leaf's own first, for the
    producer to store as ``node``."""

    def __init__(self, size: int = 0, hashes: Sequence[bytes] = ()):
        if size < 0 or len(hashes) != size.bit_count() or any(len(h) != HASH_SIZE for h in hashes):
            raise ValueError("a frontier holds one hash per bit set in its size")
        self.size, self.hashes = size, list(hashes)

    @classmethod
    def load(cls, size: int, node: NodeHash) -> Frontier:
        """The frontier of a stored tree of ``size`` leaves, read from its stored nodes."""
        levels = [level for level in reversed(range(size.bit_length())) if size >> level & 1]
        return cls(size, [node(level, (size >> level) - 1) for level in levels])

    def append(self, leaf: bytes) -> list[tuple[int, int, bytes]]:
        if len(leaf) != HASH_SIZE:
            raise ValueError("a leaf hash is 32 bytes")
        index, level, h = self.size, 0, leaf
        finished = [(0, index, leaf)]
        while index >> level & 1:  # a complete subtree of this height sits to the left: join it
            h = node_hash(self.hashes.pop(), h)
            level += 1
            finished.append((level, index >> level, h))
        self.hashes.append(h)
        self.size += 1
        return finished

    def root(self) -> bytes:
        if not self.hashes:
            return EMPTY_ROOT
        root = self.hashes[-1]
        for h in reversed(self.hashes[:-1]):
            root = node_hash(h, root)
        return root


class MemoryTree:
    """A whole tree in memory: every complete subtree's hash in a dict."""

    def __init__(self, leaves: Iterable[bytes] = ()):
        self.frontier = Frontier()
        self.nodes: dict[tuple[int, int], bytes] = {}
        for leaf in leaves:
            self.append(leaf)

    @property
    def size(self) -> int:
        return self.frontier.size

    def append(self, leaf: bytes) -> int:
        """Add a leaf (its hash); returns its index."""
        for level, index, h in self.frontier.append(leaf):
            self.nodes[level, index] = h
        return self.size - 1

    def node(self, level: int, index: int) -> bytes:
        return self.nodes[level, index]

    def root(self, size: int | None = None) -> bytes:
        return tree_root(self.size if size is None else size, self.node)

    def inclusion_proof(self, index: int, size: int | None = None) -> list[bytes]:
        return inclusion_proof(index, self.size if size is None else size, self.node)

    def consistency_proof(self, size1: int, size2: int | None = None) -> list[bytes]:
        return consistency_proof(size1, self.size if size2 is None else size2, self.node)


# --- Keys, notes and checkpoints -----------------------------------------------------------


def _ed25519() -> type[Ed25519PrivateKey]:
    """Ed25519 from ``cryptography`` (the `evidence` extra), imported by the code that signs."""
    from evq.worker.extras import needs

    with needs("evidence", "signing the evidence log"):
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    return Ed25519PrivateKey


class Signer:
    """A note signer key, ``PRIVATE+KEY+name+hexhash+base64(0x01 || 32-byte Ed25519 seed)``,
    where hexhash is the public key's hash. ``vkey`` is the matching verifier key."""

    def __init__(self, skey: str):
        private, key, name, hash16, seed64 = (skey.split("+", 4) + [""] * 5)[:5]
        try:
            seed = b64decode(seed64)
        except VerifyError:
            seed = b""
        if (
            (private, key) != ("PRIVATE", "KEY")
            or not valid_key_name(name)
            or not re.fullmatch(r"[0-9a-fA-F]{8}", hash16)
        ):
            raise ValueError("not a signer key: want PRIVATE+KEY+name+hexhash+base64key")
        if len(seed) != 33 or seed[0] != ALG_ED25519:
            raise ValueError("not an Ed25519 signer key (type byte 0x01 and a 32-byte seed)")
        self._private: Ed25519PrivateKey = _ed25519().from_private_bytes(seed[1:])
        public = bytes([ALG_ED25519]) + self._private.public_key().public_bytes_raw()
        self.name, self.key_hash = name, key_hash(name, public)
        if int(hash16, 16) != self.key_hash:
            raise ValueError("the signer key's hash does not match its name and key")
        self.vkey = f"{name}+{self.key_hash:08x}+{_b64(public)}"

    def sign(self, message: bytes) -> bytes:
        return self._private.sign(message)

    def __repr__(self) -> str:
        return f"Signer(vkey={self.vkey!r})"


def generate_key(name: str) -> tuple[str, str]:
    """A new key pair: (signer key, verifier key). Keep the first secret; publish the second."""
    if not valid_key_name(name):
        raise ValueError("a key name is non-empty, with no space, control character or '+'")
    private = _ed25519().generate()
    public = bytes([ALG_ED25519]) + private.public_key().public_bytes_raw()
    prefix = f"{name}+{key_hash(name, public):08x}"
    return (
        f"PRIVATE+KEY+{prefix}+{_b64(bytes([ALG_ED25519]) + private.private_bytes_raw())}",
        f"{prefix}+{_b64(public)}",
    )


def sign_note(text: str, *signers: Signer) -> str:
    """A C2SP signed note: the text, a blank line, one signature line per signer."""
    if not text.endswith("\n") or any(c < " " and c != "\n" for c in text):
        raise ValueError("a note's text ends in a newline and holds no other control character")
    message = text.encode()
    lines = (f"{SIGNATURE_PREFIX}{s.name} {_b64(s.key_hash.to_bytes(4, 'big') + s.sign(message))}\n" for s in signers)
    return text + "\n" + "".join(lines)


def sign_checkpoint(signer: Signer, size: int, root: bytes, extensions: Sequence[str] = ()) -> str:
    """The signed checkpoint of the tree of ``size`` leaves with ``root``; the origin is the key's name."""
    if size < 0 or len(root) != HASH_SIZE or any(not e or "\n" in e for e in extensions):
        raise ValueError("a checkpoint has a size, a SHA-256 root and non-empty extension lines")
    return sign_note(Checkpoint(signer.name, size, root, tuple(extensions)).text(), signer)


# --- Leaves and bundles --------------------------------------------------------------------


def timestamp(value: datetime.datetime) -> str:
    """RFC 3339 in UTC with microseconds: 2024-05-01T12:34:56.789012Z."""
    if value.tzinfo is None or value.utcoffset() is None:
        raise TypeError("a timestamp without a time zone names no instant")
    t = value.astimezone(datetime.UTC)
    return f"{t.year:04d}-{t.month:02d}-{t.day:02d}T{t.hour:02d}:{t.minute:02d}:{t.second:02d}.{t.microsecond:06d}Z"


def json_value(value: Any) -> Any:
    """A database value as leaf encoding v1 writes it: JSON's own types as they are (jsonb
    included), timestamps by :func:`timestamp`, UUIDs in lowercase 8-4-4-4-12 form, bytes in
    standard base64, arrays as lists. Any other type is refused, not guessed at."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, datetime.datetime):
        return timestamp(value)
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, bytes | bytearray | memoryview):
        return _b64(bytes(value))
    if isinstance(value, list | tuple):
        return [json_value(v) for v in value]
    if isinstance(value, Mapping) and all(isinstance(k, str) for k in value):
        return {k: json_value(v) for k, v in value.items()}
    raise TypeError(f"leaf encoding v1 has no form for {type(value).__name__}")


def json_row(row: Mapping[str, Any]) -> dict[str, Any]:
    return {str(column): json_value(value) for column, value in row.items()}


def row_leaf(table: str, row: Mapping[str, Any]) -> bytes:
    """The leaf of a row as the database returns it (leaf encoding v1); its hash is
    ``evq.verify.leaf_hash(row_leaf(...))``."""
    return encode_leaf(table, json_row(row))


def entry(table: str, row: Mapping[str, Any], leaf_index: int, proof: Sequence[bytes]) -> dict[str, Any]:
    """A bundle's entry for a row whose content is kept."""
    return {"leaf_index": leaf_index, "proof": [_b64(h) for h in proof], "row": json_row(row), "table": table}


def pruned_entry(leaf_hash: bytes, leaf_index: int, proof: Sequence[bytes]) -> dict[str, Any]:
    """A bundle's entry for a row whose content was pruned: its leaf hash proves it existed."""
    return {"leaf_hash": _b64(leaf_hash), "leaf_index": leaf_index, "proof": [_b64(h) for h in proof]}


def bundle(
    checkpoint: str, entries: Sequence[Mapping[str, Any]], consistency: tuple[str, Sequence[bytes]] | None = None
) -> dict[str, Any]:
    """A proof bundle v1: a signed checkpoint, entries proven against it and, optionally, an
    older signed checkpoint with the proof that this one extends it."""
    made: dict[str, Any] = {"format": BUNDLE_FORMAT, "checkpoint": checkpoint, "entries": [dict(e) for e in entries]}
    if consistency is not None:
        made["consistency"] = {"checkpoint": consistency[0], "proof": [_b64(h) for h in consistency[1]]}
    return made


def dumps(made: Mapping[str, Any]) -> str:
    """A bundle as the file to hand out (any JSON spelling verifies; this one reads well)."""
    return json.dumps(made, ensure_ascii=False, indent=2, sort_keys=True) + "\n"
