# Guaranteed topics' inter-router envelopes (qrouter/guarantee.py, docs/exactly-once.md) in a
# compact binary form: one `eo_pack` per next hop and loop iteration, one `eo_unpack` per
# control message received. The values are the protocol's plain maps (str, int, bytes, bool,
# None, list, map with str keys); decoded through the general AMQP codec they cost about
# 7 µs an envelope (every integer becomes a Long), here well under one. (Included by
# engine.pyx.)
#
# Encoding: one tag octet per value, then
#   0x00 null, 0x01 false, 0x02 true
#   0x03 int: 8 octets, signed big-endian
#   0x04 str: u32 length, UTF-8      0x05 bytes: u32 length, octets
#   0x06 list: u32 count, values     0x07 map: u32 count, (str key, value) pairs
#   0x08 word: 1 octet, an index into EO_WORDS (the protocol's field names and ops: decoded
#        as one shared str, hash already known, nothing copied)
#   0x09 record: u32 length L, then L octets: one of the per-message ops (FWD, ACCEPT,
#        SETTLE, SEEN), which qrouter/_fast/eo_core.pyx makes and takes as tuples headed by
#        the op (RECORD_OPS there). The L octets are an op code, then the op's fields:
#          s = u32 length + UTF-8; b = u32 length + octets; i = 8 octets, signed
#          att = s i i (router, instance, n); sub = s s (container, link)
#          1 FWD:    topic s, t b, pub sub, tag b, body b, u32 count, att...
#          2 ACCEPT: topic s, t b, u32 count, sub...
#          3 SETTLE: topic s, t b, u32 count, att...
#          4 SEEN:   topic s, t b, u32 count, sub...
#        decoded straight into the tuple: no map, no field names. A record that does not
#        parse (an unknown op code: a newer router's) decodes as None, which the receiver
#        drops and counts; the rest of the envelope is unaffected (its length frames it).
#   0x0A compact record: the same four records, smaller (an ACCEPT after the first of its
#        list: 96 -> 36 octets, most of them its out tag t). Sent only to a router whose
#        SUBS said `compact` (qrouter/eo/protocol.py) and that is its own next hop (a router
#        on the way decodes what it passes on, and re-encodes it as 0x09; one before the
#        compact records cannot: RouterOutbox.direct); the others get 0x09. Its octets:
#        v L (v = unsigned LEB128 varint), then L octets: a flags octet, then the fields:
#          s = v length + UTF-8; b = v length + octets; i = zigzag varint
#          att = s i i; sub = s s; a list = v count, then its items
#        flags: 0x07 the op code (as 0x09's), 0x08 topic, 0x10 t, 0x20 x, 0x40 targets: a
#        field whose bit is set is not written, it is the same as that of the previous compact
#        record of the same list ("ms": an envelope's messages), where x is the publisher
#        (FWD), the targets (SETTLE) or the subscribers (ACCEPT, SEEN) and SETTLE's targets
#        and FWD's are one field. 0x80 is reserved.
#          FWD:    topic, t, pub sub, tag b, body b, targets att list
#          SETTLE: topic, t, att list         ACCEPT / SEEN: topic, t, sub list
#        A compact record that does not parse decodes as None, like 0x09's, and so does every
#        later one of its list that refers back (the fields it would refer to are unknown).
# u32 is big-endian. The bytes come from another router, so decoding is bounded: a count
# cannot exceed the octets left (every value takes at least one), nesting stops at
# EO_MAX_DEPTH, and anything else malformed raises DecodeError.

from cpython.ref cimport Py_INCREF, PyObject
from cpython.list cimport PyList_New, PyList_SET_ITEM
from cpython.tuple cimport PyTuple_New, PyTuple_SET_ITEM
from cpython.unicode cimport PyUnicode_DecodeUTF8
from libc.string cimport memmove
from qrouter._fast.eo_core cimport (  # a record's op codes (below) are the core's record ops
    EoOut,
    REC_ACCEPT as EOR_ACCEPT,
    REC_FWD as EOR_FWD,
    REC_SEEN as EOR_SEEN,
    REC_SETTLE as EOR_SETTLE,
    RouterOutbox,
)


cdef extern from "Python.h":
    const char* PyUnicode_AsUTF8AndSize(object s, Py_ssize_t* size) except NULL

cdef enum:
    EOW_NULL = 0
    EOW_FALSE = 1
    EOW_TRUE = 2
    EOW_INT = 3
    EOW_STR = 4
    EOW_BYTES = 5
    EOW_LIST = 6
    EOW_MAP = 7
    EOW_WORD = 8
    EOW_REC = 9
    EOW_CREC = 10
    EO_MAX_DEPTH = 16
    # a list of at most this many items is made at its size before they are read: a count
    # the octets do not hold yet costs at most this many empty slots per level of nesting
    EO_LIST_PREALLOC = 64
    EOK_OP = 0x07           # a compact record's flags (the top)
    EOK_TOPIC = 0x08
    EOK_T = 0x10
    EOK_X = 0x20
    EOK_TARGETS = 0x40
    EOK_RESERVED = 0x80

# Append only: the index of a word is its encoding (a router reads what older ones wrote).
EO_WORDS = (
    "to", "from", "e", "n", "m", "ms", "op", "v", "topic",
    "t", "pub", "tag", "body", "targets", "subs", "att", "sub", "map", "closed", "instance",
    "attached", "known", "tags", "settled", "live",
    "FWD", "ACCEPT", "SETTLE", "SEEN", "SUB", "UNSUB", "SUBS", "ASK", "ANSWER", "PING", "PONG",
)
cdef tuple _EO_WORDS = tuple(__import__("sys").intern(w) for w in EO_WORDS)
cdef dict _EO_WORD_INDEX = {w: i for i, w in enumerate(_EO_WORDS)}
# a record's op code -> its op (the shared str of EO_WORDS), and back
cdef tuple _EOR_OPS = (None, _EO_WORDS[25], _EO_WORDS[26], _EO_WORDS[27], _EO_WORDS[28])
cdef dict _EOR_CODE = {"FWD": EOR_FWD, "ACCEPT": EOR_ACCEPT, "SETTLE": EOR_SETTLE,
                       "SEEN": EOR_SEEN}


