"""Configuration: TOML loading, validation messages (file + key + what), CLI overrides."""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from qrouter.config import (
    AddressConfig,
    ConfigError,
    ListenerConfig,
    RouterConfig,
    load_config,
    parse_address_option,
    parse_listen,
)

WriteConfig = Callable[..., str]


def error_of(path: str | None = None, **overrides: object) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(path, **overrides)
    message = str(info.value)
    assert "\n" not in message
    return message


def test_defaults() -> None:
    cfg = load_config()
    assert cfg == RouterConfig()
    assert cfg.id == "qrouter-" + socket.gethostname()
    assert cfg.listeners == [ListenerConfig()]
    assert cfg.listeners[0].host == "127.0.0.1" and cfg.listeners[0].port == 5672
    assert cfg.listeners[0].sasl_mechanisms == ("ANONYMOUS", "PLAIN")
    assert cfg.addresses == []
    assert (cfg.store, cfg.log_level, cfg.log_format) == ("memory", "info", "text")
    assert cfg.max_message_size == 100 * 1024 * 1024 and cfg.link_capacity == 250
    assert cfg.source is None


def test_full_file(write_config: WriteConfig, tmp_path: Path, certs: Any) -> None:
    (tmp_path / "users").write_text("")
    path = write_config(
        f"""
id = "r1"
default_distribution = "closest"
oslo_preset = false
users_file = "users"
store = "memory"
store_path = "state"
max_message_size = 0
link_capacity = 1000

[log]
level = "debug"
format = "json"
modules = {{ core = "warning", "qrouter.mesh" = "debug" }}

[[listener]]
host = "0.0.0.0"
port = 5671
tls_cert = "{certs.cert}"
tls_key = "{certs.key}"
tls_ca = "{certs.cert}"
require_client_cert = true
sasl_mechanisms = ["plain"]
require_auth = true
max_frame_size = 16384
channel_max = 255
idle_timeout = 0

[[listener]]
port = 55672
role = "inter-router"
idle_timeout = 2.5

[[address]]
prefix = "orders"
distribution = "balanced"

[[address]]
pattern = "events.*.audit"
distribution = "multicast"
"""
    )
    cfg = load_config(path)
    assert cfg.source == path
    assert cfg.id == "r1" and cfg.default_distribution == "closest" and not cfg.oslo_preset
    assert cfg.users_file == str(tmp_path / "users")  # relative to the config file
    assert cfg.store_path == str(tmp_path / "state")
    assert cfg.max_message_size == 0 and cfg.link_capacity == 1000
    assert (cfg.log_level, cfg.log_format) == ("debug", "json")
    assert cfg.log_modules == {"core": "warning", "qrouter.mesh": "debug"}
    tls, inter = cfg.listeners
    assert tls == ListenerConfig(
        host="0.0.0.0",
        port=5671,
        tls_cert=certs.cert,
        tls_key=certs.key,
        tls_ca=certs.cert,
        require_client_cert=True,
        sasl_mechanisms=("PLAIN",),
        require_auth=True,
        max_frame_size=16384,
        channel_max=255,
        idle_timeout=0.0,
    )
    assert inter == ListenerConfig(port=55672, role="inter-router", idle_timeout=2.5)
    assert cfg.addresses == [
        AddressConfig(prefix="orders", distribution="balanced"),
        AddressConfig(pattern="events.*.audit", distribution="multicast"),
    ]


