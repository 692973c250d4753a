"""``zookeeper.security`` as kazoo client arguments, and the ACL of every znode.

* TLS to ZooKeeper's secure client port: kazoo's ``use_ssl`` with the CA, the optional
  client certificate, and host name checking.
* Identity: SASL DIGEST-MD5 (kazoo's ``sasl_options``, ZooKeeper's
  ``SASLAuthenticationProvider``), or ZooKeeper's ``digest`` scheme (``addauth``).
* ACLs: with an identity set, kazoo's ``default_acl`` gives every znode the sidecars
  create (transactions, ephemeral nodes and ``ensure_path`` included) ALL for that
  identity and READ for anyone (``world_readable``), or nothing for anyone else. A
  client without the identity can read at most; it cannot write a generation, a
  partition mode, a journal or a lock. Without an identity, znodes stay open, as before.
"""

from __future__ import annotations

import contextlib
import socket
import ssl
from typing import Any

from kazoo.security import ACL, make_acl, make_digest_acl

from sidecar.config import ZooKeeperSecuritySettings

_PREFIX = "zookeeper.security."


def kazoo_arguments(security: ZooKeeperSecuritySettings) -> dict[str, Any]:
    """KazooClient's keyword arguments for ``security``."""
    arguments: dict[str, Any] = {}
    if security.tls:
        arguments.update(
            use_ssl=True,
            verify_certs=True,
            check_hostname=security.ssl_check_hostname,
            ca=security.ssl_cafile or None,
            certfile=security.ssl_certfile or None,
            keyfile=security.ssl_keyfile or None,
        )
    if security.authenticated:
        password = security.password()
        if security.sasl_mechanism == "DIGEST-MD5":
            arguments["sasl_options"] = {
                "mechanism": "DIGEST-MD5",
                "username": security.digest_username,
                "password": password,
            }
        else:
            arguments["auth_data"] = [("digest", f"{security.digest_username}:{password}")]
        arguments["default_acl"] = znode_acl(security)
    return arguments


def znode_acl(security: ZooKeeperSecuritySettings) -> list[ACL]:
    """The ACL of every znode the sidecars create (empty: ZooKeeper's open ACL)."""
    if not security.authenticated:
        return []
    if security.sasl_mechanism == "DIGEST-MD5":
        owner = make_acl("sasl", security.digest_username, all=True)
    else:
        owner = make_digest_acl(security.digest_username, security.password(), all=True)
    acl = [owner]
    if security.world_readable:
        acl.append(make_acl("world", "anyone", read=True))
    return acl


def identity_of(security: ZooKeeperSecuritySettings) -> str:
    """How ZooKeeper names this sidecar's identity, for messages (no secret in it)."""
    if not security.authenticated:
        return "an unauthenticated client"
    scheme = "sasl" if security.sasl_mechanism == "DIGEST-MD5" else "digest"
    return f"{scheme}:{security.digest_username}"


def diagnose_tls(hosts: str, security: ZooKeeperSecuritySettings) -> str | None:
    """One TLS handshake with the first ZooKeeper server that accepts a connection: why
    it failed, naming the setting, or None (it succeeded, or no server could be reached).
    Blocking: run it in a thread."""
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    context.check_hostname = security.ssl_check_hostname
    try:
        if security.ssl_cafile:
            context.load_verify_locations(cafile=security.ssl_cafile)
        if security.ssl_certfile:
            context.load_cert_chain(security.ssl_certfile, security.ssl_keyfile)
    except (ssl.SSLError, OSError) as exc:
        return f"{_PREFIX}ssl_cafile / ssl_certfile / ssl_keyfile: unusable ({exc})"
    for entry in hosts.split("/")[0].split(","):
        host, _, port = entry.strip().rpartition(":")
        try:
            address = (host.strip("[]"), int(port))
        except ValueError:
            continue
        try:
            with (
                socket.create_connection(address, timeout=5.0) as raw,
                context.wrap_socket(raw, server_hostname=address[0]) as tls,
            ):
                with contextlib.suppress(OSError):
                    tls.recv(1)  # a refused client certificate shows at the first read
                return None
        except ssl.SSLCertVerificationError as exc:
            if exc.verify_code in (62, 64):
                return (
                    f"{_PREFIX}ssl_check_hostname: ZooKeeper's certificate does not name "
                    f"{address[0]}"
                )
            trusted = security.ssl_cafile or "the system's CA bundle"
            return (
                f"{_PREFIX}ssl_cafile: ZooKeeper's certificate at {address[0]}:{address[1]} is "
                f"not trusted by {trusted} ({exc.verify_message})"
            )
        except ssl.SSLError as exc:
            return (
                f"{_PREFIX}tls: the TLS handshake with ZooKeeper at {address[0]}:{address[1]} "
                f"failed ({exc.reason}); is it its secure client port?"
            )
        except OSError:
            continue
    return None