cdef int _eow_len(Writer w, Py_ssize_t n) except -1:
    if n > 0xFFFFFFFF:
        raise ValueError("eo_pack: value too long")
    w.put_u32(<uint32_t>n)
    return 0


# A record's fields are written straight into the writer's buffer, room reserved once per
# field (no call per octet group); octet for octet what put_u32/put_raw would write.
cdef inline void _eor_u32_at(uint8_t* q, uint32_t v) noexcept:
    q[0] = <uint8_t>(v >> 24)
    q[1] = <uint8_t>(v >> 16)
    q[2] = <uint8_t>(v >> 8)
    q[3] = <uint8_t>v


cdef inline int _eor_lp(Writer w, const char* p, Py_ssize_t n) except -1:
    """u32 length n, then the n octets at p."""
    if n > 0xFFFFFFFF:
        raise ValueError("eo_pack: value too long")
    if w.length + 4 + n > w.capacity:
        w.grow(4 + n)
    _eor_u32_at(w.data + w.length, <uint32_t>n)
    memcpy(w.data + w.length + 4, p, n)
    w.length += 4 + n
    return 0


cdef int _eor_str(Writer w, object v) except -1:
    cdef Py_ssize_t n
    cdef const char* p
    if type(v) is not str:
        raise ValueError("eo_pack: a record field is not a str")
    p = PyUnicode_AsUTF8AndSize(v, &n)
    return _eor_lp(w, p, n)


cdef int _eor_bytes(Writer w, object v) except -1:
    if type(v) is not bytes:
        raise ValueError("eo_pack: a record field is not bytes")
    return _eor_lp(w, PyBytes_AS_STRING(v), PyBytes_GET_SIZE(v))


cdef int _eor_int(Writer w, object v) except -1:
    cdef int64_t x
    cdef uint64_t u
    if type(v) is not int:
        raise ValueError("eo_pack: a record field is not an int")
    try:
        x = v
    except OverflowError:
        raise ValueError("eo_pack: integer out of range") from None
    if w.length + 8 > w.capacity:
        w.grow(8)
    u = <uint64_t>x
    _eor_u32_at(w.data + w.length, <uint32_t>(u >> 32))
    _eor_u32_at(w.data + w.length + 4, <uint32_t>u)
    w.length += 8
    return 0


cdef int _eor_pair(Writer w, object v) except -1:
    if type(v) is not tuple or len(<tuple>v) != 2:
        raise ValueError("eo_pack: a subscriber is not a pair")
    _eor_str(w, (<tuple>v)[0])
    _eor_str(w, (<tuple>v)[1])
    return 0


cdef int _eor_atts(Writer w, object v) except -1:
    if type(v) is not tuple:
        raise ValueError("eo_pack: record targets are not a tuple")
    _eow_len(w, len(<tuple>v))
    for a in <tuple>v:
        if type(a) is not tuple or len(<tuple>a) != 3:
            raise ValueError("eo_pack: an attachment is not a triple")
        _eor_str(w, (<tuple>a)[0])
        _eor_int(w, (<tuple>a)[1])
        _eor_int(w, (<tuple>a)[2])
    return 0


cdef int _eor_subs(Writer w, object v) except -1:
    if type(v) is not tuple:
        raise ValueError("eo_pack: record subscribers are not a tuple")
    _eow_len(w, len(<tuple>v))
    for sub in <tuple>v:
        _eor_pair(w, sub)
    return 0


# A FWD's publisher pair and its targets are, message after message, the very same tuples
# (the origin record's publisher; the driver's groups, eo_core's _c_grouped): each one
# packed lately is kept with its octets (direct-mapped by address; the tuple is held, so
# an address names one object while kept, and tuples of str and int cannot change), and
# packed again by copying them. Pairs and targets, and their compact forms, are kept apart
# (a tuple kept as one kind is refused as another). Bounded: EOR_HELD slots of each kind.
cdef enum:
    EOR_HELD = 16           # a power of two
    EOH_PAIR = 0            # the kinds of octets kept
    EOH_ATTS = 1
    EOH_CPAIR = 2
    EOH_CATTS = 3
cdef list _eor_held_obj = [None] * (4 * EOR_HELD)
cdef list _eor_held_raw = [None] * (4 * EOR_HELD)


cdef int _eor_held_pack(Writer w, object v, int kind) except -1:
    """`v` packed as `kind` (_eor_pair, _eor_atts or their compact forms), from the octets
    kept for it if any."""
    cdef Py_ssize_t slot = ((<Py_ssize_t><PyObject*>v >> 4) & (EOR_HELD - 1)) + \
        kind * EOR_HELD
    cdef Py_ssize_t start = w.length, n
    if _eor_held_obj[slot] is v:
        raw = _eor_held_raw[slot]
        n = PyBytes_GET_SIZE(raw)
        if w.length + n > w.capacity:
            w.grow(n)
        memcpy(w.data + w.length, PyBytes_AS_STRING(raw), n)
        w.length += n
        return 0
    if kind == EOH_PAIR:
        _eor_pair(w, v)
    elif kind == EOH_ATTS:
        _eor_atts(w, v)
    elif kind == EOH_CPAIR:
        _eok_pair(w, v)
    else:
        _eok_atts(w, v)
    _eor_held_raw[slot] = PyBytes_FromStringAndSize(<const char*>(w.data + start),
                                                    w.length - start)
    _eor_held_obj[slot] = v
    return 0


