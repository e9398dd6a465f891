# cython: freethreading_compatible = False
"""AMQP 1.0 type codec (OASIS AMQP 1.0, part 1 "Types").

Two layers:

* C-level ``Writer`` / ``Reader`` primitives, used by the engine on the per-message path
  (no Python object per field);
* ``encode(value) -> bytes`` and ``decode(data) -> value`` for the control path and tests, with
  wrapper types that keep the AMQP type of a value so that a decoded value re-encodes to the
  same type (``UInt(5)`` stays a uint, ``Symbol("x")`` stays a symbol).

Mapping of plain Python values when encoding: ``None`` null, ``bool`` boolean, ``int`` long,
``float`` double, ``str`` string, ``bytes`` binary, ``uuid.UUID`` uuid, ``list``/``tuple``
list, ``dict`` map.
"""

import uuid as _uuid

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.mem cimport PyMem_Free, PyMem_Malloc, PyMem_Realloc
from libc.stdint cimport int8_t, int16_t, int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t
from libc.string cimport memcpy, memmove


# codec.pxd: the deepest nesting of described / list / map / array values a decode accepts
MAX_DEPTH = MAX_NESTING


class DecodeError(ValueError):
    """Bytes that are not a valid AMQP 1.0 encoding (maps to amqp:decode-error)."""


# --- wrapper types (1.6): a Python value that remembers its AMQP type -----------------------
class Symbol(str):
    """AMQP symbol: ASCII, used for names of capabilities, conditions, properties keys."""
    __slots__ = ()

    def __repr__(self):
        return f"Symbol({str.__repr__(self)})"


class Char(str):
    """AMQP char: one UTF-32BE code point."""
    __slots__ = ()


class _TypedInt(int):
    __slots__ = ()
    _min = 0
    _max = 0

    def __new__(cls, value=0):
        v = int.__new__(cls, value)
        if not cls._min <= v <= cls._max:
            raise OverflowError(f"{cls.__name__} out of range: {int(value)}")
        return v

    def __repr__(self):
        return f"{type(self).__name__}({int(self)})"


class UByte(_TypedInt):
    __slots__ = ()
    _max = 0xFF


class UShort(_TypedInt):
    __slots__ = ()
    _max = 0xFFFF


class UInt(_TypedInt):
    __slots__ = ()
    _max = 0xFFFFFFFF


class ULong(_TypedInt):
    __slots__ = ()
    _max = 0xFFFFFFFFFFFFFFFF


class Byte(_TypedInt):
    __slots__ = ()
    _min = -0x80
    _max = 0x7F


class Short(_TypedInt):
    __slots__ = ()
    _min = -0x8000
    _max = 0x7FFF


class Int(_TypedInt):
    __slots__ = ()
    _min = -0x80000000
    _max = 0x7FFFFFFF


class Long(_TypedInt):
    __slots__ = ()
    _min = -0x8000000000000000
    _max = 0x7FFFFFFFFFFFFFFF


class Timestamp(_TypedInt):
    """Milliseconds since the Unix epoch."""
    __slots__ = ()
    _min = -0x8000000000000000
    _max = 0x7FFFFFFFFFFFFFFF


class Float(float):
    """AMQP float (IEEE 754 32-bit); a plain ``float`` encodes as double."""
    __slots__ = ()


class _Decimal(bytes):
    __slots__ = ()
    _size = 0

    def __new__(cls, raw):
        v = bytes.__new__(cls, raw)
        if len(v) != cls._size:
            raise ValueError(f"{cls.__name__} takes {cls._size} raw bytes")
        return v


class Decimal32(_Decimal):
    __slots__ = ()
    _size = 4


class Decimal64(_Decimal):
    __slots__ = ()
    _size = 8


class Decimal128(_Decimal):
    __slots__ = ()
    _size = 16


class Described:
    """A described type (1.5): a descriptor (ULong code or Symbol name) and its value."""
    __slots__ = ("descriptor", "value")

    def __init__(self, descriptor, value):
        self.descriptor = descriptor
        self.value = value

    def __eq__(self, other):
        return (isinstance(other, Described) and self.descriptor == other.descriptor
                and self.value == other.value)

    def __hash__(self):
        return hash((self.descriptor, _freeze(self.value)))

    def __repr__(self):
        return f"Described({self.descriptor!r}, {self.value!r})"


