# Deliveries (2.6.12): one object per message per link. An inbound delivery (from a producer)
# owns its outbound copies (to consumers); dispositions flow between them. (Included by
# engine.pyx.)


# 3.4 outcomes ranked for multicast: the producer gets the strongest terminal state of the
# copies (REJECTED > ACCEPTED > MODIFIED > RELEASED), as DESIGN.md section 4 states.
cdef inline int outcome_rank(int code) noexcept:
    if code == D_REJECTED:
        return 4
    if code == D_ACCEPTED:
        return 3
    if code == D_MODIFIED:
        return 2
    if code == D_RELEASED:
        return 1
    return 0


cdef inline bint is_terminal(int code) noexcept:
    return code == D_ACCEPTED or code == D_REJECTED or code == D_RELEASED or code == D_MODIFIED


@cython.freelist(4096)
cdef class Delivery:
    cdef Link link                # the link it travels on (None once that link is gone)
    cdef uint32_t delivery_id
    cdef bytes tag
    cdef object payload           # bytes once kept (queued, multi-frame); None while in the frame
    cdef object partial           # bytearray while a multi-frame delivery is arriving
    cdef uint32_t message_format
    cdef bint presettled          # the sender settled it on the first frame (at-most-once)
    cdef bint settled             # settled at our end (no longer in the session's unsettled map)
    cdef bint sent                # outbound: its first TRANSFER was written (the peer may have it)
    cdef Py_ssize_t offset        # outbound: payload bytes already written (frames split)
    cdef int remote_state         # last state the peer reported (descriptor code, 0 = none)
    cdef bytes remote_state_raw   # that state encoded, forwarded as it came
    cdef Delivery inbound         # outbound copy -> the delivery it copies
    cdef Delivery out             # inbound anycast -> its one copy
    cdef list copies              # inbound multicast -> its copies
    cdef int pending_copies       # multicast: copies not yet in a terminal state
    cdef int best                 # multicast: strongest terminal state so far
    cdef bytes best_raw
    cdef bint outcome_sent        # inbound: the producer has been told the outcome

    @staticmethod
    cdef inline Delivery new(Link link, uint32_t delivery_id, bytes tag):
        cdef Delivery d = Delivery.__new__(Delivery)
        d.link = link
        d.delivery_id = delivery_id
        d.tag = tag
        return d

    @property
    def tag_bytes(self):
        return self.tag

    @property
    def state(self):
        return self.remote_state
