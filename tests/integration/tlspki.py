"""Throwaway certificate authorities and certificates for the TLS tests (``cryptography``)."""

from __future__ import annotations

import datetime
import ipaddress
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = ["make_pki"]


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _cert(subject: str, key: ec.EllipticCurvePrivateKey, issuer: str, issuer_key: ec.EllipticCurvePrivateKey,
          *, ca: bool = False, server: bool = False) -> x509.Certificate:
    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (x509.CertificateBuilder().subject_name(_name(subject)).issuer_name(_name(issuer))
               .public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
               .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if server:
        builder = builder.add_extension(x509.SubjectAlternativeName(
            [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]), critical=False)
    if not ca:
        usages = [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
        builder = builder.add_extension(x509.ExtendedKeyUsage(usages), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def _write(path: Path, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey) -> tuple[str, str]:
    path.with_suffix(".pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    path.with_suffix(".key").write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                                           serialization.PrivateFormat.PKCS8,
                                                           serialization.NoEncryption()))
    return str(path.with_suffix(".pem")), str(path.with_suffix(".key"))


def make_pki(directory: Path, ca_name: str = "shoal-test-ca") -> dict[str, str]:
    """A CA, a node certificate for 127.0.0.1/localhost and a client certificate, written to
    ``directory``: paths under the keys ``ca``, ``cert``, ``key``, ``client_cert``, ``client_key``."""
    ca_key, node_key, client_key = (ec.generate_private_key(ec.SECP256R1()) for _ in range(3))
    ca = _cert(ca_name, ca_key, ca_name, ca_key, ca=True)
    ca_pem, _ = _write(directory / "ca", ca, ca_key)
    node_pem, node_key_path = _write(directory / "node", _cert("shoal-node", node_key, ca_name, ca_key, server=True),
                                     node_key)
    client_pem, client_key_path = _write(directory / "client", _cert("worker-1", client_key, ca_name, ca_key),
                                         client_key)
    return {"ca": ca_pem, "cert": node_pem, "key": node_key_path, "client_cert": client_pem,
            "client_key": client_key_path}
