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
