"""Reply addresses stay private across the mesh: a client of router B cannot attach a
receiver to a reply address (dynamic source, 3.5.3) made on router A, yet its replies to that
address still reach the requester on A."""

from __future__ import annotations

import concurrent.futures
from typing import Any

import pytest
from proton import Delivery, Message
from proton.utils import LinkDetached

from tests.clients import pump_until_done
from tests.mesh_system.mesh import mesh


def test_reply_address_of_another_router_cannot_be_taken(router: Any, blocking: Any) -> None:
    r = mesh(router, [("A", "B")], ["A", "B"])
    owner = blocking(r["A"].url)
    reply = owner.create_receiver(None, dynamic=True, name="reply", credit=1)
    address = reply.link.remote_source.address
    assert address.startswith("_dynamic/A/")

    on_b = blocking(r["B"].url)
    with pytest.raises(LinkDetached) as info:
        on_b.create_receiver(address, name="steal")
    assert info.value.link.remote_condition.name == "amqp:unauthorized-access"

    # the reply itself crosses the mesh to the owner
    sender = on_b.create_sender(address, name="answer")
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        future = pool.submit(sender.send, Message(body="from B"), 20)
        assert reply.receive(timeout=15).body == "from B"
        reply.accept()
        assert pump_until_done(reply.connection, future).remote_state == Delivery.ACCEPTED
