"""A mesh that admits only its routers (issue 14, items 4-6): mutual TLS and SASL between real
router processes, mesh identities, one connection per router id, and the refusals.

Each router here has a normal listener (clients) and, when it is listened to, an inter-router
listener; connectors are ``[[connector]]`` tables of its config file.
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path
from typing import Any

import pytest
from proton import ConnectionException
from proton.utils import BlockingConnection

from qrouter import scram
from qrouter.auth import UserDB
from tests.certs import MeshCerts, client_domain, make_mesh_certs
from tests.clients import run_container
from tests.harness import HOST, ROOT, MeshRouter, Router, free_port
from tests.mesh_system.mesh import Traffic, wait_log

FAST = scram.MIN_ITERATIONS  # users-file records cheap to check in tests


@pytest.fixture
def certs(tmp_path: Path) -> MeshCerts:
    return make_mesh_certs(tmp_path / "certs", ["A", "B", "C"])


def _tls(certs: MeshCerts, name: str) -> dict[str, Any]:
    cert, key = certs.routers[name] if name in certs.routers else certs.rogue
    return {"tls_cert": str(cert), "tls_key": str(key), "tls_ca": str(certs.ca)}


def _external(certs: MeshCerts, name: str) -> dict[str, Any]:
    """An inter-router listener of `name`'s: mutual TLS, SASL EXTERNAL required, the user the
    certificate's CN (docs/mesh.md, "Security")."""
    return {
        **_tls(certs, name),
        "require_client_cert": True,
        "sasl_mechanisms": ["EXTERNAL"],
        "require_auth": True,
        "external_user": "cn",
    }


def _start(
    router: Any,
    name: str,
    *,
    inter: dict[str, Any] | None = None,
    connectors: list[dict[str, Any]] = (),  # type: ignore[assignment]
    **config: Any,
) -> Router:
    """A router with a client listener, an inter-router listener when `inter` is given (its
    options), and `connectors`."""
    listeners: list[dict[str, Any]] = [{}]
    if inter is not None:
        listeners.append({"role": "inter-router", **inter})
    if connectors:
        config["connector"] = connectors
    return router(name, cls=_Router, listeners=listeners, config=config)  # type: ignore[no-any-return]


class _Router(Router):
    log_text = MeshRouter.log_text


def _inter_port(r: Router) -> int:
    return r.listeners[1].port


def _users(path: Path, **users: str) -> Path:
    db = UserDB()
    for user, password in users.items():
        db.set(user, password, iterations=FAST)
    db.save(str(path))
    return path


def _secret(path: Path, text: str) -> str:
    path.write_text(text + "\n")
    return str(path)


def test_mutual_tls_external_mesh_joins_and_carries_traffic(router: Any, certs: MeshCerts) -> None:
    """The hardened three-router set-up of docs/mesh.md ("Security"): every hop mutual TLS
    with SASL EXTERNAL, user = the certificate's CN, only the listed identities admitted;
    traffic crosses two TLS hops (A - B - C)."""
    ids = ["A", "B", "C"]
    a = _start(router, "A", inter=_external(certs, "A"), mesh_identities=ids)
    b = _start(
        router,
        "B",
        inter=_external(certs, "B"),
        connectors=[{"port": _inter_port(a), **_tls(certs, "B"), "sasl_mechanism": "EXTERNAL"}],
        mesh_identities=ids,
    )
    c = _start(
        router,
        "C",
        connectors=[{"port": _inter_port(b), **_tls(certs, "C"), "sasl_mechanism": "EXTERNAL"}],
        mesh_identities=ids,
    )
    wait_log(c, "router 'A' reachable", timeout=15)
    t = run_container(Traffic(a.url, [c.url], "tls.q", 200), timeout=60)
    assert t.received[0] == list(range(200))
    wait_log(a, "authenticated 'B' (EXTERNAL)")
    wait_log(b, "authenticated 'C' (EXTERNAL)")
    assert "with TLS (inter-router)" in a.log_text()


@pytest.mark.parametrize("who", ["rogue", "no-cert"])
def test_a_router_without_a_mesh_ca_certificate_cannot_join(
    router: Any, certs: MeshCerts, who: str
) -> None:
    a = _start(
        router,
        "A",
        inter={**_tls(certs, "A"), "require_client_cert": True, "sasl_mechanisms": ["EXTERNAL"]},
    )
    connector: dict[str, Any] = {"port": _inter_port(a), "tls_ca": str(certs.ca)}
    if who == "rogue":
        cert, key = certs.rogue
        connector.update(tls_cert=str(cert), tls_key=str(key), sasl_mechanism="EXTERNAL")
    x = _start(router, "X", connectors=[connector])
    # the connector tried and was turned away by TLS (the listener wants a mesh certificate)
    wait_log(x, "closed by the listener before its OPEN", timeout=15)
    time.sleep(1.0)  # a few more attempts (backoff from 0.1 s)
    assert "inter-router connection to 'X'" not in a.log_text()
    assert "neighbour 'A' up" not in x.log_text()
    assert "router 'X' reachable" not in a.log_text()