class Array:
    """An AMQP array (1.6.24): items of one type, named by its format code (e.g. FC_SYM32);
    ``descriptor`` is set for arrays of a described type."""
    __slots__ = ("code", "items", "descriptor")

    def __init__(self, code, items, descriptor=None):
        self.code = code
        self.items = list(items)
        self.descriptor = descriptor

    def __eq__(self, other):
        if isinstance(other, Array):
            return self.items == other.items and self.descriptor == other.descriptor
        if isinstance(other, (list, tuple)):
            return self.items == list(other)
        return NotImplemented

    def __hash__(self):
        return hash(tuple(_freeze(i) for i in self.items))

    def __iter__(self):
        return iter(self.items)

    def __len__(self):
        return len(self.items)

    def __repr__(self):
        return f"Array(0x{self.code:02x}, {self.items!r})"


def symbol_array(items):
    """Convenience: an array of symbols (capabilities, mechanisms)."""
    return Array(FC_SYM32, [Symbol(i) for i in items])


def _freeze(v):
    if isinstance(v, dict):
        return tuple((_freeze(k), _freeze(x)) for k, x in v.items())
    if isinstance(v, list):
        return tuple(_freeze(x) for x in v)
    return v


# --- the writer ------------------------------------------------------------------------------
cdef class Writer:
    def __cinit__(self, Py_ssize_t capacity=4096):
        self.capacity = capacity if capacity > 64 else 64
        self.data = <uint8_t*>PyMem_Malloc(self.capacity)
        if self.data == NULL:
            raise MemoryError()
        self.length = 0

    def __dealloc__(self):
        if self.data != NULL:
            PyMem_Free(self.data)
            self.data = NULL

    cdef int grow(self, Py_ssize_t need) except -1:
        cdef Py_ssize_t cap = self.capacity
        while cap < self.length + need:
            cap *= 2
        cdef uint8_t* p = <uint8_t*>PyMem_Realloc(self.data, cap)
        if p == NULL:
            raise MemoryError()
        self.data = p
        self.capacity = cap
        return 0

    cdef inline int reserve(self, Py_ssize_t n) except -1:
        if self.length + n > self.capacity:
            self.grow(n)
        return 0

    cdef inline int put_u8(self, uint8_t v) except -1:
        if self.length + 1 > self.capacity:
            self.grow(1)
        self.data[self.length] = v
        self.length += 1
        return 0

    cdef inline int put_u16(self, uint16_t v) except -1:
        if self.length + 2 > self.capacity:
            self.grow(2)
        cdef uint8_t* p = self.data + self.length
        p[0] = v >> 8
        p[1] = v & 0xff
        self.length += 2
        return 0

    cdef inline int put_u32(self, uint32_t v) except -1:
        if self.length + 4 > self.capacity:
            self.grow(4)
        cdef uint8_t* p = self.data + self.length
        p[0] = v >> 24
        p[1] = (v >> 16) & 0xff
        p[2] = (v >> 8) & 0xff
        p[3] = v & 0xff
        self.length += 4
        return 0

    cdef inline int put_u64(self, uint64_t v) except -1:
        self.put_u32(<uint32_t>(v >> 32))
        self.put_u32(<uint32_t>(v & 0xffffffff))
        return 0

    cdef inline int put_raw(self, const uint8_t* p, Py_ssize_t n) except -1:
        if self.length + n > self.capacity:
            self.grow(n)
        memcpy(self.data + self.length, p, n)
        self.length += n
        return 0

    cdef inline void patch_u32(self, Py_ssize_t pos, uint32_t v) noexcept:
        cdef uint8_t* p = self.data + pos
        p[0] = v >> 24
        p[1] = (v >> 16) & 0xff
        p[2] = (v >> 8) & 0xff
        p[3] = v & 0xff

    # 1.6.1 - 1.6.22: the smallest encoding of each primitive
    cdef inline int w_null(self) except -1:
        return self.put_u8(FC_NULL)

    cdef inline int w_bool(self, bint v) except -1:
        return self.put_u8(FC_TRUE if v else FC_FALSE)

    cdef inline int w_ubyte(self, uint8_t v) except -1:
        self.put_u8(FC_UBYTE)
        return self.put_u8(v)

    cdef inline int w_ushort(self, uint16_t v) except -1:
        self.put_u8(FC_USHORT)
        return self.put_u16(v)

    cdef inline int w_uint(self, uint32_t v) except -1:
        if v == 0:
            return self.put_u8(FC_UINT0)
        if v < 256:
            self.put_u8(FC_SMALLUINT)
            return self.put_u8(<uint8_t>v)
        self.put_u8(FC_UINT)
        return self.put_u32(v)

    cdef inline int w_ulong(self, uint64_t v) except -1:
        if v == 0:
            return self.put_u8(FC_ULONG0)
        if v < 256:
            self.put_u8(FC_SMALLULONG)
            return self.put_u8(<uint8_t>v)
        self.put_u8(FC_ULONG)
        return self.put_u64(v)

    cdef inline int w_long(self, int64_t v) except -1:
        if -128 <= v <= 127:
            self.put_u8(FC_SMALLLONG)
            return self.put_u8(<uint8_t><int8_t>v)
        self.put_u8(FC_LONG)
        return self.put_u64(<uint64_t>v)

    cdef inline int w_binary(self, const uint8_t* p, Py_ssize_t n) except -1:
        if n < 256:
            self.put_u8(FC_VBIN8)
            self.put_u8(<uint8_t>n)
        else:
            self.put_u8(FC_VBIN32)
            self.put_u32(<uint32_t>n)
        return self.put_raw(p, n)

    cdef inline int w_string(self, const uint8_t* p, Py_ssize_t n) except -1:
        if n < 256:
            self.put_u8(FC_STR8)
            self.put_u8(<uint8_t>n)
        else:
            self.put_u8(FC_STR32)
            self.put_u32(<uint32_t>n)
        return self.put_raw(p, n)

    cdef inline int w_symbol(self, const uint8_t* p, Py_ssize_t n) except -1:
        if n < 256:
            self.put_u8(FC_SYM8)
            self.put_u8(<uint8_t>n)
        else:
            self.put_u8(FC_SYM32)
            self.put_u32(<uint32_t>n)
        return self.put_raw(p, n)

    cdef inline int w_descriptor(self, uint64_t code) except -1:
        self.put_u8(FC_DESCRIBED)
        return self.w_ulong(code)

    # A list32 whose size and count are patched by end_list (1.6.22): the writer does not know
    # how many trailing fields it will write until it has written them.
    cdef inline Py_ssize_t begin_list(self) except -1:
        self.put_u8(FC_LIST32)
        cdef Py_ssize_t pos = self.length
        self.put_u32(0)
        self.put_u32(0)
        return pos

    cdef inline void end_list(self, Py_ssize_t pos, uint32_t count) noexcept:
        self.patch_u32(pos, <uint32_t>(self.length - pos - 4))
        self.patch_u32(pos + 4, count)

    cdef int w_value(self, object v) except -1:
        cdef bytes b
        cdef Py_ssize_t pos
        if v is None:
            return self.w_null()
        t = type(v)
        if t is bool:
            return self.w_bool(v)
        if t is Symbol:
            b = (<str>v).encode("ascii")
            return self.w_symbol(<const uint8_t*>PyBytes_AS_STRING(b), PyBytes_GET_SIZE(b))
        if t is str:
            b = (<str>v).encode("utf-8")
            return self.w_string(<const uint8_t*>PyBytes_AS_STRING(b), PyBytes_GET_SIZE(b))
        if t is bytes:
            return self.w_binary(<const uint8_t*>PyBytes_AS_STRING(v), PyBytes_GET_SIZE(v))
        if t is int or t is Long:
            return self.w_long(v)
        if t is UInt:
            return self.w_uint(v)
        if t is ULong:
            return self.w_ulong(v)
        if t is UByte:
            return self.w_ubyte(v)
        if t is UShort:
            return self.w_ushort(v)
        if t is Byte:
            self.put_u8(FC_BYTE)
            return self.put_u8(<uint8_t><int8_t>v)
        if t is Short:
            self.put_u8(FC_SHORT)
            return self.put_u16(<uint16_t><int16_t>v)
        if t is Int:
            if -128 <= v <= 127:
                self.put_u8(FC_SMALLINT)
                return self.put_u8(<uint8_t><int8_t>v)
            self.put_u8(FC_INT)
            return self.put_u32(<uint32_t><int32_t>v)
        if t is Timestamp:
            self.put_u8(FC_TIMESTAMP)
            return self.put_u64(<uint64_t><int64_t>v)
        if t is float:
            return self._w_double(v)
        if t is Float:
            return self._w_float(v)
        if t is Char:
            if len(v) != 1:
                raise ValueError("Char holds exactly one code point")
            self.put_u8(FC_CHAR)
            return self.put_u32(ord(v))
        if t is Decimal32 or t is Decimal64 or t is Decimal128:
            self.put_u8(FC_DECIMAL32 if t is Decimal32 else (FC_DECIMAL64 if t is Decimal64
                                                             else FC_DECIMAL128))
            return self.put_raw(<const uint8_t*>PyBytes_AS_STRING(v), PyBytes_GET_SIZE(v))
        if t is Described:
            self.put_u8(FC_DESCRIBED)
            self.w_value(v.descriptor)
            return self.w_value(v.value)
        if t is list or t is tuple:
            if len(v) == 0:
                return self.put_u8(FC_LIST0)
            pos = self.begin_list()
            for item in v:
                self.w_value(item)
            self.end_list(pos, <uint32_t>len(v))
            return self._shrink(pos)
        if t is dict:
            self.put_u8(FC_MAP32)
            pos = self.length
            self.put_u32(0)
            self.put_u32(0)
            for key, item in (<dict>v).items():
                self.w_value(key)
                self.w_value(item)
            self.patch_u32(pos, <uint32_t>(self.length - pos - 4))
            self.patch_u32(pos + 4, <uint32_t>(2 * len(v)))
            return self._shrink(pos)
        if t is Array:
            return self._w_array(v)
        if isinstance(v, _uuid.UUID):
            self.put_u8(FC_UUID)
            b = v.bytes
            return self.put_raw(<const uint8_t*>PyBytes_AS_STRING(b), 16)
        if isinstance(v, bytearray) or isinstance(v, memoryview):
            b = bytes(v)
            return self.w_binary(<const uint8_t*>PyBytes_AS_STRING(b), PyBytes_GET_SIZE(b))
        # subclasses of the basic types (e.g. enum members of int): encode as the base type
        if isinstance(v, bool):
            return self.w_bool(v)
        if isinstance(v, int):
            return self.w_long(v)
        if isinstance(v, str):
            return self.w_value(str(v))
        raise TypeError(f"cannot encode {t.__name__} as AMQP")

    cdef int _shrink(self, Py_ssize_t pos) except -1:
        # A compound whose body fits in 255 bytes is rewritten as list8/map8 (code - 0x10):
        # the compact form peers produce themselves.
        cdef Py_ssize_t size = self.length - pos - 4
        cdef uint32_t count
        if size > 255 - 3:
            return 0
        count = (<uint32_t>self.data[pos + 4] << 24) | (<uint32_t>self.data[pos + 5] << 16) | \
                (<uint32_t>self.data[pos + 6] << 8) | self.data[pos + 7]
        if count > 255:
            return 0
        self.data[pos - 1] = self.data[pos - 1] - 0x10
        self.data[pos] = <uint8_t>(size - 3)
        self.data[pos + 1] = <uint8_t>count
        memmove(self.data + pos + 2, self.data + pos + 8, size - 4)
        self.length -= 6
        return 0

    cdef int _w_double(self, double d) except -1:
        cdef uint64_t bits
        memcpy(&bits, &d, 8)
        self.put_u8(FC_DOUBLE)
        return self.put_u64(bits)

    cdef int _w_float(self, float f) except -1:
        cdef uint32_t bits
        memcpy(&bits, &f, 4)
        self.put_u8(FC_FLOAT)
        return self.put_u32(bits)

    cdef int _w_array(self, object arr) except -1:
        # 1.6.24: array32 = size, count, one constructor, then the items without constructors.
        cdef int code = arr.code
        cdef Py_ssize_t pos
        self.put_u8(FC_ARRAY32)
        pos = self.length
        self.put_u32(0)
        self.put_u32(<uint32_t>len(arr.items))
        if arr.descriptor is not None:
            self.put_u8(FC_DESCRIBED)
            self.w_value(arr.descriptor)
        self.put_u8(<uint8_t>code)
        for item in arr.items:
            if arr.descriptor is not None and type(item) is Described:
                item = item.value     # decoded items of a described array come back described
            self._w_element(code, item)
        self.patch_u32(pos, <uint32_t>(self.length - pos - 4))
        return 0

    cdef int _w_element(self, int code, object v) except -1:
        cdef bytes b
        cdef Writer sub
        if code == FC_SYM32 or code == FC_STR32 or code == FC_VBIN32:
            if code == FC_SYM32:
                b = v.encode("ascii")
            elif code == FC_STR32:
                b = v.encode("utf-8")
            else:
                b = bytes(v)
            self.put_u32(<uint32_t>len(b))
            return self.put_raw(<const uint8_t*>PyBytes_AS_STRING(b), len(b))
        if code == FC_SYM8 or code == FC_STR8 or code == FC_VBIN8:
            b = v.encode("ascii" if code == FC_SYM8 else "utf-8") if code != FC_VBIN8 else bytes(v)
            if len(b) > 255:
                raise OverflowError("array element too long for an 8-bit width")
            self.put_u8(<uint8_t>len(b))
            return self.put_raw(<const uint8_t*>PyBytes_AS_STRING(b), len(b))
        # fixed-width and compound elements: encode with a constructor and drop it
        sub = _fixed_encode(_as_code(code, v))
        if sub.data[0] != code:
            raise TypeError(f"array element {v!r} does not encode as 0x{code:02x}")
        return self.put_raw(sub.data + 1, sub.length - 1)

    # Python-level access (tests, the control path)
    def write(self, value):
        self.w_value(value)

    def getvalue(self):
        return PyBytes_FromStringAndSize(<char*>self.data, self.length)

    def __len__(self):
        return self.length

    cdef bytes take(self):
        cdef bytes out = PyBytes_FromStringAndSize(<char*>self.data, self.length)
        self.length = 0
        return out

    cdef void clear(self) noexcept:
        self.length = 0


