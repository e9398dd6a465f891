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
