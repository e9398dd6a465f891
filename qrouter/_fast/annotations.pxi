# Mesh multicast (docs/mesh.md, "Multicast"): the ingress router of a message travels in its
# message-annotations as `x-opt-qr-ingress` (as qdrouterd's `x-opt-qd.ingress`), so transit
# routers can apply the valid-origin rule. Only multicast deliveries that leave for another
# router pay for this; the bytes of anything else are never touched. (Included by engine.pyx.)

cdef object _INGRESS_KEY = Symbol("x-opt-qr-ingress")


cdef Py_ssize_t _sections(const uint8_t* data, Py_ssize_t n, Py_ssize_t* ma_end) except -2:
    """3.2: a bare message may start with header, delivery-annotations, message-annotations
    (in that order). Returns where the message-annotations section starts (its end in
    ma_end), or -1 and in ma_end where it would go (after header / delivery-annotations)."""
    cdef Reader r
    cdef uint64_t code
    cdef Py_ssize_t start
    r.p = data
    r.n = n
    r.pos = 0
    while r.pos < r.n:
        start = r.pos
        r_descriptor(&r, &code)
        if code == D_HEADER or code == D_DELIVERY_ANNOTATIONS:
            r_skip(&r)
            continue
        if code == D_MESSAGE_ANNOTATIONS:
            r_skip(&r)
            ma_end[0] = r.pos
            return start
        ma_end[0] = start
        return -1
    ma_end[0] = r.pos
    return -1


cdef object _ORIGIN_KEY = Symbol("x-opt-qr-origin")


cdef int reject_undecodable(Router router, Delivery inb, str what, object e) except -1:
    """A section of `inb` that the router must read (3.2: the header, delivery- and
    message-annotations it skips or rewrites, the properties' `to`) does not decode, or its
    annotations do not encode again: the delivery is REJECTED with amqp:decode-error (3.4.2;
    a presettled one is dropped) and counted. Only this message is refused: its link and
    connection go on, as does everything else."""
    router.n_decode_errors += 1
    log.info("[C%d] message refused: its %s do not decode: %s",
             inb.link.conn.conn_id if inb.link is not None else 0, what, e)
    if inb.presettled:
        return 0
    apply_outcome(inb, D_REJECTED, encode_state(D_REJECTED, error_value(
        "amqp:decode-error", f"the message's {what} do not decode: {e}")))
    return 0


cdef int annotate(Router router, Delivery inb, const uint8_t* data, Py_ssize_t n, str ingress,
                  bint journal) except -1:
    """inb.payload = `data` with add_ingress (journal off) or journal_annotate (journal on)
    applied; 1, or 0 when the message's sections do not decode, after rejecting it
    (reject_undecodable). The caller reads the bytes from inb.payload afterwards."""
    try:
        b = journal_annotate(inb, data, n, ingress) if journal else add_ingress(data, n, ingress)
    except (ValueError, TypeError, OverflowError) as e:     # DecodeError is a ValueError
        reject_undecodable(router, inb, "sections", e)
        return 0
    if b is not None:
        inb.payload = b
    elif inb.payload is None:
        inb.payload = PyBytes_FromStringAndSize(<char*>data, n)
    return 1


cdef bytes add_ingress(const uint8_t* data, Py_ssize_t n, str router_id):
    """The message with `x-opt-qr-ingress = router_id` in its message-annotations."""
    return add_annotations(data, n, {_INGRESS_KEY: router_id})


cdef bytes journal_annotate(Delivery inb, const uint8_t* data, Py_ssize_t n, str ingress):
    """Journal on: the message as it leaves for another router, with its origin (the
    publisher's link prefix and tag) as `x-opt-qr-origin`, so every router journals the same
    origin for it (docs/journal.md); and `x-opt-qr-ingress` when `ingress` is given."""
    extra = {}
    if ingress is not None:
        extra[_INGRESS_KEY] = ingress
    if inb.jorigin is not None and not inb.transit:
        extra[_ORIGIN_KEY] = [inb.jorigin.origin_prefix, inb.tag]
    return add_annotations(data, n, extra) if extra else None


cdef object message_origin(const uint8_t* data, Py_ssize_t n):
    """`x-opt-qr-origin` of a message as (prefix, tag), or None."""
    found = message_annotations(data, n)
    if isinstance(found, dict):
        value = found.get(_ORIGIN_KEY)
        if isinstance(value, list) and len(value) == 2 and isinstance(value[0], str) and \
                isinstance(value[1], bytes):
            return value[0], value[1]
    return None


cdef bytes add_annotations(const uint8_t* data, Py_ssize_t n, dict extra):
    """The message with `extra` in its message-annotations (a new section when it has none,
    which leaves every other byte as it was)."""
    cdef Reader r
    cdef uint64_t code
    cdef Py_ssize_t end = 0
    cdef Py_ssize_t start = _sections(data, n, &end)
    cdef bytes head, tail
    annotations = {}
    if start >= 0:
        r.p = data + start
        r.n = end - start
        r.pos = 0
        r_descriptor(&r, &code)
        found = r_value(&r)
        if isinstance(found, dict):
            annotations = dict(found)
        head = PyBytes_FromStringAndSize(<char*>data, start)
    else:
        head = PyBytes_FromStringAndSize(<char*>data, end)
    annotations.update(extra)
    tail = PyBytes_FromStringAndSize(<char*>(data + end), n - end)
    return head + encode(Described(ULong(D_MESSAGE_ANNOTATIONS), annotations)) + tail


cdef object message_ingress(const uint8_t* data, Py_ssize_t n):
    """`x-opt-qr-ingress` of a message, or None."""
    found = message_annotations(data, n)
    if isinstance(found, dict):
        value = found.get(_INGRESS_KEY)
        return str(value) if value is not None else None
    return None


cdef object message_annotations(const uint8_t* data, Py_ssize_t n):
    """The message-annotations map of a message, or None."""
    cdef Reader r
    cdef uint64_t code
    cdef Py_ssize_t end = 0
    cdef Py_ssize_t start
    try:
        start = _sections(data, n, &end)
        if start < 0:
            return None
        r.p = data + start
        r.n = end - start
        r.pos = 0
        r_descriptor(&r, &code)
        found = r_value(&r)
    except DecodeError:
        return None
    return found


def _test_add_ingress(bytes message not None, str router_id not None):
    """For tests: add_ingress on a Python bytes object."""
    return add_ingress(<const uint8_t*>PyBytes_AS_STRING(message), len(message), router_id)


def _test_message_ingress(bytes message not None):
    return message_ingress(<const uint8_t*>PyBytes_AS_STRING(message), len(message))
