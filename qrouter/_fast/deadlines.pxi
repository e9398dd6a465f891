# Deadlines for a connection that is still arriving, and the deferred SASL check (issue 13).
# (Included by engine.pyx after connection.pxi; the control plane sets `handshake_timeout` and
# answers a deferred check with `Connection.complete_sasl`.)
#
# * handshake: protocol header (2.2), SASL (5.3) and OPEN (2.4.1) must all be done within
#   `handshake_timeout` seconds of the accept, or the connection is closed. Before the AMQP
#   header there is no frame that could carry an error, so the socket is just closed; after
#   it, OPEN then CLOSE with amqp:resource-limit-exceeded (2.4.1: OPEN always precedes CLOSE).
# * partial frame: a frame that has begun arriving must be whole within the idle timeout.
#   Every byte refreshes `last_read`, so the idle check (2.4.5) alone never fires for a peer
#   that trickles a frame one byte at a time (slow-loris); this clock starts with the first
#   byte of a frame and is reset only when a whole frame was read.


cdef inline int note_partial(Connection c, Py_ssize_t consumed) noexcept:
    # after a feed: `consumed` bytes were whole frames / headers; the rest waits in `inbuf`
    if c.inbuf is None:
        c.partial_since = 0
    elif consumed > 0 or c.partial_since == 0:
        c.partial_since = c.last_read
    return 0


cdef int check_deadlines(Connection c, double now) except -1:
    """Close the connection if a deadline passed; 1 if it did."""
    if c.handshake_timeout > 0 and not c.client and now - c.created > c.handshake_timeout and \
            (c.state == CS_HEADER or c.state == CS_SASL or c.state == CS_SASL_DONE or
             c.state == CS_OPEN_WAIT):
        c.fail("amqp:resource-limit-exceeded",
               f"protocol header, SASL and OPEN not done within {c.handshake_timeout:g} s")
        return 1
    if c.partial_since > 0 and not c.sasl_pending and c.idle_timeout_ms and \
            now - c.partial_since > c.idle_timeout_ms / 1000.0:
        c.fail("amqp:resource-limit-exceeded",
               f"a frame still incomplete after the idle timeout "
               f"({c.idle_timeout_ms / 1000.0:g} s)")
        return 1
    return 0