def test_an_authenticated_peer_outside_mesh_identities_is_refused(
    router: Any, certs: MeshCerts
) -> None:
    a = _start(
        router,
        "A",
        inter=_external(certs, "A"),
        mesh_identities=["A", "B"],
    )
    # C has a good mesh certificate but is not a listed identity
    c = _start(
        router,
        "C",
        connectors=[{"port": _inter_port(a), **_tls(certs, "C"), "sasl_mechanism": "EXTERNAL"}],
    )
    wait_log(a, "inter-router connection refused: 'C' is not a mesh identity", timeout=15)
    wait_log(c, "is not a mesh identity", timeout=15)
    assert "neighbour 'A' up" not in c.log_text()


def test_a_mesh_identity_may_claim_only_its_router_id(router: Any, certs: MeshCerts) -> None:
    """mesh_identities as a table binds each identity to one router id: C's certificate
    claiming B's id is refused on A's listener, though C is a mesh identity and no B is
    connected to A (so the one-connection-per-id rule cannot see it); the real C joins."""
    bound = {"A": "A", "B": "B", "C": "C"}
    inter = _external(certs, "A")
    from tests.management.tooling import scrape, value

    metrics = free_port()
    a = _start(router, "A", inter=inter, mesh_identities=bound, metrics=f"{HOST}:{metrics}")
    connector = {"port": _inter_port(a), **_tls(certs, "C"), "sasl_mechanism": "EXTERNAL"}
    forged = _start(router, "B", connectors=[connector], mesh_identities=bound)
    wait_log(a, "inter-router connection refused: 'C' may act as router 'C' only, not 'B'", 15)
    wait_log(forged, "may act as router 'C' only", timeout=15)
    assert "router 'B' reachable" not in a.log_text()
    assert value(scrape(metrics), "qrouter_mesh_refused_total", reason="identity") >= 1
    c = _start(router, "C", connectors=[connector], mesh_identities=bound)
    wait_log(c, "neighbour 'A' up", timeout=15)
    # our connector checks the listener's certificate the same way: A's, bound to "A"
    wait_log(a, "neighbour 'C' up")


def test_a_listener_claiming_another_router_id_is_refused_by_our_connector(
    router: Any, certs: MeshCerts
) -> None:
    """The connector's side of the binding: a listener showing C's certificate but calling
    itself B in its OPEN is not taken for B."""
    bound = {"A": "A", "B": "B", "C": "C"}
    inter = {**_tls(certs, "C"), "require_client_cert": True, "sasl_mechanisms": ["EXTERNAL"]}
    forged = _start(router, "B", inter=inter)
    connector = {"port": _inter_port(forged), **_tls(certs, "A"), "sasl_mechanism": "EXTERNAL"}
    a = _start(router, "A", connectors=[connector], mesh_identities=bound)
    wait_log(a, "inter-router connection refused: 'C' may act as router 'C' only, not 'B'", 15)
    assert "neighbour 'B' up" not in a.log_text()


def test_with_mesh_identities_as_a_list_a_router_id_belongs_to_its_first_identity(
    router: Any, certs: MeshCerts
) -> None:
    """mesh_identities as a list: B's certificate claims "B" first; once B is gone, C's
    certificate (a mesh identity too) claiming "B" is refused and counted, where it would
    otherwise have been taken for B restarting; the real B comes back."""
    ids = ["A", "B", "C"]
    inter = _external(certs, "A")
    from tests.management.tooling import scrape, value

    metrics = free_port()
    a = _start(router, "A", inter=inter, mesh_identities=ids, metrics=f"{HOST}:{metrics}")
    as_b = {"port": _inter_port(a), **_tls(certs, "B"), "sasl_mechanism": "EXTERNAL"}
    b = _start(router, "B", connectors=[as_b], mesh_identities=ids)
    wait_log(a, "neighbour 'B' up", timeout=15)
    b.stop()
    wait_log(a, "neighbour 'B' lost", timeout=15)
    as_c = {"port": _inter_port(a), **_tls(certs, "C"), "sasl_mechanism": "EXTERNAL"}
    forged = _start(router, "forged", connectors=[as_c], mesh_identities=ids, id="B")
    wait_log(
        a,
        "inter-router connection refused: 'C' may not act as router 'B': that id is bound "
        "to 'B' (first use)",
        timeout=15,
    )
    wait_log(forged, "may not act as router 'B'", timeout=15)
    assert value(scrape(metrics), "qrouter_mesh_refused_total", reason="identity") >= 1
    assert a.log_text().count("neighbour 'B' up") == 1
    forged.stop()
    b = _start(router, "B-again", connectors=[as_b], mesh_identities=ids, id="B")
    wait_log(b, "neighbour 'A' up", timeout=15)


