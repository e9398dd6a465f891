# Limits the engine enforces where the frames are parsed (issue 13, docs/configuration.md
# "[limits]"): sessions per connection (2.7.1 channel-max), links per connection (2.7.2
# handle-max) and the unsettled deliveries the router holds on one incoming link. The control
# plane checks the rest (qrouter/limits.py). One Limits object per router; a connection refers
# to it, or to None when it is not limited (the mesh's inter-router connections).
# (Included by engine.pyx.)


cdef class Limits:
    cdef public uint32_t sessions           # per connection; 0: no limit
    cdef public uint32_t links              # per connection; 0: no limit
    cdef public int64_t unsettled           # per incoming link; 0: no limit
    cdef public bint oversize_close         # a message over max-message-size closes its conn.
    # refusals, for $management and /metrics
    cdef readonly int64_t n_sessions, n_links, n_unsettled, n_message_size

    def __init__(self, uint32_t sessions=0, uint32_t links=0, int64_t unsettled=0,
                 bint oversize_close=False):
        self.sessions = sessions
        self.links = links
        self.unsettled = unsettled
        self.oversize_close = oversize_close

    def counters(self):
        return {"sessions_per_connection": self.n_sessions,
                "links_per_connection": self.n_links,
                "unsettled_per_link": self.n_unsettled,
                "message_size": self.n_message_size}


cdef int oversize(Connection c, Link link, uint64_t mms) except -1:
    """A delivery grew past the max-message-size of its link (2.7.3): the link is detached with
    amqp:link:message-size-exceeded (2.8.18). With limits.message_size_exceeded = "close" a
    client connection is then closed with amqp:connection:forced (2.8.16), as Qpid Dispatch
    does: nothing more of the message, which may go on for megabytes, is read."""
    cdef Limits lim = c.limits
    if lim is not None:
        lim.n_message_size += 1
    link_error(link, "amqp:link:message-size-exceeded", f"message exceeds {mms} bytes")
    if lim is not None and lim.oversize_close:
        c.fail("amqp:connection:forced",
               f"message exceeds {mms} bytes (max-message-size): connection closed")
    return 0


cdef bint session_refused(Connection c, uint16_t channel) except -1:
    """2.5.2 / 2.7.1: a BEGIN beyond the session limit (or on a channel above the channel-max
    we advertised) is answered with BEGIN and END carrying amqp:resource-limit-exceeded; the
    connection goes on. The refused session stays mapped until the peer's END (2.5.3), and a
    peer that piles up more refused sessions than the limit itself is closed."""
    cdef Limits lim = c.limits
    cdef Session s
    cdef Py_ssize_t pending = 0
    if lim is None or lim.sessions == 0:
        return False
    if channel > c.channel_max and <uint32_t>c.channel_max + 1 < lim.sessions:
        return False                        # the listener's channel-max, not the limit: 2.7.1
    for s in c.sessions.values():
        if s.ended:
            pending += 1
    if channel <= c.channel_max and len(c.sessions) - pending < <Py_ssize_t>lim.sessions:
        return False
    lim.n_sessions += 1
    if pending >= lim.sessions:
        raise ProtocolError("amqp:resource-limit-exceeded",
                            f"sessions per connection limit {lim.sessions} reached "
                            f"({pending} refused sessions not ended by the peer)")
    return True


cdef int refuse_session(Connection c, Session s) except -1:
    log.warning("[C%d] refusing session on channel %d: sessions per connection limit %d "
                "reached", c.conn_id, s.remote_channel, c.limits.sessions)
    s.ended = True                          # frames on it are ignored until the peer's END
    c.write_frame(FRAME_AMQP, s.channel, D_END, {"error": error_value(
        "amqp:resource-limit-exceeded",
        f"sessions per connection limit {c.limits.sessions} reached "
        f"(channel-max {c.channel_max})")})
    return 0


cdef uint32_t limit_handle_max(Connection c, uint32_t peer) noexcept:
    """2.7.2: the handle-max the router advertises in its BEGIN: the peer's, at most the
    links-per-connection limit less one."""
    cdef Limits lim = c.limits
    if lim is None or lim.links == 0 or peer < lim.links - 1:
        return peer
    return lim.links - 1