def _as_code(int code, v):
    # the typed wrapper that encodes with exactly `code` in an array element
    if code == FC_UINT:
        return _FixedUInt(v)
    if code == FC_ULONG:
        return _FixedULong(v)
    if code == FC_LONG:
        return _FixedLong(v)
    if code == FC_INT:
        return _FixedInt(v)
    if code == FC_UBYTE:
        return UByte(v)
    if code == FC_USHORT:
        return UShort(v)
    if code == FC_BYTE:
        return Byte(v)
    if code == FC_SHORT:
        return Short(v)
    if code == FC_DOUBLE:
        return float(v)
    if code == FC_FLOAT:
        return Float(v)
    if code == FC_TIMESTAMP:
        return Timestamp(v)
    if code == FC_BOOL:
        return _FixedBool(v)
    if code == FC_CHAR:
        return Char(v)
    if code == FC_LIST32:
        return _FixedList(v)
    if code == FC_MAP32:
        return _FixedMap(v)
    return v


class _FixedUInt(int):
    pass


class _FixedULong(int):
    pass


class _FixedLong(int):
    pass


class _FixedInt(int):
    pass


class _FixedBool(int):
    pass


class _FixedList(list):
    pass


class _FixedMap(dict):
    pass


# Array elements must all use the array's constructor, so the compact encodings (uint0,
# smallulong, list8 ...) are not allowed there; this produces the full-width forms.
cdef Writer _fixed_encode(v):
    cdef Writer w = Writer(64)
    t = type(v)
    if t is _FixedUInt:
        w.put_u8(FC_UINT)
        w.put_u32(v)
    elif t is _FixedULong:
        w.put_u8(FC_ULONG)
        w.put_u64(v)
    elif t is _FixedLong:
        w.put_u8(FC_LONG)
        w.put_u64(<uint64_t><int64_t>v)
    elif t is _FixedInt:
        w.put_u8(FC_INT)
        w.put_u32(<uint32_t><int32_t>v)
    elif t is _FixedBool:
        w.put_u8(FC_BOOL)
        w.put_u8(1 if v else 0)
    elif t is _FixedList:
        w.w_value(list(v))
        _widen(w, FC_LIST32)
    elif t is _FixedMap:
        w.w_value(dict(v))
        _widen(w, FC_MAP32)
    else:
        w.w_value(v)
    return w