cdef int _eor_pack(Writer w, tuple v, int code) except -1:
    """A per-message record given as its tuple (see the top)."""
    if len(v) != (7 if code == EOR_FWD else 4):
        raise ValueError("eo_pack: a record of the wrong length")
    if code == EOR_FWD:
        return _eor_fields(w, code, v[1], v[2], v[3], v[4], v[5], v[6])
    return _eor_fields(w, code, v[1], v[2], v[3], None, None, None)


cdef int _eor_fields(Writer w, int code, topic, t, x, tag, body, targets) except -1:
    """A per-message record (see the top) of its fields: tag, length (patched), op code,
    topic, t, then pub, tag, body and targets (FWD) or the subscribers or targets (`x`)."""
    cdef Py_ssize_t start
    if w.length + 6 > w.capacity:
        w.grow(6)
    w.data[w.length] = EOW_REC
    start = w.length + 1  # the length, patched below
    w.data[w.length + 5] = <uint8_t>code
    w.length += 6
    _eor_str(w, topic)
    _eor_bytes(w, t)
    if code == EOR_FWD:
        _eor_held_pack(w, x, EOH_PAIR)
        _eor_bytes(w, tag)
        _eor_bytes(w, body)
        _eor_held_pack(w, targets, EOH_ATTS)
    elif code == EOR_SETTLE:
        _eor_held_pack(w, x, EOH_ATTS)
    else:
        _eor_subs(w, x)
    if w.length - start - 4 > 0xFFFFFFFF:
        raise ValueError("eo_pack: record too long")
    w.patch_u32(start, <uint32_t>(w.length - start - 4))
    return 0


# The buffers of runs and of the messages that carry them (eo_message) are taken from those
# used before and given back, so they have grown to the size of an envelope once and cost no
# growth after. Bounded: EOR_SPARE buffers of at most EOR_SPARE_MAX octets are kept.
cdef enum:
    EOR_SPARE = 8
    EOR_SPARE_MAX = 1 << 16
cdef list _eor_spare = []


cdef inline Writer _eor_take_writer():
    if _eor_spare:
        return <Writer>_eor_spare.pop()
    return Writer(4096)


cdef inline void _eor_give_writer(Writer w) noexcept:
    if (w is not None and _eor_spare is not None and len(_eor_spare) < EOR_SPARE
            and w.capacity <= EOR_SPARE_MAX):
        w.length = 0
        _eor_spare.append(w)


@cython.final
cdef class EoRun:
    """Records to one router, written in the compact encoding as the engine applied them
    (`eo_send_record`): `n` consecutive messages of an envelope's list ("ms"), which
    _eow_pack writes as the n records they are, octet for octet what their tuples would be.
    Only ever an item of such a list."""
    cdef Writer w
    cdef Py_ssize_t n
    cdef bint compact  # its router is its own next hop: the records it reads compact go so
    # the fields of its last compact record (_eok_fields), which the next one may share
    cdef object c_topic, c_t, c_pub, c_atts, c_subs

    def __cinit__(self):
        self.w = _eor_take_writer()

    def __dealloc__(self):
        _eor_give_writer(self.w)

    def __len__(self):
        return self.n


# The compact records (0x0A at the top): varints for lengths, counts and integers, and the
# fields a record shares with the previous one of its run not written at all. Most of an
# ACCEPT or SEEN is its subscriber's names, of a SETTLE its targets, and the records of one
# envelope are mostly for one topic and a few subscribers or targets: written once a run.
cdef inline int _eok_varint(Writer w, uint64_t v) except -1:
    cdef uint8_t* q
    if w.length + 10 > w.capacity:
        w.grow(10)
    q = w.data + w.length
    while v >= 0x80:
        q[0] = <uint8_t>(v | 0x80)
        v >>= 7
        q += 1
    q[0] = <uint8_t>v
    w.length = q + 1 - w.data
    return 0


cdef inline int _eok_lp(Writer w, const char* p, Py_ssize_t n) except -1:
    """v length n, then the n octets at p."""
    _eok_varint(w, <uint64_t>n)
    if w.length + n > w.capacity:
        w.grow(n)
    memcpy(w.data + w.length, p, n)
    w.length += n
    return 0


cdef int _eok_str(Writer w, object v) except -1:
    cdef Py_ssize_t n
    cdef const char* p
    if type(v) is not str:
        raise ValueError("eo_pack: a record field is not a str")
    p = PyUnicode_AsUTF8AndSize(v, &n)
    return _eok_lp(w, p, n)


cdef int _eok_bytes(Writer w, object v) except -1:
    if type(v) is not bytes:
        raise ValueError("eo_pack: a record field is not bytes")
    return _eok_lp(w, PyBytes_AS_STRING(v), PyBytes_GET_SIZE(v))


cdef int _eok_int(Writer w, object v) except -1:
    cdef int64_t x
    if type(v) is not int:
        raise ValueError("eo_pack: a record field is not an int")
    try:
        x = v
    except OverflowError:
        raise ValueError("eo_pack: integer out of range") from None
    return _eok_varint(w, (<uint64_t>x << 1) ^ <uint64_t>(x >> 63))  # zigzag


cdef int _eok_pair(Writer w, object v) except -1:
    if type(v) is not tuple or len(<tuple>v) != 2:
        raise ValueError("eo_pack: a subscriber is not a pair")
    _eok_str(w, (<tuple>v)[0])
    _eok_str(w, (<tuple>v)[1])
    return 0


cdef int _eok_atts(Writer w, object v) except -1:
    if type(v) is not tuple:
        raise ValueError("eo_pack: record targets are not a tuple")
    _eok_varint(w, len(<tuple>v))
    for a in <tuple>v:
        if type(a) is not tuple or len(<tuple>a) != 3:
            raise ValueError("eo_pack: an attachment is not a triple")
        _eok_str(w, (<tuple>a)[0])
        _eok_int(w, (<tuple>a)[1])
        _eok_int(w, (<tuple>a)[2])
    return 0