cdef inline bint handle_max_is_limit(Connection c, Session s) noexcept:
    """The handle-max of `s` is the links limit's (else the peer's own, and a handle above it
    is a framing error, 2.7.2)."""
    return c.limits is not None and c.limits.links != 0 and s.handle_max == c.limits.links - 1


cdef bint link_refused(Connection c, Session s, Link link, uint32_t handle) except -1:
    """A new ATTACH beyond the links-per-connection limit, or on a handle above our handle-max
    (2.7.3): the link is attached with a null terminus and detached with
    amqp:resource-limit-exceeded (2.6.3). Refused links count until the peer's DETACH answers
    ours, so a peer that does not answer reaches twice the limit and is closed."""
    cdef Limits lim = c.limits
    cdef Session o
    cdef Py_ssize_t n = 0
    if lim is None or lim.links == 0:
        return False
    for o in c.sessions.values():
        n += len(o.links)
    if handle <= s.handle_max and n <= <Py_ssize_t>lim.links:
        return False                        # (n counts this link already)
    # a handle above handle-max gets here only when the handle-max is the limit's
    lim.n_links += 1
    if n > 2 * <Py_ssize_t>lim.links:
        raise ProtocolError("amqp:resource-limit-exceeded",
                            f"links per connection limit {lim.links} reached "
                            "(refused links not detached by the peer)")
    if n <= <Py_ssize_t>lim.links + 1:
        # the first refusal of a connection is logged, the rest only counted: a peer that
        # attaches in a loop must not turn each of its frames into a log line
        log.warning("[C%d] refusing link %r (handle %d): links per connection limit %d "
                    "reached (further refusals counted, not logged)",
                    c.conn_id, link.name, handle, lim.links)
    link.detach("amqp:resource-limit-exceeded",
                f"links per connection limit {lim.links} reached (handle-max {s.handle_max})",
                True)
    return True


cdef bint unsettled_refused(Link link) except -1:
    """A producer that sends past the credit the router granted it is already refused
    (transfer-limit-exceeded); this bounds what the router holds for one that stays within
    credit while its consumers do not settle."""
    cdef Limits lim = link.conn.limits
    if lim is None or lim.unsettled == 0 or link.endpoint or \
            link.unsettled_count < lim.unsettled:
        return False
    lim.n_unsettled += 1
    link_error(link, "amqp:resource-limit-exceeded",
               f"unsettled deliveries per link limit {lim.unsettled} reached")
    return True


cdef inline int64_t limit_credit(Link p, int64_t cap) noexcept:
    """The credit the router grants a producer: the link capacity, but never more than its
    room under the unsettled limit, so a producer that keeps to its credit never meets it."""
    cdef Limits lim = p.conn.limits
    cdef int64_t room
    if lim is None or lim.unsettled == 0 or p.endpoint:
        return cap
    room = lim.unsettled - p.unsettled_count
    if room < cap:
        return room if room > 0 else 0
    return cap


cdef int limit_settled(Link p) except -1:
    """One of a producer's deliveries was settled. While the unsettled limit holds its credit
    back, credit comes back as the room grows (by half a window at a time: one FLOW per that
    many settlements), else a producer whose consumers hold credit but settle late would stall
    for good."""
    cdef Limits lim = p.conn.limits
    cdef int64_t cap, want, step
    if lim is None or lim.unsettled == 0 or p.endpoint or p.state != LINK_ATTACHED:
        return 0
    cap = p.conn.router.link_capacity
    if p.credit > cap // 2 or p.unsettled_count + cap < lim.unsettled:
        return 0
    want = limit_credit(p, cap)
    step = (cap if cap < lim.unsettled else lim.unsettled) // 2
    if want - p.credit < (step if step > 0 else 1):
        return 0
    if p.address is not None:
        if p.address.capacity() <= 0:
            return 0                        # no consumer credit: it comes with the next FLOW
    elif p not in p.conn.router.anonymous:
        return 0
    p.credit = want
    p.revoked = 0
    p.credit_changed()
    p.conn.write_flow(p.session, p, False)
    return 0