cdef int _widen(Writer w, int code) except -1:
    # undo _shrink: re-encode a list8/map8/list0 as its 32-bit form
    cdef bytes old = w.getvalue()
    cdef uint32_t size, count
    c = old[0]
    if c == FC_LIST0:
        size, count, body = 4, 0, b""
    elif c == FC_LIST8 or c == FC_MAP8:
        count = old[2]
        body = old[3:]
        size = len(body) + 4
    else:
        return 0
    w.clear()
    w.put_u8(code)
    w.put_u32(size)
    w.put_u32(count)
    w.put_raw(<const uint8_t*>PyBytes_AS_STRING(body), len(body))
    return 0


# --- the reader ------------------------------------------------------------------------------
cdef int raise_decode_error(str message) except -1:
    raise DecodeError(message)


cdef inline uint64_t _be64(const uint8_t* p) noexcept:
    return ((<uint64_t>p[0] << 56) | (<uint64_t>p[1] << 48) | (<uint64_t>p[2] << 40) |
            (<uint64_t>p[3] << 32) | (<uint64_t>p[4] << 24) | (<uint64_t>p[5] << 16) |
            (<uint64_t>p[6] << 8) | p[7])


cdef int _width(Reader* r, int code) except -2:
    # Bytes that follow a constructor of fixed width; -1 for variable width (1.6 / 1.2 "Type
    # Encodings": the subcategory is the high nibble of the format code).
    cdef int hi = code >> 4
    if hi == 0x4:
        return 0
    if hi == 0x5:
        return 1
    if hi == 0x6:
        return 2
    if hi == 0x7:
        return 4
    if hi == 0x8:
        return 8
    if hi == 0x9:
        return 16
    return -1