cdef int _eok_subs(Writer w, object v) except -1:
    if type(v) is not tuple:
        raise ValueError("eo_pack: record subscribers are not a tuple")
    _eok_varint(w, len(<tuple>v))
    for sub in <tuple>v:
        _eok_pair(w, sub)
    return 0


cdef inline bint _eok_same(object prev, object v):
    """`v` is the previous record's field (then it packs to the same octets: the previous one
    was checked when written, and only values of the same type compare equal here)."""
    return prev is v or (prev is not None and type(prev) is type(v) and prev == v)


cdef int _eok_fields(Writer w, EoRun run, int code, topic, t, x, tag, body,
                     targets) except -1:
    """A per-message record as a compact record (the top), into `run`'s writer `w`; the run
    remembers its fields for the next one (only once it is whole: a record that fails leaves
    the run as it was, and the caller cuts its octets)."""
    cdef Py_ssize_t start, n, k
    cdef int flags = code
    cdef uint8_t* q
    if w.length + 3 > w.capacity:
        w.grow(3)
    w.data[w.length] = EOW_CREC
    start = w.length + 1  # the length: one octet, moved on below if it takes more
    w.length += 3
    if _eok_same(run.c_topic, topic):
        flags |= EOK_TOPIC
    else:
        _eok_str(w, topic)
    if _eok_same(run.c_t, t):
        flags |= EOK_T
    else:
        _eok_bytes(w, t)
    if code == EOR_FWD:
        if _eok_same(run.c_pub, x):
            flags |= EOK_X
        else:
            _eor_held_pack(w, x, EOH_CPAIR)
        _eok_bytes(w, tag)
        _eok_bytes(w, body)
        if _eok_same(run.c_atts, targets):
            flags |= EOK_TARGETS
        else:
            _eor_held_pack(w, targets, EOH_CATTS)
    elif code == EOR_SETTLE:
        if _eok_same(run.c_atts, x):
            flags |= EOK_X
        else:
            _eor_held_pack(w, x, EOH_CATTS)
    elif _eok_same(run.c_subs, x):
        flags |= EOK_X
    else:
        _eok_subs(w, x)
    w.data[start + 1] = <uint8_t>flags
    n = w.length - start - 1  # the flags and the fields
    if n >= 0x80:
        k = 1
        while (n >> (7 * k)) != 0:
            k += 1
        if w.length + k - 1 > w.capacity:
            w.grow(k - 1)
        memmove(w.data + start + k, w.data + start + 1, n)
        w.length += k - 1
    q = w.data + start
    while n >= 0x80:
        q[0] = <uint8_t>(n | 0x80)
        n >>= 7
        q += 1
    q[0] = <uint8_t>n
    run.c_topic = topic
    run.c_t = t
    if code == EOR_FWD:
        run.c_pub = x
        run.c_atts = targets
    elif code == EOR_SETTLE:
        run.c_atts = x
    else:
        run.c_subs = x
    return 0


cdef int eo_send_record(RouterOutbox outbox, EoOut *o) except -1:
    """An OUT_RECORD (eo_core.pxd) to its router, applied after the commit like any output
    (`EoLinks.apply_outputs`): written straight into the run at the end of the router's
    envelope of this loop iteration, or into a new run that `outbox` puts where it would
    have put the record's tuple (a new envelope; dropped if the router is down). So a record
    takes its place among the router's other messages, in order, and makes no tuple."""
    cdef EoRun run = None
    cdef Py_ssize_t start
    router = <object>o.a
    group = outbox.c_open(router)
    if group is not None and len(<list>group):
        last = (<list>group)[len(<list>group) - 1]
        if type(last) is EoRun:
            run = <EoRun>last
    if run is None:
        run = EoRun()
        run.compact = router in outbox.direct
        outbox.c_send(router, run)
    start = run.w.length
    try:
        if o.flag and run.compact:  # a router that reads them (_c_record_to_peer), no relay
            _eok_fields(run.w, run, o.op, <object>o.topic, <object>o.b, <object>o.c,
                        <object>o.d, <object>o.e, <object>o.f)
        else:
            _eor_fields(run.w, o.op, <object>o.topic, <object>o.b, <object>o.c, <object>o.d,
                        <object>o.e, <object>o.f)
    except BaseException:
        run.w.length = start  # (a field of the wrong type: the run keeps whole records)
        raise
    run.n += 1
    return 0


cdef int _eow_pack(Writer w, object v, int depth) except -1:
    cdef int64_t x
    cdef Py_ssize_t n
    cdef const char* p
    cdef object word
    if depth > EO_MAX_DEPTH:
        raise ValueError("eo_pack: nested too deep")
    if type(v) is tuple and len(<tuple>v) > 0 and type((<tuple>v)[0]) is str:
        word = _EOR_CODE.get((<tuple>v)[0])  # a record, the most common value here
        if word is not None:
            return _eor_pack(w, <tuple>v, <int>word)
    if v is None:
        w.put_u8(EOW_NULL)
    elif v is True:
        w.put_u8(EOW_TRUE)
    elif v is False:
        w.put_u8(EOW_FALSE)
    elif isinstance(v, int):
        try:
            x = v
        except OverflowError:
            raise ValueError("eo_pack: integer out of range") from None
        w.put_u8(EOW_INT)
        w.put_u64(<uint64_t>x)
    elif isinstance(v, str):
        word = _EO_WORD_INDEX.get(v)
        if word is not None:
            w.put_u8(EOW_WORD)
            w.put_u8(<uint8_t>(<int>word))
            return 0
        p = PyUnicode_AsUTF8AndSize(v, &n)
        w.put_u8(EOW_STR)
        _eow_len(w, n)
        w.put_raw(<const uint8_t*>p, n)
    elif isinstance(v, bytes):
        w.put_u8(EOW_BYTES)
        _eow_len(w, PyBytes_GET_SIZE(v))
        w.put_raw(<const uint8_t*>PyBytes_AS_STRING(v), PyBytes_GET_SIZE(v))
    elif isinstance(v, (bytearray, memoryview)):
        _eow_pack(w, bytes(v), depth)
    elif isinstance(v, list):
        n = len(<list>v)
        for item in <list>v:
            if type(item) is EoRun:
                n += (<EoRun>item).n - 1
        w.put_u8(EOW_LIST)
        _eow_len(w, n)
        for item in <list>v:
            if type(item) is EoRun:  # records already written (a run counts as its n)
                w.put_raw((<EoRun>item).w.data, (<EoRun>item).w.length)
            else:
                _eow_pack(w, item, depth + 1)
    elif isinstance(v, tuple):  # (a record went above)
        w.put_u8(EOW_LIST)
        _eow_len(w, len(<tuple>v))
        for item in <tuple>v:
            _eow_pack(w, item, depth + 1)
    elif isinstance(v, dict):
        w.put_u8(EOW_MAP)
        _eow_len(w, len(<dict>v))
        for key, item in (<dict>v).items():
            if not isinstance(key, str):
                raise ValueError("eo_pack: map keys are str")
            _eow_pack(w, key, depth + 1)
            _eow_pack(w, item, depth + 1)
    else:
        raise ValueError(f"eo_pack: cannot encode {type(v).__name__}")
    return 0