def test_a_peer_claiming_our_router_id_is_refused_and_counted(router: Any) -> None:
    from tests.management.tooling import scrape, value

    metrics = free_port()
    a = router("A", cls=MeshRouter, extra_args=["--metrics", f"127.0.0.1:{metrics}"])
    forged = router("forged", cls=MeshRouter, router_id="A", connect=[a.inter_port])
    wait_log(a, "duplicate router id 'A': a peer uses our id; refused", timeout=15)
    wait_log(forged, "duplicate router id 'A'", timeout=15)
    assert value(scrape(metrics), "qrouter_mesh_refused_total", reason="identity") >= 1
    assert "neighbour 'A' up" not in forged.log_text()


def test_an_anonymous_router_is_refused_where_mesh_identities_are_set(router: Any) -> None:
    a = _start(router, "A", inter={}, mesh_identities=["B"])
    b = _start(router, "B", connectors=[{"port": _inter_port(a)}])
    wait_log(a, "an anonymous peer is not a mesh identity", timeout=15)
    assert "neighbour 'A' up" not in b.log_text()


def test_scram_connector_joins_and_a_wrong_password_is_refused(router: Any, tmp_path: Path) -> None:
    users = _users(tmp_path / "users", **{"router-b": "b-secret"})
    a = _start(
        router,
        "A",
        inter={"sasl_mechanisms": ["SCRAM-SHA-256"], "require_auth": True},
        users_file=str(users),
        mesh_identities=["router-b"],
    )
    connector = {
        "port": _inter_port(a),
        "sasl_mechanism": "SCRAM-SHA-256",
        "sasl_username": "router-b",
    }
    good = _secret(tmp_path / "good", "b-secret")
    b = _start(router, "B", connectors=[{**connector, "sasl_password_file": good}])
    t = run_container(Traffic(a.url, [b.url], "scram.q", 100), timeout=60)
    assert t.received[0] == list(range(100))
    wait_log(a, "authenticated user 'router-b' (SCRAM-SHA-256)")

    bad = _secret(tmp_path / "bad", "not-it")
    c = _start(router, "C", connectors=[{**connector, "sasl_password_file": bad}])
    wait_log(a, "SASL SCRAM-SHA-256: refused user 'router-b': invalid proof", timeout=15)
    wait_log(c, "SASL SCRAM-SHA-256 failed (outcome code 1)", timeout=15)
    assert "neighbour 'A' up" not in c.log_text()