cdef int _skip_body(Reader* r, int code) except -1:
    cdef int w = _width(r, code)
    cdef uint32_t size
    if w >= 0:
        r_need(r, w)
        r.pos += w
        return 0
    if code == FC_VBIN8 or code == FC_STR8 or code == FC_SYM8 or code == FC_LIST8 \
            or code == FC_MAP8 or code == FC_ARRAY8:
        size = r_u8(r)
    elif code == FC_VBIN32 or code == FC_STR32 or code == FC_SYM32 or code == FC_LIST32 \
            or code == FC_MAP32 or code == FC_ARRAY32:
        size = r_be32(r)
    else:
        raise DecodeError(f"invalid format code 0x{code:02x} at offset {r.pos - 1}")
    r_need(r, size)
    r.pos += size
    return 0


cdef inline int _nest(Reader* r, int depth) except -1:
    # Nesting bound (see MAX_NESTING in codec.pxd): one more level of described / list / map /
    # array would pass it. Raised before the level is entered, so the C stack and the Python
    # objects of a decode grow by at most MAX_NESTING frames whatever the peer sends.
    if depth >= MAX_NESTING:
        raise DecodeError(f"nesting deeper than {MAX_NESTING} levels at offset {r.pos}")
    return 0


cdef int _skip(Reader* r, int depth) except -1:
    # 1.5: a described value is a descriptor then a value, each of which may be described
    # again; lists, maps and arrays are skipped by their size, never walked
    cdef int code = r_u8(r)
    if code == FC_DESCRIBED:
        _nest(r, depth)
        _skip(r, depth + 1)
        return _skip(r, depth + 1)
    return _skip_body(r, code)


