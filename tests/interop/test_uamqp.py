"""uAMQP (Azure's uAMQP-C, Python binding `uamqp` 1.6 from PyPI) as a sender.

uAMQP attaches its senders with sender-settle-mode unsettled and receiver-settle-mode
*second* on a non-durable target, completes a send only on a *settled* outcome, and never
settles first. The router answers such an ATTACH with *first* (2.7.3; docs/client.md,
"Settlement modes"), so its outcomes arrive settled and the sends complete. The binding speaks
only amqps: the router gets a TLS listener with the test CA (tests/certs.py), which uAMQP
verifies. A proton consumer on a plain listener takes the messages.
"""

from __future__ import annotations

import concurrent.futures
from typing import Any

import pytest

from tests.certs import Certs, tls_listener
from tests.clients import pump_until_done

uamqp = pytest.importorskip(
    "uamqp", reason="uamqp (pip install uamqp: a manylinux wheel) is not installed"
)

MSG_TIMEOUT_MS = 15000  # uAMQP's own bound on one send


def _target(r: Any, queue: str) -> str:
    """The URL uAMQP's SendClient is given (its connection goes where `auth` says)."""
    return f"amqps://127.0.0.1:{r.listeners[0].port}/{queue}"


def _address(r: Any, queue: str) -> str:
    """The address uAMQP puts in its target: the URL without the port."""
    from uamqp.address import Target

    address = Target(_target(r, queue)).address
    return address.decode() if isinstance(address, bytes) else str(address)


def _send(r: Any, certs: Certs, queue: str, bodies: list[bytes]) -> list[Any]:
    """Send *bodies* with uAMQP's default SendClient: each message's final state and the
    error uAMQP recorded for it (its `_response`: no public accessor in 1.6)."""
    from uamqp import Message, SendClient, authentication

    auth = authentication.SASLAnonymous("127.0.0.1", port=r.listeners[0].port, verify=str(certs.ca))
    client = SendClient(_target(r, queue), auth=auth, msg_timeout=MSG_TIMEOUT_MS)
    messages = [Message(body) for body in bodies]
    for m in messages:
        client.queue_message(m)
    try:
        client.send_all_messages(close_on_done=True)
    finally:
        client.close()
    return [(m.state, m._response) for m in messages]


def _consumer(r: Any, blocking: Any, queue: str, credit: int) -> Any:
    """A proton receiver on the plain listener for uAMQP's target address."""
    conn = blocking(r.listeners[1].url)
    return conn.create_receiver(_address(r, queue), credit=credit)


@pytest.fixture
def tls_router(router: Any, certs: Certs) -> Any:
    return router(listeners=[tls_listener(certs), {}])


def test_uamqp_sends_complete(tls_router: Any, blocking: Any, certs: Certs) -> None:
    from uamqp.constants import MessageState

    receiver = _consumer(tls_router, blocking, "uamqp/q", credit=10)
    bodies = [f"uamqp {i}".encode() for i in range(5)]
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        future = pool.submit(_send, tls_router, certs, "uamqp/q", bodies)
        got = []
        for _ in bodies:
            message = receiver.receive(timeout=20)  # its body is a view into the message
            got.append(bytes(message.body))
            receiver.accept()
        states = pump_until_done(receiver.connection, future, timeout=60)
    assert got == bodies
    assert [state for state, _ in states] == [MessageState.SendComplete] * len(bodies)


def test_uamqp_sees_a_rejection(tls_router: Any, blocking: Any, certs: Certs) -> None:
    """The consumer's REJECTED, with its error, reaches uAMQP as the send's failure (a
    condition uAMQP does not retry, so one rejection ends the send)."""
    from proton import Condition, Delivery
    from uamqp.constants import ErrorCodes, MessageState

    receiver = _consumer(tls_router, blocking, "uamqp/rejected", credit=1)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        future = pool.submit(_send, tls_router, certs, "uamqp/rejected", [b"refuse me"])
        message = receiver.receive(timeout=20)
        assert bytes(message.body) == b"refuse me"
        delivery = receiver.fetcher.unsettled.popleft()
        delivery.local.condition = Condition("amqp:precondition-failed", "not this one")
        delivery.update(Delivery.REJECTED)
        delivery.settle()
        [(state, response)] = pump_until_done(receiver.connection, future, timeout=60)
    assert state == MessageState.SendFailed
    assert getattr(response, "condition", None) == ErrorCodes.PreconditionFailed, response
    assert "not this one" in str(response.description), response


def test_uamqp_sender_to_unavailable_address_fails(router: Any, certs: Certs) -> None:
    from uamqp.errors import AMQPConnectionError, LinkDetach, MessageException

    r = router(listeners=[tls_listener(certs)], addresses={"amqps://127.0.0.1": "unavailable"})
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        future = pool.submit(_send, r, certs, "gone/q", [b"nowhere"])
        with pytest.raises((LinkDetach, MessageException, AMQPConnectionError)) as info:
            future.result(timeout=60)
    assert "not-found" in str(info.value) or "NotFound" in str(info.value), info.value


def test_uamqp_one_mib_message(tls_router: Any, blocking: Any, certs: Certs) -> None:
    from uamqp.constants import MessageState

    receiver = _consumer(tls_router, blocking, "uamqp/big", credit=1)
    body = bytes(range(256)) * 4096  # 1 MiB
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        future = pool.submit(_send, tls_router, certs, "uamqp/big", [body])
        message = receiver.receive(timeout=30)
        assert bytes(message.body) == body
        receiver.accept()
        states = pump_until_done(receiver.connection, future, timeout=60)
    assert [state for state, _ in states] == [MessageState.SendComplete]
