"""TLS listeners (certificate, key and CA from the router's config).

proton's client verifies the router's certificate against our test CA and
checks the peer name (SSLDomain.VERIFY_PEER_NAME); a client trusting another
CA must fail the handshake; with require_client_cert the router must refuse
a client without a certificate signed by its CA.
"""

from __future__ import annotations

import concurrent.futures
from typing import Any

import pytest
from proton import ConnectionException, Delivery, Message

from tests.certs import Certs, client_domain, tls_listener
from tests.clients import pump_until_done


def round_trip(blocking: Any, url: str, address: str, **kwargs: Any) -> None:
    receiver = blocking(url, **kwargs).create_receiver(address, credit=1)
    sender = blocking(url, **kwargs).create_sender(address)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        future = pool.submit(sender.send, Message(body="over tls"), 15)
        assert receiver.receive(timeout=10).body == "over tls"
        receiver.accept()
        assert pump_until_done(receiver.connection, future).remote_state == Delivery.ACCEPTED


def test_tls_round_trip(router: Any, blocking: Any, certs: Certs) -> None:
    r = router(listeners=[tls_listener(certs)])
    assert r.url.startswith("amqps://127.0.0.1:")
    round_trip(blocking, r.url, "tls/q", ssl_domain=client_domain(certs.ca))


def test_tls_and_plain_listeners_side_by_side(router: Any, blocking: Any, certs: Certs) -> None:
    r = router(listeners=[tls_listener(certs), {}])
    tls_url, plain_url = r.listeners[0].url, r.listeners[1].url
    receiver = blocking(tls_url, ssl_domain=client_domain(certs.ca)).create_receiver(
        "mixed/q", credit=1
    )
    sender = blocking(plain_url).create_sender("mixed/q")
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        future = pool.submit(sender.send, Message(body="plain to tls"), 15)
        assert receiver.receive(timeout=10).body == "plain to tls"
        receiver.accept()
        assert pump_until_done(receiver.connection, future).remote_state == Delivery.ACCEPTED


def test_tls_client_with_wrong_ca_fails(router: Any, blocking: Any, certs: Certs) -> None:
    r = router(listeners=[tls_listener(certs)])
    with pytest.raises(ConnectionException, match="(?i)ssl|certificate|verify"):
        blocking(r.url, ssl_domain=client_domain(certs.other_ca), timeout=5)


def test_mutual_tls(router: Any, blocking: Any, certs: Certs) -> None:
    r = router(listeners=[tls_listener(certs, tls_ca=str(certs.ca), require_client_cert=True)])
    domain = client_domain(certs.ca, certs.client_cert, certs.client_key)
    round_trip(blocking, r.url, "mtls/q", ssl_domain=domain)


def test_mutual_tls_refuses_client_without_certificate(
    router: Any, blocking: Any, certs: Certs
) -> None:
    r = router(listeners=[tls_listener(certs, tls_ca=str(certs.ca), require_client_cert=True)])
    with pytest.raises(ConnectionException):
        conn = blocking(r.url, ssl_domain=client_domain(certs.ca), timeout=5)
        # TLS 1.3: the server's verdict on the client certificate can arrive
        # after the client's handshake is done; the connection must not work.
        conn.create_receiver("mtls/refused", credit=1)