cdef int r_skip(Reader* r) except -1:
    return _skip(r, 0)


cdef int r_ulong(Reader* r, uint64_t* out) except -1:
    cdef int code = r_u8(r)
    cdef uint32_t u
    if code == FC_ULONG0:
        out[0] = 0
    elif code == FC_SMALLULONG:
        out[0] = r_u8(r)
    elif code == FC_ULONG:
        r_need(r, 8)
        out[0] = _be64(r.p + r.pos)
        r.pos += 8
    elif code == FC_NULL:
        return 0
    else:
        r.pos -= 1
        if r_uint(r, &u):
            out[0] = u
            return 1
        return 0
    return 1


cdef int r_descriptor(Reader* r, uint64_t* code) except -1:
    """Read the descriptor of a described value whose descriptor is a ulong code. Symbolic
    descriptors are mapped to their numeric code for the types the engine knows; others give
    code 0xffffffffffffffff."""

    cdef int fc = r_u8(r)
    if fc != FC_DESCRIBED:
        raise DecodeError(f"expected a described type, found format code 0x{fc:02x}")
    r_need(r, 1)
    fc = r.p[r.pos]
    if fc == FC_SYM8 or fc == FC_SYM32:
        name = r_value(r)
        code[0] = _SYMBOLIC.get(name, 0xffffffffffffffff)
        return 1
    if not r_ulong(r, code):
        raise DecodeError("null descriptor")
    return 1


# The symbolic names of the described types (part 2, 3, 5) so a peer may use either form.
_SYMBOLIC = {
    "amqp:open:list": 0x10, "amqp:begin:list": 0x11, "amqp:attach:list": 0x12,
    "amqp:flow:list": 0x13, "amqp:transfer:list": 0x14, "amqp:disposition:list": 0x15,
    "amqp:detach:list": 0x16, "amqp:end:list": 0x17, "amqp:close:list": 0x18,
    "amqp:error:list": 0x1d, "amqp:received:list": 0x23, "amqp:accepted:list": 0x24,
    "amqp:rejected:list": 0x25, "amqp:released:list": 0x26, "amqp:modified:list": 0x27,
    "amqp:source:list": 0x28, "amqp:target:list": 0x29,
    "amqp:delete-on-close:list": 0x2b, "amqp:delete-on-no-links:list": 0x2c,
    "amqp:delete-on-no-messages:list": 0x2d, "amqp:delete-on-no-links-or-messages:list": 0x2e,
    "amqp:coordinator:list": 0x30, "amqp:declare:list": 0x31, "amqp:discharge:list": 0x32,
    "amqp:declared:list": 0x33, "amqp:transactional-state:list": 0x34,
    "amqp:sasl-mechanisms:list": 0x40, "amqp:sasl-init:list": 0x41,
    "amqp:sasl-challenge:list": 0x42, "amqp:sasl-response:list": 0x43,
    "amqp:sasl-outcome:list": 0x44,
    "amqp:header:list": 0x70, "amqp:delivery-annotations:map": 0x71,
    "amqp:message-annotations:map": 0x72, "amqp:properties:list": 0x73,
    "amqp:application-properties:map": 0x74, "amqp:data:binary": 0x75,
    "amqp:amqp-sequence:list": 0x76, "amqp:amqp-value:*": 0x77, "amqp:footer:map": 0x78,
}


