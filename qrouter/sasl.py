"""The server side of SASL beyond PLAIN (5.3.3): which mechanisms a listener offers, ANONYMOUS
off loopback, EXTERNAL from the TLS client certificate, the SCRAM-SHA-256 exchange, and who is
admitted as a router (docs/configuration.md, "Security").

Called once per connection (qrouter/core.py), never per message.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from qrouter.config import ConnectorConfig, ListenerConfig, RouterConfig, is_loopback
from qrouter.scram import MECHANISM as SCRAM
from qrouter.scram import ScramError, ScramServer

if TYPE_CHECKING:
    from qrouter.auth import UserDB

log = logging.getLogger("qrouter.sasl")

# RFC 4514 section 3 short names of the attributes a certificate subject usually has
_SHORT = {
    "commonName": "CN",
    "organizationName": "O",
    "organizationalUnitName": "OU",
    "countryName": "C",
    "localityName": "L",
    "stateOrProvinceName": "ST",
    "streetAddress": "STREET",
    "domainComponent": "DC",
    "userId": "UID",
}


def anonymous_allowed(listener: ListenerConfig) -> bool:
    """ANONYMOUS (and a connection without SASL): never with require_auth; off loopback only
    with allow_anonymous."""
    if listener.require_auth:
        return False
    return listener.allow_anonymous or is_loopback(listener.host)


def offered(listener: ListenerConfig, have_users: bool) -> tuple[str, ...]:
    """The listener's mechanisms that can succeed here, in its order."""
    out = []
    for mech in listener.sasl_mechanisms:
        if mech == "ANONYMOUS" and not anonymous_allowed(listener):
            continue
        if mech in ("PLAIN", SCRAM) and not have_users:
            continue
        if mech == "EXTERNAL" and listener.tls_ca is None:
            continue
        out.append(mech)
    return tuple(out)


def _escape(value: str) -> str:
    # RFC 4514 2.4: escape the specials, a leading '#' or space, a trailing space
    out = "".join("\\" + ch if ch in ',+"\\<>;=' else ch for ch in value)
    if out.startswith(("#", " ")):
        out = "\\" + out
    if out.endswith(" ") and not out.endswith("\\ "):
        out = out[:-1] + "\\ "
    return out


def subject_name(peercert: dict[str, Any]) -> str:
    """The certificate subject as an RFC 4514 string (most specific RDN first)."""
    rdns = []
    for rdn in reversed(peercert.get("subject", ())):
        rdns.append("+".join(f"{_SHORT.get(k, k)}={_escape(str(v))}" for k, v in rdn))
    return ",".join(rdns)


def common_name(peercert: dict[str, Any]) -> str | None:
    names = [v for rdn in peercert.get("subject", ()) for k, v in rdn if k == "commonName"]
    return str(names[-1]) if names else None


def peer_certificate(transport: Any) -> dict[str, Any] | None:
    """The verified peer certificate of a TLS transport (None: no TLS or no certificate)."""
    if transport is None:
        return None
    cert = transport.get_extra_info("peercert")
    return cert if isinstance(cert, dict) and cert.get("subject") else None


def external_user(transport: Any, mapping: str) -> str | None:
    cert = peer_certificate(transport)
    if cert is None:
        return None
    return common_name(cert) if mapping == "cn" else subject_name(cert)


class ServerMechanisms:
    """SCRAM-SHA-256 and EXTERNAL for one connection (PLAIN and ANONYMOUS stay in core)."""

    def __init__(self, listener: ListenerConfig, users: UserDB | None) -> None:
        self.listener = listener
        self.users = users
        self.scram: ScramServer | None = None

    def start(self, conn: Any, mechanism: str, response: bytes | None) -> Any:
        """The verdict on a sasl-init (qrouter/_fast/connection.pxi `sasl_answer`)."""
        if mechanism == "EXTERNAL":
            user = external_user(conn.transport, self.listener.external_user)
            if user is None:
                log.warning("[C%d] SASL EXTERNAL without a client certificate", conn.conn_id)
                return False
            # 5.3.3.2 / RFC 4422 appendix A: a non-empty response is the authzid asked for
            asked = bytes(response or b"").decode("utf-8", "replace")
            if asked and asked != user:
                log.warning("[C%d] SASL EXTERNAL: %r may not act as %r", conn.conn_id, user, asked)
                return False
            log.info("[C%d] authenticated %r (EXTERNAL)", conn.conn_id, user)
            return user
        if mechanism == SCRAM and self.users is not None:
            # an unknown user is told the count the file's users have (no tell who exists)
            self.scram = ScramServer(self.users.scram_keys, self.users.typical_iterations())
            try:
                return self.scram.first(response)
            except ScramError as exc:
                log.warning("[C%d] SASL SCRAM-SHA-256 refused: %s", conn.conn_id, exc)
                return False
        return False

    def respond(self, conn: Any, response: bytes | None) -> Any:
        """The verdict on a sasl-response: SCRAM's client-final-message."""
        if self.scram is None:
            return False
        scram, self.scram = self.scram, None  # one round trip: a second response fails
        try:
            user, server_final = scram.final(response)
        except ScramError as exc:
            log.warning(
                "[C%d] SASL SCRAM-SHA-256: refused user %r: %s", conn.conn_id, scram.user, exc
            )
            return False
        log.info("[C%d] authenticated user %r (SCRAM-SHA-256)", conn.conn_id, user)
        return (user, server_final)


