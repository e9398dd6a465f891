"""Router configuration: dataclasses, TOML loading, validation, CLI overrides.

The file format and every setting are documented in docs/configuration.md. Every problem is
reported as one `ConfigError` line naming the file, the key (``listener[1].port``) and what is
wrong; a problem in a command-line option names the option instead (``--listen: ...``).

Relative paths in a config file (TLS files, ``users_file``, ``store_path``) are taken relative
to the directory of that file; relative paths given on the command line, relative to the
current directory. Both are stored absolute.
"""

from __future__ import annotations

import ipaddress
import os
import re
import socket
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

from qrouter.addresses import (
    DISTRIBUTIONS,
    GUARANTEES,
    check_diversion,
    check_pattern,
    normalize_prefix,
)
from qrouter.limits import LIMIT_KEYS, LimitsConfig, parse_limits

if TYPE_CHECKING:
    from qrouter.policy import PolicyConfig

ROLES = ("normal", "inter-router")
SASL_MECHANISMS = ("ANONYMOUS", "PLAIN", "SCRAM-SHA-256", "EXTERNAL")
CONNECTOR_MECHANISMS = ("ANONYMOUS", "PLAIN", "SCRAM-SHA-256", "EXTERNAL")
# a connector's role: another router of the mesh, or a broker (docs/brokers.md)
CONNECTOR_ROLES = ("inter-router", "route-container")
AUTOLINK_DIRECTIONS = ("in", "out")
EXTERNAL_USER = ("subject", "cn")  # EXTERNAL's user name: RFC 4514 subject DN, or its CN
STORES = ("memory", "lmdb", "leveldb")
STORE_SYNC = ("batched", "always")
LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")
LOG_FORMATS = ("text", "json")

_UINT32_MAX = 2**32 - 1
# busy_poll_us: at most 10 ms of spinning after an active loop iteration
BUSY_POLL_MAX_US = 10_000
_MIN_MAX_FRAME_SIZE = 512  # 2.7.1 open: min-max-frame-size


class ConfigError(Exception):
    """A configuration problem, as one line: ``<file>: <key>: <what is wrong>``."""

    def __init__(self, what: str, *, key: str | None = None, file: str | None = None) -> None:
        self.what = what
        self.key = key
        self.file = file
        super().__init__(": ".join(part for part in (file, key, what) if part))

    def located(self, *, key: str | None = None, file: str | None = None) -> ConfigError:
        """A copy with `file` (and `key`, when this error has none) filled in."""
        return ConfigError(self.what, key=self.key or key, file=self.file or file)


def _default_id() -> str:
    return "qrouter-" + socket.gethostname()


def default_store_path(router_id: str, store: str) -> str:
    """Where a disk store lives when no path is given: ``$XDG_STATE_HOME/qrouter/ID/STORE``
    (``~/.local/state`` when XDG_STATE_HOME is unset), as the XDG base directories define
    per-user state that survives restarts."""
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(
        os.path.expanduser("~"), ".local", "state"
    )
    return os.path.join(base, "qrouter", router_id, store)


@dataclass
class ListenerConfig:
    host: str = "127.0.0.1"
    port: int = 5672
    role: str = "normal"  # "normal" | "inter-router"
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_ca: str | None = None
    require_client_cert: bool = False
    sasl_mechanisms: tuple[str, ...] = ("ANONYMOUS", "PLAIN")
    require_auth: bool = False  # True: ANONYMOUS and no-SASL connections are refused
    # ANONYMOUS (and no SASL) on a non-loopback host only when set (loopback: always allowed
    # unless require_auth)
    allow_anonymous: bool = False
    external_user: str = "subject"  # EXTERNAL: the user is the client certificate's subject
    max_frame_size: int = 65536
    channel_max: int = 32767
    idle_timeout: float = 16.0  # seconds; 0 disables
    max_message_size: int | None = None  # bytes, 0 = unlimited; None: the router's
    # seconds from accept to the end of protocol header + SASL + OPEN; 0 disables
    handshake_timeout: float = 10.0


@dataclass
class LoginConfig:
    """SASL PLAIN checks (qrouter/login_throttle.py): worker threads, how many may wait, and
    the per-host backoff after failed logins."""

    workers: int = 2  # threads hashing passwords (PBKDF2), off the event loop
    max_pending: int = 64  # checks queued or running; beyond it: SASL sys-temp
    backoff_after: int = 5  # failures from one host within backoff_window before delays
    backoff_window: float = 60.0  # seconds
    backoff_max: float = 8.0  # seconds; the delay doubles per failure up to this
    max_hosts: int = 4096  # hosts remembered (least recently failed forgotten first)


@dataclass
class ConnectorConfig:
    """An outgoing connection, reconnected with backoff: to another router (role inter-router,
    docs/mesh.md) or to a broker (role route-container, docs/brokers.md)."""

    host: str = "127.0.0.1"
    port: int = 55672
    cost: int = 1  # the link cost this router advertises for the connection (at least 1)
    # TLS (qrouter/tls.py client_context): the CA that signs the listener's certificate, and
    # ours for mutual TLS
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_ca: str | None = None
    tls_verify_hostname: bool = True
    # SASL: the mechanism, and for PLAIN / SCRAM-SHA-256 a user whose password is read from a
    # file (first line) or an environment variable when connecting -- never from the command line
    sasl_mechanism: str = "ANONYMOUS"
    sasl_username: str | None = None
    sasl_password_file: str | None = None
    sasl_password_env: str | None = None
    name: str | None = None  # autolinks name the connector they use; default HOST:PORT
    role: str = "inter-router"  # or route-container: a broker (docs/brokers.md)

    @property
    def tls(self) -> bool:
        return self.tls_ca is not None or self.tls_cert is not None


@dataclass
class AddressConfig:
    prefix: str | None = None  # exactly one of prefix and pattern is set
    pattern: str | None = None
    distribution: str = "balanced"  # closest | balanced | multicast | unavailable
    guarantee: str | None = None  # exactly-once | at-least-once (docs/exactly-once.md)
    fallback: str | None = None  # address used while nobody consumes this one (docs/brokers.md)
    dead_letter: str | None = None  # address for rejected / undeliverable-here deliveries
    # messages to the address go to a broker queue and consumers receive from it, through
    # autolinks (docs/brokers.md)
    waypoint: bool = False


@dataclass
class AutoLinkConfig:
    """A link the router keeps attached to a broker queue (docs/brokers.md): direction out,
    the router sends the address's messages to the queue; in, it receives the queue's
    messages for the address's consumers."""

    address: str = ""
    direction: str = "out"
    connection: str = ""  # the name of a connector with role route-container
    external_address: str | None = None  # the broker's name for the queue; None: `address`

    @property
    def queue(self) -> str:
        return self.external_address or self.address


