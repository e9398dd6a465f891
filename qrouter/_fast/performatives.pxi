# Field lists of the composite types the control path handles as Python dicts, and the
# encoders of every frame the engine writes. (Included by engine.pyx.)

# 2.7 performatives, 2.8.14 error, 3.5.3 source, 3.5.4 target, 5.3.3 SASL frames
FIELDS = {
    D_OPEN: ("container_id", "hostname", "max_frame_size", "channel_max", "idle_time_out",
             "outgoing_locales", "incoming_locales", "offered_capabilities",
             "desired_capabilities", "properties"),
    D_BEGIN: ("remote_channel", "next_outgoing_id", "incoming_window", "outgoing_window",
              "handle_max", "offered_capabilities", "desired_capabilities", "properties"),
    D_ATTACH: ("name", "handle", "role", "snd_settle_mode", "rcv_settle_mode", "source",
               "target", "unsettled", "incomplete_unsettled", "initial_delivery_count",
               "max_message_size", "offered_capabilities", "desired_capabilities",
               "properties"),
    D_DETACH: ("handle", "closed", "error"),
    D_END: ("error",),
    D_CLOSE: ("error",),
    D_ERROR: ("condition", "description", "info"),
    D_SOURCE: ("address", "durable", "expiry_policy", "timeout", "dynamic",
               "dynamic_node_properties", "distribution_mode", "filter", "default_outcome",
               "outcomes", "capabilities"),
    D_TARGET: ("address", "durable", "expiry_policy", "timeout", "dynamic",
               "dynamic_node_properties", "capabilities"),
    D_SASL_MECHANISMS: ("sasl_server_mechanisms",),
    D_SASL_INIT: ("mechanism", "initial_response", "hostname"),
    D_SASL_CHALLENGE: ("challenge",),
    D_SASL_RESPONSE: ("response",),
    D_SASL_OUTCOME: ("code", "additional_data"),
    D_FLOW: ("next_incoming_id", "incoming_window", "next_outgoing_id", "outgoing_window",
             "handle", "delivery_count", "link_credit", "available", "drain", "echo",
             "properties"),
    D_TRANSFER: ("handle", "delivery_id", "delivery_tag", "message_format", "settled", "more",
                 "rcv_settle_mode", "state", "resume", "aborted", "batchable"),
    D_DISPOSITION: ("role", "first", "last", "settled", "state", "batchable"),
}

# The mandatory fields of each performative (2.7): a frame without them is a decode error.
MANDATORY = {
    D_OPEN: ("container_id",),
    D_BEGIN: ("next_outgoing_id", "incoming_window", "outgoing_window"),
    D_ATTACH: ("name", "handle", "role"),
    D_DETACH: ("handle",),
    D_SASL_INIT: ("mechanism",),
    D_SASL_CHALLENGE: ("challenge",),
    D_SASL_RESPONSE: ("response",),
    D_ERROR: ("condition",),
}


# The types of the fields the engine reads from control performatives (2.7, 3.5, 5.3.3): a
# field of another type is a decode error, never an internal one.
_UINT = ("uint", 0xffffffff)
_USHORT = ("uint", 0xffff)
_UBYTE = ("uint", 0xff)
FIELD_TYPES = {
    D_OPEN: {"container_id": str, "hostname": str, "max_frame_size": _UINT,
             "channel_max": _USHORT, "idle_time_out": _UINT, "properties": dict},
    D_BEGIN: {"remote_channel": _USHORT, "next_outgoing_id": _UINT, "incoming_window": _UINT,
              "outgoing_window": _UINT, "handle_max": _UINT, "properties": dict},
    D_ATTACH: {"handle": _UINT, "role": bool, "snd_settle_mode": _UBYTE,
               "rcv_settle_mode": _UBYTE, "unsettled": dict,
               "initial_delivery_count": _UINT, "max_message_size": ("uint", 2**64 - 1),
               "properties": dict},
    D_DETACH: {"handle": _UINT, "closed": bool},
    D_SOURCE: {"address": str, "durable": _UINT, "timeout": _UINT, "dynamic": bool},
    D_TARGET: {"address": str, "durable": _UINT, "timeout": _UINT, "dynamic": bool},
    D_SASL_INIT: {"mechanism": str, "initial_response": bytes, "hostname": str},
    D_SASL_CHALLENGE: {"challenge": bytes},
    D_SASL_RESPONSE: {"response": bytes},
    D_SASL_OUTCOME: {"code": _UBYTE, "additional_data": bytes},
}


