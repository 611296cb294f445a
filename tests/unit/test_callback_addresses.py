"""Which addresses a key's callback may be POSTed to (adapters/http/callback.py)."""

from __future__ import annotations

import ipaddress

import pytest

from evq.adapters.http.callback import public


@pytest.mark.parametrize(
    "address",
    [
        "127.0.0.1",
        "10.0.0.1",
        "169.254.169.254",
        "::1",
        "::ffff:127.0.0.1",
        "::127.0.0.1",  # IPv4-compatible
        "64:ff9b::7f00:1",  # NAT64 of 127.0.0.1
        "64:ff9b::a00:1",  # NAT64 of 10.0.0.1
        "64:ff9b::a9fe:a9fe",  # NAT64 of the metadata address
        "64:ff9b:1::1",  # local-use NAT64
        "2002:7f00:1::",  # 6to4 of 127.0.0.1
        "fec0::1",  # site-local
        "fe80::1",
        "fc00::1",
        "224.0.0.1",
        "ff02::1",
    ],
)
def test_internal_addresses_are_refused(address):
    assert public(ipaddress.ip_address(address)) is False


@pytest.mark.parametrize("address", ["93.184.216.34", "2606:2800:220:1:248:1893:25c8:1946", "64:ff9b::5db8:d822"])
def test_public_addresses_are_allowed(address):
    # The last: NAT64 of the public 93.184.216.34.
    assert public(ipaddress.ip_address(address)) is True