@dataclass
class LinkRouteConfig:
    """Links attached to matching addresses are routed to a broker (docs/brokers.md "Link
    routes"): direction out, the clients' sending links; in, their receiving links."""

    prefix: str | None = None  # matches the address itself and what follows "." or "/"
    pattern: str | None = None  # "*" one token, "#" any number (tokens split on "." "/")
    direction: str = "out"
    # the name of a connector with role route-container; "": the broker is behind another
    # router of the mesh (the one that advertises this route)
    connection: str = ""


@dataclass
class RouterConfig:
    id: str = field(default_factory=_default_id)
    listeners: list[ListenerConfig] = field(default_factory=lambda: [ListenerConfig()])
    connectors: list[ConnectorConfig] = field(default_factory=list)
    addresses: list[AddressConfig] = field(default_factory=list)
    autolinks: list[AutoLinkConfig] = field(default_factory=list)
    linkroutes: list[LinkRouteConfig] = field(default_factory=list)
    default_distribution: str = "balanced"
    oslo_preset: bool = True
    users_file: str | None = None
    # who may do what (qrouter/policy.py): a [policy] table, or a file holding one; None: none
    policy: PolicyConfig | None = None
    policy_file: str | None = None
    login: LoginConfig = field(default_factory=LoginConfig)
    store: str = "memory"
    store_path: str | None = None
    store_sync: str = "batched"  # "always": fsync every group commit; "batched": ~1 s
    store_map_size: int | None = None  # lmdb: the most the map may grow to (bytes); 1 TiB
    journal: str | None = None  # directory of the delivery journal (docs/journal.md); off
    journal_sample: float = 1.0  # share of deliveries journalled (by origin: same everywhere)
    hello_interval: float = 1.0  # mesh: seconds between HELLOs to each neighbour
    hello_max_age: float = 3.0  # mesh: a neighbour silent this long is lost
    # guaranteed topics: a subscriber away (or a publisher gone) this long is discarded
    guarantee_timeout: float = 60.0
    log_level: str = "info"
    log_format: str = "text"
    log_modules: dict[str, str] = field(default_factory=dict)
    max_message_size: int = 100 * 1024 * 1024  # bytes, 0 = unlimited
    link_capacity: int = 250  # max credit the router grants one producer link
    # backpressure: above `high` bytes waiting in a connection's write buffer it takes no new
    # deliveries and its producers no new credit, until the buffer is down to `low`
    write_buffer_high: int = 1024 * 1024
    write_buffer_low: int = 256 * 1024
    # latency (docs/performance.md): after a loop iteration that read something, spin up to
    # this many µs polling the sockets before sleeping; 0 = off (it costs CPU)
    busy_poll_us: int = 0
    metrics: str | None = None  # HOST:PORT of the Prometheus endpoint (/metrics); None: off
    limits: LimitsConfig = field(default_factory=LimitsConfig)  # [limits] (qrouter/limits.py)
    # mesh (docs/mesh.md, "Security"): the authenticated identities (EXTERNAL-mapped subjects,
    # users-file users) admitted as routers; empty: any peer an inter-router listener admits
    mesh_identities: tuple[str, ...] = ()
    # mesh_identities given as a table: identity -> the one router id it may claim
    mesh_router_ids: dict[str, str] = field(default_factory=dict)
    allow_insecure_mesh: bool = False  # an inter-router listener off loopback without TLS
    # frame trace (docs/operations.md): log every frame of new connections on qrouter.trace
    trace: bool = False
    source: str | None = None  # config file path, for messages


# -- type checks ----------------------------------------------------------------------------


def _type_name(value: object) -> str:
    return {
        bool: "a boolean",
        int: "an integer",
        float: "a number",
        str: "a string",
        list: "an array",
        dict: "a table",
    }.get(type(value), type(value).__name__)


def _want_str(key: str, value: object) -> str:
    if not isinstance(value, str):
        raise ConfigError(f"expected a string, got {_type_name(value)}", key=key)
    return value


def _want_bool(key: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"expected true or false, got {_type_name(value)}", key=key)
    return value


def _want_int(key: str, value: object, low: int, high: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"expected an integer, got {_type_name(value)}", key=key)
    if value < low or (high is not None and value > high):
        bounds = f"between {low} and {high}" if high is not None else f"at least {low}"
        raise ConfigError(f"{value} is out of range (must be {bounds})", key=key)
    return value


def _want_number(key: str, value: object, low: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"expected a number, got {_type_name(value)}", key=key)
    if not value >= low:  # also refuses nan
        raise ConfigError(f"{value} is out of range (must be at least {low})", key=key)
    return float(value)


def _want_choice(key: str, value: object, choices: Sequence[str]) -> str:
    text = _want_str(key, value)
    if text not in choices:
        raise ConfigError(f"{text!r} is not one of {', '.join(choices)}", key=key)
    return text


def _want_table(key: str, value: object) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise ConfigError(f"expected a table, got {_type_name(value)}", key=key)
    return value


def _want_tables(key: str, value: object) -> list[Mapping[str, Any]]:
    if not isinstance(value, list):
        raise ConfigError(
            f"expected an array of tables ([[{key}]]), got {_type_name(value)}", key=key
        )
    return [_want_table(f"{key}[{i}]", item) for i, item in enumerate(value)]


def _check_keys(key: str | None, table: Mapping[str, Any], allowed: Sequence[str]) -> None:
    for name in table:
        if name not in allowed:
            full = f"{key}.{name}" if key else name
            raise ConfigError(f"unknown key (known: {', '.join(allowed)})", key=full)


def _path(key: str, value: object, base: str | None) -> str:
    text = _want_str(key, value)
    if not text:
        raise ConfigError("must not be empty", key=key)
    text = os.path.expanduser(text)
    return os.path.abspath(os.path.join(base, text) if base else text)


def _readable_file(key: str, path: str) -> None:
    try:
        with open(path, "rb"):
            pass
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror or exc}", key=key) from None


# -- TOML tables -> dataclasses -------------------------------------------------------------

