"""Fuzz targets: one function per surface the network reaches, ``target(data: bytes) -> None``.

The same functions run under atheris (``python -m tests.fuzz.run``, coverage-guided, on an
instrumented build) and under pytest (``tests/fuzz/test_corpus.py`` replays the corpus on the
normal build). A target returns normally when the input was handled, including when it was
refused with the error the code documents for bad input; anything else escaping (another
exception, a failed invariant) is a finding, and a crash of the process is one too.

* ``connection``: a socketless engine connection fed the bytes from the first one, so the
  protocol header, SASL and OPEN exchange are fuzzed; the documented outcome of bad bytes is
  ``conn.error`` set to a spec condition and the connection closed, never an exception out of
  ``feed``, never ``amqp:internal-error``, and no address left behind once it is gone.
* ``session``: the same, after a valid AMQP header and OPEN, so the fuzzer spends its time on
  BEGIN / ATTACH / FLOW / TRANSFER / DISPOSITION / DETACH / END / CLOSE and message payloads.
* ``message``: the codec's ``decode_all`` and ``qrouter.message.decode_message`` (``DecodeError``).
* ``management``: a ``$management`` request as the node receives it (``on_message``): decoded,
  answered with a status; a 500 ("internal error") answer is a finding.
* ``interrouter``: control messages as a neighbour router sends them (one AMQP value each,
  concatenated), given to the routing engine (qrouter/mesh, ``ProtocolError`` drops them) and,
  for guaranteed-topic envelopes, to a topic's state machine (qrouter/eo, ``ProtocolError`` /
  ``ValueError`` / ``TypeError`` drop them, as ``TopicRouter.receive`` documents).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import tempfile
import time
from collections.abc import Callable
from typing import Any

from qrouter._fast.codec import DecodeError, Described, Symbol, UInt, decode_all, encode

# 2.2 protocol header; 2.7.1 open (container-id, hostname, max-frame-size)
AMQP_HEADER = b"AMQP\x00\x01\x00\x00"
_OPEN = Described(UInt(0x10), ["fuzz-peer", None, UInt(4096)])
OPEN_FRAME_BODY = encode(_OPEN)
OPEN_FRAME = (8 + len(OPEN_FRAME_BODY)).to_bytes(4, "big") + b"\x02\x00\x00\x00" + OPEN_FRAME_BODY
SESSION_PRELUDE = AMQP_HEADER + OPEN_FRAME


class Finding(AssertionError):
    """An input the code did not handle the documented way."""


# --- logging: quiet, and an ERROR record is a finding -------------------------------------------


class _Errors(logging.Handler):
    """Collects the ERROR records of the ``qrouter`` loggers while one input runs: the code
    logs ``log.exception`` where it catches what it did not expect (a 500 from $management, a
    callback that raised), which for bad input means it was not handled as documented."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def _describe(records: list[logging.LogRecord]) -> str:
    if not records:
        return ""
    r = records[0]
    detail = logging.Formatter().formatException(r.exc_info) if r.exc_info else ""
    return f"\n{r.name}: {r.getMessage()}\n{detail}"


def _checked(target: Callable[[bytes], None]) -> Callable[[bytes], None]:
    @functools.wraps(target)
    def run(data: bytes) -> None:
        logger = logging.getLogger("qrouter")
        errors = _Errors()
        saved = logger.level, logger.propagate
        logger.addHandler(errors)
        logger.setLevel(logging.ERROR)
        logger.propagate = False
        try:
            target(data)
        except Finding as e:
            raise Finding(f"{e}{_describe(errors.records)}") from None
        finally:
            logger.removeHandler(errors)
            logger.setLevel(saved[0])
            logger.propagate = saved[1]
        if errors.records:
            raise Finding(f"logged an error{_describe(errors.records)}")

    return run


# --- the engine --------------------------------------------------------------------------------


@functools.cache
def _core() -> Any:
    """One router core for every input (as a router serves every connection); PLAIN is
    offered (a users file with one cheap hash) so SASL is reached both ways."""
    from qrouter.auth import hash_password
    from qrouter.config import RouterConfig
    from qrouter.core import Core

    fd, path = tempfile.mkstemp(prefix="qrouter-fuzz-users-")
    with os.fdopen(fd, "w") as f:
        f.write(f"fuzz:{hash_password('fuzz', iterations=1)}\n")
    try:
        return Core(RouterConfig(id="fuzz", users_file=path))
    finally:
        os.unlink(path)


@functools.cache
def _listener() -> Any:
    from qrouter.config import ListenerConfig

    return ListenerConfig(max_frame_size=4096, idle_timeout=0)


def _engine_run(data: bytes) -> None:
    core = _core()
    conn = core.new_connection(_listener())
    # two pieces: TCP splits bytes anywhere, so partial frames are part of every input
    half = len(data) // 2
    for piece in (data[:half], data[half:]):
        conn.feed(piece)  # documented: never raises, bad bytes close the connection
        if not isinstance(conn.take_output(), bytes):
            raise Finding("take_output() did not return bytes")
    if conn.error is not None and conn.error[0] == "amqp:internal-error":
        # the peer's fault is a spec condition; internal-error means the engine tripped
        raise Finding(f"bad input answered with {conn.error}")
    conn.tick(time.monotonic() + 1)
    conn.take_output()
    conn.connection_lost()
    if not conn.closed:
        raise Finding("connection not closed after connection_lost()")
    core.connections.discard(conn)
    core.engine.flush()  # the server's loop does this each turn: the dirty list is emptied
    left = core.engine.address_names()
    if left:
        raise Finding(f"addresses left behind by a closed connection: {left}")


def connection(data: bytes) -> None:
    _engine_run(data)


