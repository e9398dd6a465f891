"""TLS contexts: made from a certificate generated for the run (conftest `certs`)."""

from __future__ import annotations

import shutil
import ssl
from pathlib import Path
from typing import Any

import pytest

from qrouter.config import ConfigError
from qrouter.tls import client_context, server_context


def handshake(server: ssl.SSLContext, client: ssl.SSLContext) -> tuple[str | None, Any]:
    """Run a TLS handshake in memory (no sockets); return (version, server's view of peer)."""
    s_in, s_out, c_in, c_out = (ssl.MemoryBIO() for _ in range(4))
    s = server.wrap_bio(s_in, s_out, server_side=True)
    c = client.wrap_bio(c_in, c_out, server_side=False, server_hostname="localhost")
    done = {"s": False, "c": False}
    for _ in range(20):
        for name, obj in (("c", c), ("s", s)):
            if not done[name]:
                try:
                    obj.do_handshake()
                    done[name] = True
                except ssl.SSLWantReadError:
                    pass
        s_in.write(c_out.read())
        c_in.write(s_out.read())
        if all(done.values()):
            return c.version(), s.getpeercert()
    raise AssertionError("handshake did not finish")


def test_server_and_client(certs: Any) -> None:
    server = server_context(certs.cert, certs.key)
    assert server.minimum_version == ssl.TLSVersion.TLSv1_2
    assert server.verify_mode == ssl.CERT_NONE
    client = client_context(ca=certs.cert)
    assert client.minimum_version == ssl.TLSVersion.TLSv1_2 and client.check_hostname
    version, peer = handshake(server, client)
    assert version in ("TLSv1.2", "TLSv1.3")
    assert peer is None or peer == {}


def test_client_certificate_required(certs: Any) -> None:
    server = server_context(certs.cert, certs.key, ca=certs.cert, require_client_cert=True)
    assert server.verify_mode == ssl.CERT_REQUIRED
    client = client_context(ca=certs.cert, cert=certs.cert, key=certs.key)
    _, peer = handshake(server, client)
    assert peer and dict(x[0] for x in peer["subject"])["commonName"] == "localhost"
    optional = server_context(certs.cert, certs.key, ca=certs.cert)
    assert optional.verify_mode == ssl.CERT_OPTIONAL


def test_untrusted_server_is_refused(certs: Any, tmp_path: Path) -> None:
    server = server_context(certs.cert, certs.key)
    client = client_context()  # system CAs only: the self-signed certificate is not trusted
    with pytest.raises(ssl.SSLCertVerificationError):
        handshake(server, client)


def test_errors(certs: Any, tmp_path: Path) -> None:
    missing = str(tmp_path / "missing.pem")
    cases = [
        (lambda: server_context(missing, certs.key), "tls_cert", "cannot read"),
        (lambda: server_context(certs.cert, missing), "tls_key", "cannot read"),
        (lambda: server_context(certs.cert, certs.other_key), "tls_key", "is not the key of"),
        (lambda: server_context(certs.key, certs.key), "tls_cert", "cannot load certificate"),
        (lambda: server_context(certs.cert, certs.key, ca=missing), "tls_ca", "cannot load CA"),
        (lambda: server_context(certs.cert, certs.key, ca=certs.key), "tls_ca", "cannot load CA"),
        (
            lambda: server_context(certs.cert, certs.key, require_client_cert=True),
            "require_client_cert",
            "needs tls_ca",
        ),
        (lambda: client_context(cert=certs.cert), "tls_cert", "both"),
    ]
    for call, key, what in cases:
        with pytest.raises(ConfigError) as info:
            call()
        assert info.value.key == key
        assert what in str(info.value) and "\n" not in str(info.value)


@pytest.mark.skipif(shutil.which("openssl") is None, reason="no openssl command")
def test_openssl_fallback_makes_usable_files(openssl_certs: Any) -> None:
    # conftest falls back to the openssl command when `cryptography` is not installed (the
    # case in a fresh tox environment); check that path here whichever one `certs` took.
    files = openssl_certs
    handshake(server_context(files.cert, files.key), client_context(ca=files.cert))