_LISTENER_KEYS = tuple(f.name for f in fields(ListenerConfig))
_ADDRESS_KEYS = (
    "prefix", "pattern", "distribution", "guarantee", "fallback", "dead_letter", "waypoint",
)  # fmt: skip
_AUTOLINK_KEYS = ("address", "direction", "connection", "external_address")
_LINKROUTE_KEYS = ("prefix", "pattern", "direction", "connection")
_CONNECTOR_KEYS = tuple(f.name for f in fields(ConnectorConfig))
_TOP_KEYS = (
    "id",
    "default_distribution",
    "oslo_preset",
    "users_file",
    "policy",
    "policy_file",
    "login",
    "store",
    "store_path",
    "store_sync",
    "store_map_size",
    "max_message_size",
    "link_capacity",
    "write_buffer_high",
    "write_buffer_low",
    "busy_poll_us",
    "hello_interval",
    "hello_max_age",
    "guarantee_timeout",
    "journal",
    "journal_sample",
    "metrics",
    "limits",
    "mesh_identities",
    "allow_insecure_mesh",
    "trace",
    "log",
    "listener",
    "connector",
    "address",
    "autolink",
    "linkroute",
)
_LOG_KEYS = ("level", "format", "modules")


def _listener(key: str, table: Mapping[str, Any], base: str | None) -> ListenerConfig:
    _check_keys(key, table, _LISTENER_KEYS)
    lc = ListenerConfig()
    k = f"{key}."
    if "host" in table:
        lc.host = _want_str(k + "host", table["host"])
    if "port" in table:
        lc.port = _want_int(k + "port", table["port"], 0, 65535)
    if "role" in table:
        lc.role = _want_choice(k + "role", table["role"], ROLES)
    for name in ("tls_cert", "tls_key", "tls_ca"):
        if name in table:
            setattr(lc, name, _path(k + name, table[name], base))
    if "require_client_cert" in table:
        lc.require_client_cert = _want_bool(k + "require_client_cert", table["require_client_cert"])
    if "sasl_mechanisms" in table:
        lc.sasl_mechanisms = _mechanisms(k + "sasl_mechanisms", table["sasl_mechanisms"])
    if "require_auth" in table:
        lc.require_auth = _want_bool(k + "require_auth", table["require_auth"])
    if "allow_anonymous" in table:
        lc.allow_anonymous = _want_bool(k + "allow_anonymous", table["allow_anonymous"])
    if "external_user" in table:
        lc.external_user = _want_choice(k + "external_user", table["external_user"], EXTERNAL_USER)
    if "max_frame_size" in table:
        lc.max_frame_size = _want_int(
            k + "max_frame_size", table["max_frame_size"], _MIN_MAX_FRAME_SIZE, _UINT32_MAX
        )
    if "channel_max" in table:
        lc.channel_max = _want_int(k + "channel_max", table["channel_max"], 0, 65535)
    if "idle_timeout" in table:
        lc.idle_timeout = _want_number(k + "idle_timeout", table["idle_timeout"], 0.0)
    if "max_message_size" in table:
        lc.max_message_size = _want_int(k + "max_message_size", table["max_message_size"], 0)
    if "handshake_timeout" in table:
        lc.handshake_timeout = _want_number(
            k + "handshake_timeout", table["handshake_timeout"], 0.0
        )
    return lc


_LOGIN_KEYS = tuple(f.name for f in fields(LoginConfig))


def _login(table: Mapping[str, Any]) -> LoginConfig:
    _check_keys("login", table, _LOGIN_KEYS)
    lc = LoginConfig()
    for name in ("workers", "max_pending", "backoff_after", "max_hosts"):
        if name in table:
            setattr(lc, name, _want_int(f"login.{name}", table[name], 1, 1_000_000))
    for name in ("backoff_window", "backoff_max"):
        if name in table:
            setattr(lc, name, _want_number(f"login.{name}", table[name], 0.0))
    return lc


def _connector(key: str, table: Mapping[str, Any], base: str | None = None) -> ConnectorConfig:
    _check_keys(key, table, _CONNECTOR_KEYS)
    cc = ConnectorConfig()
    if "name" in table:
        cc.name = _want_str(f"{key}.name", table["name"]) or None
    if "role" in table:
        cc.role = _want_choice(f"{key}.role", table["role"], CONNECTOR_ROLES)
    if "host" in table:
        cc.host = _want_str(f"{key}.host", table["host"])
        if not cc.host:
            raise ConfigError("must not be empty", key=f"{key}.host")
    if "port" in table:
        cc.port = _want_int(f"{key}.port", table["port"], 1, 65535)
    if "cost" in table:
        cc.cost = _want_int(f"{key}.cost", table["cost"], 1, _UINT32_MAX)
    for name in ("tls_cert", "tls_key", "tls_ca", "sasl_password_file"):
        if name in table:
            setattr(cc, name, _path(f"{key}.{name}", table[name], base))
    if "tls_verify_hostname" in table:
        cc.tls_verify_hostname = _want_bool(
            f"{key}.tls_verify_hostname", table["tls_verify_hostname"]
        )
    if "sasl_mechanism" in table:
        cc.sasl_mechanism = _want_choice(
            f"{key}.sasl_mechanism", str(table["sasl_mechanism"]).upper(), CONNECTOR_MECHANISMS
        )
    for name in ("sasl_username", "sasl_password_env"):
        if name in table:
            setattr(cc, name, _want_str(f"{key}.{name}", table[name]) or None)
    _check_connector(key, cc)
    return cc


def _check_connector(key: str, cc: ConnectorConfig) -> None:
    if (cc.tls_cert is None) != (cc.tls_key is None):
        missing = "tls_key" if cc.tls_key is None else "tls_cert"
        raise ConfigError("missing (tls_cert and tls_key go together)", key=f"{key}.{missing}")
    for name in ("tls_cert", "tls_key", "tls_ca", "sasl_password_file"):
        path = getattr(cc, name)
        if path is not None:
            _readable_file(f"{key}.{name}", path)
    if cc.tls:
        from qrouter.tls import client_context  # ssl only when TLS is configured

        try:
            client_context(cc.tls_ca, cc.tls_cert, cc.tls_key)
        except ConfigError as exc:
            raise ConfigError(exc.what, key=f"{key}.{exc.key or 'tls_cert'}") from None
    mech = cc.sasl_mechanism
    if mech == "EXTERNAL" and cc.tls_cert is None:
        raise ConfigError("EXTERNAL needs tls_cert and tls_key", key=f"{key}.sasl_mechanism")
    if mech in ("PLAIN", "SCRAM-SHA-256"):
        if not cc.sasl_username:
            raise ConfigError(f"{mech} needs sasl_username", key=f"{key}.sasl_mechanism")
        if (cc.sasl_password_file is None) == (cc.sasl_password_env is None):
            raise ConfigError(
                f"{mech} needs exactly one of sasl_password_file and sasl_password_env",
                key=f"{key}.sasl_mechanism",
            )
        if cc.sasl_password_env is not None and not os.environ.get(cc.sasl_password_env):
            raise ConfigError(
                f"environment variable {cc.sasl_password_env} is not set",
                key=f"{key}.sasl_password_env",
            )
    if mech == "PLAIN" and not cc.tls:
        raise ConfigError(
            "PLAIN sends the password in the clear: use it with TLS (tls_ca)",
            key=f"{key}.sasl_mechanism",
        )


