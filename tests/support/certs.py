"""Throwaway X.509 material for TLS tests: a self-signed CA, and a server certificate it signs.
EC P-256, valid from five minutes ago for a day; nothing here is fit for anything but a test."""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

_PEM = serialization.Encoding.PEM


def _window(builder: x509.CertificateBuilder) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.UTC)
    return builder.not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(
        now + datetime.timedelta(days=1)
    )


def new_ca(common_name: str) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    """A self-signed CA certificate named ``common_name`` and its key."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    builder = x509.CertificateBuilder().subject_name(name).issuer_name(name)
    builder = _window(
        builder.public_key(key.public_key()).serial_number(x509.random_serial_number())
    )
    builder = builder.add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
    return key, builder.sign(key, hashes.SHA256())


def write_ca(path: Path, common_name: str) -> None:
    """A new CA certificate (PEM) at ``path``; its key is thrown away."""
    _, cert = new_ca(common_name)
    path.write_bytes(cert.public_bytes(_PEM))


def write_server_set(
    directory: Path, names: Sequence[str], ca_name: str = "ironclaw test CA"
) -> None:
    """``ca.pem``, and ``server.pem``/``server.key`` for DNS ``names`` (the first is also the
    subject's common name), signed by that CA, in ``directory``."""
    ca_key, ca = new_ca(ca_name)
    key = ec.generate_private_key(ec.SECP256R1())
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])]))
        .issuer_name(ca.subject).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(n) for n in names]), False)
    )  # fmt: skip
    cert = _window(builder).sign(ca_key, hashes.SHA256())
    (directory / "ca.pem").write_bytes(ca.public_bytes(_PEM))
    (directory / "server.pem").write_bytes(cert.public_bytes(_PEM))
    (directory / "server.key").write_bytes(
        key.private_bytes(_PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