def eo_pack(value):
    """`value` (the protocol's plain maps and lists) as the compact encoding above."""
    cdef Writer w = Writer(1024)
    _eow_pack(w, value, 0)
    return PyBytes_FromStringAndSize(<const char*>w.data, w.length)


cdef struct EowReader:
    const uint8_t* p
    Py_ssize_t pos
    Py_ssize_t end


cdef inline uint32_t _eow_read_u32(EowReader* r) except? 0xFFFFFFFF:
    cdef const uint8_t* q
    if r.end - r.pos < 4:
        raise DecodeError("eo: truncated")
    q = r.p + r.pos
    r.pos += 4
    return (<uint32_t>q[0] << 24) | (<uint32_t>q[1] << 16) | (<uint32_t>q[2] << 8) | q[3]


cdef inline int _eor_need(EowReader* r, Py_ssize_t n) except -1:
    if r.end - r.pos < n:
        raise DecodeError("eo: truncated record")
    return 0


# The strings of envelopes and records are names (router ids, topics, container and link
# names) that repeat from one message to the next. Each one decoded is kept in a small
# direct-mapped cache (_eo_hash of its octets -> slot), so a name seen before comes back as the
# same str: no UTF-8 decode, no allocation, its hash already known and the dict lookups that
# follow matched by identity. Bounded: EO_NAMES slots of at most EO_NAME_MAX octets each; a
# peer that sends ever new names only replaces slots (and pays the decode, as without it).
cdef enum:
    EO_NAMES = 256          # a power of two
    EO_NAME_MAX = 96
cdef list _eo_names = [None] * EO_NAMES


cdef inline uint32_t _eo_hash(const uint8_t* q, Py_ssize_t n) noexcept:
    """A hash of the octets q[0:n] that picks a slot of the caches below, taken eight octets
    at a time (a record's span is some 40 octets: byte by byte, as FNV-1a went, its serial
    multiplies cost more than the compare that confirms a hit). Only a slot: a hit is the
    octets compared equal, so a collision (or a peer that makes them) costs a decode."""
    cdef uint64_t h = <uint64_t>n * 0x9E3779B97F4A7C15u, w
    cdef Py_ssize_t i = 0, j
    while i + 8 <= n:
        memcpy(&w, q + i, 8)  # (one load)
        h = (h ^ w) * 0xFF51AFD7ED558CCDu
        h ^= h >> 32
        i += 8
    if i < n:
        w = 0
        for j in range(n - i):  # (the last 1-7 octets: no call of memcpy for them)
            w |= <uint64_t>q[i + j] << (8 * j)
        h = (h ^ w) * 0xFF51AFD7ED558CCDu
        h ^= h >> 32
    h *= 0xC4CEB9FE1A85EC53u
    return <uint32_t>(h >> 32)


cdef object _eo_str(const uint8_t* q, uint32_t n):
    """The str of the UTF-8 octets q[0:n] (DecodeError if they are not UTF-8)."""
    cdef uint32_t slot = 0
    cdef Py_ssize_t m
    cdef const char* c
    if n <= EO_NAME_MAX:
        slot = _eo_hash(q, n) & (EO_NAMES - 1)
        known = _eo_names[slot]
        if known is not None:
            c = PyUnicode_AsUTF8AndSize(known, &m)
            if m == n and memcmp(c, q, n) == 0:
                return known
    try:
        s = PyUnicode_DecodeUTF8(<const char*>q, n, NULL)
    except UnicodeDecodeError:
        raise DecodeError("eo: invalid UTF-8") from None
    if n <= EO_NAME_MAX:
        _eo_names[slot] = s
    return s


cdef object _eor_str_of(EowReader* r):
    cdef uint32_t n = _eow_read_u32(r)
    cdef const uint8_t* q
    _eor_need(r, n)
    q = r.p + r.pos
    r.pos += n
    return _eo_str(q, n)


cdef bytes _eor_bytes_of(EowReader* r):
    cdef uint32_t n = _eow_read_u32(r)
    _eor_need(r, n)
    r.pos += n
    return PyBytes_FromStringAndSize(<const char*>(r.p + r.pos - n), n)


cdef int64_t _eor_int_of(EowReader* r) except? -1:
    cdef const uint8_t* q
    cdef uint64_t u = 0
    cdef int i
    _eor_need(r, 8)
    q = r.p + r.pos
    r.pos += 8
    for i in range(8):
        u = (u << 8) | q[i]
    return <int64_t>u


