"""API key material and roles, without a database."""

from __future__ import annotations

import pytest

from evq.worker.errors import InvalidRequest
from evq.worker.keys import (
    ALLOWED,
    Identity,
    Permission,
    Role,
    check_name,
    generate,
    hash_secret,
    scrypt_hash,
    split_key,
    verify_secret,
)

PEPPER = b"p" * 32


def test_a_key_splits_into_its_id_and_secret_and_only_the_secret_is_hashed():
    key = generate()
    assert split_key(key.text) == (key.key_id, key.secret) and key.text.startswith(key.prefix + "_")
    stored = hash_secret(key.secret, PEPPER)
    assert key.secret not in stored and stored.startswith("hmac-sha256$") and verify_secret(key.secret, stored, PEPPER)
    assert not verify_secret(key.secret + "x", stored, PEPPER)
    assert not verify_secret(key.secret, stored, b"q" * 32)  # another server's pepper matches nothing
    legacy = scrypt_hash(key.secret)  # keys evq 0.1 made
    assert verify_secret(key.secret, legacy, PEPPER) and not verify_secret(key.secret + "x", legacy, PEPPER)
    assert scrypt_hash(key.secret) != legacy  # a fresh salt every time


@pytest.mark.parametrize(
    "text", ["", "evq_", "evq_XYZ_" + "a" * 43, "key_0123456789ab_" + "a" * 43, "evq_0123456789ab_short"]
)
def test_malformed_keys_do_not_split(text):
    assert split_key(text) is None


def test_a_damaged_stored_hash_verifies_nothing():
    assert not verify_secret("s", "scrypt$oops", PEPPER)
    assert not verify_secret("s", "md5$1$2$3$00$00", PEPPER)
    assert not verify_secret("s", "hmac-sha256$", PEPPER)


def test_roles():
    assert ALLOWED == {
        Permission.READ: (Role.AGENT, Role.OPERATOR, Role.ADMIN),
        Permission.ENQUEUE: (Role.AGENT, Role.ADMIN),
        Permission.RESOLVE: (Role.OPERATOR, Role.ADMIN),
        Permission.MANAGE_KEYS: (Role.ADMIN,),
        Permission.PRUNE: (Role.ADMIN,),
        Permission.READ_CONTENT: (Role.OPERATOR, Role.ADMIN),
        Permission.APPROVE: (Role.OPERATOR, Role.ADMIN),
        Permission.CANCEL: (Role.AGENT, Role.OPERATOR, Role.ADMIN),
    }
    assert Identity("a", Role.ADMIN, "0123456789ab").may(Permission.RESOLVE) and not Identity(
        "o", Role.OPERATOR, "0123456789ac"
    ).may(Permission.ENQUEUE)


def test_an_identity_is_made_from_the_keys_row_with_its_id_and_a_revoked_key_has_none():
    from datetime import UTC, datetime

    from evq.worker.errors import BadKey
    from evq.worker.keys import identity_of

    row = {"name": "ada", "role": "admin", "revoked_at": None}
    ada = identity_of("0123456789ab", row)
    assert ada == Identity("ada", Role.ADMIN, "0123456789ab")
    assert ada.enqueued({"actor_key_id": "0123456789ab"}) and not ada.enqueued({"actor_key_id": "0123456789ac"})
    assert not ada.enqueued({"actor_key_id": None}) and not ada.enqueued(None)  # the Python API's: nobody's
    with pytest.raises(BadKey) as revoked:
        identity_of("0123456789ab", {**row, "revoked_at": datetime.now(UTC)})
    assert "revoked" in revoked.value.message


@pytest.mark.parametrize("name", ["", "-x", "a b", "x" * 65, "ünï"])
def test_bad_names_are_refused(name):
    with pytest.raises(InvalidRequest):
        check_name(name)


def test_every_secret_comparison_is_constant_time_and_an_unknown_id_does_the_work_of_a_wrong_secret(monkeypatch):
    """The comparisons go through hmac.compare_digest (never ==), and a key id that does not
    exist does exactly the work of a wrong secret for a known one: the same HMAC, the same
    comparison, so neither answers sooner than the other."""
    import asyncio
    import hmac

    from evq.worker import keys

    work: list[tuple] = []
    real_compare, real_new = hmac.compare_digest, hmac.new

    def compare(a, b):
        work.append(("compare", len(a), len(b)))
        return real_compare(a, b)

    def new(key, msg, digestmod):
        work.append(("hmac", len(key), len(msg), digestmod))
        return real_new(key, msg, digestmod)

    monkeypatch.setattr(keys.hmac, "compare_digest", compare)
    monkeypatch.setattr(keys.hmac, "new", new)
    key = keys.generate()
    row = {
        "name": "alice",
        "role": "operator",
        "revoked_at": None,
        "session_generation": 0,
        "secret_hash": keys.hash_secret(key.secret, PEPPER),
        "pepper": PEPPER,
    }

    class Keys:
        def __init__(self, known):
            self.known = known

        async def key_by_id(self, key_id):
            return row if self.known else None

        async def rehash_key(self, key_id, *, old, new):
            raise AssertionError("an HMAC key is never rehashed")

    def spent(lookup, text) -> list[tuple]:
        work.clear()
        with pytest.raises(keys.AuthFailed, match="not valid"):
            asyncio.run(keys.authenticate(lookup, text, Permission.READ))
        return list(work)

    wrong_secret = spent(Keys(known=True), f"evq_{key.key_id}_{'x' * 43}")
    unknown_id = spent(Keys(known=False), f"evq_{key.key_id}_{'x' * 43}")
    assert wrong_secret == unknown_id and [w[0] for w in wrong_secret] == ["hmac", "compare"]
    work.clear()
    assert asyncio.run(keys.authenticate(Keys(known=True), key.text, Permission.READ)).name == "alice"
    assert [w[0] for w in work] == ["hmac", "compare"]
