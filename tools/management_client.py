"""A client of a router's ``$management`` node (qrouter/management.py), on python-qpid-proton's
BlockingConnection: a receiver with a dynamic source is the reply address, a sender to
``$management`` carries the requests.

Every failure to reach or talk to the router is a `ManagementClientError` with a one-line
message, so the command line can print it and exit 1 without a traceback.
"""

from __future__ import annotations

import socket
import ssl
import uuid
from dataclasses import dataclass
from typing import Any

DEFAULT_URL = "amqp://127.0.0.1:5672"
TYPE_PREFIX = "org.qrouter."


class ManagementClientError(Exception):
    """The router cannot be reached, refused us, or did not answer: one line for the user."""


class ManagementForbidden(ManagementClientError):
    """The router's policy does not let this user do that (status 403): the reason."""


@dataclass
class Reply:
    status: int
    description: str
    body: Any


@dataclass
class ConnectOptions:
    url: str = DEFAULT_URL
    ssl_ca: str | None = None
    ssl_cert: str | None = None
    ssl_key: str | None = None
    user: str | None = None
    password: str | None = None
    timeout: float = 10.0


class ManagementClient:
    """``with ManagementClient(options) as c: c.query("link")``."""

    def __init__(self, options: ConnectOptions) -> None:
        self.options = options
        self.conn: Any = None
        self.receiver: Any = None
        self.sender: Any = None
        self.reply_to: str | None = None
        self.container_id: str | None = None

    def __enter__(self) -> ManagementClient:
        self.open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def open(self) -> None:
        from proton import ProtonException
        from proton.utils import BlockingConnection

        o = self.options
        kwargs: dict[str, Any] = {}
        if o.user is not None:
            kwargs.update(
                user=o.user,
                password=o.password or "",
                allowed_mechs="PLAIN",
                allow_insecure_mechs=True,
            )
        else:
            kwargs.update(allowed_mechs="ANONYMOUS")
        domain = self._ssl_domain()
        try:
            self.conn = BlockingConnection(o.url, timeout=o.timeout, ssl_domain=domain, **kwargs)
            self.container_id = self.conn.container.container_id
            self.receiver = self.conn.create_receiver(None, dynamic=True, credit=10)
            self.reply_to = self.receiver.link.remote_source.address
            self.sender = self.conn.create_sender("$management")
        except (ProtonException, OSError, ssl.SSLError) as exc:
            self.close()
            raise ManagementClientError(f"cannot connect to {o.url}: {_describe(exc)}") from None
        if not self.reply_to:
            self.close()
            raise ManagementClientError(f"{o.url}: the router gave no dynamic reply address")

    def _ssl_domain(self) -> Any:
        o = self.options
        if not (o.ssl_ca or o.ssl_cert or o.url.startswith("amqps:")):
            return None
        from proton import SSLDomain, SSLException

        domain = SSLDomain(SSLDomain.MODE_CLIENT)
        try:
            if o.ssl_ca:
                domain.set_trusted_ca_db(o.ssl_ca)
                domain.set_peer_authentication(SSLDomain.VERIFY_PEER_NAME, o.ssl_ca)
            if o.ssl_cert:
                domain.set_credentials(o.ssl_cert, o.ssl_key or o.ssl_cert, None)
        except SSLException as exc:
            raise ManagementClientError(f"TLS settings: {exc}") from None
        return domain

    def close(self) -> None:
        conn, self.conn = self.conn, None
        if conn is not None:
            try:
                conn.close()
            except Exception:  # noqa: BLE001 - closing a broken connection: nothing to add
                pass

    # -- requests ----------------------------------------------------------------------------

    def request(
        self,
        operation: str,
        entity_type: str | None = None,
        *,
        name: str | None = None,
        identity: str | None = None,
        body: Any = None,
        properties: dict[str, Any] | None = None,
    ) -> Reply:
        from proton import Message, ProtonException

        if self.conn is None:
            self.open()
        props: dict[str, Any] = {"operation": operation}
        if entity_type is not None:
            props["type"] = full_type(entity_type)
        if name is not None:
            props["name"] = name
        if identity is not None:
            props["identity"] = identity
        props.update(properties or {})
        message_id = str(uuid.uuid4())
        try:
            self.sender.send(
                Message(id=message_id, reply_to=self.reply_to, properties=props, body=body)
            )
            while True:
                reply = self.receiver.receive(timeout=self.options.timeout)
                if reply.correlation_id == message_id:
                    break  # an older request's late answer is skipped
        except ProtonException as exc:
            raise ManagementClientError(
                f"{self.options.url}: {operation} {entity_type or ''}: {_describe(exc)}"
            ) from None
        rp = reply.properties or {}
        try:
            status = int(rp.get("statusCode", 500))
        except (TypeError, ValueError):
            status = 500
        return Reply(status, str(rp.get("statusDescription", "")), reply.body)

    def call(self, operation: str, entity_type: str | None = None, **kwargs: Any) -> Any:
        """`request`, raising ManagementClientError for a status of 300 or more."""
        reply = self.request(operation, entity_type, **kwargs)
        if reply.status == 403:
            raise ManagementForbidden(reply.description)
        if reply.status >= 300:
            what = f"{operation} {entity_type}" if entity_type else operation
            raise ManagementClientError(f"{what}: {reply.status} {reply.description}")
        return reply.body

    def query(self, entity_type: str, attributes: list[str] | None = None) -> list[dict[str, Any]]:
        """Every entity of a type, as dicts of the attributes asked for (all by default)."""
        body = self.call("QUERY", entity_type, body={"attributeNames": list(attributes or [])})
        if not isinstance(body, dict):
            raise ManagementClientError(f"QUERY {entity_type}: the reply has no result map")
        names = [str(n) for n in body.get("attributeNames", [])]
        return [dict(zip(names, row, strict=False)) for row in body.get("results", [])]


def full_type(entity_type: str) -> str:
    """``link`` -> ``org.qrouter.link``; a name with a dot in a known namespace stays."""
    if entity_type.startswith(TYPE_PREFIX) or entity_type.startswith("org.amqp."):
        return entity_type
    return TYPE_PREFIX + entity_type


def _describe(exc: BaseException) -> str:
    if isinstance(exc, socket.gaierror):
        return f"unknown host ({exc.strerror or exc})"
    text = str(exc).strip() or type(exc).__name__
    # proton: "Connection amqp://h:p disconnected: Condition('proton.pythonio', 'Connection
    # refused to all addresses')" -> the condition's description
    if "Condition(" in text:
        tail = text.rsplit("Condition(", 1)[1].rstrip(")")
        parts = [p.strip().strip("'\"") for p in tail.split(",", 1)]
        if len(parts) == 2 and parts[1]:
            return f"{parts[1]} ({parts[0]})"
    return " ".join(text.split())