cdef tuple _eor_atts_of(EowReader* r):
    cdef uint32_t n = _eow_read_u32(r)
    cdef uint32_t i
    if <Py_ssize_t>n > (r.end - r.pos) // 20:  # an attachment takes at least 20 octets
        raise DecodeError("eo: count larger than the record")
    out = PyTuple_New(n)
    for i in range(n):
        a = (_eor_str_of(r), _eor_int_of(r), _eor_int_of(r))
        Py_INCREF(a)
        PyTuple_SET_ITEM(out, i, a)
    return <tuple>out


cdef tuple _eor_subs_of(EowReader* r):
    cdef uint32_t n = _eow_read_u32(r)
    cdef uint32_t i
    if <Py_ssize_t>n > (r.end - r.pos) // 8:  # a subscriber takes at least 8 octets
        raise DecodeError("eo: count larger than the record")
    out = PyTuple_New(n)
    for i in range(n):
        sub = (_eor_str_of(r), _eor_str_of(r))
        Py_INCREF(sub)
        PyTuple_SET_ITEM(out, i, sub)
    return <tuple>out


# A record's publisher pair and its targets (or subscribers) repeat too: the same octets
# from one message to the next (one publisher link, the same attachments behind a router).
# The tuple decoded from such a span is kept the same way as the names above (_eo_hash of the
# octets and the kind of span -> slot; the octets compared before a hit), so a span seen
# before costs a hash and a compare: no str looked up, no int or tuple made. Only a span
# that decoded whole is kept, and the tuples hold only str and int: sharing them is safe.
# Bounded like the names: EO_SPANS slots per kind of at most EO_SPAN_MAX octets each.
cdef enum:
    EO_SPANS = 64           # a power of two
    EO_SPAN_MAX = 256
    EOS_PUB = 0             # the kinds of span
    EOS_ATTS = 1
    EOS_SUBS = 2
    EOS_CPUB = 3            # (a compact record's: other octets for the same values)
    EOS_CATTS = 4
    EOS_CSUBS = 5
cdef list _eo_span_raw = [None] * (6 * EO_SPANS)   # slot -> the octets (bytes)
cdef list _eo_span_val = [None] * (6 * EO_SPANS)   # slot -> the tuple decoded from them


cdef Py_ssize_t _eo_span_slot(const uint8_t* q, Py_ssize_t n, int kind) noexcept:
    return kind * EO_SPANS + (_eo_hash(q, n) & (EO_SPANS - 1))


cdef object _eo_span_known(Py_ssize_t slot, const uint8_t* q, Py_ssize_t n):
    """The tuple kept in `slot` if it was decoded from the octets q[0:n], else None."""
    raw = _eo_span_raw[slot]
    if raw is not None and PyBytes_GET_SIZE(raw) == n and memcmp(
            PyBytes_AS_STRING(raw), q, n) == 0:
        return _eo_span_val[slot]
    return None


cdef tuple _eor_pub_of(EowReader* r):
    """A publisher (container, link): two length-prefixed strs."""
    cdef Py_ssize_t start = r.pos, n, slot = -1
    cdef uint32_t a, b
    a = _eow_read_u32(r)
    _eor_need(r, a)
    r.pos += a
    b = _eow_read_u32(r)
    _eor_need(r, b)
    n = r.pos + b - start
    r.pos = start
    if n <= EO_SPAN_MAX:
        slot = _eo_span_slot(r.p + start, n, EOS_PUB)
        known = _eo_span_known(slot, r.p + start, n)
        if known is not None:
            r.pos = start + n
            return <tuple>known
    pub = (_eor_str_of(r), _eor_str_of(r))
    if slot >= 0:
        _eo_span_raw[slot] = PyBytes_FromStringAndSize(<const char*>(r.p + start), n)
        _eo_span_val[slot] = pub
    return pub


cdef tuple _eor_rest_of(EowReader* r, int kind):
    """A record's last field, the rest of it: its targets (EOS_ATTS, EOS_CATTS) or
    subscribers (EOS_SUBS, EOS_CSUBS); the reader ends at the record's end, or DecodeError."""
    cdef Py_ssize_t start = r.pos, n = r.end - r.pos, slot = -1
    cdef tuple value
    if n <= EO_SPAN_MAX:
        slot = _eo_span_slot(r.p + start, n, kind)
        known = _eo_span_known(slot, r.p + start, n)
        if known is not None:
            r.pos = r.end
            return <tuple>known
    if kind == EOS_ATTS:
        value = _eor_atts_of(r)
    elif kind == EOS_SUBS:
        value = _eor_subs_of(r)
    elif kind == EOS_CATTS:
        value = _eok_atts_of(r)
    else:
        value = _eok_subs_of(r)
    if r.pos != r.end:
        raise DecodeError("eo: trailing octets in a record")
    if slot >= 0:
        _eo_span_raw[slot] = PyBytes_FromStringAndSize(<const char*>(r.p + start), n)
        _eo_span_val[slot] = value
    return value


cdef object _eor_unpack(EowReader* outer):
    """A record of `length` octets at outer's position (see the top): its tuple, or None if
    it does not parse; the outer reader moves past it either way."""
    cdef uint32_t n = _eow_read_u32(outer)
    cdef EowReader r
    cdef int code
    if <Py_ssize_t>n > outer.end - outer.pos:
        raise DecodeError("eo: truncated")
    r.p = outer.p
    r.pos = outer.pos
    r.end = outer.pos + n
    outer.pos += n
    try:
        _eor_need(&r, 1)
        code = r.p[r.pos]
        r.pos += 1
        if code < EOR_FWD or code > EOR_SEEN:
            return None  # a newer router's op: dropped (and counted) by the receiver
        op = _EOR_OPS[code]
        topic = _eor_str_of(&r)
        t = _eor_bytes_of(&r)
        if code == EOR_FWD:
            pub = _eor_pub_of(&r)
            tag = _eor_bytes_of(&r)
            body = _eor_bytes_of(&r)
            value = (op, topic, t, pub, tag, body, _eor_rest_of(&r, EOS_ATTS))
        elif code == EOR_SETTLE:
            value = (op, topic, t, _eor_rest_of(&r, EOS_ATTS))
        else:
            value = (op, topic, t, _eor_rest_of(&r, EOS_SUBS))
        if r.pos != r.end:
            return None
        return value
    except DecodeError:
        return None