cdef object _r_body(Reader* r, int code, int depth):
    cdef uint32_t size
    cdef uint64_t u64
    cdef uint32_t u32
    cdef double d
    cdef float f
    cdef const uint8_t* p
    if code == FC_NULL:
        return None
    if code == FC_TRUE:
        return True
    if code == FC_FALSE:
        return False
    if code == FC_BOOL:
        c = r_u8(r)
        if c > 1:
            raise DecodeError(f"invalid boolean byte {c}")
        return c == 1
    if code == FC_UINT0:
        return UInt(0)
    if code == FC_ULONG0:
        return ULong(0)
    if code == FC_LIST0:
        return []
    if code == FC_UBYTE:
        return UByte(r_u8(r))
    if code == FC_SMALLUINT:
        return UInt(r_u8(r))
    if code == FC_SMALLULONG:
        return ULong(r_u8(r))
    if code == FC_BYTE:
        return Byte(<int8_t>r_u8(r))
    if code == FC_SMALLINT:
        return Int(<int8_t>r_u8(r))
    if code == FC_SMALLLONG:
        return Long(<int8_t>r_u8(r))
    if code == FC_USHORT or code == FC_SHORT:
        r_need(r, 2)
        u32 = (<uint32_t>r.p[r.pos] << 8) | r.p[r.pos + 1]
        r.pos += 2
        return UShort(u32) if code == FC_USHORT else Short(<int16_t><uint16_t>u32)
    if code == FC_UINT:
        return UInt(r_be32(r))
    if code == FC_INT:
        return Int(<int32_t>r_be32(r))
    if code == FC_CHAR:
        u32 = r_be32(r)
        if u32 > 0x10FFFF:
            raise DecodeError("char out of range")
        return Char(chr(u32))
    if code == FC_FLOAT:
        u32 = r_be32(r)
        memcpy(&f, &u32, 4)
        return Float(f)
    if code == FC_DECIMAL32:
        r_need(r, 4)
        r.pos += 4
        return Decimal32(PyBytes_FromStringAndSize(<char*>r.p + r.pos - 4, 4))
    if code == FC_ULONG or code == FC_LONG or code == FC_DOUBLE or code == FC_TIMESTAMP \
            or code == FC_DECIMAL64:
        r_need(r, 8)
        p = r.p + r.pos
        u64 = _be64(p)
        r.pos += 8
        if code == FC_ULONG:
            return ULong(u64)
        if code == FC_LONG:
            return Long(<int64_t>u64)
        if code == FC_TIMESTAMP:
            return Timestamp(<int64_t>u64)
        if code == FC_DOUBLE:
            memcpy(&d, &u64, 8)
            return d
        return Decimal64(PyBytes_FromStringAndSize(<char*>p, 8))
    if code == FC_UUID or code == FC_DECIMAL128:
        r_need(r, 16)
        r.pos += 16
        raw = PyBytes_FromStringAndSize(<char*>r.p + r.pos - 16, 16)
        return _uuid.UUID(bytes=raw) if code == FC_UUID else Decimal128(raw)
    if code == FC_VBIN8 or code == FC_STR8 or code == FC_SYM8:
        size = r_u8(r)
    elif code == FC_VBIN32 or code == FC_STR32 or code == FC_SYM32:
        size = r_be32(r)
    elif code == FC_LIST8 or code == FC_LIST32 or code == FC_MAP8 or code == FC_MAP32:
        return _r_compound(r, code, depth)
    elif code == FC_ARRAY8 or code == FC_ARRAY32:
        return _r_array(r, code, depth)
    else:
        raise DecodeError(f"invalid format code 0x{code:02x} at offset {r.pos - 1}")
    r_need(r, size)
    raw = PyBytes_FromStringAndSize(<char*>r.p + r.pos, size)
    r.pos += size
    if code == FC_VBIN8 or code == FC_VBIN32:
        return raw
    try:
        if code == FC_SYM8 or code == FC_SYM32:
            return Symbol(raw.decode("ascii"))
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise DecodeError(f"invalid text: {e}") from None


