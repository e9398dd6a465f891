# Backpressure on writes (issue 13): a connection whose outbound buffer is above its
# high-water mark takes no new deliveries, and counts as having no spare credit when the
# router tops up the producers of its addresses. (Included by engine.pyx.)
#
# The buffer is the transport's (asyncio's write buffer): the server sets its limits
# (transport.set_write_buffer_limits) and forwards asyncio's Protocol.pause_writing() and
# resume_writing() to Connection.pause_writing() / resume_writing(), once per crossing of a
# mark, never per message. The engine's own output (Connection.out) is written to the
# transport once per loop iteration, so it adds at most one iteration's worth.
#
# While a connection is paused (Connection.write_paused, a C-level flag tested on the
# credit path):
#
# * a consumer link on it is skipped by closest / balanced forwarders (Address.pick) and
#   adds nothing to its address's capacity (Address.capacity), so producers are not topped
#   up (2.6.7: the router, as receiver, decides the credit it grants);
# * a multicast address whose consumers include one on it has no capacity: its producers
#   stall until the connection drains (a router without queues can only slow the producer
#   to the pace of its slowest consumer, or drop, and presettled messages are never dropped);
# * copies already assigned to its links wait in Link.pending, anycast deliveries that
#   found no consumer wait in Address.undelivered; both are bounded by the credit already
#   granted to producers (at most link_capacity per producer link);
# * frames other than new TRANSFERs (FLOW, DISPOSITION, the rest of a delivery already
#   started, control performatives) are still written: they are bounded by what the peer
#   itself sends.
#
# The anonymous relay (a producer link with a null target; each message names its address)
# has no address whose capacity could decide its credit. Its deliveries that wait in the
# router count against it (Link.waiting: in an address's undelivered queue, and each copy
# queued on a consumer link, as multicast makes for a paused consumer): it is topped up to
# link_capacity less those, once
# credit and waiting together fall to half of it. So what one such link can make the router
# hold is bounded by link_capacity too; the price is that when half its credit's worth is
# stuck behind stalled consumers, its messages to other addresses wait as well (a link is one
# ordered stream; the router has no queue to set them aside in).
#
# Between routers the same happens on inter-router connections: a per-address link toward a
# slow neighbour stops adding capacity, so this router stops granting credit to whatever
# feeds that address here (local producers, or the per-address link from the previous hop),
# and the stall travels upstream hop by hop as credit (docs/mesh.md, "Per-address links").


cdef int conn_pause(Connection c) except -1:
    """The connection's outbound buffer rose above its high-water mark."""
    if c.write_paused:
        return 0
    c.write_paused = True
    c.n_write_pauses += 1
    c.router.n_write_pauses += 1
    return 0


cdef int conn_resume(Connection c) except -1:
    """The buffer fell below its low-water mark: write what waits on the connection's consumer
    links, take deliveries waiting in their addresses, and top up the producers again."""
    cdef Session s
    cdef Link link
    if not c.write_paused:
        return 0
    c.write_paused = False
    if c.state == CS_CLOSED or c.closing:
        return 0
    for s in list(c.sessions.values()):
        for link in list(s.links.values()):
            if link.role != ROLE_SENDER or link.state != LINK_ATTACHED:
                continue
            if c.write_paused:
                break        # (a write in between paused it again: the rest waits)
            if link.address is not None and not link.endpoint:
                link.address.consumer_credit(link)
            else:
                link.send_pending()
            if len(link.pending):
                link.block()
    return 0


cdef inline void held(Delivery inb) noexcept:
    """`inb` (or a copy of it) waits in the router (Address.undelivered, or a copy queued
    whole in a consumer's Link.pending): count it on its producer link."""
    if inb.link is not None:
        inb.link.waiting += 1


cdef int unheld(Delivery inb) except -1:
    """`inb` left the queue: an anonymous-relay producer may be due credit again."""
    cdef Link link = inb.link
    if link is None:
        return 0
    if link.waiting > 0:
        link.waiting -= 1
    if link.address is None and not link.endpoint and link.role == ROLE_RECEIVER and \
            link.state == LINK_ATTACHED:
        anonymous_topup(link)
    return 0


cdef int anonymous_topup(Link link) except -1:
    """ANONYMOUS-RELAY credit (2.6.7: the router, as receiver, decides what it grants): back to
    link_capacity less the link's deliveries still waiting in address queues, once credit
    and waiting together are down to half of it; never past its room under the unsettled
    limit (limits.pxi)."""
    cdef int64_t cap = link.conn.router.link_capacity
    cdef int64_t want
    if link.credit + link.waiting > cap // 2:
        return 0
    want = limit_credit(link, cap) - link.waiting
    if want <= link.credit:
        return 0
    link.credit = want
    link.credit_changed()
    link.conn.write_flow(link.session, link, False)
    return 0
