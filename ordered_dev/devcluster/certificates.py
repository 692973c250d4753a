"""Certificates for the dev cluster's security mode, made with ``cryptography``.

A throw-away CA, server certificates for the brokers and ZooKeeper (naming 127.0.0.1
and ``localhost``, or what the caller asks), and client certificates for mutual TLS,
written as PEM files. Kafka and ZooKeeper read PEM directly (``ssl.keystore.type=PEM``),
so no JDK ``keytool`` is needed.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_ONE_DAY = datetime.timedelta(days=1)


@dataclass(frozen=True)
class CertificateFiles:
    """A certificate and its key as PEM files (the key encrypted if ``key_password``)."""

    certfile: Path
    keyfile: Path
    key_password: str = ""

    @property
    def combined(self) -> Path:
        """Key and certificate in one file (what ZooKeeper's PEM keystore reads)."""
        return self.certfile.with_name(self.certfile.stem + "-combined.pem")


class CertificateAuthority:
    """A self-signed CA that issues server and client certificates."""

    def __init__(self, name: str = "ordered-sidecar dev CA") -> None:
        self.key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        self.certificate = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(self.key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - _ONE_DAY)
            .not_valid_after(now + 365 * _ONE_DAY)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .sign(self.key, hashes.SHA256())
        )

    def write_ca(self, path: Path) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(self.certificate.public_bytes(serialization.Encoding.PEM))
        return path

    def issue(
        self,
        directory: Path,
        name: str,
        *,
        hosts: tuple[str, ...] = ("127.0.0.1", "localhost"),
        server: bool = True,
        key_password: str = "",
        expired: bool = False,
    ) -> CertificateFiles:
        """Issue a certificate with common name ``name`` naming ``hosts`` (server and
        client use both); ``expired``: valid only until yesterday."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        not_after = now - _ONE_DAY if expired else now + 365 * _ONE_DAY
        names: list[x509.GeneralName] = []
        for host in hosts:
            try:
                names.append(x509.IPAddress(ipaddress.ip_address(host)))
            except ValueError:
                names.append(x509.DNSName(host))
        usages = [ExtendedKeyUsageOID.CLIENT_AUTH]
        if server:
            usages.append(ExtendedKeyUsageOID.SERVER_AUTH)
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
            .issuer_name(self.certificate.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - 2 * _ONE_DAY)
            .not_valid_after(not_after)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        )
        if names:
            builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
        certificate = builder.sign(self.key, hashes.SHA256())
        directory.mkdir(parents=True, exist_ok=True)
        files = CertificateFiles(directory / f"{name}.pem", directory / f"{name}.key", key_password)
        certificate_pem = certificate.public_bytes(serialization.Encoding.PEM)
        files.certfile.write_bytes(certificate_pem)
        encryption: serialization.KeySerializationEncryption = (
            serialization.BestAvailableEncryption(key_password.encode())
            if key_password
            else serialization.NoEncryption()
        )
        key_pem = key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption
        )
        files.keyfile.write_bytes(key_pem)
        files.keyfile.chmod(0o600)
        files.combined.write_bytes(key_pem + certificate_pem)
        files.combined.chmod(0o600)
        return files
