"""Fixtures for the unit tests: config files, a self-signed certificate, qrouter_tools."""

from __future__ import annotations

import datetime
import importlib.util
import ipaddress
import logging
import shutil
import subprocess
import sys
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from qrouter.config import RouterConfig
from tests.tools_alias import alias_tools_package

alias_tools_package()


@pytest.fixture(autouse=True)
def restore_logging() -> Iterator[None]:
    """Tests that run the CLI in-process configure the "qrouter" loggers (router.log); put
    them back, so later tests (pytest's caplog) still see records propagate."""
    root = logging.getLogger("qrouter")
    saved = (root.level, list(root.handlers), root.propagate)
    levels = {
        name: logger.level
        for name, logger in logging.root.manager.loggerDict.items()
        if name.startswith("qrouter.") and isinstance(logger, logging.Logger)
    }
    yield
    root.setLevel(saved[0])
    root.handlers[:] = saved[1]
    root.propagate = saved[2]
    for name, logger in logging.root.manager.loggerDict.items():
        if name.startswith("qrouter.") and isinstance(logger, logging.Logger):
            logger.setLevel(levels.get(name, logging.NOTSET))


@pytest.fixture
def write_config(tmp_path: Path) -> Callable[[str], str]:
    """Write TOML text to a file in tmp_path and return its path."""

    def write(text: str, name: str = "qrouter.toml") -> str:
        path = tmp_path / name
        path.write_text(text, encoding="utf-8")
        return str(path)

    return write


@dataclass
class CertFiles:
    cert: str  # self-signed, CN and SAN localhost + 127.0.0.1; also its own CA
    key: str
    other_key: str  # a key that does not belong to `cert`


def _generate_with_cryptography(directory: Path) -> CertFiles:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    def write_key(path: Path) -> ec.EllipticCurvePrivateKey:
        key = ec.generate_private_key(ec.SECP256R1())
        path.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
        return key

    key = write_key(directory / "key.pem")
    write_key(directory / "other-key.pem")
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    (directory / "cert.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return CertFiles(
        str(directory / "cert.pem"), str(directory / "key.pem"), str(directory / "other-key.pem")
    )


def _generate_with_openssl(directory: Path) -> CertFiles:
    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)

    for name in ("key.pem", "other-key.pem"):
        run("ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", str(directory / name))
    run(
        "req", "-x509", "-new", "-key", str(directory / "key.pem"),
        "-out", str(directory / "cert.pem"), "-days", "1", "-subj", "/CN=localhost",
        "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1",
    )  # fmt: skip
    return CertFiles(
        str(directory / "cert.pem"), str(directory / "key.pem"), str(directory / "other-key.pem")
    )


@pytest.fixture(scope="session")
def certs(tmp_path_factory: pytest.TempPathFactory) -> CertFiles:
    """A self-signed certificate made for this run.

    `cryptography` is used when installed; it is not a declared test dependency, so in a fresh
    tox environment the `openssl` command makes it instead (test_tls.py checks both ways);
    with neither, the TLS tests are skipped.
    """
    directory = tmp_path_factory.mktemp("certs")
    if importlib.util.find_spec("cryptography") is not None:
        return _generate_with_cryptography(directory)
    if shutil.which("openssl"):
        return _generate_with_openssl(directory)
    pytest.skip("neither cryptography nor the openssl command is available")


@pytest.fixture
def openssl_certs(tmp_path: Path) -> CertFiles:
    """Like `certs`, always made with the openssl command (to test that fallback)."""
    return _generate_with_openssl(tmp_path)


@pytest.fixture
def started(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[RouterConfig]]:
    """Replace router.server with a fake whose run() records the config and returns 0."""
    calls: list[RouterConfig] = []
    fake = types.ModuleType("qrouter.server")

    def run(cfg: RouterConfig) -> int:
        calls.append(cfg)
        return 0

    fake.run = run  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "qrouter.server", fake)
    root = logging.getLogger("qrouter")
    saved = (root.level, list(root.handlers), root.propagate)
    yield calls
    root.setLevel(saved[0])
    root.handlers[:] = saved[1]
    root.propagate = saved[2]


@pytest.fixture(scope="module")
def load_bin() -> Path:
    """amqp_load, the bench's proton-C yardstick (tests/unit/test_bench_*.py)."""
    from qrouter_tools.bench.run import BenchError, find_load_client

    try:
        return find_load_client(None)
    except BenchError as e:
        pytest.skip(f"amqp_load, the proton-C yardstick, cannot be built here: {e}")
