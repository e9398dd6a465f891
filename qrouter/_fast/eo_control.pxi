# Guaranteed topics' envelopes from a neighbour router, received in the engine (issue 15 item
# 2; docs/exactly-once.md, "Receiving envelopes in the engine"). (Included by engine.pyx.)
#
# Every control message on an inter-router connection's control link went to Python:
# ConnectionHandler.on_message -> Mesh.on_message (qrouter/inter_router.py), which decodes
# the AMQP map, dispatches on "op", unpacks field "b" (eo_wire.pxi), checks each envelope's
# origin and calls Guarantees.receive_batch. Under load nearly all of them are guaranteed
# topics' batches of a few envelopes each, so that Python ran per few guaranteed messages.
#
# Once the neighbour is up, Mesh binds an `EoControl` to its control link (`Link.eo`, the
# reference a guaranteed topic's client link already has), and the engine hands it the link's
# transfers (connection.pxi). It takes one kind of message itself: byte for byte the shape
# Mesh.send_eo writes (an amqp-value section holding the map {"op": "EO", "b": <binary>}),
# whose "b" decodes to a list of envelopes that all claim an origin behind this connection.
# Those go to `receive_envelopes` (qrouter/_fast/eo_core.pyx) with no Python frame. Anything
# else -- a HELLO, the routing protocol, another encoding of the map, an EO batch that does not
# decode or holds an envelope from elsewhere, or a link-state change not yet looked at -- goes
# to the connection handler, exactly as without the entry, before anything here has had an
# effect but the credit top-up that path makes as well. So the rules stay Python's: what to
# drop, count and log, and the origin check (`Mesh._from_behind`).

cdef enum:
    EOC_CREDIT = 1000       # qrouter/inter_router.py CONTROL_CREDIT: granted when below half

# 3.2.8 amqp-value: descriptor 0x00, smallulong 0x77 (how qrouter's codec writes it)
cdef bytes _EOC_VALUE = b"\x00\x53\x77"
cdef bytes _EOC_OP = b"\xa1\x02op\xa1\x02EO"     # str8 "op" -> str8 "EO" (1.6.20)
cdef bytes _EOC_B = b"\xa1\x01b"                 # str8 "b"


cdef inline uint32_t _eoc_u32(const uint8_t* q):
    return (<uint32_t>q[0] << 24) | (<uint32_t>q[1] << 16) | (<uint32_t>q[2] << 8) | q[3]


cdef inline void _eoc_put_u32(uint8_t* q, uint32_t v) noexcept:
    q[0] = <uint8_t>(v >> 24)
    q[1] = <uint8_t>(v >> 16)
    q[2] = <uint8_t>(v >> 8)
    q[3] = <uint8_t>v


cdef Py_ssize_t _eoc_batch(const uint8_t* p, Py_ssize_t n, Py_ssize_t* length):
    """The offset of field "b"'s octets if p[0:n] is an EO control message as Mesh.send_eo
    writes it (their number in `length`), else -1. 1.6.24 map8/map32: size (the octets after
    it), count (4: two pairs), then the pairs, "op" and "b" in either order; "b" a 1.6.19
    vbin8/vbin32. The parts must add up to exactly n octets."""
    cdef Py_ssize_t pos, m
    cdef uint32_t count
    cdef bint seen_op = False
    cdef Py_ssize_t at = -1
    if n < 6 or memcmp(p, <const uint8_t*>_EOC_VALUE, 3) != 0:
        return -1
    if p[3] == 0xc1:
        if p[4] != n - 5:
            return -1
        count = p[5]
        pos = 6
    elif p[3] == 0xd1:
        if n < 12 or _eoc_u32(p + 4) != n - 8:
            return -1
        count = _eoc_u32(p + 8)
        pos = 12
    else:
        return -1
    if count != 4:
        return -1
    while pos < n:
        if not seen_op and n - pos >= 8 and memcmp(p + pos, <const uint8_t*>_EOC_OP, 8) == 0:
            seen_op = True
            pos += 8
        elif at < 0 and n - pos >= 5 and memcmp(p + pos, <const uint8_t*>_EOC_B, 3) == 0:
            pos += 3
            if p[pos] == 0xa0:
                m = p[pos + 1]
                pos += 2
            elif p[pos] == 0xb0 and n - pos >= 5:
                m = _eoc_u32(p + pos + 1)
                pos += 5
            else:
                return -1
            if m > n - pos:
                return -1
            at = pos
            length[0] = m
            pos += m
        else:
            return -1
    if not seen_op or at < 0:
        return -1
    return at


