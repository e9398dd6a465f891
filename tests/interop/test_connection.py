"""Connection-level behaviour a client sees: the router's OPEN, frame-size
negotiation and heartbeats (AMQP 1.0 §2.4, §2.7.1)."""

from __future__ import annotations

import concurrent.futures
import time
from typing import Any

import pytest
from proton import Delivery, Message, Timeout, symbol

from tests.clients import pump_until_done


def test_open_properties_name_the_product(router: Any, blocking: Any) -> None:
    r = router(router_id="Router.A")
    conn = blocking(r.url)
    props = conn.conn.remote_properties or {}
    assert props.get(symbol("product")) == "qrouter", f"router OPEN properties: {props}"
    version = props.get(symbol("version"))
    assert isinstance(version, str) and version, f"no version in OPEN properties: {props}"
    assert conn.conn.remote_container, "router OPEN without a container-id"


def test_max_frame_size_advertised_by_listener(router: Any, blocking: Any) -> None:
    # §2.7.1 max-frame-size: the listener's limit is what the router announces
    r = router(listeners=[{"max_frame_size": 16384}])
    conn = blocking(r.url)
    assert conn.conn.transport.remote_max_frame_size == 16384


def test_router_honours_client_max_frame_size(router: Any, blocking: Any) -> None:
    """The client announces 512 bytes (the minimum, §2.7.1); a 20 kB message
    must reach it split into transfers of at most 512 bytes. proton closes the
    connection with amqp:connection:framing-error if a bigger frame arrives."""
    r = router()
    body = bytes(range(256)) * 80
    rconn = blocking(r.url, max_frame_size=512)
    assert rconn.conn.transport.max_frame_size == 512
    receiver = rconn.create_receiver("frames/small", credit=1)
    sender = blocking(r.url).create_sender("frames/small")
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        future = pool.submit(sender.send, Message(body=body), 15)
        msg = receiver.receive(timeout=10)
        assert msg.body == body
        receiver.accept()
        assert pump_until_done(rconn, future).remote_state == Delivery.ACCEPTED


def test_heartbeats_keep_an_idle_connection_open(router: Any, blocking: Any) -> None:
    """The client asks for idle-time-out 1 s (§2.4.5); the router must send
    frames (empty ones will do) often enough that proton's idle timer never
    fires during 3 s of silence, and the connection still works after."""
    r = router()
    conn = blocking(r.url, heartbeat=1)
    start = time.monotonic()
    with pytest.raises(Timeout):
        # ConnectionException here (not Timeout) means proton closed the
        # connection: "local-idle-timeout expired".
        conn.wait(lambda: False, timeout=3.0)
    assert time.monotonic() - start >= 3.0
    receiver = conn.create_receiver("idle/after", credit=1)
    assert receiver.link.remote_source.address == "idle/after"


def test_router_advertises_idle_timeout_when_configured(router: Any, blocking: Any) -> None:
    """A listener with idle_timeout set announces a non-zero idle-time-out;
    proton then heartbeats on its own and the connection survives."""
    r = router(listeners=[{"idle_timeout": 2}])
    conn = blocking(r.url)
    assert conn.conn.transport.remote_idle_timeout > 0
    with pytest.raises(Timeout):
        conn.wait(lambda: False, timeout=3.0)
    conn.create_receiver("idle/configured", credit=1)