def connector_password(cc: ConnectorConfig) -> str:
    """The connector's SASL password, read now (a rotated file is picked up on reconnect)."""
    if cc.sasl_password_env is not None:
        return os.environ.get(cc.sasl_password_env, "")
    if cc.sasl_password_file is not None:
        with open(cc.sasl_password_file, encoding="utf-8") as handle:
            return handle.readline().rstrip("\r\n")
    return ""


def is_loopback(host: str) -> bool:
    """Whether a listener host accepts only local connections (``localhost``, 127/8, ::1)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a name other than localhost, or "" / 0.0.0.0 style wildcards


def _mechanisms(key: str, value: object) -> tuple[str, ...]:
    if not isinstance(value, list) or not value:
        raise ConfigError("expected a non-empty array of mechanism names", key=key)
    names: list[str] = []
    for i, item in enumerate(value):
        name = _want_str(f"{key}[{i}]", item).upper()
        if name not in SASL_MECHANISMS:
            raise ConfigError(f"{item!r} is not one of {', '.join(SASL_MECHANISMS)}", key=key)
        if name not in names:
            names.append(name)
    return tuple(names)


def _address(key: str, table: Mapping[str, Any]) -> AddressConfig:
    _check_keys(key, table, _ADDRESS_KEYS)
    ac = AddressConfig()
    if "prefix" in table:
        ac.prefix = _want_str(f"{key}.prefix", table["prefix"])
    if "pattern" in table:
        ac.pattern = _want_str(f"{key}.pattern", table["pattern"])
    if "distribution" in table:
        ac.distribution = _want_choice(f"{key}.distribution", table["distribution"], DISTRIBUTIONS)
    if "guarantee" in table:
        ac.guarantee = _want_choice(f"{key}.guarantee", table["guarantee"], GUARANTEES)
    for name in ("fallback", "dead_letter"):
        if name in table:
            setattr(ac, name, _want_str(f"{key}.{name}", table[name]))
    if "waypoint" in table:
        ac.waypoint = _want_bool(f"{key}.waypoint", table["waypoint"])
    return ac


def autolink_from_table(key: str, table: Mapping[str, Any]) -> AutoLinkConfig:
    """One ``[[autolink]]`` table (also the management node's CREATE autoLink)."""
    _check_keys(key, table, _AUTOLINK_KEYS)
    al = AutoLinkConfig()
    for name in ("address", "connection"):
        if name not in table:
            raise ConfigError("is required", key=f"{key}.{name}")
        setattr(al, name, _want_str(f"{key}.{name}", table[name]))
        if not getattr(al, name):
            raise ConfigError("must not be empty", key=f"{key}.{name}")
    if "direction" not in table:
        raise ConfigError('is required ("in" or "out")', key=f"{key}.direction")
    al.direction = _want_choice(f"{key}.direction", table["direction"], AUTOLINK_DIRECTIONS)
    if "external_address" in table:
        al.external_address = (
            _want_str(f"{key}.external_address", table["external_address"]) or None
        )
    return al


def linkroute_from_table(key: str, table: Mapping[str, Any]) -> LinkRouteConfig:
    """One ``[[linkroute]]`` table (also the management node's CREATE linkRoute)."""
    from qrouter.addresses import check_pattern, normalize_prefix

    _check_keys(key, table, _LINKROUTE_KEYS)
    lr = LinkRouteConfig()
    if ("prefix" in table) == ("pattern" in table):
        raise ConfigError("needs exactly one of prefix and pattern", key=key)
    try:
        if "prefix" in table:
            lr.prefix = normalize_prefix(_want_str(f"{key}.prefix", table["prefix"]))
        else:
            lr.pattern = _want_str(f"{key}.pattern", table["pattern"])
            check_pattern(lr.pattern)
    except ValueError as exc:
        raise ConfigError(str(exc), key=key) from None
    if "connection" in table:
        lr.connection = _want_str(f"{key}.connection", table["connection"])
    if "direction" not in table:
        raise ConfigError('is required ("in" or "out")', key=f"{key}.direction")
    lr.direction = _want_choice(f"{key}.direction", table["direction"], AUTOLINK_DIRECTIONS)
    return lr


def _from_table(doc: Mapping[str, Any], base: str | None) -> RouterConfig:
    _check_keys(None, doc, _TOP_KEYS)
    cfg = RouterConfig()
    if "id" in doc:
        cfg.id = _want_str("id", doc["id"])
    if "default_distribution" in doc:
        cfg.default_distribution = _want_choice(
            "default_distribution", doc["default_distribution"], DISTRIBUTIONS
        )
    if "oslo_preset" in doc:
        cfg.oslo_preset = _want_bool("oslo_preset", doc["oslo_preset"])
    if "users_file" in doc:
        cfg.users_file = _path("users_file", doc["users_file"], base)
    if "policy" in doc:
        from qrouter.policy import parse_policy  # policy imports this module

        cfg.policy = parse_policy(_want_table("policy", doc["policy"]))
    if "policy_file" in doc:
        cfg.policy_file = _path("policy_file", doc["policy_file"], base)
    if "login" in doc:
        cfg.login = _login(_want_table("login", doc["login"]))
    if "store" in doc:
        cfg.store = _want_choice("store", doc["store"], STORES)
    if "store_path" in doc:
        cfg.store_path = _path("store_path", doc["store_path"], base)
    if "store_sync" in doc:
        cfg.store_sync = _want_choice("store_sync", doc["store_sync"], STORE_SYNC)
    if "store_map_size" in doc:
        cfg.store_map_size = _want_int("store_map_size", doc["store_map_size"], 1 << 16)
    if "max_message_size" in doc:
        cfg.max_message_size = _want_int("max_message_size", doc["max_message_size"], 0)
    if "link_capacity" in doc:
        cfg.link_capacity = _want_int("link_capacity", doc["link_capacity"], 1, _UINT32_MAX)
    for key in ("write_buffer_high", "write_buffer_low"):
        if key in doc:
            setattr(cfg, key, _want_int(key, doc[key], 0, _UINT32_MAX))
    if "busy_poll_us" in doc:
        cfg.busy_poll_us = _want_int("busy_poll_us", doc["busy_poll_us"], 0, BUSY_POLL_MAX_US)
    if "journal" in doc:
        cfg.journal = _path("journal", doc["journal"], base)
    if "journal_sample" in doc:
        cfg.journal_sample = _want_number("journal_sample", doc["journal_sample"], 0.0)
        if cfg.journal_sample > 1:
            raise ConfigError("must be within 0 and 1", key="journal_sample")
    if "hello_interval" in doc:
        cfg.hello_interval = _want_number("hello_interval", doc["hello_interval"], 0.05)
    if "guarantee_timeout" in doc:
        cfg.guarantee_timeout = _want_number("guarantee_timeout", doc["guarantee_timeout"], 0.1)
    if "hello_max_age" in doc:
        cfg.hello_max_age = _want_number("hello_max_age", doc["hello_max_age"], 0.1)
        if cfg.hello_max_age <= cfg.hello_interval:
            raise ConfigError(
                f"must be longer than hello_interval ({cfg.hello_interval} s)",
                key="hello_max_age",
            )
    if "metrics" in doc:
        cfg.metrics = parse_metrics(_want_str("metrics", doc["metrics"]), "metrics")
    if "limits" in doc:
        table = _want_table("limits", doc["limits"])
        _check_keys("limits", table, LIMIT_KEYS)
        cfg.limits = parse_limits(table, _want_int, _want_number, _want_choice)
    if "mesh_identities" in doc:
        value = doc["mesh_identities"]
        if isinstance(value, dict):  # identity = "the router id it may claim"
            cfg.mesh_router_ids = {
                str(k): _want_str(f"mesh_identities.{k}", v) for k, v in value.items()
            }
            value = list(cfg.mesh_router_ids)
        if not isinstance(value, list):
            raise ConfigError(
                "expected an array of strings or a table of identity = router id",
                key="mesh_identities",
            )
        cfg.mesh_identities = tuple(
            _want_str(f"mesh_identities[{i}]", item) for i, item in enumerate(value)
        )
    if "trace" in doc:
        cfg.trace = _want_bool("trace", doc["trace"])
    if "allow_insecure_mesh" in doc:
        cfg.allow_insecure_mesh = _want_bool("allow_insecure_mesh", doc["allow_insecure_mesh"])
    if "log" in doc:
        log = _want_table("log", doc["log"])
        _check_keys("log", log, _LOG_KEYS)
        if "level" in log:
            cfg.log_level = _want_choice("log.level", log["level"], LOG_LEVELS)
        if "format" in log:
            cfg.log_format = _want_choice("log.format", log["format"], LOG_FORMATS)
        if "modules" in log:
            modules = _want_table("log.modules", log["modules"])
            cfg.log_modules = {
                name: _want_choice(f"log.modules.{name}", level, LOG_LEVELS)
                for name, level in modules.items()
            }
    if "listener" in doc:
        tables = _want_tables("listener", doc["listener"])
        if not tables:
            raise ConfigError("needs at least one [[listener]] table", key="listener")
        cfg.listeners = [_listener(f"listener[{i}]", t, base) for i, t in enumerate(tables)]
    if "connector" in doc:
        tables = _want_tables("connector", doc["connector"])
        cfg.connectors = [_connector(f"connector[{i}]", t, base) for i, t in enumerate(tables)]
    if "address" in doc:
        tables = _want_tables("address", doc["address"])
        cfg.addresses = [_address(f"address[{i}]", t) for i, t in enumerate(tables)]
    if "autolink" in doc:
        tables = _want_tables("autolink", doc["autolink"])
        cfg.autolinks = [autolink_from_table(f"autolink[{i}]", t) for i, t in enumerate(tables)]
    if "linkroute" in doc:
        tables = _want_tables("linkroute", doc["linkroute"])
        cfg.linkroutes = [linkroute_from_table(f"linkroute[{i}]", t) for i, t in enumerate(tables)]
    return cfg


# -- command-line values --------------------------------------------------------------------


def parse_listen(value: str) -> ListenerConfig:
    """``HOST:PORT``, ``:PORT`` (127.0.0.1), ``PORT`` or ``[IPv6]:PORT`` -> a normal listener."""
    text = value.strip()
    match = re.fullmatch(r"\[([^\]]*)\]:(\d+)|([^:\[\]]*):(\d+)|(\d+)", text)
    if match is None:
        raise ConfigError(f"{value!r} is not HOST:PORT (use [ADDR]:PORT for IPv6)", key="--listen")
    v6_host, v6_port, host, port, bare_port = match.groups()
    host = v6_host if v6_host is not None else (host or "127.0.0.1")
    number = int(v6_port or port or bare_port)
    if not host:
        raise ConfigError(f"{value!r}: empty host", key="--listen")
    if number > 65535:
        raise ConfigError(f"{value!r}: port {number} is out of range (0-65535)", key="--listen")
    return ListenerConfig(host=host, port=number)


def parse_inter_router_listen(value: str) -> ListenerConfig:
    """``--inter-router-listen HOST:PORT``: a listener with role inter-router."""
    try:
        lc = parse_listen(value)
    except ConfigError as exc:
        raise ConfigError(exc.what, key="--inter-router-listen") from None
    lc.role = "inter-router"
    return lc


def parse_connect(value: str) -> list[ConnectorConfig]:
    """``--inter-router-connect HOST:PORT[,HOST:PORT...]``; an empty value: no connectors."""
    found: list[ConnectorConfig] = []
    for part in value.split(","):
        if not part.strip():
            continue
        try:
            lc = parse_listen(part)
        except ConfigError as exc:
            raise ConfigError(exc.what, key="--inter-router-connect") from None
        if lc.port == 0:
            raise ConfigError(f"{part.strip()!r}: port 0", key="--inter-router-connect")
        found.append(ConnectorConfig(host=lc.host, port=lc.port))
    return found


def parse_metrics(value: str, key: str = "--metrics") -> str:
    """The metrics endpoint, ``HOST:PORT`` as for ``--listen``; returned checked, unchanged."""
    try:
        parse_listen(value)
    except ConfigError as exc:
        raise ConfigError(exc.what, key=key) from None
    return value.strip()


def connector_from_table(table: Mapping[str, Any], key: str = "connector") -> ConnectorConfig:
    """One connector given as a table of ``[[connector]]`` keys (the management node's
    CREATE): parsed and checked as a config file's would be, relative paths taken from the
    current directory. Raises ConfigError."""
    return _connector(key, table, None)


def listener_from_table(table: Mapping[str, Any], key: str = "listener") -> ListenerConfig:
    """One listener given as a table of ``[[listener]]`` keys (the management node's CREATE):
    parsed and checked as a config file's would be, relative paths taken from the current
    directory. Raises ConfigError."""
    lc = _listener(key, table, None)
    _check_listener(key, lc)
    if lc.role == "inter-router" and not is_loopback(lc.host):
        if lc.tls_cert is None or not lc.require_client_cert:
            # no allow_insecure_mesh here: a running router does not open its mesh to any host
            raise ConfigError(
                f"an inter-router listener on {lc.host or '*'} (not loopback) needs tls_cert, "
                "tls_key, tls_ca and require_client_cert",
                key=f"{key}.host",
            )
    return lc


def parse_address_option(value: str) -> AddressConfig:
    """``PREFIX=DISTRIBUTION[,GUARANTEE]``; a left side containing ``*`` or ``#`` is a
    pattern."""
    name, sep, right = value.partition("=")
    distribution, _, guarantee = right.partition(",")
    name, distribution, guarantee = name.strip(), distribution.strip(), guarantee.strip()
    if not sep or not name or not distribution:
        raise ConfigError(f"{value!r} is not PREFIX=DISTRIBUTION[,GUARANTEE]", key="--address")
    if distribution not in DISTRIBUTIONS:
        raise ConfigError(
            f"{value!r}: {distribution!r} is not one of {', '.join(DISTRIBUTIONS)}",
            key="--address",
        )
    if guarantee and guarantee not in GUARANTEES:
        raise ConfigError(
            f"{value!r}: {guarantee!r} is not one of {', '.join(GUARANTEES)}", key="--address"
        )
    g = guarantee or None
    if "*" in name or "#" in name:
        return AddressConfig(pattern=name, distribution=distribution, guarantee=g)
    return AddressConfig(prefix=name, distribution=distribution, guarantee=g)


# -- validation ------------------------------------------------------------------------------


def _check_listener(key: str, lc: ListenerConfig) -> None:
    """Rules within one listener (the rules across settings are in `_cross_check`)."""
    if not lc.host:
        raise ConfigError("must not be empty", key=f"{key}.host")
    if (lc.tls_cert is None) != (lc.tls_key is None):
        missing = "tls_key" if lc.tls_key is None else "tls_cert"
        given = "tls_cert" if lc.tls_key is None else "tls_key"
        raise ConfigError(f"missing (required with {given})", key=f"{key}.{missing}")
    if lc.tls_ca is not None and lc.tls_cert is None:
        raise ConfigError(
            "needs tls_cert and tls_key (TLS is off without them)", key=f"{key}.tls_ca"
        )
    if lc.require_client_cert and lc.tls_ca is None:
        raise ConfigError(
            "needs tls_ca (the CA that signs client certificates)",
            key=f"{key}.require_client_cert",
        )
    for name in ("tls_cert", "tls_key", "tls_ca"):
        path = getattr(lc, name)
        if path is not None:
            _readable_file(f"{key}.{name}", path)
    if lc.tls_cert is not None and lc.tls_key is not None:
        from qrouter.tls import server_context  # ssl only when TLS is configured

        try:
            server_context(lc.tls_cert, lc.tls_key, lc.tls_ca, lc.require_client_cert)
        except ConfigError as exc:
            raise ConfigError(exc.what, key=f"{key}.{exc.key or 'tls_cert'}") from None
    if lc.require_auth and not {"PLAIN", "SCRAM-SHA-256", "EXTERNAL"} & set(lc.sasl_mechanisms):
        raise ConfigError(
            "needs PLAIN, SCRAM-SHA-256 or EXTERNAL in sasl_mechanisms", key=f"{key}.require_auth"
        )
    if "EXTERNAL" in lc.sasl_mechanisms and lc.tls_ca is None:
        raise ConfigError(
            "EXTERNAL needs TLS with tls_ca (the CA of the client certificates)",
            key=f"{key}.sasl_mechanisms",
        )


def _check_address(key: str, ac: AddressConfig) -> None:
    if (ac.prefix is None) == (ac.pattern is None):
        raise ConfigError("set exactly one of prefix and pattern", key=key)
    try:
        if ac.prefix is not None:
            ac.prefix = normalize_prefix(ac.prefix)
        else:
            assert ac.pattern is not None
            check_pattern(ac.pattern)
    except ValueError as exc:
        name = "prefix" if ac.prefix is not None else "pattern"
        raise ConfigError(str(exc), key=key if key.startswith("--") else f"{key}.{name}") from None
    if ac.distribution not in DISTRIBUTIONS:
        raise ConfigError(
            f"{ac.distribution!r} is not one of {', '.join(DISTRIBUTIONS)}",
            key=f"{key}.distribution",
        )
    if ac.waypoint and ac.distribution not in ("balanced", "closest"):
        # a broker queue hands each message to one consumer
        raise ConfigError(
            f"a waypoint needs distribution balanced or closest, not {ac.distribution}",
            key=key if key.startswith("--") else f"{key}.waypoint",
        )
    if ac.guarantee is not None:
        if ac.guarantee not in GUARANTEES:
            raise ConfigError(
                f"{ac.guarantee!r} is not one of {', '.join(GUARANTEES)}",
                key=key if key.startswith("--") else f"{key}.guarantee",
            )
        if ac.distribution != "multicast":
            # a guarantee is publish/subscribe: every subscriber gets every message
            raise ConfigError(
                f"a guarantee ({ac.guarantee}) needs distribution multicast, not {ac.distribution}",
                key=key if key.startswith("--") else f"{key}.guarantee",
            )
    try:
        check_diversion(ac.distribution, ac.fallback, ac.dead_letter)
    except ValueError as exc:
        name = "fallback" if ac.fallback is not None else "dead_letter"
        raise ConfigError(str(exc), key=key if key.startswith("--") else f"{key}.{name}") from None


# Where a setting came from, for messages: (file or None, key or --option).
_Origin = tuple[str | None, str]


def _cross_check(
    cfg: RouterConfig, origin: Callable[[str], _Origin], listener_origins: list[_Origin]
) -> None:
    """Rules that involve several settings, each blamed on where its value came from."""

    def fail(where: _Origin, what: str) -> ConfigError:
        return ConfigError(what, file=where[0], key=where[1])

    if not cfg.id or any(ch.isspace() or not ch.isprintable() for ch in cfg.id):
        raise fail(origin("id"), f"{cfg.id!r}: must be non-empty, without spaces")
    if cfg.store != "memory" and not cfg.store_path:
        # `qrouter start --store lmdb` works as it is: a per-user state folder per router id,
        # so two routers of one user never share a store by accident
        cfg.store_path = default_store_path(cfg.id, cfg.store)
    if cfg.users_file is not None:
        try:
            _readable_file("users_file", cfg.users_file)
        except ConfigError as exc:
            raise fail(origin("users_file"), exc.what) from None
        from qrouter.auth import UserDB  # auth imports this module

        UserDB.load(cfg.users_file)  # a bad line: "<users file>: line <n>: <what>"
    if cfg.policy_file is not None:
        if cfg.policy is not None:
            raise fail(origin("policy_file"), "give either a [policy] table or policy_file")
        cfg.policy = _load_policy_file(cfg.policy_file, origin("policy_file"))
    seen: dict[tuple[str, int], _Origin] = {}
    for lc, where in zip(cfg.listeners, listener_origins, strict=True):
        _check_exposure(cfg, lc, where, fail)
        if (
            lc.require_auth
            and cfg.users_file is None
            and not ("EXTERNAL" in lc.sasl_mechanisms and lc.tls_ca is not None)
        ):
            raise fail(
                (where[0], f"{where[1]}.require_auth"), "needs users_file (nobody could log in)"
            )
        address = (lc.host, lc.port)
        if lc.port != 0 and address in seen:
            other = seen[address][1]
            key = where[1] if where[1].startswith("--") else f"{where[1]}.port"
            raise fail((where[0], key), f"{lc.host}:{lc.port} is also used by {other}")
        seen[address] = where
    if cfg.write_buffer_low > cfg.write_buffer_high:
        raise fail(
            origin("write_buffer_low"),
            f"must not exceed write_buffer_high ({cfg.write_buffer_high})",
        )
    if cfg.metrics is not None:
        metrics = parse_listen(cfg.metrics)
        if metrics.port != 0 and (metrics.host, metrics.port) in seen:
            other = seen[(metrics.host, metrics.port)][1]
            raise fail(origin("metrics"), f"{cfg.metrics} is also used by {other}")


def _check_autolinks(cfg: RouterConfig, origin: Callable[[str], _Origin]) -> None:
    """Connector names are unique; an autolink names a connector with role route-container."""
    names: set[str] = set()
    for i, cc in enumerate(cfg.connectors):
        name = cc.name or f"{cc.host}:{cc.port}"
        if name in names:
            raise ConfigError(
                f"a second connector named {name!r}",
                file=origin("connector")[0],
                key=f"connector[{i}].name",
            )
        names.add(name)
    brokers = {
        cc.name or f"{cc.host}:{cc.port}" for cc in cfg.connectors if cc.role == "route-container"
    }
    seen: set[tuple[str, str, str]] = set()
    for i, al in enumerate(cfg.autolinks):
        key = (al.address, al.direction, al.connection)
        if key in seen:
            raise ConfigError(
                f"a second {al.direction} autolink for {al.address!r} on {al.connection!r}",
                file=origin("autolink")[0],
                key=f"autolink[{i}]",
            )
        seen.add(key)
        if al.connection not in brokers:
            raise ConfigError(
                f"no connector named {al.connection!r} with role route-container",
                file=origin("autolink")[0],
                key=f"autolink[{i}].connection",
            )


def _check_linkroutes(cfg: RouterConfig, origin: Callable[[str], _Origin]) -> None:
    """A link route names a connector with role route-container, once per direction."""
    brokers = {
        cc.name or f"{cc.host}:{cc.port}" for cc in cfg.connectors if cc.role == "route-container"
    }
    seen: set[tuple[str | None, str | None, str]] = set()
    for i, lr in enumerate(cfg.linkroutes):
        key = (lr.prefix, lr.pattern, lr.direction)
        if key in seen:
            raise ConfigError(
                f"a second {lr.direction} link route for {lr.prefix or lr.pattern!r}",
                file=origin("linkroute")[0],
                key=f"linkroute[{i}]",
            )
        seen.add(key)
        if lr.connection and lr.connection not in brokers:
            raise ConfigError(
                f"no connector named {lr.connection!r} with role route-container",
                file=origin("linkroute")[0],
                key=f"linkroute[{i}].connection",
            )


def _load_policy_file(path: str, where: _Origin) -> PolicyConfig:
    """A policy file: the keys of a ``[policy]`` table at its top level."""
    from qrouter.policy import parse_policy  # policy imports this module

    try:
        _readable_file("policy_file", path)
    except ConfigError as exc:
        raise ConfigError(exc.what, file=where[0], key=where[1]) from None
    doc = _read_toml(path)
    try:
        return parse_policy(doc, key="policy")
    except ConfigError as exc:
        raise exc.located(file=path) from None


def _usable_mechanisms(cfg: RouterConfig, lc: ListenerConfig) -> set[str]:
    """The listener's mechanisms other than ANONYMOUS that can succeed."""
    usable = {"PLAIN", "SCRAM-SHA-256"} if cfg.users_file is not None else set()
    if lc.tls_ca is not None:
        usable.add("EXTERNAL")
    return usable & set(lc.sasl_mechanisms)


def _check_exposure(
    cfg: RouterConfig,
    lc: ListenerConfig,
    where: _Origin,
    fail: Callable[[_Origin, str], ConfigError],
) -> None:
    """A listener off loopback: an inter-router one needs mutual TLS (unless
    allow_insecure_mesh); a normal one must let somebody in (ANONYMOUS only when allowed)."""
    if is_loopback(lc.host):
        return
    key = where[1] if where[1].startswith("--") else f"{where[1]}.host"
    if lc.role == "inter-router":
        if cfg.allow_insecure_mesh:
            return
        if lc.tls_cert is not None and lc.require_client_cert:
            if lc.allow_anonymous or _usable_mechanisms(cfg, lc):
                return
            raise fail(
                (where[0], f"{where[1]}.sasl_mechanisms"),
                "offers routers no mechanism off loopback: add EXTERNAL (the certificate), or "
                "SCRAM-SHA-256 with users_file, or allow_anonymous = true",
            )
        raise fail(
            (where[0], key),
            f"inter-router listener on {lc.host or '*'} (not loopback) without TLS and client "
            "certificates (tls_cert, tls_key, tls_ca, require_client_cert): any host could "
            "join the mesh; add them, or --allow-insecure-mesh",
        )
    if lc.require_auth or lc.allow_anonymous:
        return
    if not _usable_mechanisms(cfg, lc):
        raise fail(
            (where[0], key),
            f"listener on {lc.host or '*'} (not loopback) has no way in: ANONYMOUS there needs "
            "allow_anonymous = true (or --allow-anonymous); or give users_file",
        )


# -- entry point ----------------------------------------------------------------------------


def _read_toml(path: str) -> dict[str, Any]:
    try:
        with open(path, "rb") as handle:
            return tomllib.load(handle)
    except OSError as exc:
        raise ConfigError(f"cannot read: {exc.strerror or exc}", file=path) from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"invalid TOML: {exc}", file=path) from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"invalid TOML: not UTF-8 ({exc.reason})", file=path) from None