# The compact records (0x0A at the top), read. A router started with QROUTER_EO_COMPACT=0
# neither says in its SUBS that it reads them (qrouter/eo/protocol.py) nor reads them: it
# takes 0x0A as an unknown type, as a router before them does (the batch is dropped), so a
# test can run a mesh with such a router (tests/guarantee/test_mesh.py).
cdef bint _eok_reads = __import__("os").environ.get("QROUTER_EO_COMPACT", "1") != "0"


@cython.final
cdef class _EokCtx:
    """The fields of the last compact record read in a list, which the next may share.
    `budget`: the attachments and subscribers the list's records may still take by
    reference, at most one per octet of the list. A reference costs about 3 octets however
    long the list it repeats, and the receiver works per attachment of every record, so
    without it a peer could make one envelope name hundreds of millions of them."""
    cdef object topic, t, pub, atts, subs
    cdef Py_ssize_t budget


cdef inline object _eok_prev_list(_EokCtx ctx, object v):
    if v is None:
        raise DecodeError("eo: a compact record refers to no record")
    ctx.budget -= len(v)
    if ctx.budget < 0:
        raise DecodeError("eo: compact records refer to more than the list's octets allow")
    return v


cdef inline uint64_t _eok_varint_of(EowReader* r) except? 0xFFFFFFFFFFFFFFFF:
    cdef uint64_t v = 0, b
    cdef int shift = 0
    while True:
        if r.pos >= r.end:
            raise DecodeError("eo: truncated")
        b = r.p[r.pos]
        r.pos += 1
        if shift == 63 and b > 1:
            raise DecodeError("eo: varint out of range")
        v |= (b & 0x7F) << shift
        if b < 0x80:
            return v
        shift += 7


cdef inline Py_ssize_t _eok_len_of(EowReader* r) except -1:
    """A length (v) of octets that follow: DecodeError if they are not all there."""
    cdef uint64_t n = _eok_varint_of(r)
    if n > <uint64_t>(r.end - r.pos):
        raise DecodeError("eo: truncated record")
    return <Py_ssize_t>n


cdef object _eok_str_of(EowReader* r):
    cdef Py_ssize_t n = _eok_len_of(r)
    r.pos += n
    return _eo_str(r.p + r.pos - n, <uint32_t>n)


cdef bytes _eok_bytes_of(EowReader* r):
    cdef Py_ssize_t n = _eok_len_of(r)
    r.pos += n
    return PyBytes_FromStringAndSize(<const char*>(r.p + r.pos - n), n)


cdef int64_t _eok_int_of(EowReader* r) except? -1:
    cdef uint64_t u = _eok_varint_of(r)
    return <int64_t>((u >> 1) ^ (0 - (u & 1)))  # zigzag


