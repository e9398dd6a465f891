# The compiled outputs of a guaranteed topic's core (eo_core.pyx), shared with the engine,
# which applies them (eo_links.pxi, `EoLinks.apply_outputs`).

from cpython.ref cimport PyObject

# an output's kind (`EoOut.kind`); what its fields hold
cdef enum:
    OUT_DELIVER = 0  # a = att, b = out tag, c = body, flag = resume
    OUT_SETTLE_SUBSCRIBER = 1  # a = att, b = out tag
    OUT_ACCEPT_PUBLISHER = 2  # topic, a = pub, b = tag, c = its out tag (None: not known),
    #                           d = its origin record, a hint for eo_publisher_settled (or NULL)
    OUT_TO_ROUTER = 3  # a = router id, b = message
    OUT_PORT = 4  # a port's method at the end of the input (log, resend): a = name, b = args
    OUT_CALL = 5  # a(*b) after the commit (an output staged from Python)
    OUT_RECORD = 6  # a per-message record to a router that takes them, its fields: op,
    #                 topic, a = router id, b = t, c = pub (FWD) or subscribers / targets,
    #                 d, e, f = tag, body, targets (FWD; None otherwise)

# a record's op (`EoOut.op` of OUT_RECORD): its op code in the compact inter-router encoding
# (eo_wire.pxi), which writes it as it is
cdef enum:
    REC_FWD = 1
    REC_ACCEPT = 2
    REC_SETTLE = 3
    REC_SEEN = 4


cdef struct EoOut:
    int kind
    int op  # OUT_RECORD's
    bint flag
    PyObject *topic  # each field holds a reference (None when unused; NULL past c but
    PyObject *a      # for OUT_RECORD)
    PyObject *b
    PyObject *c
    PyObject *d
    PyObject *e
    PyObject *f


cdef class OutQueue:
    """Outputs in order, each a C struct holding its references (no tuple per output);
    items[head:n] are pending (only a core's loopback takes them from the front)."""
    cdef EoOut *items
    cdef Py_ssize_t head
    cdef Py_ssize_t n
    cdef Py_ssize_t cap
    cdef Py_ssize_t n_port  # OUT_PORT items among them
    cdef int reserve(self, Py_ssize_t n) except -1
    cdef int push(self, int kind, topic, a, b, c, bint flag) except -1
    cdef int push_record(self, int op, topic, router, t, x, tag, body, targets) except -1
    cdef int push_copy(self, EoOut *o) except -1
    cdef int move_to(self, OutQueue dst) except -1
    cdef void trim(self, Py_ssize_t keep) noexcept
    cdef void swap(self, OutQueue other)
    cdef void clear(self)


cdef class FlushDue:
    """The base of the router's `EoLinks` (eo_links.pxi): its flag that a flush is due, which
    a core's `_c_flush` reads after each input as a C field, not a Python attribute."""
    cdef public bint scheduled  # a flush is due (Guarantees.schedule)


cdef class RouterOutbox:
    cdef object g
    cdef dict open  # router id -> the message list of its envelope open this iteration
    # routers that are their own next hop (Guarantees.route): the only ones sent compact
    # records (eo_wire.pxi), as a router on the way decodes what it passes on, and one of
    # the version before the compact records cannot
    cdef public set direct
    # the router id `c_open` found last, and its envelope's list (`open`'s entry)
    cdef object _last
    cdef object _last_group
    cdef object c_open(self, router_id)
    cdef int c_send(self, router_id, message) except -1


# a topic's core's per-message inputs (EoCore's methods of the same names), as C calls for the
# engine's client links (eo_links.pxi); `core` is an EoCore (TypeError otherwise)
cdef int eo_publisher_transfer(core, pub, tag, body, double now) except -1
# (out_tag: the delivery's outgoing tag when the caller has it, else None: computed)
# (origin: the OUT_ACCEPT_PUBLISHER's record, a hint the core checks, or None)
cdef int eo_publisher_settled(core, pub, tag, out_tag, origin, double now) except -1
cdef int eo_subscriber_accepted(core, att, out_tag, double now) except -1
cdef int eo_subscriber_settled(core, att, out_tag, double now) except -1
# core.eo (exactly-once), read as a C field
cdef bint eo_core_eo(core) except -1
