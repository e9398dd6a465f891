"""Limits on what one peer can make the router hold (issue 13; docs/configuration.md
"[limits]"): connections (total, per remote host, per user), sessions and links per connection,
unsettled deliveries per incoming link, termini per container and in total, the terminus
timeout and ``expiry-policy never``.

The engine enforces those it meets while parsing frames (qrouter/_fast/limits.pxi: sessions,
links, unsettled deliveries) and counts its refusals; this module holds the configuration,
the control-plane checks (one per OPEN or per ATTACH, never per message) and the counters of
both, which ``$management`` (entity type ``limit``), ``qrouter-tool limits`` and ``/metrics``
show. A refusal carries ``amqp:resource-limit-exceeded`` with a description that names the
limit.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from qrouter.conn_rate import ConnectionRate
from qrouter.host_control_rate import HostControlRate

log = logging.getLogger("qrouter.limits")

RESOURCE_LIMIT = "amqp:resource-limit-exceeded"  # 2.8.15 amqp-error
EXPIRY_NEVER_POLICIES = ("allow", "cap", "refuse")
OVERSIZE_POLICIES = ("close", "detach")
ANONYMOUS_USER = "<anonymous>"  # every unauthenticated connection counts as this one user


@dataclass
class LimitsConfig:
    """The ``[limits]`` table; 0 turns a limit off (documented in docs/configuration.md)."""

    max_connections: int = 10_000
    max_connections_per_host: int = 1_000
    max_connections_per_user: int = 1_000
    max_sessions_per_connection: int = 100  # channel-max 99
    max_links_per_connection: int = 1_000  # handle-max 999
    max_unsettled_per_link: int = 1_000  # 4 x the default link_capacity (250)
    max_termini_per_container: int = 1_000
    max_termini: int = 100_000
    max_terminus_timeout: float = 7 * 24 * 3600.0  # seconds
    # allow | cap | refuse. allow: the router's own client asks for never on every durable
    # link, and the termini limits above bound what such termini can make the router keep
    expiry_never: str = "allow"
    # control frames (ATTACH, DETACH, BEGIN, ...) a second one client connection may send, in
    # bursts of as many; beyond it the router reads that peer more slowly (qrouter/server.py)
    max_control_rate: int = 500
    # close | detach: what a client connection that sends a message over max_message_size
    # gets besides the link's detach (close: as Qpid Dispatch, it is not read any further)
    message_size_exceeded: str = "close"
    # new connections a second from one remote host, loopback included, in bursts of
    # connection_rate_burst; past it a connection is reset as soon as it is accepted
    max_connection_rate_per_host: int = 20
    connection_rate_burst: int = 40
    # control frames a second from all the client connections of one remote host together,
    # loopback included, in bursts of control_rate_per_host_burst; charged alongside
    # max_control_rate, with the same slow-down (qrouter/host_control_rate.py). 4 connections'
    # worth of max_control_rate: a host opening its links at start-up is not slowed
    max_control_rate_per_host: int = 2_000
    control_rate_per_host_burst: int = 4_000


LIMIT_KEYS = tuple(f.name for f in fields(LimitsConfig))

# the name each limit has in $management, qrouter-tool and /metrics, and its config key
NAMES: dict[str, str] = {
    "connections": "max_connections",
    "connections_per_host": "max_connections_per_host",
    "connections_per_user": "max_connections_per_user",
    "sessions_per_connection": "max_sessions_per_connection",
    "links_per_connection": "max_links_per_connection",
    "unsettled_per_link": "max_unsettled_per_link",
    "message_size": "max_message_size",
    "termini_per_container": "max_termini_per_container",
    "termini": "max_termini",
    "terminus_timeout": "max_terminus_timeout",
    "expiry_never": "expiry_never",
    "control_rate": "max_control_rate",
    "connection_rate_per_host": "max_connection_rate_per_host",
    "control_rate_per_host": "max_control_rate_per_host",
}

DESCRIPTIONS: dict[str, str] = {
    "connections": "open client connections (inter-router ones are not counted)",
    "connections_per_host": "open client connections from one remote host",
    "connections_per_user": "open client connections of one user (anonymous: one user)",
    "sessions_per_connection": "sessions on one connection (the channel-max advertised + 1)",
    "links_per_connection": "links on one connection (the handle-max advertised + 1)",
    "unsettled_per_link": "unsettled deliveries the router holds on one incoming link",
    "message_size": "bytes of one message (the router default; a listener may set its own)",
    "termini_per_container": "registered termini (durable or expiry never) of one container",
    "termini": "registered termini in total",
    "terminus_timeout": "seconds a suspended terminus is kept (longer timeouts are capped)",
    "expiry_never": "what expiry-policy never gets: allow, cap (to the timeout cap), refuse",
    "control_rate": "control frames a second from one client connection (ATTACH, DETACH, "
    "BEGIN...); past it the router reads the peer more slowly",
    "connection_rate_per_host": "new connections a second from one remote host (in bursts of "
    "connection_rate_burst); past it a connection is reset when accepted",
    "control_rate_per_host": "control frames a second from all the client connections of one "
    "remote host (in bursts of control_rate_per_host_burst); past it the router reads them "
    "more slowly",
}


def parse_limits(
    table: Mapping[str, Any], want_int: Any, want_number: Any, want_choice: Any
) -> LimitsConfig:
    """The ``[limits]`` table, checked with config.py's helpers (given, not imported: config.py
    imports this module)."""
    lim = LimitsConfig()
    for name in LIMIT_KEYS:
        if name not in table:
            continue
        key = f"limits.{name}"
        if name == "expiry_never":
            lim.expiry_never = want_choice(key, table[name], EXPIRY_NEVER_POLICIES)
        elif name == "message_size_exceeded":
            lim.message_size_exceeded = want_choice(key, table[name], OVERSIZE_POLICIES)
        elif name == "max_terminus_timeout":
            lim.max_terminus_timeout = want_number(key, table[name], 0.0)
        elif name == "max_sessions_per_connection":
            lim.max_sessions_per_connection = want_int(key, table[name], 0, 65536)
        else:
            setattr(lim, name, want_int(key, table[name], 0, 0xFFFFFFFF))
    return lim


class Limits:
    """The control plane's checks and the counters of every limit."""

    def __init__(self, config: LimitsConfig, engine_limits: Any) -> None:
        self.config = config
        self.engine = engine_limits  # router._fast.engine.Limits: the engine's counters
        self.refused: Counter[str] = Counter()
        self.connections: set[Any] = set()  # admitted client connections
        self.hosts: Counter[str] = Counter()
        self.users: Counter[str] = Counter()
        self.admitted: dict[Any, tuple[str, str]] = {}
        self.rate = ConnectionRate(
            config.max_connection_rate_per_host, config.connection_rate_burst
        )
        self.control = HostControlRate(
            config.max_control_rate_per_host, config.control_rate_per_host_burst
        )

    def accept(self, host: str) -> bool:
        """A socket just accepted from `host` (before any byte is read): False when the host's
        connection rate is spent and the socket is to be reset (qrouter/conn_rate.py)."""
        if self.rate.admit(host):
            return True
        self.refused["connection_rate_per_host"] += 1
        return False

    # -- connections ---------------------------------------------------------------------------

    def admit(self, conn: Any, host: str, user: str | None) -> tuple[str, str] | None:
        """At the peer's OPEN: None when `conn` may stay (it is counted until `release`), else
        the (condition, description) to close it with."""
        c = self.config
        who = user if user is not None else ANONYMOUS_USER
        refusal: tuple[str, int, str] | None = None
        if c.max_connections and len(self.connections) >= c.max_connections:
            refusal = ("connections", c.max_connections, "")
        elif c.max_connections_per_host and self.hosts[host] >= c.max_connections_per_host:
            refusal = ("connections_per_host", c.max_connections_per_host, f" for host {host}")
        elif c.max_connections_per_user and self.users[who] >= c.max_connections_per_user:
            refusal = ("connections_per_user", c.max_connections_per_user, f" for user {who}")
        if refusal is not None:
            name, value, whom = refusal
            self.refused[name] += 1
            what = name.replace("_", " ")
            return RESOURCE_LIMIT, f"{what} limit {value} reached{whom}"
        self.connections.add(conn)
        self.hosts[host] += 1
        self.users[who] += 1
        self.admitted[conn] = (host, who)
        return None

    def release(self, conn: Any) -> None:
        if conn not in self.admitted:
            return
        host, who = self.admitted.pop(conn)
        self.connections.discard(conn)
        for table, key in ((self.hosts, host), (self.users, who)):
            table[key] -= 1
            if table[key] <= 0:
                del table[key]

    # -- termini (qrouter/link_registry.py) -------------------------------------------------

    def check_new_terminus(self, container: str, per_container: int, total: int) -> None:
        """Before the registry keeps a new terminus: raises AttachError past a limit."""
        from qrouter.link_registry import AttachError

        c = self.config
        if c.max_termini and total >= c.max_termini:
            self.refused["termini"] += 1
            raise AttachError(RESOURCE_LIMIT, f"termini limit {c.max_termini} reached")
        if c.max_termini_per_container and per_container >= c.max_termini_per_container:
            self.refused["termini_per_container"] += 1
            raise AttachError(
                RESOURCE_LIMIT,
                f"termini per container limit {c.max_termini_per_container} reached "
                f"for container {container}",
            )

    def expiry(self, policy: str, timeout: float) -> tuple[str, float]:
        """3.5.3/3.5.4: the router may grant another expiry policy and timeout than asked and
        says so in its ATTACH. `never` follows expiry_never; a longer timeout is capped."""
        from qrouter.link_registry import AttachError

        c = self.config
        if policy == "never" and c.expiry_never == "refuse":
            self.refused["expiry_never"] += 1
            raise AttachError(RESOURCE_LIMIT, "expiry_never limit: expiry-policy never is refused")
        if policy == "never" and c.expiry_never == "cap" and c.max_terminus_timeout:
            # it expires the longest allowed timeout after any suspension
            self.refused["expiry_never"] += 1
            return "link-detach", c.max_terminus_timeout
        if c.max_terminus_timeout and timeout > c.max_terminus_timeout:
            self.refused["terminus_timeout"] += 1
            return policy, c.max_terminus_timeout
        return policy, timeout

    # -- what operations see -----------------------------------------------------------------

    def rows(
        self, max_message_size: int, termini: int, connections: int | None = None
    ) -> list[dict[str, Any]]:
        """One row per limit: its value, current use where the router knows one cheaply, and
        how often it was met."""
        c = self.config
        engine = self.engine.counters() if self.engine is not None else {}
        in_use: dict[str, Any] = {
            "connections": len(self.connections) if connections is None else connections,
            "connections_per_host": max(self.hosts.values(), default=0),
            "connections_per_user": max(self.users.values(), default=0),
            "termini": termini,
        }
        out = []
        for name, key in NAMES.items():
            value = max_message_size if name == "message_size" else getattr(c, key)
            out.append(
                {
                    "identity": name,
                    "name": name,
                    "config_key": key,
                    "value": value,
                    "in_use": in_use.get(name),
                    "exceeded": engine.get(name, 0) + self.refused[name],
                    "description": DESCRIPTIONS[name],
                }
            )
        return out
