"""Qpid Dispatch's configuration file (``qdrouterd.conf``) read as qrouter's configuration.

The format (Dispatch 1.19): sections ``entity { ... }`` holding ``attribute: value`` pairs, one
a line (several on one line are taken too: ``router { mode: interior id: A }``), ``#``
comments. The result is the same table the TOML loader reads (qrouter/config.py
`_from_table`), so every check of a TOML file applies to a converted one.

Never silently ignored: an entity or attribute qrouter has no counterpart for is refused with
one line naming the file, line, entity and attribute (all of them at once, one line each), so
an operator knows exactly what the migration drops. docs/migrating-from-dispatch.md lists the
mapping.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from qrouter.config import ConfigError

_KEY = re.compile(r"^([A-Za-z][A-Za-z0-9_-]*):$")
_SECTION = re.compile(r"^([A-Za-z][A-Za-z0-9_.-]*)\s*\{\s*(.*)$")
MAX_FILE_SIZE = 1 << 20  # a configuration file; beyond this it is not one


@dataclass
class Section:
    entity: str
    line: int
    attributes: dict[str, tuple[str, int]] = field(default_factory=dict)  # name -> value, line


def looks_like_dispatch(path: str, head: bytes | None = None) -> bool:
    """A Dispatch file: named ``*.conf``, or its first section opens with ``word {``."""
    if path.endswith(".conf"):
        return True
    if head is None:
        try:
            with open(path, "rb") as handle:
                head = handle.read(4096)
        except OSError:
            return False
    for raw in head.decode("utf-8", "replace").splitlines():
        text = raw.split("#", 1)[0].strip()
        if text:
            return _SECTION.match(text) is not None
    return False


def parse(text: str, path: str = "qdrouterd.conf") -> list[Section]:
    """The sections of a Dispatch configuration file; ConfigError on a syntax error."""
    sections: list[Section] = []
    current: Section | None = None
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        while line:
            if current is None:
                match = _SECTION.match(line)
                if match is None:
                    raise _error(path, number, None, None, f"expected 'entity {{', got {line!r}")
                current = Section(match.group(1), number)
                line = match.group(2).strip()
                continue
            if line.startswith("}"):
                sections.append(current)
                current = None
                line = line[1:].strip()
                continue
            body, _, rest = line.partition("}")
            _pairs(current, body, number, path)
            line = ("}" + rest).strip() if _ else ""
    if current is not None:
        raise _error(path, current.line, current.entity, None, "section is not closed with '}'")
    return sections


def _pairs(section: Section, text: str, number: int, path: str) -> None:
    """``key: value [key: value ...]`` on one line; a value may hold spaces
    (``saslMechanisms: ANONYMOUS PLAIN``) and may be quoted."""
    key: str | None = None
    words: list[str] = []
    for token in text.split():
        match = _KEY.match(token)
        if match is not None:
            if key is not None:
                _set(section, key, words, number, path)
            key, words = match.group(1), []
        elif key is None:
            raise _error(
                path, number, section.entity, None, f"expected 'attribute: value', got {text!r}"
            )
        else:
            words.append(token)
    if key is not None:
        _set(section, key, words, number, path)


def _set(section: Section, key: str, words: list[str], number: int, path: str) -> None:
    value = " ".join(words)
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
        value = value[1:-1]
    if not value:
        raise _error(path, number, section.entity, key, "no value")
    if key in section.attributes:
        raise _error(path, number, section.entity, key, "given twice")
    section.attributes[key] = (value, number)


def _error(
    path: str, line: int, entity: str | None, attribute: str | None, what: str
) -> ConfigError:
    key = ".".join(part for part in (entity, attribute) if part) or None
    return ConfigError(what, key=key, file=f"{path}:{line}")


# -- conversion --------------------------------------------------------------------------------

_UNSUPPORTED_ENTITIES = {
    "policy": "Dispatch's policy (vhosts) is not in qrouter; use [policy] (docs/configuration.md)",
    "vhost": "Dispatch's vhost policy is not in qrouter; use [policy] (docs/configuration.md)",
    "exchange": "exchanges are not in qrouter",
    "binding": "exchange bindings are not in qrouter",
    "tcpListener": "TCP adaptors are not in qrouter",
    "tcpConnector": "TCP adaptors are not in qrouter",
    "httpListener": "HTTP adaptors are not in qrouter",
    "httpConnector": "HTTP adaptors are not in qrouter",
    "authServicePlugin": "remote authentication services are not in qrouter; use users_file",
    "console": "the web console is not in qrouter",
}
_PORTS = {"amqp": 5672, "amqps": 5671}
# sslProfile files: Dispatch 1.19's names, and the older keyFile / certDb they replaced
_SSL_FILES = {
    "certFile": "tls_cert",
    "privateKeyFile": "tls_key",
    "keyFile": "tls_key",
    "caCertFile": "tls_ca",
    "certDb": "tls_ca",
}
# Dispatch's log levels (the lowest of ``enable``) as qrouter's
_LOG_LEVELS = {
    "trace": "debug",
    "debug": "debug",
    "info": "info",
    "notice": "info",
    "warning": "warning",
    "error": "error",
    "critical": "critical",
}


class _Converter:
    def __init__(self, path: str, sections: list[Section]) -> None:
        self.path = path
        self.sections = sections
        self.errors: list[ConfigError] = []
        self.ssl_profiles: dict[str, Section] = {}
        self.doc: dict[str, Any] = {}

    def refuse(self, section: Section, attribute: str | None, what: str) -> None:
        line = section.attributes[attribute][1] if attribute else section.line
        self.errors.append(_error(self.path, line, section.entity, attribute, what))

    def run(self) -> dict[str, Any]:
        for s in self.sections:
            if s.entity == "sslProfile":
                self.ssl_profile(s)
        handlers: dict[str, Callable[[Section], None]] = {
            "router": self.router,
            "listener": self.listener,
            "connector": self.connector,
            "address": self.address,
            "autoLink": self.autolink,
            "linkRoute": self.linkroute,
            "log": self.log,
            "sslProfile": lambda s: None,
        }
        routers = 0
        for s in self.sections:
            if s.entity == "router":
                routers += 1
                if routers > 1:
                    self.refuse(s, None, "a second router section")
                    continue
            handler = handlers.get(s.entity)
            if handler is not None:
                handler(s)
            elif s.entity in _UNSUPPORTED_ENTITIES:
                self.refuse(s, None, f"not supported: {_UNSUPPORTED_ENTITIES[s.entity]}")
            else:
                self.refuse(s, None, "unknown entity, not supported by qrouter")
        if self.errors:
            if len(self.errors) == 1:
                raise self.errors[0]
            raise ConfigError(
                f"{len(self.errors)} settings qrouter does not support:\n"
                + "\n".join(str(e) for e in self.errors),
                file=self.path,
            )
        return self.doc

    # each entity: a table of attribute -> handler(section, attribute, value, table)

    def append(
        self,
        s: Section,
        kind: str,
        rules: dict[str, Callable[[Section, str, str, dict[str, Any]], None]],
    ) -> None:
        """One ``[[kind]]`` table of the TOML document, made from a section by `rules`."""
        table: dict[str, Any] = {}
        self.take(s, table, rules)
        self.doc.setdefault(kind, []).append(table)

    def take(
        self,
        s: Section,
        table: dict[str, Any],
        rules: dict[str, Callable[[Section, str, str, dict[str, Any]], None]],
    ) -> None:
        for attribute, (value, _line) in s.attributes.items():
            rule = rules.get(attribute)
            if rule is None:
                self.refuse(s, attribute, "attribute not supported by qrouter")
                continue
            try:
                rule(s, attribute, value, table)
            except ValueError as exc:
                self.refuse(s, attribute, str(exc))

    def router(self, s: Section) -> None:
        self.take(
            s,
            self.doc,
            {
                "id": _to("id"),
                "name": _to("id"),
                "mode": _mode,
                "defaultDistribution": _to("default_distribution", _distribution),
                "helloIntervalSeconds": _to("hello_interval", _number),
                "helloMaxAgeSeconds": _to("hello_max_age", _number),
                # the names before Dispatch 1.0, still read by 1.19
                "routerId": _to("id"),
                "helloInterval": _to("hello_interval", _number),
                "helloMaxAge": _to("hello_max_age", _number),
            },
        )
        given = [name for name in ("id", "routerId", "name") if name in s.attributes]
        if len(given) > 1:
            self.refuse(s, given[1], f"give one of id, routerId and name (also: {given[0]})")

    def listener(self, s: Section) -> None:
        self.append(
            s,
            "listener",
            {
                "name": _label,
                "host": _to("host"),
                "port": _to("port", _port),
                "role": _to("role", _role),
                "authenticatePeer": _to("require_auth", _boolean),
                "saslMechanisms": _to("sasl_mechanisms", str.split),
                "maxFrameSize": _to("max_frame_size", int),
                "idleTimeoutSeconds": _to("idle_timeout", _number),
                "initialHandshakeTimeoutSeconds": _to("handshake_timeout", _number),
                "sslProfile": self._ssl,
                "requireSsl": self._require_ssl,
                "requireEncryption": self._require_ssl,
            },
        )

    def connector(self, s: Section) -> None:
        self.append(
            s,
            "connector",
            {
                "name": _to("name"),  # autoLinks name their connection by it
                "host": _to("host"),
                "port": _to("port", _port),
                "role": _connector_role,
                "cost": _to("cost", int),
                "sslProfile": self._ssl,
                "verifyHostname": _to("tls_verify_hostname", _boolean),
                "verifyHostName": _to("tls_verify_hostname", _boolean),  # before 1.0
                "saslMechanisms": _to("sasl_mechanism", _one_mechanism),
                "saslUsername": _to("sasl_username"),
                "saslPassword": _password,
            },
        )

    def address(self, s: Section) -> None:
        self.append(
            s,
            "address",
            {
                "name": _label,
                "prefix": _to("prefix"),
                "pattern": _to("pattern"),
                "distribution": _to("distribution", _distribution),
                "waypoint": _to("waypoint", _boolean),
                "enableFallback": _off("fallback addresses are not in qrouter"),
            },
        )

    def autolink(self, s: Section) -> None:
        """autoLink (docs/brokers.md): on a connector with role route-container."""
        self.append(
            s,
            "autolink",
            {
                "name": _label,
                "address": _to("address"),
                "addr": _to("address"),  # the name before Dispatch 1.0
                "direction": _to("direction", _direction),
                "dir": _to("direction", _direction),
                "connection": _to("connection"),
                "externalAddress": _to("external_address"),
                "externalAddr": _to("external_address"),
                "phase": _never("address phases are not in qrouter (a waypoint's are fixed)"),
                "containerId": _never("qrouter's autolinks name a connector (connection)"),
            },
        )

    def linkroute(self, s: Section) -> None:
        """linkRoute (docs/brokers.md "Link routes"); direction has Dispatch's meaning (in:
        client senders, out: client receivers)."""
        self.append(
            s,
            "linkroute",
            {
                "name": _label,
                "prefix": _to("prefix"),
                "pattern": _to("pattern"),
                "direction": _to("direction", _direction),
                "dir": _to("direction", _direction),
                "connection": _to("connection"),
                "distribution": _link_balanced,
                "containerId": _never("qrouter's link routes name a connector (connection)"),
                "addExternalPrefix": _never("prefix rewriting is not in qrouter"),
                "delExternalPrefix": _never("prefix rewriting is not in qrouter"),
            },
        )

    def log(self, s: Section) -> None:
        module = s.attributes.get("module", ("", s.line))[0]
        if module != "DEFAULT":
            self.refuse(
                s,
                "module" if "module" in s.attributes else None,
                f"only module DEFAULT maps to qrouter's [log] (got {module or 'none'!r})"
                + (
                    "; for a frame trace use trace = true or --trace"
                    if module == "PROTOCOL"
                    else ""
                ),
            )
            return
        table = self.doc.setdefault("log", {})
        self.take(
            s,
            table,
            {
                "module": lambda *_: None,
                "enable": _to("level", _log_level),
                "includeTimestamp": _on("qrouter's log lines always carry a timestamp"),
                "timestamp": _on("qrouter's log lines always carry a timestamp"),
            },
        )

    def ssl_profile(self, s: Section) -> None:
        name = s.attributes.get("name", ("", s.line))[0]
        if not name:
            self.refuse(s, None, "an sslProfile needs a name")
            return
        for attribute in s.attributes:
            if attribute not in ("name", *_SSL_FILES):
                self.refuse(s, attribute, "attribute not supported by qrouter")
        self.ssl_profiles[name] = s

    def _ssl(self, s: Section, attribute: str, value: str, table: dict[str, Any]) -> None:
        profile = self.ssl_profiles.get(value)
        if profile is None:
            raise ValueError(f"no sslProfile named {value!r}")
        for theirs, ours in _SSL_FILES.items():
            if theirs in profile.attributes:
                if ours in table:
                    raise ValueError(f"sslProfile {value!r} gives {ours} twice")
                table[ours] = profile.attributes[theirs][0]

    def _require_ssl(self, s: Section, attribute: str, value: str, table: dict[str, Any]) -> None:
        # a qrouter listener with a certificate speaks only TLS: requireSsl yes needs the
        # profile; requireSsl no (TLS optional on one port) qrouter does not do
        wanted = _boolean(value)
        has_profile = "sslProfile" in s.attributes
        if wanted and not has_profile:
            raise ValueError("needs an sslProfile")
        if not wanted and has_profile:
            raise ValueError("TLS and plain AMQP on one port is not in qrouter: use two listeners")


Rule = Callable[[Section, str, str, dict[str, Any]], None]


def _to(key: str, convert: Callable[[str], Any] = str) -> Rule:
    def rule(s: Section, attribute: str, value: str, table: dict[str, Any]) -> None:
        table[key] = convert(value)

    return rule


def _label(s: Section, attribute: str, value: str, table: dict[str, Any]) -> None:
    """A listener's, connector's or address's name: a label only (qrouter's management
    names listeners HOST:PORT); accepted, nothing to convert."""


def _off(why: str) -> Rule:
    def rule(s: Section, attribute: str, value: str, table: dict[str, Any]) -> None:
        if _boolean(value):
            raise ValueError(why)

    return rule


def _never(why: str) -> Rule:
    def rule(s: Section, attribute: str, value: str, table: dict[str, Any]) -> None:
        raise ValueError(why)

    return rule


def _on(why: str) -> Rule:
    def rule(s: Section, attribute: str, value: str, table: dict[str, Any]) -> None:
        if not _boolean(value):
            raise ValueError(why)

    return rule


def _mode(s: Section, attribute: str, value: str, table: dict[str, Any]) -> None:
    # qrouter joins a mesh when it has inter-router listeners or connectors: standalone and
    # interior both fit; edge and endpoint routers are not in qrouter
    if value not in ("standalone", "interior"):
        raise ValueError(f"mode {value!r} is not in qrouter (standalone and interior are)")


def _role(value: str) -> str:
    if value not in ("normal", "inter-router"):
        raise ValueError(f"role {value!r} is not in qrouter (normal and inter-router are)")
    return value


def _connector_role(s: Section, attribute: str, value: str, table: dict[str, Any]) -> None:
    if value not in ("inter-router", "route-container"):
        raise ValueError(
            f"role {value!r}: qrouter's connectors are inter-router or route-container"
        )
    table["role"] = value


def _link_balanced(s: Section, attribute: str, value: str, table: dict[str, Any]) -> None:
    if value != "linkBalanced":  # Dispatch's only one (and its default)
        raise ValueError(f"distribution {value!r}: link routes are linkBalanced")


def _direction(value: str) -> str:
    if value not in ("in", "out"):
        raise ValueError(f"direction {value!r} is not in or out")
    return value


def _password(s: Section, attribute: str, value: str, table: dict[str, Any]) -> None:
    if value.startswith("env:"):
        table["sasl_password_env"] = value[4:].strip()
    elif value.startswith("file:"):
        table["sasl_password_file"] = value[5:].strip()
    else:
        raise ValueError("a password in the file is not taken: use env:VARIABLE or file:PATH")


def _one_mechanism(value: str) -> str:
    names = value.split()
    if len(names) != 1:
        raise ValueError("a qrouter connector uses one mechanism")
    return names[0].upper()


def _port(value: str) -> int:
    text = value.strip().lower()
    if text in _PORTS:
        return _PORTS[text]
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"{value!r} is not a port number (or amqp, amqps)") from None


def _number(value: str) -> float:
    try:
        return float(value)
    except ValueError:
        raise ValueError(f"{value!r} is not a number") from None


def _distribution(value: str) -> str:
    if value not in ("closest", "balanced", "multicast"):
        raise ValueError(f"distribution {value!r} is not closest, balanced or multicast")
    return value


def _boolean(value: str) -> bool:
    text = value.strip().lower()
    if text in ("yes", "true", "1", "on"):
        return True
    if text in ("no", "false", "0", "off"):
        return False
    raise ValueError(f"{value!r} is not yes or no")


def _log_level(value: str) -> str:
    # ``enable: info+`` (this level and above), or a list ``warning,error``: the lowest
    words = [w.strip().rstrip("+").lower() for w in value.replace(",", " ").split()]
    if words == ["none"]:
        return "critical"
    order = list(_LOG_LEVELS)
    known = [w for w in words if w in _LOG_LEVELS]
    if not known or len(known) != len(words):
        raise ValueError(f"{value!r}: levels are {', '.join(order)} (with + for and above)")
    return _LOG_LEVELS[min(known, key=order.index)]


def read(path: str) -> dict[str, Any]:
    """The TOML-shaped table of a qdrouterd.conf; ConfigError naming file and line."""
    try:
        with open(path, "rb") as handle:
            data = handle.read(MAX_FILE_SIZE + 1)
    except OSError as exc:
        raise ConfigError(f"cannot read: {exc.strerror or exc}", file=path) from None
    if len(data) > MAX_FILE_SIZE:
        raise ConfigError(f"larger than {MAX_FILE_SIZE} bytes", file=path)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"not UTF-8 ({exc.reason})", file=path) from None
    if text.lstrip().startswith("["):
        raise ConfigError(
            "the JSON form of qdrouterd.conf is not read: use the section form", file=path
        )
    return _Converter(path, parse(text, path)).run()
