# AMQP 1.0 type system (part 1, "Types"): the C-level reader and writer the engine uses on
# the per-message path, and the generic Python-object codec used on the control path.

from libc.stdint cimport int64_t, uint8_t, uint16_t, uint32_t, uint64_t


# 1.6 primitive type encodings: the format codes the engine writes or tests directly.
cdef enum FormatCode:
    FC_DESCRIBED = 0x00
    FC_NULL = 0x40
    FC_BOOL = 0x56
    FC_TRUE = 0x41
    FC_FALSE = 0x42
    FC_UBYTE = 0x50
    FC_USHORT = 0x60
    FC_UINT = 0x70
    FC_SMALLUINT = 0x52
    FC_UINT0 = 0x43
    FC_ULONG = 0x80
    FC_SMALLULONG = 0x53
    FC_ULONG0 = 0x44
    FC_BYTE = 0x51
    FC_SHORT = 0x61
    FC_INT = 0x71
    FC_SMALLINT = 0x54
    FC_LONG = 0x81
    FC_SMALLLONG = 0x55
    FC_FLOAT = 0x72
    FC_DOUBLE = 0x82
    FC_DECIMAL32 = 0x74
    FC_DECIMAL64 = 0x84
    FC_DECIMAL128 = 0x94
    FC_CHAR = 0x73
    FC_TIMESTAMP = 0x83
    FC_UUID = 0x98
    FC_VBIN8 = 0xa0
    FC_VBIN32 = 0xb0
    FC_STR8 = 0xa1
    FC_STR32 = 0xb1
    FC_SYM8 = 0xa3
    FC_SYM32 = 0xb3
    FC_LIST0 = 0x45
    FC_LIST8 = 0xc0
    FC_LIST32 = 0xd0
    FC_MAP8 = 0xc1
    FC_MAP32 = 0xd1
    FC_ARRAY8 = 0xe0
    FC_ARRAY32 = 0xf0


# A growable output buffer. One per connection: every frame for that peer is encoded straight
# into it, and the server hands its bytes to the transport once per loop iteration.
cdef class Writer:
    cdef uint8_t* data
    cdef Py_ssize_t length
    cdef Py_ssize_t capacity

    cdef int grow(self, Py_ssize_t need) except -1
    cdef int reserve(self, Py_ssize_t n) except -1
    cdef int put_u8(self, uint8_t v) except -1
    cdef int put_u16(self, uint16_t v) except -1
    cdef int put_u32(self, uint32_t v) except -1
    cdef int put_u64(self, uint64_t v) except -1
    cdef int put_raw(self, const uint8_t* p, Py_ssize_t n) except -1
    cdef void patch_u32(self, Py_ssize_t pos, uint32_t v) noexcept

    cdef int w_null(self) except -1
    cdef int w_bool(self, bint v) except -1
    cdef int w_ubyte(self, uint8_t v) except -1
    cdef int w_ushort(self, uint16_t v) except -1
    cdef int w_uint(self, uint32_t v) except -1
    cdef int w_ulong(self, uint64_t v) except -1
    cdef int w_long(self, int64_t v) except -1
    cdef int w_binary(self, const uint8_t* p, Py_ssize_t n) except -1
    cdef int w_string(self, const uint8_t* p, Py_ssize_t n) except -1
    cdef int w_symbol(self, const uint8_t* p, Py_ssize_t n) except -1
    cdef int w_descriptor(self, uint64_t code) except -1
    cdef Py_ssize_t begin_list(self) except -1
    cdef void end_list(self, Py_ssize_t pos, uint32_t count) noexcept
    cdef int w_value(self, object v) except -1
    cdef int _shrink(self, Py_ssize_t pos) except -1
    cdef int _w_double(self, double d) except -1
    cdef int _w_float(self, float f) except -1
    cdef int _w_array(self, object arr) except -1
    cdef int _w_element(self, int code, object v) except -1

    cdef bytes take(self)
    cdef void clear(self) noexcept


# The deepest nesting a decode accepts: described values, lists, maps and arrays inside one
# another (1.5, 1.6.22-1.6.24). Real AMQP needs under 10 (a performative's source holds a
# filter map of described values); anything deeper is refused with DecodeError
# (amqp:decode-error, 2.8.15) before the level is entered, so no peer controls how deep the
# decoder recurses.
cdef enum:
    MAX_NESTING = 64


