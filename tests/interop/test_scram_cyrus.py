"""SCRAM-SHA-256 with a third-party AMQP client (issue 14, item 6): python-qpid-proton whose C
core is built with Cyrus SASL, whose SCRAM plugin (libsasl2-modules) computes the client's
side. The PyPI wheel of python-qpid-proton is built without Cyrus (SASL.extended() is False)
and speaks only ANONYMOUS, PLAIN and EXTERNAL, so these tests run where proton was built from
its source distribution with libsasl2-dev present (pip install --no-binary
python-qpid-proton python-qpid-proton); docs/security.md, "SCRAM with other clients".

Cyrus refuses to compute more than 65,536 iterations, so its users are written with
``qrouter-tool passwd --iterations 65536``; a user at the default 200,000 is refused by the
client itself, which the last test pins down.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import proton
import pytest
from proton import ConnectionException, Message
from proton.reactor import AtMostOnce

from qrouter import scram
from qrouter.auth import UserDB
from tests.harness import MeshRouter, Router
from tests.mesh_system.mesh import wait_log

pytestmark = pytest.mark.skipif(
    not proton.SASL.extended(),
    reason="this python-qpid-proton is built without Cyrus SASL (the PyPI wheel), so it cannot "
    "do SCRAM-SHA-256; build it from its sdist with libsasl2-dev and libsasl2-modules to run this",
)


class _Router(Router):
    log_text = MeshRouter.log_text


def _router(router: Any, tmp_path: Path) -> Any:
    db = UserDB()
    db.set("cyrus", "cyrus-secret", iterations=scram.CYRUS_MAX_ITERATIONS)
    db.set("carol", "carol-secret", iterations=scram.CYRUS_MAX_ITERATIONS)
    db.set("modern", "modern-secret")  # the default count, 200,000
    db.save(str(tmp_path / "users"))
    return router(
        cls=_Router,
        config={"users_file": str(tmp_path / "users")},
        listeners=[{"sasl_mechanisms": ["SCRAM-SHA-256"], "require_auth": True}],
    )


def _scram(user: str, password: str) -> dict[str, Any]:
    return {"allowed_mechs": "SCRAM-SHA-256", "user": user, "password": password}


def test_cyrus_scram_client_logs_in_and_carries_messages(
    router: Any, blocking: Any, tmp_path: Path
) -> None:
    r = _router(router, tmp_path)
    conn = blocking(r.url, **_scram("cyrus", "cyrus-secret"))
    receiver = conn.create_receiver("scram.cyrus", credit=10)
    sender = conn.create_sender("scram.cyrus", options=AtMostOnce())
    for i in range(3):
        sender.send(Message(body=i))
    assert [receiver.receive(timeout=10).body for _ in range(3)] == [0, 1, 2]
    wait_log(r, "authenticated user 'cyrus' (SCRAM-SHA-256)")


@pytest.mark.parametrize(
    ("user", "password"),
    [("cyrus", "not-it"), ("mallory", "cyrus-secret")],
    ids=["wrong-password", "unknown-user"],
)
def test_cyrus_scram_client_refused(
    router: Any, blocking: Any, tmp_path: Path, user: str, password: str
) -> None:
    """A wrong password and an unknown user get the same answer (SASL outcome auth), the
    unknown user after a challenge with the users' iteration count (else Cyrus would refuse
    it as too big, which would tell who exists)."""
    r = _router(router, tmp_path)
    with pytest.raises(ConnectionException, match="Authentication failed") as failed:
        blocking(r.url, timeout=10, **_scram(user, password))
    assert "too big" not in str(failed.value)
    wait_log(r, f"SASL SCRAM-SHA-256: refused user {user!r}")


def test_cyrus_refuses_more_than_65536_iterations(
    router: Any, blocking: Any, tmp_path: Path
) -> None:
    r = _router(router, tmp_path)
    with pytest.raises(ConnectionException, match="iteration-count is too big"):
        blocking(r.url, timeout=10, **_scram("modern", "modern-secret"))