cdef tuple _eok_atts_of(EowReader* r):
    cdef uint64_t n = _eok_varint_of(r)
    cdef Py_ssize_t i
    if n > <uint64_t>((r.end - r.pos) // 3):  # an attachment takes at least 3 octets
        raise DecodeError("eo: count larger than the record")
    out = PyTuple_New(<Py_ssize_t>n)
    for i in range(<Py_ssize_t>n):
        a = (_eok_str_of(r), _eok_int_of(r), _eok_int_of(r))
        Py_INCREF(a)
        PyTuple_SET_ITEM(out, i, a)
    return <tuple>out


cdef tuple _eok_subs_of(EowReader* r):
    cdef uint64_t n = _eok_varint_of(r)
    cdef Py_ssize_t i
    if n > <uint64_t>((r.end - r.pos) // 2):  # a subscriber takes at least 2 octets
        raise DecodeError("eo: count larger than the record")
    out = PyTuple_New(<Py_ssize_t>n)
    for i in range(<Py_ssize_t>n):
        sub = (_eok_str_of(r), _eok_str_of(r))
        Py_INCREF(sub)
        PyTuple_SET_ITEM(out, i, sub)
    return <tuple>out


cdef tuple _eok_pub_of(EowReader* r):
    """A publisher (container, link): two strs, kept like _eor_pub_of's."""
    cdef Py_ssize_t start = r.pos, n, slot = -1
    r.pos += _eok_len_of(r)
    r.pos += _eok_len_of(r)
    n = r.pos - start
    r.pos = start
    if n <= EO_SPAN_MAX:
        slot = _eo_span_slot(r.p + start, n, EOS_CPUB)
        known = _eo_span_known(slot, r.p + start, n)
        if known is not None:
            r.pos = start + n
            return <tuple>known
    pub = (_eok_str_of(r), _eok_str_of(r))
    if slot >= 0:
        _eo_span_raw[slot] = PyBytes_FromStringAndSize(<const char*>(r.p + start), n)
        _eo_span_val[slot] = pub
    return pub


cdef inline object _eok_prev(object v):
    if v is None:
        raise DecodeError("eo: a compact record refers to no record")
    return v


cdef object _eok_unpack(EowReader* outer, _EokCtx ctx):
    """A compact record at outer's position (past its type): its tuple, or None if it does
    not parse (then the fields of `ctx` are forgotten: a later record that refers to them
    is None too); the outer reader moves past it either way."""
    cdef uint64_t n = _eok_varint_of(outer)
    cdef EowReader r
    cdef int flags, code
    if n > <uint64_t>(outer.end - outer.pos):
        raise DecodeError("eo: truncated")
    r.p = outer.p
    r.pos = outer.pos
    r.end = outer.pos + <Py_ssize_t>n
    outer.pos = r.end
    if ctx is None:  # (not in a list: nothing to refer to)
        ctx = _EokCtx.__new__(_EokCtx)
    pub = x = targets = None
    try:
        _eor_need(&r, 1)
        flags = r.p[r.pos]
        r.pos += 1
        code = flags & EOK_OP
        if flags & EOK_RESERVED or code < EOR_FWD or code > EOR_SEEN:
            # a newer router's: dropped (and counted) by the receiver, and the context
            # forgotten, as the next record may refer to this one's fields
            raise DecodeError("eo: a compact record of a kind this router does not know")
        if code != EOR_FWD and flags & EOK_TARGETS:
            raise DecodeError("eo: a FWD's flag on another record")
        op = _EOR_OPS[code]
        topic = _eok_prev(ctx.topic) if flags & EOK_TOPIC else _eok_str_of(&r)
        t = _eok_prev(ctx.t) if flags & EOK_T else _eok_bytes_of(&r)
        if code == EOR_FWD:
            pub = _eok_prev(ctx.pub) if flags & EOK_X else _eok_pub_of(&r)
            tag = _eok_bytes_of(&r)
            body = _eok_bytes_of(&r)
            if flags & EOK_TARGETS:
                targets = _eok_prev_list(ctx, ctx.atts)
            else:
                targets = _eor_rest_of(&r, EOS_CATTS)
            value = (op, topic, t, pub, tag, body, targets)
        else:
            if flags & EOK_X:
                x = _eok_prev_list(ctx, ctx.atts if code == EOR_SETTLE else ctx.subs)
            else:
                x = _eor_rest_of(&r, EOS_CATTS if code == EOR_SETTLE else EOS_CSUBS)
            value = (op, topic, t, x)
        if r.pos != r.end:
            raise DecodeError("eo: trailing octets in a record")
    except DecodeError:
        ctx.topic = ctx.t = ctx.pub = ctx.atts = ctx.subs = None
        return None
    ctx.topic = topic
    ctx.t = t
    if code == EOR_FWD:
        ctx.pub = pub
        ctx.atts = targets
    elif code == EOR_SETTLE:
        ctx.atts = x
    else:
        ctx.subs = x
    return value


cdef object _eow_unpack(EowReader* r, int depth, _EokCtx ctx):
    """The value at r's position; `ctx` the compact records' context of the list it is in."""
    cdef uint8_t kind
    cdef uint32_t n, i
    cdef uint64_t u
    cdef const uint8_t* q
    cdef object key
    cdef list items
    cdef dict m
    if depth > EO_MAX_DEPTH:
        raise DecodeError("eo: nested too deep")
    if r.pos >= r.end:
        raise DecodeError("eo: truncated")
    kind = r.p[r.pos]
    r.pos += 1
    if kind == EOW_NULL:
        return None
    if kind == EOW_FALSE:
        return False
    if kind == EOW_TRUE:
        return True
    if kind == EOW_INT:
        if r.end - r.pos < 8:
            raise DecodeError("eo: truncated")
        q = r.p + r.pos
        r.pos += 8
        u = 0
        for i in range(8):
            u = (u << 8) | q[i]
        return <int64_t>u
    if kind == EOW_STR or kind == EOW_BYTES:
        n = _eow_read_u32(r)
        if <Py_ssize_t>n > r.end - r.pos:
            raise DecodeError("eo: truncated")
        q = r.p + r.pos
        r.pos += n
        if kind == EOW_BYTES:
            return PyBytes_FromStringAndSize(<const char*>q, n)
        return _eo_str(q, n)
    if kind == EOW_WORD:
        if r.pos >= r.end:
            raise DecodeError("eo: truncated")
        i = r.p[r.pos]
        r.pos += 1
        if i >= <uint32_t>len(_EO_WORDS):
            raise DecodeError(f"eo: unknown word {i}")
        return _EO_WORDS[i]
    if kind == EOW_REC:
        return _eor_unpack(r)
    if kind == EOW_CREC and _eok_reads:
        return _eok_unpack(r, ctx)
    if kind == EOW_LIST:
        n = _eow_read_u32(r)
        if <Py_ssize_t>n > r.end - r.pos:
            raise DecodeError("eo: count larger than the data")
        ctx = _EokCtx.__new__(_EokCtx)  # (the list's own: its records refer to each other)
        ctx.budget = r.end - r.pos
        if n > EO_LIST_PREALLOC:
            items = []
            for i in range(n):
                items.append(_eow_unpack(r, depth + 1, ctx))
            return items
        # (a short list, as an envelope's messages mostly are: made at its size, no growth;
        # one that fails part way is let go with its empty slots, which list_dealloc skips)
        items = PyList_New(n)
        for i in range(n):
            item = _eow_unpack(r, depth + 1, ctx)
            Py_INCREF(item)
            PyList_SET_ITEM(items, i, item)
        return items
    if kind == EOW_MAP:
        n = _eow_read_u32(r)
        if <Py_ssize_t>n > (r.end - r.pos) // 2:
            raise DecodeError("eo: count larger than the data")
        m = {}
        for i in range(n):
            if r.pos >= r.end or (r.p[r.pos] != EOW_STR and r.p[r.pos] != EOW_WORD):
                raise DecodeError("eo: a map key is not a string")
            key = _eow_unpack(r, depth + 1, None)
            m[key] = _eow_unpack(r, depth + 1, None)
        return m
    raise DecodeError(f"eo: unknown type {kind:#04x}")


def eo_unpack(bytes data):
    """The value `eo_pack` made; DecodeError for anything else."""
    cdef EowReader r
    r.p = <const uint8_t*>PyBytes_AS_STRING(data)
    r.pos = 0
    r.end = PyBytes_GET_SIZE(data)
    value = _eow_unpack(&r, 0, None)
    if r.pos != r.end:
        raise DecodeError("eo: trailing bytes")
    return value
