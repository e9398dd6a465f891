"""qrouter/dispatch_config.py: Qpid Dispatch's qdrouterd.conf read as qrouter's configuration,
and every entity or attribute qrouter lacks refused with a line naming file, line, entity and
attribute."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from qrouter.config import ConfigError, load_config
from qrouter.dispatch_config import looks_like_dispatch, parse

FULL = """\
# a Dispatch 1.19 interior router
router {
    mode: interior
    id: Router.A   # trailing comment
    defaultDistribution: closest
    helloIntervalSeconds: 2
    helloMaxAgeSeconds: 6
}
sslProfile {
    name: server-tls
    certFile: pki/server.pem
    privateKeyFile: pki/server.key
    caCertFile: pki/ca.pem
}
listener {
    name: public
    host: 127.0.0.1
    port: amqps
    sslProfile: server-tls
    requireSsl: yes
    saslMechanisms: PLAIN SCRAM-SHA-256
    authenticatePeer: no
    maxFrameSize: 16384
    idleTimeoutSeconds: 60
}
listener { host: 127.0.0.1 port: 55672 role: inter-router }
connector {
    host: router-b.example
    port: 55673
    role: inter-router
    cost: 5
    sslProfile: server-tls
    verifyHostname: no
    saslMechanisms: PLAIN
    saslUsername: Router.A
    saslPassword: env:MESH_PASSWORD
}
address { prefix: broadcast distribution: multicast }
address {
    pattern: sensors/*/temperature
    distribution: balanced
    waypoint: no
}
log {
    module: DEFAULT
    enable: warning+
    includeTimestamp: yes
}
"""


def write(tmp_path: Path, text: str, name: str = "qdrouterd.conf") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def refusal(tmp_path: Path, text: str) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, text))
    return str(info.value)


def test_a_full_file_becomes_the_same_router_config(
    tmp_path: Path, certs: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MESH_PASSWORD", "secret")
    (tmp_path / "pki").mkdir()
    for name, source in (("server.pem", certs.cert), ("server.key", certs.key)):
        shutil.copy(source, tmp_path / "pki" / name)
    shutil.copy(certs.cert, tmp_path / "pki" / "ca.pem")  # self-signed: its own CA
    cfg = load_config(write(tmp_path, FULL), allow_insecure_mesh=True)
    assert cfg.id == "Router.A" and cfg.default_distribution == "closest"
    assert (cfg.hello_interval, cfg.hello_max_age) == (2.0, 6.0)
    public, mesh = cfg.listeners
    assert (public.host, public.port, public.role) == ("127.0.0.1", 5671, "normal")
    pki = tmp_path / "pki"  # relative paths: from the file's folder, as in TOML
    assert public.tls_cert == str(pki / "server.pem") and public.tls_key == str(pki / "server.key")
    assert public.tls_ca == str(pki / "ca.pem")
    assert public.sasl_mechanisms == ("PLAIN", "SCRAM-SHA-256") and not public.require_auth
    assert public.max_frame_size == 16384 and public.idle_timeout == 60.0
    assert (mesh.host, mesh.port, mesh.role) == ("127.0.0.1", 55672, "inter-router")
    (cc,) = cfg.connectors
    assert (cc.host, cc.port, cc.cost) == ("router-b.example", 55673, 5)
    assert cc.sasl_mechanism == "PLAIN" and cc.sasl_username == "Router.A"
    assert cc.sasl_password_env == "MESH_PASSWORD" and cc.tls_verify_hostname is False
    assert [(a.prefix, a.pattern, a.distribution) for a in cfg.addresses] == [
        ("broadcast", None, "multicast"),
        (None, "sensors/*/temperature", "balanced"),
    ]
    assert cfg.log_level == "warning"


def test_detected_by_extension_or_content(tmp_path: Path) -> None:
    assert looks_like_dispatch("x.conf")
    path = write(tmp_path, "\n# hi\nrouter {\n id: X\n}\n", name="router-config")
    assert looks_like_dispatch(path)
    assert load_config(path).id == "X"
    toml = write(tmp_path, 'id = "T"\n', name="router.toml")
    assert not looks_like_dispatch(toml) and load_config(toml).id == "T"


def test_one_line_sections_and_quoted_values() -> None:
    (router, listener) = parse('router { mode: interior id: "A B" }\nlistener { port: 1 }\n')
    assert router.attributes["id"][0] == "A B" and router.attributes["mode"][0] == "interior"
    assert listener.attributes == {"port": ("1", 2)}


