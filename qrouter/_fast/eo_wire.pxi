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
# u32 is big-endian. The bytes come from another router, so decoding is bounded: a count
# cannot exceed the octets left (every value takes at least one), nesting stops at
# EO_MAX_DEPTH, and anything else malformed raises DecodeError.

from cpython.unicode cimport PyUnicode_DecodeUTF8


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
    EO_MAX_DEPTH = 16

# Append only: the index of a word is its encoding (a router reads what older ones wrote).
EO_WORDS = (
    "to", "from", "e", "n", "m", "ms", "op", "v", "topic",
    "t", "pub", "tag", "body", "targets", "subs", "att", "sub", "map", "closed", "instance",
    "attached", "known", "tags", "settled", "live",
    "FWD", "ACCEPT", "SETTLE", "SEEN", "SUB", "UNSUB", "SUBS", "ASK", "ANSWER", "PING", "PONG",
)
cdef tuple _EO_WORDS = tuple(__import__("sys").intern(w) for w in EO_WORDS)
cdef dict _EO_WORD_INDEX = {w: i for i, w in enumerate(_EO_WORDS)}


cdef int _eow_len(Writer w, Py_ssize_t n) except -1:
    if n > 0xFFFFFFFF:
        raise ValueError("eo_pack: value too long")
    w.put_u32(<uint32_t>n)
    return 0


cdef int _eow_pack(Writer w, object v, int depth) except -1:
    cdef int64_t x
    cdef Py_ssize_t n
    cdef const char* p
    cdef object word
    if depth > EO_MAX_DEPTH:
        raise ValueError("eo_pack: nested too deep")
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
        w.put_u8(EOW_LIST)
        _eow_len(w, len(<list>v))
        for item in <list>v:
            _eow_pack(w, item, depth + 1)
    elif isinstance(v, tuple):
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


cdef object _eow_unpack(EowReader* r, int depth):
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
        try:
            return PyUnicode_DecodeUTF8(<const char*>q, n, NULL)
        except UnicodeDecodeError:
            raise DecodeError("eo: invalid UTF-8") from None
    if kind == EOW_WORD:
        if r.pos >= r.end:
            raise DecodeError("eo: truncated")
        i = r.p[r.pos]
        r.pos += 1
        if i >= <uint32_t>len(_EO_WORDS):
            raise DecodeError(f"eo: unknown word {i}")
        return _EO_WORDS[i]
    if kind == EOW_LIST:
        n = _eow_read_u32(r)
        if <Py_ssize_t>n > r.end - r.pos:
            raise DecodeError("eo: count larger than the data")
        items = []
        for i in range(n):
            items.append(_eow_unpack(r, depth + 1))
        return items
    if kind == EOW_MAP:
        n = _eow_read_u32(r)
        if <Py_ssize_t>n > (r.end - r.pos) // 2:
            raise DecodeError("eo: count larger than the data")
        m = {}
        for i in range(n):
            if r.pos >= r.end or (r.p[r.pos] != EOW_STR and r.p[r.pos] != EOW_WORD):
                raise DecodeError("eo: a map key is not a string")
            key = _eow_unpack(r, depth + 1)
            m[key] = _eow_unpack(r, depth + 1)
        return m
    raise DecodeError(f"eo: unknown type {kind:#04x}")


def eo_unpack(bytes data):
    """The value `eo_pack` made; DecodeError for anything else."""
    cdef EowReader r
    r.p = <const uint8_t*>PyBytes_AS_STRING(data)
    r.pos = 0
    r.end = PyBytes_GET_SIZE(data)
    value = _eow_unpack(&r, 0)
    if r.pos != r.end:
        raise DecodeError("eo: trailing bytes")
    return value
