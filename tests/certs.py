"""Throw-away certificates for TLS tests, made with `cryptography`.

One CA; a server certificate for 127.0.0.1 / localhost signed by it; a client
certificate signed by it (for mutual TLS); and a second, unrelated CA that
trusts nothing of ours. All PEM files, unencrypted keys.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass
class Certs:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    other_ca: Path


def _name(cn: str) -> x509.Name:
    return x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "qrouter tests"),
            x509.NameAttribute(NameOID.COMMON_NAME, cn),
        ]
    )


def _write_key(key: ec.EllipticCurvePrivateKey, path: Path) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )


def _write_cert(cert: x509.Certificate, path: Path) -> None:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


def _ca(cn: str) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(cn))
        .issuer_name(_name(cn))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=2))
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
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return key, cert


def _leaf(
    ca_key: ec.EllipticCurvePrivateKey, ca_cert: x509.Certificate, cn: str, server: bool
) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(cn))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
    )
    if server:
        # proton's peer-name check looks at DNS names and the CN; OpenSSL-based
        # servers and other clients look at the IP entry.
        builder = builder.add_extension(
            x509.SubjectAlternativeName(
                [
                    x509.DNSName("localhost"),
                    x509.DNSName("127.0.0.1"),
                    x509.IPAddress(ipaddress.IPv4Address("127.0.0.1")),
                ]
            ),
            critical=False,
        )
    return key, builder.sign(ca_key, hashes.SHA256())


def make_certs(folder: Path) -> Certs:
    folder.mkdir(parents=True, exist_ok=True)
    ca_key, ca_cert = _ca("qrouter test CA")
    s_key, s_cert = _leaf(ca_key, ca_cert, "127.0.0.1", server=True)
    c_key, c_cert = _leaf(ca_key, ca_cert, "test-client", server=False)
    _o_key, o_cert = _ca("some other CA")
    certs = Certs(
        ca=folder / "ca.pem",
        server_cert=folder / "server-cert.pem",
        server_key=folder / "server-key.pem",
        client_cert=folder / "client-cert.pem",
        client_key=folder / "client-key.pem",
        other_ca=folder / "other-ca.pem",
    )
    _write_cert(ca_cert, certs.ca)
    _write_cert(s_cert, certs.server_cert)
    _write_key(s_key, certs.server_key)
    _write_cert(c_cert, certs.client_cert)
    _write_key(c_key, certs.client_key)
    _write_cert(o_cert, certs.other_ca)
    return certs


@dataclass
class MeshCerts:
    """A mesh CA and one certificate per router (CN = the router's name, usable as server and
    as client, for 127.0.0.1), plus a router certificate from an unrelated CA."""

    ca: Path
    routers: dict[str, tuple[Path, Path]]  # name -> (cert, key)
    rogue: tuple[Path, Path]  # CN=rogue, signed by another CA


def _router_leaf(
    ca_key: ec.EllipticCurvePrivateKey, ca_cert: x509.Certificate, cn: str
) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(cn))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
        .add_extension(
            x509.SubjectAlternativeName(
                [
                    x509.DNSName("localhost"),
                    x509.DNSName("127.0.0.1"),  # proton checks DNS names, not the IP entry
                    x509.IPAddress(ipaddress.IPv4Address("127.0.0.1")),
                ]
            ),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    return key, cert


def make_mesh_certs(folder: Path, names: list[str]) -> MeshCerts:
    folder.mkdir(parents=True, exist_ok=True)
    ca_key, ca_cert = _ca("qrouter mesh CA")
    _write_cert(ca_cert, folder / "mesh-ca.pem")
    routers = {}
    for name in names:
        key, cert = _router_leaf(ca_key, ca_cert, name)
        paths = (folder / f"{name}-cert.pem", folder / f"{name}-key.pem")
        _write_cert(cert, paths[0])
        _write_key(key, paths[1])
        routers[name] = paths
    other_key, other_cert = _ca("not the mesh CA")
    key, cert = _router_leaf(other_key, other_cert, "rogue")
    rogue = (folder / "rogue-cert.pem", folder / "rogue-key.pem")
    _write_cert(cert, rogue[0])
    _write_key(key, rogue[1])
    return MeshCerts(folder / "mesh-ca.pem", routers, rogue)


def client_domain(ca: Any, cert: Any = None, key: Any = None) -> Any:
    """A proton client SSLDomain trusting *ca*, checking the peer name."""
    from proton import SSLDomain

    domain = SSLDomain(SSLDomain.MODE_CLIENT)
    domain.set_trusted_ca_db(str(ca))
    domain.set_peer_authentication(SSLDomain.VERIFY_PEER_NAME)
    if cert is not None:
        domain.set_credentials(str(cert), str(key), None)
    return domain


def tls_listener(certs: Certs, **extra: Any) -> dict[str, Any]:
    """Listener options for a TLS listener with the test server certificate."""
    return {"tls_cert": str(certs.server_cert), "tls_key": str(certs.server_key), **extra}