@pytest.mark.parametrize(
    ("toml", "key", "what"),
    [
        ("colour = 1", "colour", "unknown key"),
        ("[log]\nlevl = 'debug'", "log.levl", "unknown key"),
        ("[[listener]]\nprot = 1", "listener[0].prot", "unknown key"),
        ("[[address]]\nprefix = 'a'\ndist = 'closest'", "address[0].dist", "unknown key"),
        ("id = 7", "id", "expected a string, got an integer"),
        ("id = 'has space'", "id", "without spaces"),
        ("oslo_preset = 'yes'", "oslo_preset", "expected true or false"),
        ("link_capacity = 0", "link_capacity", "out of range"),
        ("link_capacity = true", "link_capacity", "expected an integer, got a boolean"),
        ("max_message_size = -1", "max_message_size", "out of range"),
        ("default_distribution = 'fanout'", "default_distribution", "'fanout' is not one of"),
        ("store = 'redis'", "store", "'redis' is not one of memory, lmdb, leveldb"),
        ("[log]\nlevel = 'loud'", "log.level", "'loud' is not one of"),
        ("[log]\nformat = 'xml'", "log.format", "'xml' is not one of text, json"),
        ("[log]\nmodules = { core = 'x' }", "log.modules.core", "'x' is not one of"),
        ("log = 3", "log", "expected a table"),
        ("listener = 3", "listener", "expected an array of tables"),
        ("listener = []", "listener", "at least one"),
        ("[[listener]]\n[[listener]]\nport = 70000", "listener[1].port", "out of range"),
        ("[[listener]]\nport = '5672'", "listener[0].port", "expected an integer, got a string"),
        ("[[listener]]\nport = 5672\n[[listener]]\nport = 5672", "listener[1].port", "also used"),
        ("[[listener]]\nrole = 'broker'", "listener[0].role", "'broker' is not one of"),
        ("[[listener]]\nmax_frame_size = 100", "listener[0].max_frame_size", "out of range"),
        ("[[listener]]\nchannel_max = 65536", "listener[0].channel_max", "out of range"),
        ("[[listener]]\nidle_timeout = -1", "listener[0].idle_timeout", "out of range"),
        ("[[listener]]\nsasl_mechanisms = []", "listener[0].sasl_mechanisms", "non-empty"),
        ("[[listener]]\nsasl_mechanisms = ['GSSAPI']", "listener[0].sasl_mechanisms", "GSSAPI"),
        (
            "[[listener]]\nsasl_mechanisms = ['ANONYMOUS']\nrequire_auth = true",
            "listener[0].require_auth",
            "needs PLAIN",
        ),
        ("[[listener]]\nrequire_auth = true", "listener[0].require_auth", "needs users_file"),
        ("[[listener]]\ntls_cert = 'c.pem'", "listener[0].tls_key", "missing"),
        ("[[listener]]\ntls_key = 'k.pem'", "listener[0].tls_cert", "missing"),
        ("[[listener]]\ntls_ca = 'ca.pem'", "listener[0].tls_ca", "needs tls_cert"),
        (
            "[[listener]]\ntls_cert = 'c.pem'\ntls_key = 'k.pem'",
            "listener[0].tls_cert",
            "cannot read",
        ),
        ("users_file = 'nope'", "users_file", "cannot read"),
        ("[[address]]\ndistribution = 'closest'", "address[0]", "exactly one of prefix and"),
        ("[[address]]\nprefix = 'a'\npattern = 'b.*'", "address[0]", "exactly one of prefix"),
        ("[[address]]\nprefix = 'a'\ndistribution = 'x'", "address[0].distribution", "'x' is"),
        ("[[address]]\nprefix = 'a.*'", "address[0].prefix", "use pattern"),
        ("[[address]]\npattern = 'a*'", "address[0].pattern", "whole tokens"),
    ],
)
def test_errors_name_file_and_key(
    write_config: WriteConfig, toml: str, key: str, what: str
) -> None:
    path = write_config(toml)
    message = error_of(path)
    assert message.startswith(f"{path}: {key}: "), message
    assert what in message


def test_tls_key_mismatch_and_require_client_cert(write_config: WriteConfig, certs: Any) -> None:
    path = write_config(f"[[listener]]\ntls_cert = '{certs.cert}'\ntls_key = '{certs.other_key}'")
    assert error_of(path).startswith(f"{path}: listener[0].tls_key: ")
    path = write_config(
        f"[[listener]]\ntls_cert = '{certs.cert}'\ntls_key = '{certs.key}'\n"
        "require_client_cert = true"
    )
    assert error_of(path) == f"{path}: listener[0].require_client_cert: needs tls_ca " + (
        "(the CA that signs client certificates)"
    )


def test_toml_syntax_error(write_config: WriteConfig) -> None:
    path = write_config("id = \n")
    message = error_of(path)
    assert message.startswith(f"{path}: invalid TOML: ") and "line 1" in message


def test_unreadable_file(tmp_path: Path) -> None:
    path = str(tmp_path / "missing.toml")
    assert error_of(path) == f"{path}: cannot read: No such file or directory"
    assert error_of(str(tmp_path)).startswith(f"{tmp_path}: cannot read: ")


def test_not_utf8(write_config: WriteConfig, tmp_path: Path) -> None:
    path = tmp_path / "latin1.toml"
    path.write_bytes(b'id = "r\xe9"\n')
    assert error_of(str(path)).startswith(f"{path}: invalid TOML: ")


@pytest.mark.parametrize(
    ("value", "host", "port"),
    [
        ("127.0.0.1:5672", "127.0.0.1", 5672),
        ("0.0.0.0:1", "0.0.0.0", 1),
        ("localhost:0", "localhost", 0),
        ("[::1]:5672", "::1", 5672),
        ("[::]:5673", "::", 5673),
        (":5674", "127.0.0.1", 5674),
        ("5675", "127.0.0.1", 5675),
    ],
)
def test_parse_listen(value: str, host: str, port: int) -> None:
    assert parse_listen(value) == ListenerConfig(host=host, port=port)


