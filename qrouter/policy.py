"""Who may do what on a router: the ``[policy]`` of docs/configuration.md.

A policy puts users in groups; a group says which addresses its users may attach to (as
sources, to receive; as targets, to send), whether they may ask for a dynamic source or use the
anonymous relay, how many sessions, senders and receivers one connection may have, the largest
message it may send, how many connections one user and one remote host may hold, and its
management role (``admin``, ``monitor``, ``none``). No policy: every attach is allowed, as
before; only management changes are restricted (see `management_role`).

The core asks once per connection (`admit`, `release`) and once per link attach
(`check_attach`); the answers are a `Refusal` or None. Nothing here runs per message: the
message size maximum becomes the link's max-message-size (2.7.3), which the engine enforces.

This module owns the per-group rules only. The router-wide resource limits (connections,
sessions, links...) are a separate layer; both apply, so the smaller maximum wins.
"""

from __future__ import annotations

import ipaddress
import logging
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from qrouter.addresses import AddressEntry, AddressTable, check_pattern
from qrouter.config import ConfigError

log = logging.getLogger("qrouter.policy")

ANONYMOUS_USER = "$anonymous"  # the `users` entry for connections without a user name
USER_VARIABLE = "${user}"
ROLES = ("admin", "monitor", "none")
UNAUTHORIZED = "amqp:unauthorized-access"
RESOURCE_LIMIT = "amqp:resource-limit-exceeded"  # 2.8.15 amqp-error
# at most one log line per (connection, rule) this often; the others are counted
DEFAULT_LOG_INTERVAL = 10.0
_COMPILED_MAX = 10_000  # cached (group, user) pattern tables

_GROUP_KEYS = (
    "name",
    "users",
    "sources",
    "targets",
    "allow_dynamic_source",
    "allow_anonymous_sender",
    "max_sessions",
    "max_senders",
    "max_receivers",
    "max_message_size",
    "max_connections_per_user",
    "max_connections_per_host",
    "management",
)
_POLICY_KEYS = ("allow_unknown_user", "default_group", "management_users", "log_interval", "group")
_LIMITS = (
    "max_sessions",
    "max_senders",
    "max_receivers",
    "max_message_size",
    "max_connections_per_user",
    "max_connections_per_host",
)


@dataclass
class GroupConfig:
    """One ``[[policy.group]]``. A maximum of 0 means no maximum (of this group's own)."""

    name: str
    users: tuple[str, ...] = ()
    sources: tuple[str, ...] = ()
    targets: tuple[str, ...] = ()
    allow_dynamic_source: bool = True
    allow_anonymous_sender: bool = False
    max_sessions: int = 0
    max_senders: int = 0
    max_receivers: int = 0
    max_message_size: int = 0
    max_connections_per_user: int = 0
    max_connections_per_host: int = 0
    management: str = "none"


@dataclass
class PolicyConfig:
    groups: list[GroupConfig] = field(default_factory=list)
    allow_unknown_user: bool = False
    default_group: str | None = None
    management_users: dict[str, str] = field(default_factory=dict)
    log_interval: float = DEFAULT_LOG_INTERVAL


# -- parsing (config.py calls this for [policy] and for policy_file) ---------------------------


def _want(key: str, value: object, kind: type, what: str) -> Any:
    if kind is int and isinstance(value, bool):
        raise ConfigError(f"expected {what}", key=key)
    if not isinstance(value, kind):
        raise ConfigError(f"expected {what}", key=key)
    return value


def _strings(key: str, value: object) -> tuple[str, ...]:
    items = _want(key, value, list, "an array of strings")
    return tuple(_want(f"{key}[{i}]", v, str, "a string") for i, v in enumerate(items))


def _patterns(key: str, value: object) -> tuple[str, ...]:
    found = _strings(key, value)
    for i, pattern in enumerate(found):
        try:
            check_pattern(pattern.replace(USER_VARIABLE, "user"))
        except ValueError as exc:
            raise ConfigError(str(exc), key=f"{key}[{i}]") from None
    return found


