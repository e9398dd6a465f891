# The read path: one call per socket read, from the server's Protocol.data_received
# (docs/performance.md, "Latency across the load range"). A small read (light traffic: a
# burst of a few messages, a disposition) is fed with the end-of-iteration flush held back,
# then flushed at once: its output leaves before the other connections read in the same loop
# iteration are handled, and no flush is scheduled that would run only to find nothing (one
# event-loop callback less per read). The flush is the whole Router.flush: the group commit
# of durable changes (DESIGN.md section 5) still comes before any output that depends on it.
# (Included by engine.pyx.)


cdef bint read_received(Connection c, object data, Py_ssize_t flush_now) except -1:
    cdef Router r = c.router
    if len(data) > flush_now or r.eager:      # a large read, or one fed from within a feed
        c.feed(data)
    else:
        r.eager = True
        try:
            c.feed(data)
        except BaseException:
            r.eager = False
            r.schedule_flush()                # what the read produced still gets written
            raise
        r.eager = False
        r.flush_now()
    return c.control_used > 0 or c.yielded


cdef class ReadGate:
    """The server Protocol's `data_received`, compiled (qrouter/server.py): the event loop
    calls its bound `data_received` once per socket read, which feeds the read (and flushes
    a small one: read_received) and calls the protocol's `after` (its `_after_read`) only
    when that has work: the read held control frames or the engine yielded, the protocol
    asked for every read (`slow`: the busy poll, a control-frame bucket in debt), or the
    peer's OPEN changed its idle-time-out since the protocol last armed its timer (2.4.5).
    So a read of transfers, flows and dispositions runs no Python frame."""
    cdef public Connection conn        # None: refused, bytes read before the pause are dropped
    cdef public object after           # callable(): the protocol's _after_read; None once gone
    cdef public Py_ssize_t flush_now   # the server's FLUSH_NOW_BYTES
    cdef public bint slow              # call `after` after every read
    cdef public uint32_t tick_remote   # the idle-time-out the protocol's timer was armed for
    cdef public object lingering       # the transport of a closed connection that reads on
    cdef public Py_ssize_t linger_left  # bytes it may still read and drop (server.linger_close)

    def __init__(self, after, Py_ssize_t flush_now):
        self.after = after
        self.flush_now = flush_now

    def data_received(self, data):
        cdef Connection c = self.conn
        if c is None:
            return
        if c.state == CS_CLOSED:               # closed: the socket lingers (server.py)
            if self.lingering is not None:
                self.linger_left -= len(data)
                if self.linger_left < 0:       # a peer that keeps on: no more is read
                    t = self.lingering
                    self.lingering = None
                    t.close()
            return
        if read_received(c, data, self.flush_now) or self.slow or \
                c.remote_idle_timeout_ms != self.tick_remote:
            if self.after is not None:
                self.after()