def test_scram_password_from_the_environment(
    router: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    users = _users(tmp_path / "users", mesh="env-secret")
    a = _start(
        router,
        "A",
        inter={"sasl_mechanisms": ["SCRAM-SHA-256"], "require_auth": True},
        users_file=str(users),
        mesh_identities=["mesh"],
    )
    monkeypatch.setenv("QROUTER_TEST_MESH_PASSWORD", "env-secret")  # inherited by B
    b = _start(
        router,
        "B",
        connectors=[
            {
                "port": _inter_port(a),
                "sasl_mechanism": "SCRAM-SHA-256",
                "sasl_username": "mesh",
                "sasl_password_env": "QROUTER_TEST_MESH_PASSWORD",
            }
        ],
    )
    wait_log(b, "neighbour 'A' up", timeout=15)
    assert "env-secret" not in a.log_text() + b.log_text()


def test_a_second_connection_claiming_a_connected_router_id_is_refused(router: Any) -> None:
    from tests.management.tooling import scrape, value

    metrics = free_port()
    a = router("A", cls=MeshRouter, extra_args=["--metrics", f"127.0.0.1:{metrics}"])
    b = router("B", cls=MeshRouter, connect=[a.inter_port])
    wait_log(b, "neighbour 'A' up", timeout=15)
    assert value(scrape(metrics), "qrouter_mesh_refused_total", reason="second-connection") == 0
    forged = router("forged", cls=MeshRouter, router_id="B", connect=[a.inter_port])
    wait_log(a, "router id 'B' is already connected on C", timeout=15)
    wait_log(forged, "already connected", timeout=15)
    assert value(scrape(metrics), "qrouter_mesh_refused_total", reason="second-connection") >= 1
    # the real B still carries traffic
    t = run_container(Traffic(a.url, [b.url], "forged.q", 50), timeout=60)
    assert t.received[0] == list(range(50))


def test_external_needs_a_client_certificate(router: Any, certs: MeshCerts) -> None:
    """A client listener with EXTERNAL: the user is the certificate subject; without a
    certificate EXTERNAL fails (5.3.3.6 outcome auth)."""
    r = router(
        "R",
        cls=_Router,
        listeners=[
            {
                "tls_cert": str(certs.routers["A"][0]),
                "tls_key": str(certs.routers["A"][1]),
                "tls_ca": str(certs.ca),
                "sasl_mechanisms": ["EXTERNAL"],
                "require_auth": True,
            }
        ],
    )
    cert, key = certs.routers["C"]
    conn = BlockingConnection(
        r.url,
        timeout=10,
        ssl_domain=client_domain(certs.ca, cert, key),
        allowed_mechs="EXTERNAL",
    )
    conn.close()
    wait_log(r, "authenticated 'CN=C,O=qrouter tests' (EXTERNAL)")
    with pytest.raises(ConnectionException):
        BlockingConnection(
            r.url, timeout=10, ssl_domain=client_domain(certs.ca), allowed_mechs="EXTERNAL"
        )
    wait_log(r, "SASL EXTERNAL without a client certificate")


def _frame(code: int, fields: list[Any]) -> bytes:
    from qrouter._fast.codec import Described, ULong, encode

    body = encode(Described(ULong(code), fields))
    return (8 + len(body)).to_bytes(4, "big") + b"\x02\x01\x00\x00" + body


def _read_frame(sock: socket.socket) -> tuple[int, list[Any]]:
    from qrouter._fast.codec import decode

    def exactly(n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = sock.recv(n - len(data))
            if not chunk:
                raise ConnectionError("closed")
            data += chunk
        return data

    size = int.from_bytes(exactly(4), "big")
    rest = exactly(size - 4)
    value, _ = decode(rest[4:])
    return int(value.descriptor), list(value.value)


@pytest.mark.parametrize("password", ["third-party", "wrong"])
def test_scram_with_a_third_party_implementation(
    router: Any, tmp_path: Path, password: str
) -> None:
    """proton's PyPI wheel has no Cyrus SASL (SASL.extended() is False) and so no SCRAM
    (tests/interop/test_scram_cyrus.py runs with a proton built with Cyrus), so the SASL
    frames go over a raw socket and scramp, a SCRAM library that is not ours, computes the
    client's messages and checks the router's signature."""
    import scramp
    from qrouter._fast.codec import Symbol

    users = _users(tmp_path / "users", dora="third-party")
    r = router(
        "R",
        cls=_Router,
        listeners=[{"sasl_mechanisms": ["SCRAM-SHA-256"], "require_auth": True}],
        config={"users_file": str(users)},
    )
    client = scramp.ScramClient(["SCRAM-SHA-256"], "dora", password)
    with socket.create_connection((HOST, r.port), timeout=10) as sock:
        sock.sendall(b"AMQP\x03\x01\x00\x00")
        assert sock.recv(8) == b"AMQP\x03\x01\x00\x00"
        code, fields = _read_frame(sock)
        assert code == 0x40 and list(fields[0]) == ["SCRAM-SHA-256"]
        first = client.get_client_first().encode()
        sock.sendall(_frame(0x41, [Symbol("SCRAM-SHA-256"), first]))  # 5.3.3.2 sasl-init
        code, fields = _read_frame(sock)
        assert code == 0x42  # 5.3.3.3 sasl-challenge: the server-first-message
        client.set_server_first(fields[0].decode())
        sock.sendall(_frame(0x43, [client.get_client_final().encode()]))  # sasl-response
        code, fields = _read_frame(sock)
        assert code == 0x44  # 5.3.3.6 sasl-outcome
        if password == "wrong":
            assert fields[0] == 1  # auth
            return
        assert fields[0] == 0
        client.set_server_final(fields[1].decode())  # raises unless the router signed right
        sock.sendall(b"AMQP\x00\x01\x00\x00")
        assert sock.recv(8) == b"AMQP\x00\x01\x00\x00"
    wait_log(r, "authenticated user 'dora' (SCRAM-SHA-256)")


def test_insecure_inter_router_listener_off_loopback_refuses_to_start(tmp_path: Path) -> None:
    import subprocess
    import sys

    port = free_port()
    cmd = [sys.executable, "-m", "qrouter", "start", "--inter-router-listen", f"0.0.0.0:{port}"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd=tmp_path, env=env)
    assert done.returncode != 0
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, done.stderr
    assert "--inter-router-listen" in lines[0] and "without TLS" in lines[0]