cdef object _r_compound(Reader* r, int code, int depth):
    cdef uint32_t size, count
    cdef Py_ssize_t end, saved_n
    _nest(r, depth)
    if code == FC_LIST8 or code == FC_MAP8:
        size = r_u8(r)
        r_need(r, size)
        if size < 1:
            raise DecodeError("compound size too small")
        count = r_u8(r)
        end = r.pos + size - 1
    else:
        size = r_be32(r)
        r_need(r, size)
        if size < 4:
            raise DecodeError("compound size too small")
        count = r_be32(r)
        end = r.pos + size - 4
    # every item takes at least one byte: a count beyond the size is a lie (and a memory bomb)
    if count > <uint32_t>(end - r.pos):
        raise DecodeError(f"compound count {count} exceeds its size")
    saved_n = r.n
    r.n = end
    try:
        if code == FC_LIST8 or code == FC_LIST32:
            out = [_r_value(r, depth + 1) for _ in range(count)]
        else:
            if count % 2:
                raise DecodeError("map with an odd number of items")
            out = {}
            for _ in range(count // 2):
                k = _r_value(r, depth + 1)
                try:
                    out[k] = _r_value(r, depth + 1)
                except TypeError:
                    raise DecodeError(f"unhashable map key {k!r}") from None
        if r.pos != end:
            raise DecodeError("compound size does not match its items")
    finally:
        r.n = saved_n
    return out


cdef object _r_array(Reader* r, int code, int depth):
    cdef uint32_t size, count
    cdef Py_ssize_t end, saved_n
    cdef int ec
    _nest(r, depth)
    if code == FC_ARRAY8:
        size = r_u8(r)
        r_need(r, size)
        if size < 2:
            raise DecodeError("array size too small")
        count = r_u8(r)
        end = r.pos + size - 1
    else:
        size = r_be32(r)
        r_need(r, size)
        if size < 5:
            raise DecodeError("array size too small")
        count = r_be32(r)
        end = r.pos + size - 4
    saved_n = r.n
    r.n = end
    try:
        descriptor = None
        ec = r_u8(r)
        if ec == FC_DESCRIBED:
            descriptor = _r_value(r, depth + 1)
            ec = r_u8(r)
        if _width(r, ec) == 0:
            # zero-width items (null, true, uint0, list0 ...) carry no bytes, yet each is a
            # Python object: at most one per byte of the array's size, so that what a decode
            # allocates stays proportional to its input (a 9-byte array32 of nulls claiming
            # 2^32 items is refused, not 32 GiB of pointers)
            if count > size:
                raise DecodeError(f"array of {count} zero-width items in {size} bytes")
        elif count > <uint32_t>(end - r.pos):
            raise DecodeError(f"array count {count} exceeds its size")
        items = [_r_body(r, ec, depth + 1) for _ in range(count)]
        if descriptor is not None:
            items = [Described(descriptor, v) for v in items]
        if r.pos != end:
            raise DecodeError("array size does not match its items")
    finally:
        r.n = saved_n
    return Array(ec, items, descriptor)


cdef object _r_value(Reader* r, int depth):
    cdef int code = r_u8(r)
    if code == FC_DESCRIBED:
        # 1.5: the descriptor and the value are one level below the described value
        _nest(r, depth)
        descriptor = _r_value(r, depth + 1)
        return Described(descriptor, _r_value(r, depth + 1))
    return _r_body(r, code, depth)


cdef object r_value(Reader* r):
    return _r_value(r, 0)


cdef int check_value(const uint8_t* p, Py_ssize_t n) except -1:
    """DecodeError unless p[0:n] is exactly one well-formed value: what r_skip passed over
    (it trusts sizes and does not look inside strings or maps) checked in full, for bytes
    the router keeps or relays to another peer."""
    cdef Reader r
    r.p = p
    r.n = n
    r.pos = 0
    _r_value(&r, 0)
    if r.pos != n:
        raise DecodeError(f"{n - r.pos} bytes after the value")
    return 0


# --- Python API --------------------------------------------------------------------------------
def encode(value) -> bytes:
    """Encode one value (see the module doc for how plain Python types map)."""

    cdef Writer w = Writer(256)
    w.w_value(value)
    return w.take()


cdef int reader_at(Reader* r, bytes b, Py_ssize_t offset) except -1:
    """`r` reads `b` (which the caller keeps alive) from `offset`."""
    r.p = <const uint8_t*>PyBytes_AS_STRING(b)
    r.n = PyBytes_GET_SIZE(b)
    if offset < 0 or offset > r.n:
        raise ValueError("offset out of range")
    r.pos = offset
    return 0


def decode(data, Py_ssize_t offset=0):
    """Decode the one value at ``offset``; returns ``(value, next_offset)``."""

    cdef bytes b = bytes(data)
    cdef Reader r
    reader_at(&r, b, offset)
    v = r_value(&r)
    return v, r.pos


def skip(data, Py_ssize_t offset=0):
    """The offset just past the one value at ``offset``, found from its sizes without
    decoding it (as the engine skips the sections it need not read); DecodeError if its
    sizes do not fit or its described values nest too deep."""

    cdef bytes b = bytes(data)
    cdef Reader r
    reader_at(&r, b, offset)
    r_skip(&r)
    return r.pos


def decode_all(data) -> list:
    """Decode a sequence of values filling ``data`` exactly (e.g. the sections of a message)."""

    cdef bytes b = bytes(data)
    cdef Reader r
    r.p = <const uint8_t*>PyBytes_AS_STRING(b)
    r.n = PyBytes_GET_SIZE(b)
    r.pos = 0
    out = []
    while r.pos < r.n:
        out.append(r_value(&r))
    return out