def parse_policy(table: Mapping[str, Any], key: str = "policy") -> PolicyConfig:
    """A ``[policy]`` table (or a policy file's top level) -> PolicyConfig. Raises
    ConfigError naming the key."""
    for name in table:
        if name not in _POLICY_KEYS:
            raise ConfigError(
                f"unknown key (known: {', '.join(_POLICY_KEYS)})", key=f"{key}.{name}"
            )
    pc = PolicyConfig()
    if "allow_unknown_user" in table:
        pc.allow_unknown_user = _want(
            f"{key}.allow_unknown_user", table["allow_unknown_user"], bool, "true or false"
        )
    if "default_group" in table:
        pc.default_group = _want(f"{key}.default_group", table["default_group"], str, "a string")
    if "log_interval" in table:
        value = table["log_interval"]
        if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
            raise ConfigError("expected a number of seconds >= 0", key=f"{key}.log_interval")
        pc.log_interval = float(value)
    if "management_users" in table:
        users = _want(f"{key}.management_users", table["management_users"], dict, "a table")
        for user, role in users.items():
            if role not in ROLES:
                raise ConfigError(
                    f"{role!r} is not one of {', '.join(ROLES)}",
                    key=f"{key}.management_users.{user}",
                )
            pc.management_users[str(user)] = role
    groups = table.get("group", [])
    if not isinstance(groups, list):
        raise ConfigError("expected an array of tables ([[policy.group]])", key=f"{key}.group")
    members: dict[str, str] = {}
    for i, raw in enumerate(groups):
        gk = f"{key}.group[{i}]"
        g = _group(gk, _want(gk, raw, dict, "a table"))
        if any(other.name == g.name for other in pc.groups):
            raise ConfigError(f"a group named {g.name!r} exists already", key=f"{gk}.name")
        for user in g.users:
            if user in members:
                raise ConfigError(
                    f"user {user!r} is also in group {members[user]!r} (one group per user)",
                    key=f"{gk}.users",
                )
            members[user] = g.name
        pc.groups.append(g)
    if pc.default_group is not None and not any(g.name == pc.default_group for g in pc.groups):
        raise ConfigError(
            f"no [[policy.group]] named {pc.default_group!r}", key=f"{key}.default_group"
        )
    if pc.allow_unknown_user and pc.default_group is None:
        raise ConfigError(
            "needs default_group (the group of users listed in no group)",
            key=f"{key}.allow_unknown_user",
        )
    return pc


def _group(key: str, table: Mapping[str, Any]) -> GroupConfig:
    for name in table:
        if name not in _GROUP_KEYS:
            raise ConfigError(f"unknown key (known: {', '.join(_GROUP_KEYS)})", key=f"{key}.{name}")
    if "name" not in table:
        raise ConfigError("missing (every group has a name)", key=f"{key}.name")
    name = _want(f"{key}.name", table["name"], str, "a string")
    if not name:
        raise ConfigError("must not be empty", key=f"{key}.name")
    g = GroupConfig(name=name)
    if "users" in table:
        g.users = _strings(f"{key}.users", table["users"])
    for which in ("sources", "targets"):
        if which in table:
            setattr(g, which, _patterns(f"{key}.{which}", table[which]))
    for flag in ("allow_dynamic_source", "allow_anonymous_sender"):
        if flag in table:
            setattr(g, flag, _want(f"{key}.{flag}", table[flag], bool, "true or false"))
    for limit in _LIMITS:
        if limit in table:
            value = _want(f"{key}.{limit}", table[limit], int, "an integer")
            high = 65536 if limit == "max_sessions" else None  # 2.7.1: channel-max is a ushort
            if value < 0 or (high is not None and value > high):
                bound = f"between 0 and {high}" if high else "at least 0"
                raise ConfigError(
                    f"{value} is out of range (must be {bound})", key=f"{key}.{limit}"
                )
            setattr(g, limit, value)
    if "management" in table:
        role = _want(f"{key}.management", table["management"], str, "a string")
        if role not in ROLES:
            raise ConfigError(f"{role!r} is not one of {', '.join(ROLES)}", key=f"{key}.management")
        g.management = role
    return g