def client_start(cc: ConnectorConfig) -> tuple[str, bytes | None, None, Any]:
    """Connection.start's arguments for a connector: mechanism, initial response, hostname and
    the step callback (SCRAM). The password is read now: a rotated file is used on reconnect."""
    from qrouter.config import connector_password
    from qrouter.scram import ScramClient

    mech = cc.sasl_mechanism
    if mech == "PLAIN":
        response = b"\0" + (cc.sasl_username or "").encode() + b"\0"
        return mech, response + connector_password(cc).encode(), None, None
    if mech == SCRAM:
        client = ScramClient(cc.sasl_username or "", connector_password(cc))
        return mech, client.initial(), None, client
    if mech == "EXTERNAL":
        return mech, b"", None, None  # the identity is the one of our certificate
    return "ANONYMOUS", None, None, None


def mesh_refusal(
    config: RouterConfig, conn: Any, connector: ConnectorConfig | None, claimed: object = None
) -> str | None:
    """Why a peer may not be a router of this mesh (None: admitted). On our listener: its
    authenticated identity must be in mesh_identities; on our connector with TLS: the
    listener's certificate (subject or CN) must be. With mesh_identities as a table, the
    router id the peer `claimed` in its OPEN must be the one its identity is given."""
    identities = set(config.mesh_identities)
    if not identities:
        return None
    if connector is None:
        if conn.user in identities:
            return _claim_refusal(config, {str(conn.user)}, claimed)
        who = repr(conn.user) if conn.user else "an anonymous peer"
        return f"{who} is not a mesh identity"
    cert = peer_certificate(conn.transport)
    if cert is None:
        if connector.sasl_mechanism == SCRAM:
            return None  # the listener proved it holds our SCRAM keys
        return "the listener showed no certificate to check against mesh_identities"
    names = {name for name in (subject_name(cert), common_name(cert)) if name in identities}
    if names:
        return _claim_refusal(config, names, claimed)
    return f"the listener's certificate {subject_name(cert)!r} is not a mesh identity"


def _claim_refusal(config: RouterConfig, names: set[str], claimed: object) -> str | None:
    """A router id is bound to an identity (mesh_identities as a table): another one is a
    forgery, whatever else the mesh knows of that id."""
    if not config.mesh_router_ids:
        return None
    allowed = sorted(config.mesh_router_ids[name] for name in names)
    if claimed in allowed:
        return None
    who = ", ".join(repr(name) for name in sorted(names))
    return f"{who} may act as router {' or '.join(map(repr, allowed))} only, not {claimed!r}"


def peer_identity(conn: Any, connector: ConnectorConfig | None) -> tuple[str, frozenset[str]]:
    """Who the peer proved to be, as (the name to log, the names that identify it). Its
    certificate when it showed one (subject and CN: the names mesh_identities may use, and the
    same whichever end connected); else on our listener its SASL identity. ("", empty): it
    proved nothing (anonymous, or a SCRAM listener seen from our connector without TLS)."""
    cert = peer_certificate(conn.transport)
    user = str(conn.user) if connector is None and conn.user else ""
    if cert is not None:
        names = frozenset(n for n in (subject_name(cert), common_name(cert)) if n)
        return (user if user in names else subject_name(cert)), names
    return user, frozenset((user,) if user else ())


MAX_BOUND_IDS = 4096
"""Router ids bound on first use, at most (qrouter's and Dispatch's meshes are tens to a few
hundred routers)."""


def first_use_refusal(
    config: RouterConfig,
    bound: dict[str, tuple[str, frozenset[str]]],
    conn: Any,
    connector: ConnectorConfig | None,
    claimed: object,
) -> str | None:
    """Trust on first use, where mesh_identities is no table: the first identity this router
    sees with a router id owns it for the run (`bound`: router id -> that identity); another
    identity claiming it is a forgery. Several ids may share one identity (a mesh-wide SCRAM
    user): the binding keeps an id to its identity, not an identity to one id. A table binds
    more (every router knows every binding from the start), so it replaces this."""
    if config.mesh_router_ids or not isinstance(claimed, str) or claimed == config.id:
        return None  # our own id is refused by qrouter/inter_router.py Mesh.on_open
    who, names = peer_identity(conn, connector)
    if not names:
        return None
    if claimed not in bound and len(bound) >= MAX_BOUND_IDS:
        # a member inventing ids must not grow this without end; no real mesh comes near it
        return f"{who!r} may not act as router {claimed!r}: {MAX_BOUND_IDS} router ids bound"
    holder, held = bound.setdefault(claimed, (who, names))
    if held & names:
        return None
    return f"{who!r} may not act as router {claimed!r}: that id is bound to {holder!r} (first use)"


def binding_warning(config: RouterConfig) -> str | None:
    """The start-up warning where router ids are bound only on first use and the mesh is
    reachable beyond loopback (docs/security.md, "The mesh")."""
    if config.mesh_router_ids:
        return None
    exposed = [
        lc.host or "*"
        for lc in config.listeners
        if lc.role == "inter-router" and not is_loopback(lc.host)
    ]
    if not exposed:
        return None
    return (
        f"inter-router listener on {exposed[0]} (not loopback) with mesh_identities "
        f"{'as a list' if config.mesh_identities else 'unset'}: a router id is bound to the "
        "identity that first claims it here, for this run only; give mesh_identities as a "
        "table (identity = router id) to bind every id across the mesh"
    )
