# The peer's max-frame-size (2.7.1 open) bounds every frame the engine writes, not only
# transfers. Transfers are split (2.6.14, Connection.write_transfer); flows are small by
# construction; what remains are dispositions carrying a peer's outcome and the control
# performatives, whose fields may echo what a peer with a larger max-frame-size sent.
# (Included by engine.pyx after connection.pxi.)
#
# What does not fit is cut down the ways the spec allows, else the connection is closed:
# * ATTACH: an unsettled map too large for one frame is cut to the entries that fit and
#   incomplete-unsettled is set (2.7.3; 2.8.15 amqp:frame-size-too-small names this way out).
# * DETACH / END / CLOSE: the error's description is shortened, then the error dropped.
# * a disposition's state (3.4): rejected loses its error, modified its message-annotations.
# * anything else (an ATTACH whose addresses alone are too long, an OPEN, a BEGIN): CLOSE with
#   amqp:frame-size-too-small (2.8.15: "the smallest encoding of the performative with the
#   currently valid values would be too large to fit within a frame of the agreed maximum
#   frame size").

cdef dict _NAMES = {D_OPEN: "OPEN", D_BEGIN: "BEGIN", D_ATTACH: "ATTACH", D_DETACH: "DETACH",
                    D_END: "END", D_CLOSE: "CLOSE"}


cdef bint _rewrite(Connection c, Py_ssize_t start, int ftype, uint16_t channel, int code,
                   dict fields) except -1:
    c.out.length = start
    write_control(c.out, ftype, channel, code, fields)
    if c.out.length - start <= c.remote_max_frame_size:
        return True
    c.out.length = start
    return False


cdef int fit_control(Connection c, Py_ssize_t start, int ftype, uint16_t channel, int code,
                     dict fields) except -1:
    """The frame just written at `start` exceeds the peer's max-frame-size: write a smaller
    form of it, or close the connection (raising ProtocolError to stop the caller)."""
    cdef Py_ssize_t size = c.out.length - start
    cdef dict smaller
    if code == D_ATTACH and fields.get("unsettled"):
        # as many entries as fit (those first in the map), then none
        smaller = dict(fields)
        smaller["incomplete_unsettled"] = True
        entries = list(fields["unsettled"].items())
        cut = size - <Py_ssize_t>c.remote_max_frame_size + 16
        while entries and cut > 0:
            tag, state = entries.pop()
            cut -= len(encode(tag)) + (1 if state is None else len(encode(state)))
        smaller["unsettled"] = dict(entries) if entries else None
        if _rewrite(c, start, ftype, channel, code, smaller):
            return 0
        smaller["unsettled"] = None
        if _rewrite(c, start, ftype, channel, code, smaller):
            return 0
    err = fields.get("error")
    if err is not None and (code == D_DETACH or code == D_END or code == D_CLOSE):
        smaller = dict(fields)
        items = list(err.value) if isinstance(err, Described) else []
        desc = items[1] if len(items) > 1 else None
        if items and isinstance(desc, str):
            cut = desc.encode("utf-8")
            cut = cut[:max(0, len(cut) - (size - <Py_ssize_t>c.remote_max_frame_size) - 16)]
            smaller["error"] = error_value(items[0], cut.decode("utf-8", "ignore"))
            if _rewrite(c, start, ftype, channel, code, smaller):
                return 0
        smaller["error"] = None
        if _rewrite(c, start, ftype, channel, code, smaller):
            return 0
    c.out.length = start
    what = (f"{_NAMES.get(code, 'a frame')} of {size} bytes exceeds the peer's "
            f"max-frame-size {c.remote_max_frame_size}")
    c.fail("amqp:frame-size-too-small", what)
    raise ProtocolError("amqp:frame-size-too-small", what)


cdef bytes fit_state(bytes state, Py_ssize_t room):
    """`state` (an encoded delivery state, 3.4) if it takes at most `room` bytes, else the
    same outcome without its optional parts."""
    if state is None or PyBytes_GET_SIZE(state) <= room:
        return state
    from qrouter._fast.codec import decode
    try:
        value = decode(state)[0]
        code = int(value.descriptor)
        items = list(value.value or ())
    except Exception:
        return None
    if code == D_REJECTED:
        return encode_state(D_REJECTED, None)
    if code == D_MODIFIED:
        return encode_state(D_MODIFIED, (
            bool(items[0]) if len(items) > 0 else False,
            bool(items[1]) if len(items) > 1 else False))
    return None