# -- run time --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Refusal:
    """Why an attach or a connection is refused: the AMQP error condition, a description that
    names the rule, and the rule (the counter's label)."""

    condition: str
    description: str
    rule: str


@dataclass
class ConnInfo:
    """What the policy knows of one connection: who, from where, on which listener."""

    conn_id: int
    user: str | None
    host: str | None  # the remote address, without the port
    listener_host: str
    require_auth: bool
    group: GroupConfig | None = None
    sources: AddressTable | None = None
    targets: AddressTable | None = None
    admitted: bool = False
    # the log rate limiter: rule -> (monotonic time of the last line, refusals not logged)
    log_marks: dict[str, tuple[float, int]] = field(default_factory=dict)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _table(patterns: Sequence[str], user: str | None) -> AddressTable:
    """The patterns of a group with ``${user}`` replaced by this user's name. A pattern with
    ``${user}`` matches nothing for an anonymous connection, nor for a user whose name holds a
    wildcard (``*``, ``#``): a name must never widen what the pattern grants."""
    table = AddressTable(oslo_preset=False)
    for pattern in patterns:
        if USER_VARIABLE in pattern:
            if user is None or not user or "*" in user or "#" in user:
                continue
            pattern = pattern.replace(USER_VARIABLE, user)
        try:
            table.add(AddressEntry(prefix=None, pattern=pattern, distribution="balanced"))
        except ValueError:
            continue  # e.g. a user name with an empty token: nothing granted
    return table