cdef class EoControl(EoEntry):
    """An up neighbour's control link (`Link.eo`): its guaranteed topics' batches, received
    here (see the top); the rest goes to the connection's handler. Made and bound by
    qrouter/inter_router.py (`Mesh._maybe_up`), unbound when the link stops being the
    peer's control link or the connection closes."""
    cdef readonly int64_t link_id   # the connection's (Mesh's link id; RoutingEngine.behind)
    cdef object mesh                 # qrouter.inter_router.Mesh: its tables after a batch
    cdef object receive              # eo_core.receive_envelopes
    cdef dict behind                 # RoutingEngine.behind_sets: link id -> routers behind it
    cdef readonly int64_t taken      # batches received here
    cdef readonly int64_t passed     # control messages handed to the handler

    def __init__(self, EoLinks owner, Link link not None, int64_t link_id, mesh, receive,
                 dict behind not None):
        self.owner = owner
        self.topic = None
        self.link = link
        self.link_id = link_id
        self.mesh = mesh
        self.receive = receive
        self.behind = behind
        self.deliveries = {}

    cdef int on_transfer(self, Delivery d) except -1:
        cdef Link link = self.link
        payload = d.payload
        if link.credit < EOC_CREDIT // 2:
            link.flow(EOC_CREDIT)  # as Mesh.on_message
        envelopes = self.batch(<bytes>payload)
        if envelopes is None:
            self.passed += 1
            link.conn.handler.on_message(link.conn, link, d, payload)
            return 0
        self.taken += 1
        self.receive(self.owner, envelopes, self.owner.c_now())
        if self.mesh._dirty:
            self.mesh._apply()  # as Mesh.on_message after a dispatch
        return 0

    cdef list batch(self, bytes payload):
        """The envelopes of an EO batch this entry takes, else None (see the top)."""
        cdef Py_ssize_t length = 0
        cdef Py_ssize_t at = _eoc_batch(<const uint8_t*>PyBytes_AS_STRING(payload),
                                        PyBytes_GET_SIZE(payload), &length)
        cdef EowReader r
        cdef list envelopes
        if at < 0:
            return None
        r.p = <const uint8_t*>PyBytes_AS_STRING(payload)
        r.pos = at
        r.end = at + length
        try:
            value = _eow_unpack(&r, 0, None)
        except DecodeError:
            return None  # Mesh.on_message drops and counts it (receive_batch)
        if r.pos != r.end or type(value) is not list:
            return None
        reach = self.behind.get(self.link_id)
        if type(reach) is not frozenset:
            return None  # not looked at since the link state changed: RoutingEngine.behind
        envelopes = <list>value
        for envelope in envelopes:
            if type(envelope) is not dict:
                return None
            src = (<dict>envelope).get("from")
            if type(src) is not str or src not in <frozenset>reach:
                return None  # Mesh._from_behind drops and counts it
        return envelopes

    def take(self, bytes payload not None):
        """What `on_transfer` would hand `receive_envelopes` for this payload (a list), or
        None if it would hand the message to the handler (for tests)."""
        return self.batch(payload)


def eo_message(envelopes):
    """The control message Mesh.send_eo sends: `envelopes` in the compact encoding
    (eo_pack) as field "b" of the map {"op": "EO", "b": ...} in an amqp-value section, octet
    for octet what the codec makes of that map (qrouter/_fast/codec.pyx: map8 when the count
    and body fit in 255 octets, as Writer._shrink decides; vbin8 below 256 octets), without
    the dict, the bytes of "b" and the general encoder. ValueError as eo_pack."""
    cdef Writer w = _eor_take_writer()  # (given back below; eo_wire.pxi)
    cdef Py_ssize_t n, head, body
    cdef uint8_t hdr[32]
    try:
        _eow_pack(w, envelopes, 0)
    except BaseException:
        _eor_give_writer(w)
        raise
    n = w.length
    if n > 0xFFFFFFFF - 32:
        raise ValueError("eo_pack: value too long")
    memcpy(hdr, <const uint8_t*>_EOC_VALUE, 3)
    body = 8 + 3 + (2 if n < 256 else 5) + n  # the two pairs
    if 4 + body <= 252:  # map8: size (count + pairs) and count in one octet each
        hdr[3] = 0xc1
        hdr[4] = <uint8_t>(1 + body)
        hdr[5] = 4
        head = 6
    else:
        hdr[3] = 0xd1
        _eoc_put_u32(hdr + 4, <uint32_t>(4 + body))
        _eoc_put_u32(hdr + 8, 4)
        head = 12
    memcpy(hdr + head, <const uint8_t*>_EOC_OP, 8)
    memcpy(hdr + head + 8, <const uint8_t*>_EOC_B, 3)
    head += 11
    if n < 256:
        hdr[head] = 0xa0
        hdr[head + 1] = <uint8_t>n
        head += 2
    else:
        hdr[head] = 0xb0
        _eoc_put_u32(hdr + head + 1, <uint32_t>n)
        head += 5
    out = PyBytes_FromStringAndSize(NULL, head + n)
    memcpy(PyBytes_AS_STRING(out), hdr, head)
    memcpy(PyBytes_AS_STRING(out) + head, w.data, n)
    _eor_give_writer(w)
    return out
