"""API key material and roles, without a database."""

from __future__ import annotations

import pytest

from worker.errors import InvalidRequest
from worker.keys import ALLOWED, Identity, Permission, Role, check_name, generate, hash_secret, split_key, verify_secret


def test_a_key_splits_into_its_id_and_secret_and_only_the_secret_is_hashed():
    key = generate()
    assert split_key(key.text) == (key.key_id, key.secret) and key.text.startswith(key.prefix + "_")
    stored = hash_secret(key.secret)
    assert key.secret not in stored and verify_secret(key.secret, stored)
    assert not verify_secret(key.secret + "x", stored)
    assert hash_secret(key.secret) != stored  # a fresh salt every time


@pytest.mark.parametrize("text", ["", "evq_", "evq_XYZ_" + "a" * 43, "key_0123456789ab_" + "a" * 43, "evq_0123456789ab_short"])
def test_malformed_keys_do_not_split(text):
    assert split_key(text) is None


def test_a_damaged_stored_hash_verifies_nothing():
    assert not verify_secret("s", "scrypt$oops")
    assert not verify_secret("s", "md5$1$2$3$00$00")


def test_roles():
    assert ALLOWED == {
        Permission.READ: (Role.AGENT, Role.OPERATOR, Role.ADMIN),
        Permission.ENQUEUE: (Role.AGENT, Role.ADMIN),
        Permission.RESOLVE: (Role.OPERATOR, Role.ADMIN),
        Permission.MANAGE_KEYS: (Role.ADMIN,),
        Permission.PRUNE: (Role.ADMIN,),
    }
    assert Identity("a", Role.ADMIN).may(Permission.RESOLVE) and not Identity("o", Role.OPERATOR).may(Permission.ENQUEUE)


@pytest.mark.parametrize("name", ["", "-x", "a b", "x" * 65, "ünï"])
def test_bad_names_are_refused(name):
    with pytest.raises(InvalidRequest):
        check_name(name)


def test_a_verified_key_is_remembered_only_for_its_own_secret_and_stored_hash():
    from worker.keys import Verified

    key = generate()
    stored = hash_secret(key.secret)
    verified = Verified(size=2)
    assert verified.check(key.key_id, key.secret, stored)
    assert verified.check(key.key_id, key.secret, stored)  # from memory now
    assert not verified.check(key.key_id, key.secret + "x", stored)  # another secret for the same id
    assert not verified.check(key.key_id, key.secret, hash_secret("another"))  # the stored hash changed
    for _ in range(3):  # bounded: the oldest is forgotten, and is verified again when it comes back
        other = generate()
        assert verified.check(other.key_id, other.secret, hash_secret(other.secret))
    assert len(verified._seen) == 2 and verified.check(key.key_id, key.secret, stored)


def test_every_secret_comparison_is_constant_time_and_an_unknown_id_pays_for_scrypt(monkeypatch):
    """The comparisons go through hmac.compare_digest (never ==), and a key id that does not
    exist is still checked against a decoy hash, so neither a wrong secret nor an unknown id
    answers sooner than the other."""
    import asyncio
    import hashlib
    import hmac

    from worker import keys

    compared: list[tuple[str, str]] = []
    hashed: list[bytes] = []
    real_compare, real_scrypt = hmac.compare_digest, hashlib.scrypt

    def compare(a, b):
        compared.append((a, b))
        return real_compare(a, b)

    def scrypt(secret, **kw):
        hashed.append(kw["salt"])
        return real_scrypt(secret, **kw)

    monkeypatch.setattr(keys.hmac, "compare_digest", compare)
    monkeypatch.setattr(keys.hashlib, "scrypt", scrypt)
    key = keys.generate()
    stored = keys.hash_secret(key.secret)
    assert keys.verify_secret(key.secret, stored) and not keys.verify_secret(key.secret + "x", stored)
    assert len(compared) == 2
    cache = keys.Verified()
    assert cache.check(key.key_id, key.secret, stored) and not cache.check(key.key_id, key.secret + "x", stored)
    assert len(compared) == 4  # the remembered match is compared in constant time too

    class NoKeys:
        async def key_by_id(self, key_id):
            return None

    hashed.clear()
    with pytest.raises(keys.AuthFailed, match="not valid"):
        asyncio.run(keys.authenticate(NoKeys(), key.text, Permission.READ))
    decoy_salt = bytes.fromhex(keys._DECOY.split("$")[4])
    assert hashed == [decoy_salt] and len(compared) == 5