class Policy:
    """The run-time policy of one router. `config` None: no policy (everything allowed)."""

    def __init__(self, config: PolicyConfig | None, *, users_file: bool) -> None:
        self.config = config
        self.users_file = users_file
        self._group_of: dict[str, GroupConfig] = {}
        if config is not None:
            for g in config.groups:
                for user in g.users:
                    self._group_of[user] = g
        self.per_user: Counter[str] = Counter()
        self.per_host: Counter[tuple[str, str]] = Counter()  # (group, remote host)
        self.per_group: Counter[str] = Counter()
        # the compiled sources and targets per (group, user): users come from the users file
        # (or are anonymous), so this stays as small as that file
        self._compiled: dict[tuple[str, str | None], tuple[AddressTable, AddressTable]] = {}
        # (group, rule) -> refusals; the group is "" for refusals before one is known
        self.refusals: Counter[tuple[str, str]] = Counter()

    @property
    def enabled(self) -> bool:
        return self.config is not None

    # -- connections -------------------------------------------------------------------------

    def group_for(self, user: str | None) -> GroupConfig | None:
        assert self.config is not None
        g = self._group_of.get(ANONYMOUS_USER if user is None else user)
        if g is None and self.config.allow_unknown_user and self.config.default_group:
            g = next(x for x in self.config.groups if x.name == self.config.default_group)
        return g

    def admit(self, info: ConnInfo) -> Refusal | None:
        """An OPEN from a client: its group, and the per-user and per-host maxima. On None,
        the connection counts until `release`."""
        if self.config is not None:
            g = self.group_for(info.user)
            who = "anonymous connections" if info.user is None else f"user {info.user!r}"
            if g is None:
                return self._refuse(
                    info,
                    "",
                    "allow_unknown_user",
                    UNAUTHORIZED,
                    f"policy: {who} in no group, and allow_unknown_user is false",
                )
            info.group = g
            if g.max_connections_per_user and info.user is not None:
                if self.per_user[info.user] >= g.max_connections_per_user:
                    return self._refuse(
                        info,
                        g.name,
                        "max_connections_per_user",
                        RESOURCE_LIMIT,
                        f"policy group {g.name!r}: user {info.user!r} has "
                        f"{self.per_user[info.user]} connections "
                        f"(max_connections_per_user {g.max_connections_per_user})",
                    )
            if g.max_connections_per_host and info.host is not None:
                held = self.per_host[(g.name, info.host)]
                if held >= g.max_connections_per_host:
                    return self._refuse(
                        info,
                        g.name,
                        "max_connections_per_host",
                        RESOURCE_LIMIT,
                        f"policy group {g.name!r}: host {info.host} has {held} connections "
                        f"of this group (max_connections_per_host {g.max_connections_per_host})",
                    )
            info.sources, info.targets = self._tables(g, info.user)
            self.per_group[g.name] += 1
            if info.user is not None:
                self.per_user[info.user] += 1
            if info.host is not None:
                self.per_host[(g.name, info.host)] += 1
        info.admitted = True
        return None

    def _tables(self, g: GroupConfig, user: str | None) -> tuple[AddressTable, AddressTable]:
        key = (g.name, user)
        tables = self._compiled.get(key)
        if tables is None:
            if len(self._compiled) >= _COMPILED_MAX:
                self._compiled.clear()  # user names from elsewhere (certificates): stay bounded
            tables = self._compiled[key] = (_table(g.sources, user), _table(g.targets, user))
        return tables

    def release(self, info: ConnInfo) -> None:
        """The connection is closed: it no longer counts."""
        if not info.admitted:
            return
        info.admitted = False
        if info.group is None:
            return
        group = info.group.name
        for counter, key in (
            (self.per_user, info.user),
            (self.per_host, (group, info.host) if info.host is not None else None),
            (self.per_group, group),
        ):
            if key is not None:
                counter[key] -= 1  # type: ignore[index]
                if counter[key] <= 0:  # type: ignore[index]
                    del counter[key]  # type: ignore[arg-type]

    def max_sessions(self, info: ConnInfo) -> int:
        return info.group.max_sessions if info.group is not None else 0

    def refuse_session(self, info: ConnInfo, channel: int) -> Refusal | None:
        """A BEGIN above the channel-max that max_sessions set in our OPEN (2.7.1): counted
        and logged as this group's refusal (the engine closes the connection)."""
        g = info.group
        if g is None or not g.max_sessions:
            return None
        return self._refuse(
            info,
            g.name,
            "max_sessions",
            RESOURCE_LIMIT,
            f"policy group {g.name!r}: session on channel {channel} (max_sessions "
            f"{g.max_sessions})",
        )

    def max_message_size(self, info: ConnInfo, router_max: int) -> int:
        """The largest message this connection's producers may send: the group's maximum
        within the router's (0: none)."""
        own = info.group.max_message_size if info.group is not None else 0
        if own and router_max:
            return min(own, router_max)
        return own or router_max

    # -- links -------------------------------------------------------------------------------

    def check_attach(
        self,
        info: ConnInfo,
        receiving: bool,
        address: str | None,
        dynamic: bool,
        open_links: Callable[[], int] = lambda: 0,
    ) -> Refusal | None:
        """May the client attach a link on which it receives (`receiving`, a source address)
        or sends (a target address; None = the anonymous relay)? `open_links()`: how many
        links of that direction the connection has attached already (asked only when the
        group has a maximum)."""
        g = info.group
        if g is None:
            return None
        what = "source" if receiving else "target"
        limit = g.max_receivers if receiving else g.max_senders
        rule = "max_receivers" if receiving else "max_senders"
        if limit and (count := open_links()) >= limit:
            return self._refuse(
                info,
                g.name,
                rule,
                RESOURCE_LIMIT,
                f"policy group {g.name!r}: {count} {rule[4:]} on this connection ({rule} {limit})",
            )
        if dynamic:
            if not g.allow_dynamic_source:
                return self._refuse(
                    info,
                    g.name,
                    "allow_dynamic_source",
                    UNAUTHORIZED,
                    f"policy group {g.name!r}: dynamic {what} not allowed (allow_dynamic_source)",
                )
            return None
        if address is None:
            if receiving:
                return None  # a null source address: the registry's rules apply
            if not g.allow_anonymous_sender:
                return self._refuse(
                    info,
                    g.name,
                    "allow_anonymous_sender",
                    UNAUTHORIZED,
                    f"policy group {g.name!r}: the anonymous relay (null target) is not "
                    "allowed (allow_anonymous_sender)",
                )
            return None
        table = info.sources if receiving else info.targets
        if table is None or table.match(address) is None:
            rule = "sources" if receiving else "targets"
            patterns = list(g.sources if receiving else g.targets)
            return self._refuse(
                info,
                g.name,
                rule,
                UNAUTHORIZED,
                f"policy group {g.name!r}: {what} {address!r} not in {rule} {patterns}",
            )
        return None

    def refuse_reply_address(self, info: ConnInfo, address: str) -> Refusal:
        """A receiver on a dynamic address another connection made (reply addresses are
        private, with or without a policy)."""
        return self._refuse(
            info,
            info.group.name if info.group is not None else "",
            "reply_address",
            UNAUTHORIZED,
            f"{address!r} is the reply address of another connection (dynamic addresses are "
            "private to the connection that made them)",
        )

    # -- management --------------------------------------------------------------------------

    def management_role(self, info: ConnInfo) -> str:
        """``admin``, ``monitor`` or ``none`` for a management request on this connection.

        Without a policy: admin on a loopback listener of a router without a users file (the
        embedded default, `qrouter start`), monitor everywhere else. With one: the user's
        entry in management_users, else the group's role. In no case is an anonymous
        connection admin on a listener that requires authentication or listens beyond the
        loopback interface."""
        loopback = is_loopback(info.listener_host)
        if self.config is None:
            role = "admin" if loopback and not self.users_file else "monitor"
        else:
            role = self.config.management_users.get(info.user or ANONYMOUS_USER, "")
            if not role:
                role = info.group.management if info.group is not None else "none"
        if role == "admin" and info.user is None and (info.require_auth or not loopback):
            role = "monitor"
        return role

    # -- counting and logging ----------------------------------------------------------------

    def _refuse(
        self, info: ConnInfo, group: str, rule: str, condition: str, description: str
    ) -> Refusal:
        self.refusals[(group, rule)] += 1
        self._log(info, rule, description)
        return Refusal(condition, description, rule)

    def _log(self, info: ConnInfo, rule: str, description: str) -> None:
        """At most one line per (connection, rule) per log_interval; the lines skipped in
        between are counted in the next one."""
        interval = self.config.log_interval if self.config is not None else DEFAULT_LOG_INTERVAL
        now = time.monotonic()
        last, skipped = info.log_marks.get(rule, (-1e18, 0))
        if now - last < interval:
            info.log_marks[rule] = (last, skipped + 1)
            return
        info.log_marks[rule] = (now, 0)
        more = f" ({skipped} more refused since the last line)" if skipped else ""
        log.warning(
            "[C%d] refused (user %r, host %s): %s%s",
            info.conn_id,
            info.user,
            info.host,
            description,
            more,
        )

    def group_rows(self) -> list[dict[str, Any]]:
        """The management entity ``policy.group``: one row per group (and one for refusals
        before a group was known, named ``""``)."""
        if self.config is None:
            return []
        rows = []
        names = [g.name for g in self.config.groups]
        for g in self.config.groups:
            refused = {rule: n for (group, rule), n in self.refusals.items() if group == g.name}
            rows.append(
                {
                    "identity": g.name,
                    "name": g.name,
                    "users": list(g.users),
                    "management": g.management,
                    "connections": self.per_group.get(g.name, 0),
                    "refused": sum(refused.values()),
                    "refused_by_rule": refused,
                }
            )
        other = {rule: n for (group, rule), n in self.refusals.items() if group not in names}
        if other:
            rows.append(
                {
                    "identity": "",
                    "name": "",
                    "users": [],
                    "management": "none",
                    "connections": 0,
                    "refused": sum(other.values()),
                    "refused_by_rule": other,
                }
            )
        return rows
