"""SASL PLAIN against the router's users file (hashed passwords).

The users file holds `user:<hash>` lines made with router.auth.hash_password.
A listener with sasl_mechanisms ["PLAIN"] and require_auth: the right
password opens the connection; a wrong one, an unknown user, or ANONYMOUS is
refused with SASL outcome auth (proton: ConnectionException, "Authentication
failed" / amqp:unauthorized-access).
"""

from __future__ import annotations

import concurrent.futures
from pathlib import Path
from typing import Any

import pytest
from proton import ConnectionException, Delivery, Message

from tests.certs import Certs, client_domain, tls_listener
from tests.clients import pump_until_done

USER, PASSWORD = "alice", "correct horse battery staple"


def users_file(folder: Path) -> Path:
    from qrouter.auth import hash_password

    path = folder / "users"
    path.write_text(f"{USER}:{hash_password(PASSWORD)}\nbob:{hash_password('bobs-secret')}\n")
    return path


def plain_router(router: Any, tmp_path: Path, **listener: Any) -> Any:
    return router(
        config={"users_file": str(users_file(tmp_path))},
        listeners=[{"sasl_mechanisms": ["PLAIN"], "require_auth": True, **listener}],
    )


def plain(user: str, password: str) -> dict[str, Any]:
    # allow_insecure_mechs: PLAIN over a socket without TLS (loopback)
    return {
        "allowed_mechs": "PLAIN",
        "user": user,
        "password": password,
        "allow_insecure_mechs": True,
    }


def test_sasl_plain_accepted(router: Any, blocking: Any, tmp_path: Path) -> None:
    r = plain_router(router, tmp_path)
    receiver = blocking(r.url, **plain(USER, PASSWORD)).create_receiver("sasl/q", credit=1)
    sender = blocking(r.url, **plain("bob", "bobs-secret")).create_sender("sasl/q")
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        future = pool.submit(sender.send, Message(body="authenticated"), 15)
        assert receiver.receive(timeout=10).body == "authenticated"
        receiver.accept()
        assert pump_until_done(receiver.connection, future).remote_state == Delivery.ACCEPTED


@pytest.mark.parametrize(
    ("user", "password"),
    [(USER, "wrong password"), ("mallory", PASSWORD), (USER, "")],
    ids=["wrong-password", "unknown-user", "empty-password"],
)
def test_sasl_plain_refused(
    router: Any, blocking: Any, tmp_path: Path, user: str, password: str
) -> None:
    r = plain_router(router, tmp_path)
    with pytest.raises(ConnectionException, match="(?i)auth"):
        blocking(r.url, timeout=5, **plain(user, password))


def test_anonymous_refused_when_auth_required(router: Any, blocking: Any, tmp_path: Path) -> None:
    r = plain_router(router, tmp_path)
    with pytest.raises(ConnectionException):
        blocking(r.url, timeout=5, allowed_mechs="ANONYMOUS")


def test_sasl_plain_over_tls(router: Any, blocking: Any, tmp_path: Path, certs: Certs) -> None:
    r = plain_router(router, tmp_path, **tls_listener(certs))
    conn = blocking(
        r.url,
        ssl_domain=client_domain(certs.ca),
        allowed_mechs="PLAIN",
        user=USER,
        password=PASSWORD,
        allow_insecure_mechs=False,
    )
    assert conn.conn.transport.user == USER
    conn.create_receiver("sasl/tls", credit=1)
    with pytest.raises(ConnectionException, match="(?i)auth"):
        blocking(r.url, ssl_domain=client_domain(certs.ca), timeout=5, **plain(USER, "nope"))
