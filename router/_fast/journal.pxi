# The delivery journal's events (docs/journal.md), gathered on the data path as one tuple per
# event and handed to router/journal.py's writer once per loop iteration by Router.flush().
# Off unless the router runs with --journal: then Router.jrows is a list, else None, and
# every hook below is one pointer test. (Included by engine.pyx.)

from posix.time cimport CLOCK_REALTIME

# the order of the journal's columns in each event tuple
JOURNAL_COLUMNS = ("time_ns", "connection", "link", "address", "tag", "origin", "event",
                   "outcome", "size")

OUTCOME_NAMES = {D_ACCEPTED: "accepted", D_REJECTED: "rejected", D_RELEASED: "released",
                 D_MODIFIED: "modified"}


cdef inline int64_t wall_ns() noexcept:
    cdef timespec ts
    clock_gettime(CLOCK_REALTIME, &ts)
    return <int64_t>ts.tv_sec * 1000000000 + ts.tv_nsec


cdef int jr(Link link, bytes tag, str origin, str event, object outcome,
            Py_ssize_t size) except -1:
    cdef Router r = link.conn.router
    r.jrows.append((wall_ns(), link.conn.conn_id, link.name,
                    link.address.name if link.address is not None else "",
                    tag, origin, event, outcome, size))
    return 0


cdef inline bint journaling(Link link) noexcept:
    return link is not None and link.conn.router.jrows is not None


cdef str inbound_origin(Link link, Delivery d):
    # <publisher container>/<link>/<tag hex>: the prefix is made once per link at attach
    return (link.origin_prefix if link.origin_prefix is not None else "") + d.tag.hex()
