"""A message whose annotations the router must rewrite, nested past the codec's limit
(issue 13, point 1): multicast toward another router adds `x-opt-qr-ingress` to the
message-annotations (docs/mesh.md, "Multicast"), so the ingress router must read them. That
delivery is REJECTED with amqp:decode-error; the producer's link and the mesh go on."""

from __future__ import annotations

from typing import Any

from proton import Delivery, Message, Timeout
from proton.reactor import AtMostOnce

from tests.harness import retry
from tests.interop.test_hostile_input import NESTED, _send_raw
from tests.mesh_system.mesh import mesh


def test_multicast_ingress_rejects_undecodable_annotations(router: Any, blocking: Any) -> None:
    r = mesh(router, [("A", "B")], ["A", "B"], addresses={"mc": "multicast"})
    rcv = blocking(r["B"].url).create_receiver("mc.deep", credit=100)
    conn = blocking(r["A"].url)
    probe = conn.create_sender("mc.deep", name="probe", options=AtMostOnce())

    def send(body: str) -> None:
        # presettled: written by the connection's next I/O, which pump_until drives
        probe.send(Message(body=body), timeout=10)
        try:
            conn.wait(lambda: False, timeout=0.2)  # its I/O for a moment
        except Timeout:
            pass

    def reached_b() -> bool:
        send("probe")
        try:
            return rcv.receive(timeout=0.5).body == "probe"
        except Exception:  # noqa: BLE001 - proton's Timeout: not there yet
            return False

    retry(reached_b, timeout=30, message="B's consumer never became reachable from A")
    snd = conn.create_sender("mc.deep", name="deep")
    inner = b"\xa3\x05x-opt" + b"\x00\x53\x77" + NESTED  # {x-opt: <nested 200,000 deep>}
    annotations = (
        b"\x00\x53\x72\xd1" + (len(inner) + 4).to_bytes(4, "big") + b"\x00\x00\x00\x02" + inner
    )
    d = _send_raw(conn, snd, annotations + Message(body="deep").encode(), b"deep")
    assert d.remote_state == Delivery.REJECTED
    assert d.remote.condition.name == "amqp:decode-error"
    assert "nesting" in d.remote.condition.description
    # the same router goes on routing multicast to B
    send("after")
    bodies = []
    while "after" not in bodies:
        bodies.append(rcv.receive(timeout=10).body)
    assert "deep" not in bodies
    r["A"].check_running()
    r["B"].check_running()
