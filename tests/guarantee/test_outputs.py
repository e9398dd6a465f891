"""The staged outputs of guaranteed topics (qrouter/_fast/eo_core.pxd's `OutQueue`, applied by
`EoLinks.apply_outputs`) and the router outbox's open envelopes, driven without sockets."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from qrouter._fast.eo_core import OutQueue, scan_memory
from qrouter.guarantee import Guarantees


class _Mesh:
    def __init__(self, peer: str) -> None:
        self.next_hop = {peer: 1}
        self.sent: list[tuple[int, dict[str, Any]]] = []

    def send_eo(self, link_id: int, envelopes: list[dict[str, Any]]) -> None:
        self.sent.extend((link_id, e) for e in envelopes)


def _router(name: str, peer: str) -> Guarantees:
    core = SimpleNamespace(
        config=SimpleNamespace(id=name, guarantee_timeout=30.0),
        persistence=None,
        mesh=_Mesh(peer),
        table=SimpleNamespace(guarantee=lambda topic: None),
    )
    return Guarantees(core)  # type: ignore[arg-type]


def test_outputs_keep_their_order_and_arguments() -> None:
    q = OutQueue()
    q.add("deliver", None, (("A", 1, 0), b"t1", b"body", True))
    q.add("accept_publisher", "events", (("c", "l"), b"tag"))
    q.add("to_router", None, ("B", ("FWD",)))
    q.add("settle_subscriber", None, (("A", 1, 0), b"t1"))
    q.add("accept_publisher", "events", (("c", "other"), b"tag2"))
    assert len(q) == 5
    assert q.entries() == [
        ("deliver", None, (("A", 1, 0), b"t1", b"body", True)),
        ("accept_publisher", "events", (("c", "l"), b"tag")),
        ("to_router", None, ("B", ("FWD",))),
        ("settle_subscriber", None, (("A", 1, 0), b"t1")),
        ("accept_publisher", "events", (("c", "other"), b"tag2")),
    ]
    assert q.accepting(("c", "l")) == {b"tag"}


def test_applied_in_order_after_the_commit_and_emptied() -> None:
    g = _router("A", "B")
    seen: list[Any] = []
    for i in range(40):  # more than the queue's first allocation
        g.stage(seen.append, (i,))
    assert len(g.outputs) == 40 and not seen
    g.flush()
    assert seen == list(range(40))
    assert len(g.outputs) == 0


def test_a_new_route_opens_a_new_envelope_in_the_same_iteration() -> None:
    """The outbox remembers the envelope open for a router; a channel that changes (a new
    next hop, so a new epoch) must not get messages into the envelope of the old one."""
    g = _router("A", "B")
    g.route("B", 1)
    epoch = g.channels["B"].epoch
    g.outbox("B", "m1")
    g.outbox("B", "m2")
    g.route("B", 2)  # a new next hop before the iteration's envelopes are sent
    g.outbox("B", "m3")
    g.flush()
    sent = g.core.mesh.sent
    assert [(link, e["e"], e["n"], e["ms"]) for link, e in sent] == [
        (1, epoch, 0, ["m1", "m2"]),
        (2, epoch + 1, 0, ["m3"]),
    ]
    g.outbox("B", "m4")  # the next iteration: a new envelope, the next number
    g.flush()
    assert [(link, e["e"], e["n"], e["ms"]) for link, e in sent[2:]] == [(2, epoch + 1, 1, ["m4"])]


def test_a_router_down_drops_what_is_sent_to_it() -> None:
    g = _router("A", "B")
    g.route("B", 1)
    g.outbox("B", "m1")
    g.route("B", None)
    g.outbox("B", "lost")  # a broken channel loses what it carried
    g.flush()
    assert [e["ms"] for _, e in g.core.mesh.sent] == [["m1"]]


def test_memory_scan_joins_the_topics_records_under_their_prefixes() -> None:
    """No store: each topic's records are kept by key under its prefix (`commit_memory`);
    a scan sees them as full keys, in key order, whatever prefix it asks for."""
    memory = {b"eot/a": b"", b"eot/a/b": b""}
    topics = {
        b"eo/a/": {b"o/2": b"r2", b"m/2": b"b2", b"c/x": b""},
        b"eo/a/b/": {b"o/1": b"r1"},
    }
    assert scan_memory(b"eot/", memory, topics) == [(b"eot/a", b""), (b"eot/a/b", b"")]
    assert scan_memory(b"eo/a/o/", memory, topics) == [(b"eo/a/o/2", b"r2")]
    assert scan_memory(b"eo/a/b/", memory, topics) == [(b"eo/a/b/o/1", b"r1")]
    assert scan_memory(b"eo/a/", memory, topics) == [
        (b"eo/a/b/o/1", b"r1"),
        (b"eo/a/c/x", b""),
        (b"eo/a/m/2", b"b2"),
        (b"eo/a/o/2", b"r2"),
    ]
