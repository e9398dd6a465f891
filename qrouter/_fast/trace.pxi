# Frame trace (issue 16): every protocol header (2.2) and frame (2.3) a connection reads or
# writes, logged readably on ``qrouter.trace`` at level TRACE (5), as proton's PN_TRACE_FRM
# prints them: ``[C3] <- @1 transfer(handle=0, delivery_id=7, ...) payload=42``.
# Off, it costs one test of Connection.trace per frame read and per output flush; the copy,
# the decoding and the formatting are all here, done only when it is on. (Included by
# engine.pyx.)

TRACE = 5
logging.addLevelName(TRACE, "TRACE")
trace_log = logging.getLogger("qrouter.trace")

_PERFORMATIVES = {
    D_OPEN: "open", D_BEGIN: "begin", D_ATTACH: "attach", D_FLOW: "flow",
    D_TRANSFER: "transfer", D_DISPOSITION: "disposition", D_DETACH: "detach", D_END: "end",
    D_CLOSE: "close", D_SASL_MECHANISMS: "sasl-mechanisms", D_SASL_INIT: "sasl-init",
    D_SASL_CHALLENGE: "sasl-challenge", D_SASL_RESPONSE: "sasl-response",
    D_SASL_OUTCOME: "sasl-outcome", D_ERROR: "error", D_SOURCE: "source", D_TARGET: "target",
    D_RECEIVED: "received", D_ACCEPTED: "accepted", D_REJECTED: "rejected",
    D_RELEASED: "released", D_MODIFIED: "modified",
}
# 3.4 outcomes: their fields (the performatives' are FIELDS, performatives.pxi)
_OUTCOME_FIELDS = {
    D_RECEIVED: ("section_number", "section_offset"), D_REJECTED: ("error",),
    D_MODIFIED: ("delivery_failed", "undeliverable_here", "message_annotations"),
}
# 5.3.3: credentials (PLAIN's password, SCRAM's proofs) are shown by their size only
_SECRET = frozenset({"initial_response", "response", "challenge", "additional_data"})
_HEADERS = {0: "AMQP", 2: "AMQP TLS", 3: "AMQP SASL"}    # 2.2 / 5.2.1 / 5.3.1 protocol ids
_CLIP = 120                                              # characters of one field value shown


cdef int trace_in(Connection c, const uint8_t* p, Py_ssize_t n) except -1:
    """One frame (or protocol header) read by `c`, before the engine acts on it."""
    trace_bytes(c.conn_id, "<-", PyBytes_FromStringAndSize(<const char*>p, n))
    return 0


cdef int trace_out(Connection c) except -1:
    """The frames `c` is about to hand to its transport (whole frames: the engine writes
    each one completely into its output buffer)."""
    if c.out.length:
        trace_bytes(c.conn_id, "->",
                    PyBytes_FromStringAndSize(<const char*>c.out.data, c.out.length))
    return 0


def trace_bytes(conn_id, str direction, bytes data):
    """Log each header and frame in `data`; never raises (a frame that does not decode is
    shown as such: the engine's own parse answers it)."""
    cdef Py_ssize_t pos = 0, n = len(data), size, doff
    if not trace_log.isEnabledFor(TRACE):
        return
    while pos < n:
        if data[pos:pos + 4] == b"AMQP":
            head = data[pos:pos + 8]
            kind = _HEADERS.get(head[4], f"protocol {head[4]}") if len(head) > 4 else "?"
            trace_log.log(TRACE, "[C%d] %s %s header %s", conn_id, direction, kind,
                          ".".join(str(b) for b in head[5:8]))
            pos += 8
            continue
        if n - pos < 8:
            trace_log.log(TRACE, "[C%d] %s %d bytes of a frame header", conn_id, direction,
                          n - pos)
            return
        size = int.from_bytes(data[pos:pos + 4], "big")
        doff = data[pos + 4] * 4
        if size < 8 or doff < 8 or doff > size or pos + size > n:
            trace_log.log(TRACE, "[C%d] %s bad frame (size %d, data offset %d)", conn_id,
                          direction, size, doff)
            return
        channel = int.from_bytes(data[pos + 6:pos + 8], "big")
        sasl = data[pos + 5] == FRAME_SASL
        text = frame_text(data[pos + doff:pos + size])
        trace_log.log(TRACE, "[C%d] %s %s@%d %s", conn_id, direction, "SASL:" if sasl else "",
                      channel, text)
        pos += size


def frame_text(bytes body):
    """A frame body as ``name(field=value, ...)``, with ``payload=N`` for a transfer's
    message bytes; empty: a heartbeat (2.4.5)."""
    if not body:
        return "(empty frame: heartbeat)"
    try:
        value, end = decode(body, 0)
    except Exception as e:
        return f"undecodable performative ({type(e).__name__}: {e})"
    text = _value_text(value)
    if isinstance(value, Described) and value.descriptor == D_TRANSFER:
        text += f" payload={len(body) - end}"
    elif end < len(body):
        text += f" +{len(body) - end} bytes"
    return text


def _value_text(v):
    if isinstance(v, Described):
        code = v.descriptor
        if isinstance(code, str):
            code = _SYMBOLIC_CODES.get(code, code)
        name = _PERFORMATIVES.get(code)
        names = FIELDS.get(code) or _OUTCOME_FIELDS.get(code, ())
        if name is None or not isinstance(v.value, list):
            return _clip(repr(v))
        parts = []
        for i, item in enumerate(v.value):
            if item is None:
                continue
            field = names[i] if i < len(names) else f"field{i}"
            if field in _SECRET and isinstance(item, (bytes, bytearray)):
                parts.append(f"{field}=<{len(item)} bytes>")
                continue
            parts.append(f"{field}={_value_text(item)}")
        return f"{name}({', '.join(parts)})"
    if isinstance(v, (list, Array)):
        return _clip("[" + ", ".join(_value_text(x) for x in v) + "]")
    if isinstance(v, dict):
        return _clip("{" + ", ".join(f"{_value_text(k)}: {_value_text(x)}"
                                     for k, x in v.items()) + "}")
    if isinstance(v, bool) or v is None:
        return str(v).lower()
    if isinstance(v, int):
        return str(int(v))                              # UInt(5) -> 5
    if isinstance(v, (bytes, bytearray)):
        return _clip("b" + repr(bytes(v))[1:] if len(v) <= 32 else f"<{len(v)} bytes>")
    if isinstance(v, str):
        return _clip(repr(str(v)) if not isinstance(v, Symbol) else ":" + str(v))
    return _clip(str(v))


def _clip(str s):
    return s if len(s) <= _CLIP else s[:_CLIP] + "..."