@pytest.mark.parametrize("value", ["host", "host:", "::1:5672", "[::1]", "h:70000", "h:-1", ""])
def test_parse_listen_errors(value: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_listen(value)
    assert str(info.value).startswith("--listen: ")


def test_parse_address_option() -> None:
    assert parse_address_option("orders=balanced") == AddressConfig("orders", None, "balanced")
    assert parse_address_option("a.*.b=multicast") == AddressConfig(None, "a.*.b", "multicast")
    assert parse_address_option("a/#=closest") == AddressConfig(None, "a/#", "closest")
    for bad in ("orders", "orders=", "=closest", "orders=fanout"):
        with pytest.raises(ConfigError) as info:
            parse_address_option(bad)
        assert str(info.value).startswith("--address: ")


def test_listen_replaces_normal_listeners_only(write_config: WriteConfig) -> None:
    path = write_config(
        "[[listener]]\nport = 1000\n[[listener]]\nport = 2000\nrole = 'inter-router'\n"
        "[[listener]]\nport = 3000"
    )
    cfg = load_config(path, listen=("[::1]:4000", "127.0.0.1:4001"))
    assert [(lc.host, lc.port, lc.role) for lc in cfg.listeners] == [
        ("::1", 4000, "normal"),
        ("127.0.0.1", 4001, "normal"),
        ("127.0.0.1", 2000, "inter-router"),
    ]
    assert [lc.port for lc in load_config(path, listen=()).listeners] == [1000, 2000, 3000]
    assert [lc.port for lc in load_config(path, listen="5").listeners] == [5, 2000]


def test_address_extends(write_config: WriteConfig) -> None:
    path = write_config("[[address]]\nprefix = 'a'\ndistribution = 'closest'")
    cfg = load_config(path, address=["b=multicast", "c.#=unavailable"])
    assert cfg.addresses == [
        AddressConfig(prefix="a", distribution="closest"),
        AddressConfig(prefix="b", distribution="multicast"),
        AddressConfig(pattern="c.#", distribution="unavailable"),
    ]


def test_simple_overrides(write_config: WriteConfig, tmp_path: Path) -> None:
    path = write_config("id = 'from-file'\n[log]\nlevel = 'debug'")
    cfg = load_config(path, id="from-cli", log_level="WARNING", log_format="json", store=None)
    assert (cfg.id, cfg.log_level, cfg.log_format, cfg.store) == (
        "from-cli",
        "warning",
        "json",
        "memory",
    )
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        cfg = load_config(None, store="lmdb", store_path="data")
    finally:
        os.chdir(cwd)
    assert cfg.store == "lmdb" and cfg.store_path == str(tmp_path / "data")


def test_override_errors_name_the_option(write_config: WriteConfig, tmp_path: Path) -> None:
    assert error_of(store="redis").startswith("--store: 'redis' is not one of")
    assert error_of(id="a b").startswith("--id: ")
    assert error_of(log_level="loud").startswith("--log-level: ")
    assert error_of(users_file=str(tmp_path / "none")).startswith("--users-file: cannot read")
    assert error_of(listen=["5672", "127.0.0.1:5672"]).startswith("--listen: 127.0.0.1:5672 is")
    # a rule broken by the file alone is still reported against the file
    path = write_config("[[listener]]\nrequire_auth = true")
    assert error_of(path, id="x").startswith(f"{path}: listener[0].require_auth: ")
    # ... and a CLI value can satisfy it
    users = tmp_path / "users"
    users.write_text("")
    assert load_config(path, users_file=str(users)).users_file == str(users)
    with pytest.raises(TypeError):
        load_config(None, colour="red")


def test_bad_users_file_is_reported_with_its_line(
    write_config: WriteConfig, tmp_path: Path
) -> None:
    users = tmp_path / "users"
    users.write_text("# ok\nalice\n")
    path = write_config("users_file = 'users'")
    assert error_of(path) == f"{users}: line 2: expected user:hash"
    assert error_of(users_file=str(users)) == f"{users}: line 2: expected user:hash"


def test_address_guarantee(write_config: WriteConfig) -> None:
    # issue 5: a topic with a guarantee, from the command line and from the file
    assert parse_address_option("events=multicast,exactly-once") == AddressConfig(
        "events", None, "multicast", "exactly-once"
    )
    assert parse_address_option("t.#=multicast, at-least-once").guarantee == "at-least-once"
    for bad, what in (
        ("events=multicast,twice", "'twice' is not one of exactly-once, at-least-once"),
        ("events=balanced,exactly-once", "needs distribution multicast, not balanced"),
    ):
        message = error_of(address=[bad])
        assert message.startswith("--address: ") and what in message, message
    path = write_config(
        "[[address]]\nprefix = 'events'\ndistribution = 'multicast'\nguarantee = 'exactly-once'"
    )
    assert load_config(path).addresses[0].guarantee == "exactly-once"
    path = write_config("[[address]]\nprefix = 'events'\nguarantee = 'exactly-once'")
    assert error_of(path) == (
        f"{path}: address[0].guarantee: a guarantee (exactly-once) needs distribution "
        "multicast, not balanced"
    )


def test_store_map_size(write_config: WriteConfig, tmp_path: Path) -> None:
    # the most an LMDB map may grow to (qrouter/stores/lmdb_store.py); past it commits fail and the
    # router holds durable work (qrouter/store_health.py)
    assert load_config(None).store_map_size is None
    path = write_config(f"store = 'lmdb'\nstore_path = '{tmp_path}'\nstore_map_size = 1048576")
    assert load_config(path).store_map_size == 1 << 20
    path = write_config(f"store = 'lmdb'\nstore_path = '{tmp_path}'\nstore_map_size = 4096")
    assert error_of(path).startswith(f"{path}: store_map_size: 4096 is out of range")
