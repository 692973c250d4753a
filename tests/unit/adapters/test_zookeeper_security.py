"""``zookeeper.security`` as kazoo arguments and the znodes' ACL, without a server."""

from __future__ import annotations

from kazoo.security import OPEN_ACL_UNSAFE, Permissions, make_digest_acl_credential

from sidecar.adapters.zookeeper_security import identity_of, kazoo_arguments, znode_acl
from sidecar.config import Secret, ZooKeeperSecuritySettings


def test_without_an_identity_nothing_changes() -> None:
    assert kazoo_arguments(ZooKeeperSecuritySettings()) == {}
    assert znode_acl(ZooKeeperSecuritySettings()) == []


def test_sasl_digest_md5_owns_every_znode_and_others_read() -> None:
    security = ZooKeeperSecuritySettings(
        tls=True,
        ssl_cafile="/etc/ca.pem",
        sasl_mechanism="DIGEST-MD5",
        digest_username="sidecar",
        digest_password=Secret("pw"),
    )
    arguments = kazoo_arguments(security)
    assert arguments["use_ssl"] is True
    assert arguments["ca"] == "/etc/ca.pem"
    assert arguments["check_hostname"] is True
    assert arguments["sasl_options"] == {
        "mechanism": "DIGEST-MD5",
        "username": "sidecar",
        "password": "pw",
    }
    owner, world = arguments["default_acl"]
    assert (owner.id.scheme, owner.id.id, owner.perms) == ("sasl", "sidecar", Permissions.ALL)
    assert (world.id.scheme, world.id.id, world.perms) == ("world", "anyone", Permissions.READ)
    assert arguments["default_acl"] != OPEN_ACL_UNSAFE
    assert identity_of(security) == "sasl:sidecar"


def test_digest_scheme_adds_auth_and_can_hide_the_znodes() -> None:
    security = ZooKeeperSecuritySettings(
        digest_username="sidecar", digest_password=Secret("pw"), world_readable=False
    )
    arguments = kazoo_arguments(security)
    assert arguments["auth_data"] == [("digest", "sidecar:pw")]
    assert "sasl_options" not in arguments
    (owner,) = arguments["default_acl"]
    assert owner.id.scheme == "digest"
    assert owner.id.id == make_digest_acl_credential("sidecar", "pw")
    assert "pw" not in identity_of(security)