# A cursor over bytes held elsewhere (the frame buffer); it never copies.
cdef struct Reader:
    const uint8_t* p
    Py_ssize_t n
    Py_ssize_t pos


# The per-field readers the engine calls on the per-message path: defined here, inline, so
# that they compile into the engine module (a cross-module call cannot be inlined).

cdef int raise_decode_error(str message) except -1

cdef inline int r_need(Reader* r, Py_ssize_t k) except -1:
    if r.pos + k > r.n:
        raise_decode_error(f"truncated: need {k} bytes at offset {r.pos}, have {r.n - r.pos}")
    return 0


cdef inline int r_u8(Reader* r) except -1:
    r_need(r, 1)
    r.pos += 1
    return r.p[r.pos - 1]


cdef inline uint32_t r_be32(Reader* r) except? 0xffffffff:
    r_need(r, 4)
    cdef const uint8_t* p = r.p + r.pos
    r.pos += 4
    return (<uint32_t>p[0] << 24) | (<uint32_t>p[1] << 16) | (<uint32_t>p[2] << 8) | p[3]


cdef inline int r_is_null(Reader* r) except -1:
    r_need(r, 1)
    if r.p[r.pos] == FC_NULL:
        r.pos += 1
        return 1
    return 0


cdef inline int r_uint(Reader* r, uint32_t* out) except -1:
    """Read a uint (any encoding); 0 if it was null, 1 if a value was stored."""
    cdef int code = r_u8(r)
    if code == FC_UINT0:
        out[0] = 0
    elif code == FC_SMALLUINT or code == FC_UBYTE:
        out[0] = r_u8(r)
    elif code == FC_UINT:
        out[0] = r_be32(r)
    elif code == FC_USHORT:
        r_need(r, 2)
        out[0] = (<uint32_t>r.p[r.pos] << 8) | r.p[r.pos + 1]
        r.pos += 2
    elif code == FC_NULL:
        return 0
    else:
        raise_decode_error(f"expected uint, found format code 0x{code:02x}")
    return 1


cdef inline int r_bool(Reader* r, bint* out) except -1:
    cdef int code = r_u8(r)
    if code == FC_TRUE:
        out[0] = True
    elif code == FC_FALSE:
        out[0] = False
    elif code == FC_BOOL:
        out[0] = r_u8(r) != 0
    elif code == FC_NULL:
        return 0
    else:
        raise_decode_error(f"expected boolean, found format code 0x{code:02x}")
    return 1


cdef inline int r_binary(Reader* r, const uint8_t** out, Py_ssize_t* n) except -1:
    cdef int code = r_u8(r)
    cdef uint32_t size = 0
    if code == FC_VBIN8:
        size = r_u8(r)
    elif code == FC_VBIN32:
        size = r_be32(r)
    elif code == FC_NULL:
        return 0
    else:
        raise_decode_error(f"expected binary, found format code 0x{code:02x}")
    r_need(r, size)
    out[0] = r.p + r.pos
    n[0] = size
    r.pos += size
    return 1


cdef inline int r_list(Reader* r, uint32_t* count, Py_ssize_t* end) except -1:
    """Enter a list: its item count and the offset just past it. 0 if null."""
    cdef int code = r_u8(r)
    cdef uint32_t size
    if code == FC_LIST0:
        count[0] = 0
        end[0] = r.pos
        return 1
    if code == FC_LIST8:
        size = r_u8(r)
        r_need(r, size)
        if size < 1:
            raise_decode_error("list8 size too small")
        count[0] = r_u8(r)
        end[0] = r.pos + size - 1
    elif code == FC_LIST32:
        size = r_be32(r)
        r_need(r, size)
        if size < 4:
            raise_decode_error("list32 size too small")
        count[0] = r_be32(r)
        end[0] = r.pos + size - 4
    elif code == FC_NULL:
        count[0] = 0
        end[0] = r.pos
        return 0
    else:
        raise_decode_error(f"expected list, found format code 0x{code:02x}")
    if count[0] > <uint32_t>(end[0] - r.pos):
        # every field takes at least one byte: a count beyond the size is a lie
        raise_decode_error(f"list count {count[0]} exceeds its size")
    return 1


cdef int r_skip(Reader* r) except -1
cdef int r_ulong(Reader* r, uint64_t* out) except -1
cdef int r_descriptor(Reader* r, uint64_t* code) except -1
cdef object r_value(Reader* r)
cdef int check_value(const uint8_t* p, Py_ssize_t n) except -1