_SIMPLE_OVERRIDES: dict[str, Callable[[str, Any], Any]] = {
    "id": _want_str,
    "store": lambda key, value: _want_choice(key, value, STORES),
    "store_path": lambda key, value: _path(key, value, None),
    "store_sync": lambda key, value: _want_choice(key, value, STORE_SYNC),
    "journal": lambda key, value: _path(key, value, None),
    "journal_sample": lambda key, value: _want_sample(key, value),
    "users_file": lambda key, value: _path(key, value, None),
    "policy_file": lambda key, value: _path(key, value, None),
    "log_level": lambda key, value: _want_choice(key, str(value).lower(), LOG_LEVELS),
    "log_format": lambda key, value: _want_choice(key, value, LOG_FORMATS),
    "default_distribution": lambda key, value: _want_choice(key, value, DISTRIBUTIONS),
    "metrics": lambda key, value: parse_metrics(_want_str(key, value), key),
    "write_buffer_high": lambda key, value: _want_int(key, value, 0, _UINT32_MAX),
    "write_buffer_low": lambda key, value: _want_int(key, value, 0, _UINT32_MAX),
    "busy_poll_us": lambda key, value: _want_int(key, value, 0, BUSY_POLL_MAX_US),
    "allow_insecure_mesh": _want_bool,
    "trace": _want_bool,
}


