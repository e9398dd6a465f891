"""A delivery settled awaiting the peer before the peer gave credit for it (Delivery.settle
with await_peer): written once credit comes, then settled, never dropped unseen.

A guaranteed topic settles a delivery that a subscriber reported on attach with an empty
resumed transfer (2.6.13) that carries only the settlement (eo_links.pxi
c_settle_subscriber); when that happens before the subscriber's first FLOW, the transfer waits
for credit. Dropped unseen, it left the subscriber holding the delivery and the router waiting
for its settle in return, for ever (tests/guarantee/test_mesh.py::
test_origin_that_is_also_a_subscriber_router_killed_mid_stream, about 1 run in 10)."""

from __future__ import annotations

from tests.engine.pump import DISPOSITION, TRANSFER, parse_output
from tests.engine.test_frame_size import EndpointPair

TAG = b"t" * 32


def test_settled_awaiting_the_peer_before_credit_is_written_then_settled() -> None:
    pair = EndpointPair(65536, credit=0)
    d = pair.link.send(TAG, b"", resume=True)
    d.settle(await_peer=True)
    pair.pump()
    assert pair.receiver.current is None, "written without credit (2.6.7)"
    pair.receiver.flow(1)
    pair.pump()
    dlv = pair.receiver.current
    assert dlv is not None and dlv.tag == TAG.decode()  # (proton gives the tag as str)
    assert dlv.settled, "the settlement never reached the peer"
    _, frames = parse_output(bytes(pair.from_engine))
    ours = [f for f in frames if f.code in (TRANSFER, DISPOSITION)]
    # 2.6.13 the resumed transfer, unsettled (the peer is to settle in return), then the
    # settling disposition: a presettled transfer would leave nothing to settle in return
    assert [f.code for f in ours] == [TRANSFER, DISPOSITION]
    assert ours[0].fields["resume"] is True and not ours[0].fields["settled"]
    assert ours[1].fields["settled"] is True and ours[1].fields["role"] is False


def test_settled_before_credit_without_awaiting_the_peer_is_dropped_unseen() -> None:
    # a copy the peer never saw needs no word about it (Delivery.settle's default)
    pair = EndpointPair(65536, credit=0)
    d = pair.link.send(TAG, b"payload")
    d.settle()
    pair.receiver.flow(1)
    pair.pump()
    assert pair.receiver.current is None
    _, frames = parse_output(bytes(pair.from_engine))
    assert not [f for f in frames if f.code in (TRANSFER, DISPOSITION)]
