"""Configuration of a secure mesh and of who may log in (issue 14, items 4 and 5): connector
TLS and SASL, ANONYMOUS off loopback, the insecure-mesh refusal, mesh identities."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from qrouter.config import ConfigError, ListenerConfig, connector_password, is_loopback, load_config
from qrouter.sasl import anonymous_allowed, offered
from tests.unit.test_config import WriteConfig, error_of


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.9.9.9", True),
        ("::1", True),
        ("[::1]", True),
        ("localhost", True),
        ("0.0.0.0", False),
        ("::", False),
        ("", False),
        ("10.0.0.1", False),
        ("router-a.example", False),
    ],
)
def test_is_loopback(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def test_inter_router_listener_off_loopback_without_tls_refuses_to_start() -> None:
    message = error_of(inter_router_listen="0.0.0.0:55672")
    assert message.startswith("--inter-router-listen: inter-router listener on 0.0.0.0")
    assert "without TLS" in message and "--allow-insecure-mesh" in message
    cfg = load_config(inter_router_listen="0.0.0.0:55672", allow_insecure_mesh=True)
    assert cfg.allow_insecure_mesh
    # loopback stays as it was: no TLS needed
    load_config(inter_router_listen="127.0.0.1:55672")


def test_inter_router_listener_off_loopback_needs_client_certificates(
    write_config: WriteConfig, certs: Any
) -> None:
    tls = f'tls_cert = "{certs.cert}"\ntls_key = "{certs.key}"\n'
    path = write_config(f'[[listener]]\nhost = "0.0.0.0"\nrole = "inter-router"\n{tls}')
    assert "listener[0].host: inter-router listener on 0.0.0.0" in error_of(path)
    mutual = f'{tls}tls_ca = "{certs.cert}"\nrequire_client_cert = true\n'
    path = write_config(f'[[listener]]\nhost = "0.0.0.0"\nrole = "inter-router"\n{mutual}')
    assert "listener[0].sasl_mechanisms: offers routers no mechanism" in error_of(path)
    path = write_config(
        f'[[listener]]\nhost = "0.0.0.0"\nrole = "inter-router"\n{mutual}'
        'sasl_mechanisms = ["EXTERNAL"]\nrequire_auth = true\n'
    )
    load_config(path)
    path = write_config(
        'allow_insecure_mesh = true\n[[listener]]\nhost = "0.0.0.0"\nrole = "inter-router"\n'
    )
    assert load_config(path).allow_insecure_mesh


def test_client_listener_off_loopback_needs_a_way_in(write_config: WriteConfig) -> None:
    message = error_of(listen="0.0.0.0:5672")
    assert "--listen: listener on 0.0.0.0 (not loopback) has no way in" in message
    cfg = load_config(listen="0.0.0.0:5672", allow_anonymous=True)
    assert cfg.listeners[0].allow_anonymous
    path = write_config('[[listener]]\nhost = "0.0.0.0"\nallow_anonymous = true\n')
    assert anonymous_allowed(load_config(path).listeners[0])


def test_anonymous_is_offered_on_loopback_only_unless_allowed() -> None:
    assert offered(ListenerConfig(host="127.0.0.1"), False) == ("ANONYMOUS",)
    assert offered(ListenerConfig(host="0.0.0.0"), True) == ("PLAIN",)
    assert offered(ListenerConfig(host="0.0.0.0", allow_anonymous=True), False) == ("ANONYMOUS",)
    assert offered(ListenerConfig(require_auth=True), True) == ("PLAIN",)
    scram = ListenerConfig(sasl_mechanisms=("SCRAM-SHA-256", "PLAIN", "EXTERNAL"))
    assert offered(scram, True) == ("SCRAM-SHA-256", "PLAIN")  # EXTERNAL needs tls_ca
    assert offered(scram, False) == ()


def test_connector_tls_and_sasl(write_config: WriteConfig, tmp_path: Path, certs: Any) -> None:
    (tmp_path / "mesh-password").write_text("s3cret\nignored\n")
    path = write_config(
        "[[connector]]\nport = 5000\n"
        f'tls_cert = "{certs.cert}"\ntls_key = "{certs.key}"\ntls_ca = "{certs.cert}"\n'
        'sasl_mechanism = "scram-sha-256"\nsasl_username = "router-b"\n'
        'sasl_password_file = "mesh-password"\ntls_verify_hostname = false\n'
    )
    cc = load_config(path).connectors[0]
    assert cc.tls and not cc.tls_verify_hostname
    assert cc.sasl_mechanism == "SCRAM-SHA-256" and cc.sasl_username == "router-b"
    assert cc.sasl_password_file == str(tmp_path / "mesh-password")  # relative to the file
    assert connector_password(cc) == "s3cret"


def test_mesh_identities(write_config: WriteConfig) -> None:
    cfg = load_config(write_config('mesh_identities = ["CN=router-b,O=acme", "router-c"]\n'))
    assert cfg.mesh_identities == ("CN=router-b,O=acme", "router-c")
    assert "mesh_identities: expected an array" in error_of(
        write_config('mesh_identities = "router-b"\n')
    )


def test_mesh_identities_as_a_table_bind_router_ids(write_config: WriteConfig) -> None:
    cfg = load_config(write_config('[mesh_identities]\n"CN=b,O=acme" = "B"\nrouter-c = "C"\n'))
    assert cfg.mesh_identities == ("CN=b,O=acme", "router-c")
    assert cfg.mesh_router_ids == {"CN=b,O=acme": "B", "router-c": "C"}
    assert "mesh_identities.router-c" in error_of(write_config("[mesh_identities]\nrouter-c = 3\n"))


@pytest.mark.parametrize(
    ("text", "key", "what"),
    [
        ('sasl_mechanism = "PLAIN"', "sasl_mechanism", "needs sasl_username"),
        (
            'sasl_mechanism = "SCRAM-SHA-256"\nsasl_username = "b"',
            "sasl_mechanism",
            "exactly one of sasl_password_file and sasl_password_env",
        ),
        (
            'sasl_mechanism = "SCRAM-SHA-256"\nsasl_username = "b"\n'
            'sasl_password_env = "QROUTER_TEST_NOT_SET_ANYWHERE"',
            "sasl_password_env",
            "is not set",
        ),
        (
            'sasl_mechanism = "PLAIN"\nsasl_username = "b"\nsasl_password_env = "HOME"',
            "sasl_mechanism",
            "PLAIN sends the password in the clear",
        ),
        ('sasl_mechanism = "EXTERNAL"', "sasl_mechanism", "EXTERNAL needs tls_cert"),
        ('sasl_mechanism = "GSSAPI"', "sasl_mechanism", "not one of"),
        ('sasl_password_file = "missing"', "sasl_password_file", "cannot read"),
        ("password = 'x'", "password", "unknown key"),
    ],
)
def test_connector_errors(write_config: WriteConfig, text: str, key: str, what: str) -> None:
    message = error_of(write_config(f"[[connector]]\n{text}\n"))
    assert f"connector[0].{key}" in message and what in message


def test_listener_external_needs_a_ca(write_config: WriteConfig, certs: Any) -> None:
    path = write_config(
        f'[[listener]]\ntls_cert = "{certs.cert}"\ntls_key = "{certs.key}"\n'
        'sasl_mechanisms = ["EXTERNAL"]\n'
    )
    assert "listener[0].sasl_mechanisms: EXTERNAL needs TLS with tls_ca" in error_of(path)
    path = write_config('[[listener]]\nexternal_user = "email"\n')
    assert "listener[0].external_user" in error_of(path)


def test_connector_password_never_on_the_command_line() -> None:
    # connectors from --inter-router-connect are ANONYMOUS: there is no option for a secret
    cfg = load_config(inter_router_connect="127.0.0.1:5000")
    assert cfg.connectors[0].sasl_mechanism == "ANONYMOUS"
    with pytest.raises(ConfigError):
        load_config(inter_router_connect="127.0.0.1:5000?password=x")


def test_management_cannot_open_an_insecure_mesh_listener_off_loopback(certs: Any) -> None:
    from qrouter.config import listener_from_table

    with pytest.raises(ConfigError, match="listener.host: an inter-router listener on 0.0.0.0"):
        listener_from_table({"host": "0.0.0.0", "port": 0, "role": "inter-router"})
    listener_from_table({"host": "127.0.0.1", "port": 0, "role": "inter-router"})
    listener_from_table(
        {
            "host": "0.0.0.0",
            "port": 0,
            "role": "inter-router",
            "tls_cert": certs.cert,
            "tls_key": certs.key,
            "tls_ca": certs.cert,
            "require_client_cert": True,
        }
    )


def test_router_ids_bound_on_first_use_without_a_table() -> None:
    from types import SimpleNamespace

    from qrouter.sasl import first_use_refusal

    cfg = load_config(id="A")
    bound: dict[str, tuple[str, frozenset[str]]] = {}

    def claim(user: str | None, router_id: str) -> str | None:
        conn = SimpleNamespace(user=user, transport=None)
        return first_use_refusal(cfg, bound, conn, None, router_id)

    assert claim("mesh-b", "B") is None
    assert claim("mesh-b", "B") is None  # B reconnecting, or restarted
    refusal = claim("mesh-c", "B")
    assert refusal == "'mesh-c' may not act as router 'B': that id is bound to 'mesh-b' (first use)"
    assert claim("mesh-b", "C") is None  # one identity shared by several routers (SCRAM)
    assert claim(None, "D") is None and "D" not in bound  # anonymous: nothing to bind
    assert claim("mesh-c", "A") is None and "A" not in bound  # our id: Mesh.on_open refuses it
    assert {rid: who for rid, (who, _names) in bound.items()} == {"B": "mesh-b", "C": "mesh-b"}
    cfg.mesh_router_ids = {"mesh-c": "B"}  # a table decides instead (mesh_refusal)
    assert claim("mesh-c", "B") is None


def test_first_use_bindings_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    from types import SimpleNamespace

    import qrouter.sasl
    from qrouter.sasl import first_use_refusal

    monkeypatch.setattr(qrouter.sasl, "MAX_BOUND_IDS", 3)
    cfg = load_config(id="A")
    bound: dict[str, tuple[str, frozenset[str]]] = {}
    conn = SimpleNamespace(user="member", transport=None)
    for rid in "BCD":
        assert first_use_refusal(cfg, bound, conn, None, rid) is None
    refusal = first_use_refusal(cfg, bound, conn, None, "E")
    assert refusal == "'member' may not act as router 'E': 3 router ids bound"
    assert len(bound) == 3
    assert first_use_refusal(cfg, bound, conn, None, "B") is None  # a bound id still works


def test_first_use_binding_off_loopback_is_warned_about(write_config: WriteConfig) -> None:
    from qrouter.sasl import binding_warning

    insecure = {"inter_router_listen": "0.0.0.0:55672", "allow_insecure_mesh": True}
    assert binding_warning(load_config(inter_router_listen="127.0.0.1:55672")) is None
    warning = binding_warning(load_config(**insecure))
    assert warning is not None
    assert warning.startswith("inter-router listener on 0.0.0.0 (not loopback) with ")
    assert "mesh_identities unset" in warning and "as a table" in warning
    listed = load_config(write_config('mesh_identities = ["b"]\n'), **insecure)
    assert "mesh_identities as a list" in str(binding_warning(listed))
    table = load_config(write_config('mesh_identities = { b = "B" }\n'), **insecure)
    assert binding_warning(table) is None


def test_first_use_knows_a_router_by_its_certificate_whichever_end_connected() -> None:
    from types import SimpleNamespace

    from qrouter.config import ConnectorConfig
    from qrouter.sasl import first_use_refusal

    def tls(cn: str) -> SimpleNamespace:
        cert = {"subject": ((("organizationName", "acme"),), (("commonName", cn),))}
        return SimpleNamespace(get_extra_info=lambda name: cert if name == "peercert" else None)

    cfg = load_config(id="A")
    bound: dict[str, tuple[str, frozenset[str]]] = {}
    # B connected to our listener (EXTERNAL, user = CN); later our connector reaches B's
    # listener, which shows the same certificate: its subject is the same identity
    assert (
        first_use_refusal(cfg, bound, SimpleNamespace(user="B", transport=tls("B")), None, "B")
        is None
    )
    to_b = SimpleNamespace(user=None, transport=tls("B"))
    assert first_use_refusal(cfg, bound, to_b, ConnectorConfig(), "B") is None
    to_c = SimpleNamespace(user=None, transport=tls("C"))
    refusal = first_use_refusal(cfg, bound, to_c, ConnectorConfig(), "B")
    assert refusal == "'CN=C,O=acme' may not act as router 'B': that id is bound to 'B' (first use)"
    # a SCRAM user shared by the mesh does not make two certificates one identity
    shared = SimpleNamespace(user="mesh", transport=tls("C"))
    assert first_use_refusal(cfg, bound, shared, None, "B") is not None