def session(data: bytes) -> None:
    _engine_run(SESSION_PRELUDE + data)


# --- message decoding --------------------------------------------------------------------------


def message(data: bytes) -> None:
    from qrouter.message import decode_message

    try:
        decode_all(data)
    except DecodeError:
        pass
    try:
        decode_message(data)
    except DecodeError:
        pass


# --- $management -------------------------------------------------------------------------------


class _FakeHandler:
    """An anonymous client on a loopback listener of a router without users: the embedded
    default's admin (qrouter/policy.py), so every operation is reached."""

    listener = None

    def __init__(self) -> None:
        from qrouter.policy import ConnInfo

        self.info = ConnInfo(0, None, "127.0.0.1", "127.0.0.1", False)


class _FakeConn:
    conn_id = 0
    user = None
    transport = None
    write_paused = False
    handler = _FakeHandler()


class _FakeLink:
    """What ``ManagementNode.on_message`` uses of a link: credit, flow(), conn."""

    credit = 100
    conn = _FakeConn()

    def flow(self, credit: int) -> None:
        pass


class _FakeDelivery:
    def update(self, outcome: int, state: Any = None) -> None:
        pass


@functools.cache
def _loop() -> asyncio.AbstractEventLoop:
    return asyncio.new_event_loop()


def management(data: bytes) -> None:
    from qrouter.config import RouterConfig
    from qrouter.core import Core

    node = Core(RouterConfig(id="fuzz-mgmt")).management  # fresh: CREATE/DELETE change tables

    async def deliver() -> None:
        node.on_message(_FakeLink(), _FakeDelivery(), data)
        await asyncio.sleep(0)  # let an answer that waits on the server run

    _loop().run_until_complete(deliver())


# --- inter-router ------------------------------------------------------------------------------


class _DataPlane:
    """qrouter.mesh.DataPlane that keeps nothing."""

    def send(self, link_id: int, message: dict[str, Any]) -> None:
        pass

    def set_next_hop(self, router_id: str, link_id: int | None) -> None:
        pass

    def set_cost(self, router_id: str, cost: int | None) -> None:
        pass

    def set_valid_origins(self, router_id: str, origins: list[str]) -> None:
        pass

    def add_remote_address(self, address: str, router_id: str) -> None:
        pass

    def del_remote_address(self, address: str, router_id: str) -> None:
        pass

    def router_lost(self, router_id: str) -> None:
        pass

    def log(self, level: str, msg: str) -> None:
        pass


class _Port:
    """qrouter.eo.Port that keeps nothing."""

    def to_router(self, router_id: str, message: dict[str, Any]) -> None:
        pass

    def deliver(self, att: Any, out_tag: bytes, body: bytes, resume: bool) -> None:
        pass

    def settle_subscriber(self, att: Any, out_tag: bytes) -> None:
        pass

    def accept_publisher(self, pub: Any, tag: bytes) -> None:
        pass

    def resend(self, pub: Any, tags: list[bytes]) -> None:
        pass

    def log(self, level: str, msg: str) -> None:
        pass


EO_OP = "EO"  # qrouter/inter_router.py: a control message carrying guaranteed-topic envelopes
MAX_TOPICS = 4  # per input: enough for messages about several topics, bounded


def _topic_router(topic: str) -> Any:
    """A guaranteed topic's state machine here ("A"), with a local publisher and subscriber
    for the messages to act on."""
    from qrouter.eo import TopicRouter

    tr = TopicRouter("A", _Port(), instance=1, topic=topic)
    tr.publisher_attached(("pc", "pl"), (), 0.0)
    tr.subscriber_attached(("sc", "sl"), (), 0.0)
    return tr


def interrouter(data: bytes) -> None:
    from qrouter.inter_router import eo_envelopes
    from qrouter.mesh import RoutingEngine

    try:
        values = decode_all(data)
    except DecodeError:
        return  # qrouter/inter_router.py drops an undecodable control message
    mesh = RoutingEngine("A", _DataPlane(), instance=1)
    mesh.link_up(1)
    topics: dict[str, Any] = {}
    up: set[tuple[str, str]] = set()
    now = 0.0
    for value in values:
        now += 0.5
        msg = value.value if isinstance(value, Described) else value
        if not (isinstance(msg, dict) and msg.get("op") == EO_OP):
            mesh.receive(1, msg, now)
            mesh.tick(now)
            continue
        # qrouter/guarantee.py: a batch of envelopes {to, from, e, n, ms} (or m: one message);
        # each message goes to its topic
        envelopes = eo_envelopes(msg)  # compact ("b", eo_wire.pxi) or an AMQP list ("m")
        for env in envelopes if isinstance(envelopes, list) else ():
            src = env.get("from") if isinstance(env, dict) else None
            if not isinstance(src, str):
                continue
            inners = env.get("ms", [env.get("m")])
            for inner in inners if isinstance(inners, list) else ():
                if not isinstance(inner, dict):
                    continue
                topic = inner.get("topic")
                if not isinstance(topic, str):
                    continue
                tr = topics.get(topic)
                if tr is None:
                    if len(topics) >= MAX_TOPICS:
                        continue
                    tr = topics[topic] = _topic_router(topic)
                if (topic, src) not in up:
                    up.add((topic, src))
                    tr.router_up(src, now)
                tr.receive(src, inner, now)
                tr.tick(now)


TARGETS: dict[str, Callable[[bytes], None]] = {
    name: _checked(fn)
    for name, fn in {
        "connection": connection,
        "session": session,
        "message": message,
        "management": management,
        "interrouter": interrouter,
    }.items()
}

__all__ = ["TARGETS", "Finding", "SESSION_PRELUDE", "Symbol"]