cdef int check_types(int code, dict out) except -1:
    types = FIELD_TYPES.get(code)
    if types is None:
        return 0
    for name, want in types.items():
        v = out.get(name)
        if v is None:
            continue
        if type(want) is tuple:
            if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= want[1]:
                raise DecodeError(f"{name} must be an unsigned integer up to {want[1]}")
        elif not isinstance(v, want):
            raise DecodeError(f"{name} has the wrong type ({type(v).__name__})")
        elif want is str and type(v) is not str:
            out[name] = str(v)  # a symbol where a string belongs: its text (typed str below)
    return 0


def described_to_dict(value, code=None):
    """A described list (performative, source, target, error) as a dict of its named fields;
    unknown descriptors come back as they are."""
    if not isinstance(value, Described):
        return value
    desc = value.descriptor
    if isinstance(desc, str):
        desc = _SYMBOLIC_CODES.get(desc, desc)
    elif not isinstance(desc, int):
        return value  # 1.5: a descriptor we know is a symbol or a ulong (a list is not hashable)
    names = FIELDS.get(desc)
    if names is None or not isinstance(value.value, list):
        return value
    out = {"_code": desc}
    items = value.value
    for i, name in enumerate(names):
        v = items[i] if i < len(items) else None
        if name in ("source", "target", "error") and v is not None:
            v = described_to_dict(v)
        out[name] = v
    for name in MANDATORY.get(desc, ()):
        if out[name] is None:
            raise DecodeError(f"mandatory field {name} is null")
    if type(desc) is int or isinstance(desc, int):
        check_types(desc, out)
    return out


_SYMBOLIC_CODES = {
    "amqp:source:list": D_SOURCE, "amqp:target:list": D_TARGET, "amqp:error:list": D_ERROR,
}


def make_described(int code, dict fields):
    """The inverse of described_to_dict: a Described list with trailing nulls dropped."""
    names = FIELDS[code]
    items = [fields.get(n) for n in names]
    # (not items[-1]: the engine is built with wraparound=False, where -1 reads out of bounds)
    while items and items[len(items) - 1] is None:
        items.pop()
    return Described(ULong(code), items)


def error_value(condition, description=None, info=None):
    """An error (2.8.14) for DETACH / END / CLOSE / rejected."""
    if condition is None:
        return None
    items = [Symbol(condition)]
    if description is not None or info is not None:
        items.append(description)
    if info is not None:
        items.append(info)
    return Described(ULong(D_ERROR), items)


cdef inline Py_ssize_t begin_frame(Writer w, int ftype, uint16_t channel) except -1:
    # 2.3.1: size (patched by end_frame), doff = 2 (no extended header), type, channel
    cdef Py_ssize_t start = w.length
    w.put_u32(0)
    w.put_u8(2)
    w.put_u8(<uint8_t>ftype)
    w.put_u16(channel)
    return start


cdef inline void end_frame(Writer w, Py_ssize_t start) noexcept:
    w.patch_u32(start, <uint32_t>(w.length - start))


cdef int write_control(Writer w, int ftype, uint16_t channel, int code, dict fields) except -1:
    cdef Py_ssize_t start = begin_frame(w, ftype, channel)
    w.w_value(make_described(code, fields))
    end_frame(w, start)
    return 0


# The delivery states the engine writes itself (3.4).
cdef bytes _STATE_ACCEPTED = b"\x00\x53\x24\x45"
cdef bytes _STATE_RELEASED = b"\x00\x53\x26\x45"


cdef bytes encode_state(int code, object detail):
    """An outcome encoded once: accepted/released are constants; rejected carries an error,
    modified its delivery-failed / undeliverable-here flags."""
    if code == D_ACCEPTED and detail is None:
        return _STATE_ACCEPTED
    if code == D_RELEASED and detail is None:
        return _STATE_RELEASED
    cdef Writer w = Writer(64)
    if code == D_REJECTED:
        w.w_value(Described(ULong(D_REJECTED), [detail] if detail is not None else []))
    elif code == D_MODIFIED:
        failed, undeliverable = detail if detail is not None else (True, False)
        w.w_value(Described(ULong(D_MODIFIED), [bool(failed), bool(undeliverable)]))
    else:
        w.w_value(Described(ULong(code), detail if detail is not None else []))
    return w.take()


def source_value(dict fields):
    """A source terminus (3.5.3) from a dict of its fields."""
    return make_described(D_SOURCE, fields)


def target_value(dict fields):
    """A target terminus (3.5.4) from a dict of its fields."""
    return make_described(D_TARGET, fields)