def _want_sample(key: str, value: Any) -> float:
    rate = _want_number(key, float(value) if isinstance(value, str) else value, 0.0)
    if rate > 1:
        raise ConfigError("must be within 0 and 1", key=key)
    return rate


def _option(name: str) -> str:
    return "--" + name.replace("_", "-")


def load_config(path: str | None = None, **overrides: Any) -> RouterConfig:
    """Read `path` (TOML; None = defaults only), apply command-line `overrides`, validate.

    `overrides`: ``listen`` (HOST:PORT strings or ListenerConfig; replaces the configured
    *normal* listeners, inter-router ones are kept), ``inter_router_listen`` (HOST:PORT;
    replaces the configured inter-router listeners), ``inter_router_connect``
    (HOST:PORT[,HOST:PORT...] or ConnectorConfigs; replaces the connectors, "" = none), ``address`` (PREFIX=DIST strings or
    AddressConfig; appended after the file's entries, so they win over them), and ``id``,
    ``store``, ``store_path``, ``users_file``, ``log_level``, ``log_format``,
    ``default_distribution``, ``metrics``, ``write_buffer_high``, ``write_buffer_low``, ``busy_poll_us`` (replace). None and empty values are ignored, so click options
    can be passed through unchanged. Raises ConfigError.
    """
    cfg = RouterConfig()
    listener_origins: list[_Origin] = [(None, "listener[0]")]
    if path is not None:
        from qrouter import dispatch_config  # Qpid Dispatch's qdrouterd.conf, converted

        doc = (
            dispatch_config.read(path)
            if dispatch_config.looks_like_dispatch(path)
            else _read_toml(path)
        )
        try:
            cfg = _from_table(doc, os.path.dirname(os.path.abspath(path)))
            for i, lc in enumerate(cfg.listeners):
                _check_listener(f"listener[{i}]", lc)
            for i, ac in enumerate(cfg.addresses):
                _check_address(f"address[{i}]", ac)
        except ConfigError as exc:
            raise exc.located(file=path) from None
        cfg.source = path
        listener_origins = [(path, f"listener[{i}]") for i in range(len(cfg.listeners))]

    given: set[str] = set()
    for name, value in overrides.items():
        if value is None or (
            name in ("listen", "address", "inter_router_listen", "limit") and not value
        ):
            continue
        if name in ("allow_insecure_mesh", "allow_anonymous", "trace") and not value:
            continue  # a CLI flag that was not given
        if name == "allow_anonymous":
            given.add(name)
            continue  # applied to the listeners below, once they are all known
        given.add(name)
        if name == "inter_router_listen":
            lc = value if isinstance(value, ListenerConfig) else parse_inter_router_listen(value)
            kept = [
                (old, where)
                for old, where in zip(cfg.listeners, listener_origins, strict=True)
                if old.role != "inter-router"
            ]
            cfg.listeners = [old for old, _ in kept] + [lc]
            listener_origins = [where for _, where in kept] + [(None, "--inter-router-listen")]
            continue
        if name == "inter_router_connect":
            # an empty value is meaningful: no inter-router connectors (the file's are dropped
            # too); connectors to brokers stay
            brokers = [cc for cc in cfg.connectors if cc.role == "route-container"]
            cfg.connectors = parse_connect(value) if isinstance(value, str) else list(value)
            cfg.connectors += brokers
            continue
        if name in ("listen", "address") and isinstance(value, str):
            value = [value]
        if name == "listen":
            new = [v if isinstance(v, ListenerConfig) else parse_listen(v) for v in value]
            for lc in new:
                _check_listener("--listen", lc)
            kept = [
                (lc, where)
                for lc, where in zip(cfg.listeners, listener_origins, strict=True)
                if lc.role != "normal"
            ]
            cfg.listeners = new + [lc for lc, _ in kept]
            listener_origins = [(None, "--listen")] * len(new) + [where for _, where in kept]
        elif name == "address":
            for v in value:
                ac = v if isinstance(v, AddressConfig) else parse_address_option(v)
                _check_address("--address", ac)
                cfg.addresses.append(ac)
        elif name == "limit":
            # --limit NAME=VALUE (repeatable): a [limits] key, over the file's
            table = dict(vars(cfg.limits))
            for item in [value] if isinstance(value, str) else value:
                key, sep, text = item.partition("=")
                if not sep or key.strip() not in LIMIT_KEYS:
                    raise ConfigError(
                        f"{item!r}: expected NAME=VALUE with NAME one of {', '.join(LIMIT_KEYS)}",
                        key="--limit",
                    )
                raw: Any = text.strip()
                try:
                    raw = float(raw) if "." in raw else int(raw)
                except ValueError:
                    pass
                table[key.strip()] = raw
            cfg.limits = parse_limits(table, _want_int, _want_number, _want_choice)
        elif name in _SIMPLE_OVERRIDES:
            setattr(cfg, name, _SIMPLE_OVERRIDES[name](_option(name), value))
        else:
            raise TypeError(f"load_config: unknown override {name!r}")

    if "allow_anonymous" in given:
        for lc in cfg.listeners:
            if lc.role == "normal":
                lc.allow_anonymous = True

    def origin(name: str) -> _Origin:
        if name in given:
            return (None, _option(name))
        return (path, name)

    _cross_check(cfg, origin, listener_origins)
    _check_autolinks(cfg, origin)
    _check_linkroutes(cfg, origin)
    return cfg