def test_every_unsupported_entity_and_attribute_is_named(tmp_path: Path) -> None:
    text = """\
router {
    mode: edge
    workerThreads: 4
}
listener {
    port: 5672
    maxSessions: 10
}
linkRoute {
    prefix: queue.
    direction: in
    containerId: broker1
}
autoLink { address: q dir: in containerId: broker1 }
policy { maxConnections: 10 }
log {
    module: ROUTER_CORE
    enable: trace+
}
"""
    path = write(tmp_path, text)
    lines = refusal(tmp_path, text).splitlines()
    assert lines[0] == f"{path}: 7 settings qrouter does not support:"
    assert lines[1:] == [
        f"{path}:2: router.mode: mode 'edge' is not in qrouter (standalone and interior are)",
        f"{path}:3: router.workerThreads: attribute not supported by qrouter",
        f"{path}:7: listener.maxSessions: attribute not supported by qrouter",
        f"{path}:12: linkRoute.containerId: qrouter's link routes name a connector (connection)",
        f"{path}:14: autoLink.containerId: qrouter's autolinks name a connector (connection)",
        f"{path}:15: policy: not supported: Dispatch's policy (vhosts) is not in qrouter; "
        "use [policy] (docs/configuration.md)",
        f"{path}:17: log.module: only module DEFAULT maps to qrouter's [log] (got 'ROUTER_CORE')",
    ]  # one line per refusal, none dropped


def test_older_attribute_names_are_read(tmp_path: Path) -> None:
    text = "router {\n routerId: Old\n helloInterval: 2\n helloMaxAge: 9\n}\n"
    cfg = load_config(write(tmp_path, text))
    assert (cfg.id, cfg.hello_interval, cfg.hello_max_age) == ("Old", 2.0, 9.0)
    both = refusal(tmp_path, "router {\n id: A\n routerId: B\n}\n")
    assert both.endswith(":3: router.routerId: give one of id, routerId and name (also: id)")


def test_syntax_errors_name_the_line(tmp_path: Path) -> None:
    assert refusal(tmp_path, "router {\n id: A\n").endswith(
        ":1: router: section is not closed with '}'"
    )
    assert refusal(tmp_path, "router {\n id A\n}\n").endswith(
        ":2: router: expected 'attribute: value', got 'id A'"
    )
    assert refusal(tmp_path, "router {\n id: A\n id: B\n}\n").endswith(":3: router.id: given twice")
    assert refusal(tmp_path, "listener { port: 5672 sslProfile: nope }\n").endswith(
        ":1: listener.sslProfile: no sslProfile named 'nope'"
    )


def test_broker_connector_waypoint_and_autolinks(tmp_path: Path) -> None:
    """docs/brokers.md: Dispatch's route-container connector, waypoint and autoLink."""
    text = """\
connector { name: broker role: route-container host: 127.0.0.1 port: amqp }
address { prefix: orders waypoint: yes }
autoLink { address: orders direction: out connection: broker externalAddress: /queue/orders }
autoLink { addr: orders dir: in connection: broker }
"""
    cfg = load_config(write(tmp_path, text))
    (cc,) = cfg.connectors
    assert (cc.name, cc.role, cc.port) == ("broker", "route-container", 5672)
    assert [(a.prefix, a.waypoint) for a in cfg.addresses] == [("orders", True)]
    assert [
        (al.address, al.direction, al.connection, al.external_address) for al in cfg.autolinks
    ] == [
        ("orders", "out", "broker", "/queue/orders"),
        ("orders", "in", "broker", None),
    ]


def test_link_routes_convert_with_dispatchs_direction(tmp_path: Path) -> None:
    """docs/brokers.md "Link routes": `in` is client senders in both (Dispatch's meaning);
    a route without connection goes through the mesh."""
    text = """\
connector { name: broker role: route-container host: 127.0.0.1 port: amqp }
linkRoute { prefix: /queue direction: in connection: broker }
linkRoute { pattern: orders.* dir: out connection: broker distribution: linkBalanced }
linkRoute {
    prefix: remote
    direction: in
}
"""
    cfg = load_config(write(tmp_path, text))
    assert [(lr.prefix, lr.pattern, lr.direction, lr.connection) for lr in cfg.linkroutes] == [
        ("/queue", None, "in", "broker"),
        (None, "orders.*", "out", "broker"),
        ("remote", None, "in", ""),
    ]


def test_the_protocol_log_module_points_at_the_frame_trace(tmp_path: Path) -> None:
    """Dispatch's frame trace is `log { module: PROTOCOL }`; qrouter's is `--trace`: the refusal
    says so (docs/migrating-from-dispatch.md)."""
    text = "router {\n    id: R\n}\nlog {\n    module: PROTOCOL\n    enable: trace+\n}\n"
    path = write(tmp_path, text)
    assert refusal(tmp_path, text) == (
        f"{path}:5: log.module: only module DEFAULT maps to qrouter's [log] (got 'PROTOCOL'); "
        "for a frame trace use trace = true or --trace"
    )
