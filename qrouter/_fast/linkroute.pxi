# Link routes (docs/brokers.md "Link routes"): a client's link and the link the router
# attached for it on a broker connection are paired (Link.route_peer); the router does not
# terminate either. Transfers go from the producer end to the consumer end with their
# delivery-tags, the consumer's credit becomes the producer's, and dispositions travel back
# and forth through the delivery pair (inbound -> its one copy, as for anycast), all here in
# C. Python pairs them once per attach (qrouter/linkroutes.py) and unpairs them on detach.
# (Included by engine.pyx.)


def route_pair(Link a not None, Link b not None):
    """Pair two links of opposite roles on different connections; the consumer end's credit
    so far is passed to the producer end at once."""
    if a.role == b.role:
        raise ValueError("a routed pair needs one sending and one receiving link")
    a.route_peer = b
    b.route_peer = a
    route_credit(a if a.role == ROLE_SENDER else b)


def route_unpair(Link a not None):
    """Break the pair (one end detached): the other end forwards nothing more."""
    cdef Link b = a.route_peer
    a.route_peer = None
    if b is not None and b.route_peer is a:
        b.route_peer = None


cdef int route_transfer(Link link, Delivery d, const uint8_t* data, Py_ssize_t n) except -1:
    """A complete delivery on the producer end: one copy on the consumer end under the same
    delivery-tag (2.8.7: unique among the link's unsettled, which the producer kept)."""
    cdef Link peer = link.route_peer
    cdef Delivery out
    if peer.state != LINK_ATTACHED or peer.conn.state != CS_OPENED:
        release_inbound(d)                    # 3.4.4: the other end is going away
        return 0
    out = Delivery.new(peer, 0, d.tag)
    out.inbound = d
    out.presettled = d.presettled
    out.message_format = d.message_format
    # 2.6.13: a resumed delivery goes on as one, with the state the producer gave it
    out.resume = d.resume
    out.send_state = d.remote_state_raw
    d.out = out
    if len(peer.pending) == 0 and peer.credit > 0 and \
            peer.session.remote_incoming_window > 0 and not peer.conn.write_paused:
        if not peer.conn.write_transfer(peer, out, data, n):
            if d.payload is None:
                d.payload = PyBytes_FromStringAndSize(<char*>data, n)
            peer.pending.append(out)          # the window closed mid-message (2.5.6)
    else:
        # in flight under credit the consumer has since lowered (route_credit revoked it):
        # it waits, bounded by what the producer had been granted
        if d.payload is None:
            d.payload = PyBytes_FromStringAndSize(<char*>data, n)
        peer.pending.append(out)
        peer.block()
        held(d)                               # backpressure.pxi
    return 0


cdef int route_credit(Link sender) except -1:
    """The consumer end's credit changed (its peer's FLOW, 2.7.4): the producer end gets
    the same, less what waits on the consumer end; drain travels with it (2.6.7)."""
    cdef Link peer = sender.route_peer
    cdef int64_t want
    if peer is None or peer.state != LINK_ATTACHED or peer.conn.state != CS_OPENED:
        return 0
    want = sender.credit - len(sender.pending)
    if want < 0:
        want = 0
    if want == peer.credit and sender.drain == peer.drain:
        return 0
    if want < peer.credit:
        # 2.6.7: lowered credit; transfers the producer sent under the old one still arrive
        peer.revoked += peer.credit - want
    elif peer.credit > 0:
        # raised: RabbitMQ 3.10 counts what it had in flight under the old credit on top of
        # the new (seen: credit 1 then 2 at delivery-count 0 brought 3 transfers). Those are
        # taken and wait on the consumer end, bounded by the credit granted.
        peer.revoked += peer.credit
        if peer.revoked > want + conn_capacity(peer):
            peer.revoked = want + conn_capacity(peer)
    peer.credit = want
    peer.drain = sender.drain
    peer.credit_changed()
    peer.conn.write_flow(peer.session, peer, False)
    return 0


cdef inline int64_t conn_capacity(Link link) noexcept:
    return link.conn.router.link_capacity


def free_channels(Connection c not None):
    """Sessions we may still begin on `c`: the peer's channel-max allows channels 0 to
    channel-max (2.7.1); ours in use include those ended and not yet answered."""
    cdef Py_ssize_t used = 0
    for s in c.local_sessions:
        if s is not None:
            used += 1
    return <Py_ssize_t>c.remote_channel_max + 1 - used
