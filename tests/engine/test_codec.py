"""The type codec against python-qpid-proton's ``Data`` (AMQP 1.0 part 1, "Types").

Every primitive type and every width of it goes both ways: encoded by qrouter and decoded by
proton, encoded by proton (or written by hand, for the widths proton never writes) and decoded
by qrouter. Values keep their AMQP type through a round trip (``UInt(5)`` stays a uint).
"""

from __future__ import annotations

import math
import struct
import uuid
from typing import Any

import proton
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from proton import Data
from qrouter._fast.codec import (
    Array,
    Byte,
    Char,
    Decimal32,
    Decimal64,
    Decimal128,
    DecodeError,
    Described,
    Float,
    Int,
    Long,
    Short,
    Symbol,
    Timestamp,
    UByte,
    UInt,
    ULong,
    UShort,
    decode,
    decode_all,
    encode,
    symbol_array,
)

# --- helpers ---------------------------------------------------------------------------------


def same(a: Any, b: Any) -> bool:
    """Equal in value *and* AMQP type, recursively."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float) and math.isnan(a):
        return math.isnan(b)
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        if len(a) != len(b):
            return False
        bk = {(type(k), k): v for k, v in b.items()}
        return all((type(k), k) in bk and same(v, bk[(type(k), k)]) for k, v in a.items())
    if isinstance(a, Described):
        return same(a.descriptor, b.descriptor) and same(a.value, b.value)
    if isinstance(a, Array):
        return (
            a.code == b.code
            and same(a.descriptor, b.descriptor)
            and same(list(a.items), list(b.items))
        )
    return bool(a == b)


def proton_decode(data: bytes) -> Data:
    """Decode exactly one value with proton (it must consume every byte)."""
    d = Data()
    n = d.decode(data)
    assert n == len(data), f"proton consumed {n} of {len(data)} bytes"
    d.rewind()
    assert d.next() is not None
    return d


def _materialize(v: Any) -> Any:
    # proton hands binaries out as memoryviews into its own buffer: copy them while it lives
    if isinstance(v, memoryview):
        return bytes(v)
    if isinstance(v, list):
        return [_materialize(x) for x in v]
    if isinstance(v, dict):
        return {_materialize(k): _materialize(x) for k, x in v.items()}
    if isinstance(v, proton.Described):
        return proton.Described(_materialize(v.descriptor), _materialize(v.value))
    if isinstance(v, proton.Array):
        return proton.Array(v.descriptor, v.type, *[_materialize(x) for x in v.elements])
    return v


def proton_object(data: bytes) -> Any:
    d = proton_decode(data)
    return _materialize(d.get_object())


def proton_reencode(data: bytes) -> bytes:
    """What proton writes for the value it read from `data` (its own choice of widths)."""
    return proton_decode(data).encode()


def through_proton(value: Any) -> Any:
    """qrouter encode -> proton decode -> proton encode -> qrouter decode."""
    return decode(proton_reencode(encode(value)))[0]


def ours(data: bytes) -> Any:
    value, end = decode(data)
    assert end == len(data), f"decoded {end} of {len(data)} bytes"
    return value


U = proton.UNDESCRIBED

# --- 1.6: each primitive type, encoded by qrouter, decoded by proton -------------------------

# (qrouter value, the format code qrouter must choose, what proton must decode)
ENCODINGS = [
    (None, 0x40, None),  # 1.6.1 null
    (True, 0x41, True),  # 1.6.2 boolean true
    (False, 0x42, False),
    (UByte(0xAB), 0x50, proton.ubyte(0xAB)),  # 1.6.3
    (UShort(0xABCD), 0x60, proton.ushort(0xABCD)),  # 1.6.4
    (UInt(0), 0x43, proton.uint(0)),  # 1.6.5 uint0
    (UInt(200), 0x52, proton.uint(200)),  # smalluint
    (UInt(0xDEADBEEF), 0x70, proton.uint(0xDEADBEEF)),  # uint
    (ULong(0), 0x44, proton.ulong(0)),  # 1.6.6 ulong0
    (ULong(255), 0x53, proton.ulong(255)),  # smallulong
    (ULong(2**64 - 1), 0x80, proton.ulong(2**64 - 1)),  # ulong
    (Byte(-128), 0x51, proton.byte(-128)),  # 1.6.7
    (Short(-32768), 0x61, proton.short(-32768)),  # 1.6.8
    (Int(-5), 0x54, proton.int32(-5)),  # 1.6.9 smallint
    (Int(-(2**31)), 0x71, proton.int32(-(2**31))),  # int
    (Long(-7), 0x55, -7),  # 1.6.10 smalllong
    (Long(2**63 - 1), 0x81, 2**63 - 1),  # long
    (Float(1.5), 0x72, proton.float32(1.5)),  # 1.6.11
    (-2.25e300, 0x82, -2.25e300),  # 1.6.12 double
    (Decimal32(b"\x01\x02\x03\x04"), 0x74, proton.decimal32(0x01020304)),  # 1.6.13
    (Decimal64(bytes(range(8))), 0x84, proton.decimal64(0x0001020304050607)),  # 1.6.14
    (Decimal128(bytes(range(16))), 0x94, proton.decimal128(bytes(range(16)))),  # 1.6.15
    (Char("\U0001f600"), 0x73, proton.char("\U0001f600")),  # 1.6.16
    (Timestamp(1_700_000_000_123), 0x83, proton.timestamp(1_700_000_000_123)),  # 1.6.17
    (
        uuid.UUID(int=0x0123456789ABCDEF0123456789ABCDEF),
        0x98,  # 1.6.18
        uuid.UUID(int=0x0123456789ABCDEF0123456789ABCDEF),
    ),
    (b"\x00\xff" * 3, 0xA0, b"\x00\xff" * 3),  # 1.6.19 vbin8
    (b"x" * 300, 0xB0, b"x" * 300),  # vbin32
    ("h\u00e9llo", 0xA1, "h\u00e9llo"),  # 1.6.20 str8-utf8
    ("\u00e9" * 200, 0xB1, "\u00e9" * 200),  # str32-utf8 (400 bytes)
    (Symbol("amqp:sym"), 0xA3, proton.symbol("amqp:sym")),  # 1.6.21 sym8
    (Symbol("s" * 256), 0xB3, proton.symbol("s" * 256)),  # sym32
    ([], 0x45, []),  # 1.6.22 list0
    ([UInt(1), "a"], 0xC0, [proton.uint(1), "a"]),  # list8
    ([b"y" * 300], 0xD0, [b"y" * 300]),  # list32
    ({Symbol("k"): True}, 0xC1, {proton.symbol("k"): True}),  # 1.6.23 map8
    ({"k": "v" * 300}, 0xD1, {"k": "v" * 300}),  # map32
    (Described(ULong(0x24), []), 0x00, proton.Described(proton.ulong(0x24), [])),  # 1.5
    (Described(Symbol("x:y"), "v"), 0x00, proton.Described(proton.symbol("x:y"), "v")),
]


@pytest.mark.parametrize(
    ("value", "code", "expected"),
    ENCODINGS,
    ids=[f"0x{c:02x}-{i}" for i, (_, c, _) in enumerate(ENCODINGS)],
)
def test_qrouter_encodes_proton_decodes(value: Any, code: int, expected: Any) -> None:
    """1.6: the format code qrouter picks is the compact one for the value, proton reads
    the same value, and it comes back through proton with its type intact."""
    data = encode(value)
    assert data[0] == code
    got = proton_object(data)
    assert got == expected
    assert type(got) is type(expected)
    assert same(through_proton(value), value)
    assert same(ours(data), value)


def test_float_and_double_precision_survive_proton() -> None:
    """1.6.11 / 1.6.12: IEEE 754 bits travel unchanged (including -0.0, inf and nan)."""
    for f in (0.0, -0.0, 1e-45, 3.4028234663852886e38, math.inf, -math.inf, math.nan):
        back = through_proton(Float(f))
        assert type(back) is Float
        assert struct.pack(">f", back) == struct.pack(">f", f)
    for d in (5e-324, -0.0, 1.7976931348623157e308, math.inf, math.nan):
        back = through_proton(d)
        assert type(back) is float
        assert struct.pack(">d", back) == struct.pack(">d", d)


# --- arrays (1.6.24), both widths ------------------------------------------------------------


ARRAYS = [
    Array(0xA3, [Symbol("ANONYMOUS"), Symbol("PLAIN")]),
    symbol_array(["a" * 300, "b"]),
    Array(0x70, [UInt(1), UInt(0), UInt(0xFFFFFFFF)]),
    Array(0x80, [ULong(0), ULong(2**64 - 1)]),
    Array(0x81, [Long(-1), Long(5)]),
    Array(0x71, [Int(-1), Int(2**31 - 1)]),
    Array(0x50, [UByte(1), UByte(255)]),
    Array(0x60, [UShort(1)]),
    Array(0x51, [Byte(-1)]),
    Array(0x61, [Short(-300)]),
    Array(0x82, [1.5, -2.0]),
    Array(0x72, [Float(0.5)]),
    Array(0x83, [Timestamp(1), Timestamp(2)]),
    Array(0x73, [Char("a"), Char("\u00e9")]),
    Array(0x56, [True, False]),
    Array(0x98, [uuid.UUID(int=1), uuid.UUID(int=2)]),
    Array(0xB1, ["x", "y" * 300]),
    Array(0xB0, [b"", b"\x00" * 3]),
    Array(0xD0, [[UInt(1)], []]),
    Array(0xD1, [{Symbol("k"): UInt(1)}]),
    Array(0x70, []),
    Array(0x70, [UInt(7)], descriptor=ULong(0x1234)),
]


@pytest.mark.parametrize("arr", ARRAYS, ids=lambda a: f"0x{a.code:02x}")
def test_arrays_both_ways(arr: Array) -> None:
    """1.6.24 array: one constructor, then the items; proton reads ours and we read its."""
    data = encode(arr)
    assert data[0] in (0xE0, 0xF0)
    got = proton_object(data)
    assert isinstance(got, proton.Array)
    assert len(got.elements) == len(arr.items)
    back = through_proton(arr)
    assert isinstance(back, Array)
    assert same(list(back.items), list(ours(data).items))
    assert encode(ours(data)) == data


def test_described_array_items_come_back_described() -> None:
    """1.6.24 / 1.5: the items of an array of a described type are described values; the
    decoded array re-encodes to the same bytes (the codec's promise: a decoded value
    re-encodes to the same type)."""
    arr = Array(0x70, [UInt(7), UInt(8)], descriptor=ULong(0x1234))
    data = encode(arr)
    back = ours(data)
    assert same(back.items, [Described(ULong(0x1234), UInt(7)), Described(ULong(0x1234), UInt(8))])
    assert encode(back) == data


def test_array8_and_array32_handwritten() -> None:
    """1.6.24: array8 (size and count in one octet each) and array32, decoded by both."""
    # array8 of smalluint: size 4 = count(1) + constructor(1) + 2 items
    array8 = bytes([0xE0, 4, 2, 0x52, 5, 7])
    a = ours(array8)
    assert isinstance(a, Array) and same(a.items, [UInt(5), UInt(7)])
    assert list(proton_object(array8).elements) == [5, 7]
    array32 = bytes([0xF0, 0, 0, 0, 9, 0, 0, 0, 2, 0x60, 0, 1, 0, 2])
    a = ours(array32)
    assert same(a.items, [UShort(1), UShort(2)])
    assert list(proton_object(array32).elements) == [1, 2]
    # a described array8: descriptor ulong 7, items uint
    described = bytes([0xE0, 6, 1, 0x00, 0x53, 7, 0x52, 3])
    a = ours(described)
    assert same(a.descriptor, ULong(7))
    assert same(a.items, [Described(ULong(7), UInt(3))])
    assert proton_object(described).descriptor == 7


# --- every width, written by hand (and by proton), decoded by qrouter --------------------------

HANDWRITTEN = [
    ("null", "40", None),
    ("bool", "5601", True),
    ("bool-false", "5600", False),
    ("true", "41", True),
    ("false", "42", False),
    ("ubyte", "50ff", UByte(255)),
    ("ushort", "60ffff", UShort(65535)),
    ("uint", "70000000ff", UInt(255)),
    ("smalluint", "52ff", UInt(255)),
    ("uint0", "43", UInt(0)),
    ("ulong", "80000000000000000f", ULong(15)),
    ("smallulong", "530f", ULong(15)),
    ("ulong0", "44", ULong(0)),
    ("byte", "51ff", Byte(-1)),
    ("short", "61fffe", Short(-2)),
    ("int", "71fffffffd", Int(-3)),
    ("smallint", "54fc", Int(-4)),
    ("long", "81fffffffffffffffb", Long(-5)),
    ("smalllong", "55fa", Long(-6)),
    ("float", "72bf800000", Float(-1.0)),
    ("double", "823ff8000000000000", 1.5),
    ("decimal32", "7430000001", Decimal32(b"\x30\x00\x00\x01")),
    ("decimal64", "843100000000000001", Decimal64(b"\x31" + b"\x00" * 6 + b"\x01")),
    ("decimal128", "94" + "30" + "00" * 14 + "01", Decimal128(b"\x30" + b"\x00" * 14 + b"\x01")),
    ("char", "7300000041", Char("A")),
    ("timestamp", "83ffffffffffffffff", Timestamp(-1)),
    ("uuid", "98" + "ab" * 16, uuid.UUID(bytes=b"\xab" * 16)),
    ("vbin8", "a003010203", b"\x01\x02\x03"),
    ("vbin32", "b000000002abcd", b"\xab\xcd"),
    ("str8", "a1026869", "hi"),
    ("str32", "b1000000026869", "hi"),
    ("sym8", "a3026869", Symbol("hi")),
    ("sym32", "b3000000026869", Symbol("hi")),
    ("list0", "45", []),
    ("list8", "c0040240 5201".replace(" ", ""), [None, UInt(1)]),
    ("list32", "d0000000070000000240 5201".replace(" ", ""), [None, UInt(1)]),
    ("map8", "c10502a3016141", {Symbol("a"): True}),
    ("map32", "d10000000800000002a3016141", {Symbol("a"): True}),
    ("described-ulong", "005324c0020141", Described(ULong(0x24), [True])),
    ("described-symbol", "00a3017845", Described(Symbol("x"), [])),
]


@pytest.mark.parametrize(
    ("hexdata", "expected"), [(h, e) for _, h, e in HANDWRITTEN], ids=[n for n, _, _ in HANDWRITTEN]
)
def test_every_width_decodes_like_proton(hexdata: str, expected: Any) -> None:
    """1.6: each encoding (compact and full width) reads as the same typed value in qrouter
    and in proton (what proton re-encodes from it also reads back the same)."""
    data = bytes.fromhex(hexdata)
    assert same(ours(data), expected)
    assert same(ours(proton_reencode(data)), expected)
    assert same(through_proton(expected), expected)


def test_proton_put_each_type_decodes() -> None:
    """Proton writes each type with its own encoder (put_*); qrouter decodes them all."""
    d = Data()
    d.put_null()
    d.put_bool(True)
    d.put_ubyte(7)
    d.put_byte(-7)
    d.put_ushort(700)
    d.put_short(-700)
    d.put_uint(70000)
    d.put_int(-70000)
    d.put_char("\u20ac")
    d.put_ulong(2**40)
    d.put_long(-(2**40))
    d.put_timestamp(123456789)
    d.put_float(0.25)
    d.put_double(0.125)
    d.put_decimal32(0x01020304)
    d.put_decimal64(0x0102030405060708)
    d.put_decimal128(b"\x01" * 16)
    d.put_uuid(uuid.UUID(int=42))
    d.put_binary(b"bin")
    d.put_string("str")
    d.put_symbol("sym")
    d.put_list()
    d.enter()
    d.put_int(1)
    d.put_string("two")
    d.exit()
    d.put_map()
    d.enter()
    d.put_symbol("k")
    d.put_ulong(1)
    d.exit()
    d.put_array(False, Data.INT)
    d.enter()
    d.put_int(1)
    d.put_int(2)
    d.exit()
    d.put_described()
    d.enter()
    d.put_ulong(0x70)
    d.put_list()
    d.exit()
    expected = [
        None,
        True,
        UByte(7),
        Byte(-7),
        UShort(700),
        Short(-700),
        UInt(70000),
        Int(-70000),
        Char("\u20ac"),
        ULong(2**40),
        Long(-(2**40)),
        Timestamp(123456789),
        Float(0.25),
        0.125,
        Decimal32(b"\x01\x02\x03\x04"),
        Decimal64(bytes(range(1, 9))),
        Decimal128(b"\x01" * 16),
        uuid.UUID(int=42),
        b"bin",
        "str",
        Symbol("sym"),
        [Int(1), "two"],
        {Symbol("k"): ULong(1)},
        Array(0x71, [Int(1), Int(2)]),
        Described(ULong(0x70), []),
    ]
    got = decode_all(d.encode())
    assert len(got) == len(expected)
    for g, e in zip(got, expected, strict=True):
        assert same(g, e), (g, e)


# --- bad encodings raise DecodeError, nothing else ----------------------------------------------

BAD = [
    ("truncated-uint", "70000000"),
    ("truncated-str8", "a1056869"),
    ("truncated-vbin32", "b0ffffffff00"),
    ("invalid-code", "ff"),
    ("reserved-code", "01"),
    ("bad-utf8", "a102c328"),
    ("non-ascii-symbol", "a301ff"),
    ("bad-boolean", "5602"),
    ("list-count-lie", "c002ff40"),
    ("list32-count-bomb", "d000000004ffffffff"),
    ("map-odd", "c1030140 40"),
    ("map-unhashable-key", "c10502450140"),
    ("list-size-mismatch", "c0030140 40 40"),
    ("list8-size-zero", "c000"),
    ("array-count-lie", "e003ff5201"),
    ("array-zero-width-bomb", "f0000000057fffffff40"),
    ("char-out-of-range", "7300110000"),
    ("described-truncated", "0053"),
]


@pytest.mark.parametrize("hexdata", [h.replace(" ", "") for _, h in BAD], ids=[n for n, _ in BAD])
def test_bad_encodings_raise_decode_error(hexdata: str) -> None:
    """1.6 / 2.8.15 amqp:decode-error: malformed input is a DecodeError, never a crash,
    never an attempt to allocate what a size field claims."""
    with pytest.raises(DecodeError):
        decode_all(bytes.fromhex(hexdata))


def test_decode_of_nothing_is_an_error() -> None:
    with pytest.raises(DecodeError):
        decode(b"")


# --- hypothesis: nested values ------------------------------------------------------------------


def _float32(x: float) -> Float:
    return Float(struct.unpack(">f", struct.pack(">f", x))[0])


def _ints(cls: type, lo: int, hi: int) -> st.SearchStrategy[Any]:
    return st.integers(lo, hi).map(cls)


text = st.text(st.characters(exclude_categories=("Cs",)), max_size=40)
scalars = st.one_of(
    st.none(),
    st.booleans(),
    _ints(UByte, 0, 255),
    _ints(UShort, 0, 2**16 - 1),
    _ints(UInt, 0, 2**32 - 1),
    _ints(ULong, 0, 2**64 - 1),
    _ints(Byte, -128, 127),
    _ints(Short, -(2**15), 2**15 - 1),
    _ints(Int, -(2**31), 2**31 - 1),
    _ints(Long, -(2**63), 2**63 - 1),
    _ints(Timestamp, -(2**63), 2**63 - 1),
    st.floats(width=32, allow_nan=False).map(_float32),
    st.floats(allow_nan=False),
    st.characters(exclude_categories=("Cs",)).map(Char),
    st.binary(min_size=4, max_size=4).map(Decimal32),
    st.binary(min_size=8, max_size=8).map(Decimal64),
    st.binary(min_size=16, max_size=16).map(Decimal128),
    st.uuids(),
    st.binary(max_size=300),
    text,
    st.text(st.characters(max_codepoint=127), max_size=40).map(Symbol),
)
keys = st.one_of(
    st.text(st.characters(max_codepoint=127), max_size=10).map(Symbol),
    _ints(ULong, 0, 2**64 - 1),
    text,
)
descriptors = st.one_of(
    _ints(ULong, 0, 2**64 - 1),
    st.text(st.characters(max_codepoint=127), min_size=1, max_size=10).map(Symbol),
)
arrays = st.one_of(
    st.lists(st.text(st.characters(max_codepoint=127), max_size=8), max_size=5).map(symbol_array),
    st.lists(_ints(UInt, 0, 2**32 - 1), max_size=5).map(lambda xs: Array(0x70, xs)),
    st.lists(_ints(Long, -(2**63), 2**63 - 1), max_size=5).map(lambda xs: Array(0x81, xs)),
    st.lists(st.binary(max_size=20), max_size=5).map(lambda xs: Array(0xB0, xs)),
)


def _compound(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(
        st.lists(children, max_size=6),
        st.dictionaries(keys, children, max_size=5),
        st.builds(Described, descriptors, children),
    )


values = st.recursive(st.one_of(scalars, arrays), _compound, max_leaves=25)


def _proton_safe(v: Any, inside_list: bool = False) -> bool:
    # python-qpid-proton 0.40 miscounts a list that holds a described value whose value is
    # itself described: [Described(0, Described(0, None)), None] comes out of Data.encode as
    # a list32 with count 1 and the bytes of 2 items (1.6.22 says count is the number of
    # items). qrouter rightly refuses that encoding, so such values skip the proton leg.
    if isinstance(v, Described):
        if inside_list and isinstance(v.value, Described):
            return False
        return _proton_safe(v.descriptor) and _proton_safe(v.value, inside_list)
    if isinstance(v, list):
        return all(_proton_safe(x, True) for x in v)
    if isinstance(v, dict):
        return all(_proton_safe(k, True) and _proton_safe(x, True) for k, x in v.items())
    return True


def test_proton_miscounts_nested_described_in_a_list() -> None:
    """Documents the proton quirk _proton_safe avoids (so we notice if proton fixes it)."""
    data = Data()
    data.decode(bytes.fromhex("c00702004400444040"))
    out = data.encode()
    assert out == bytes.fromhex("d00000000a00000001004400444040")  # count 1, two items
    with pytest.raises(DecodeError):
        ours(out)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(values)
def test_nested_values_round_trip(value: Any) -> None:
    """Part 1: any value survives qrouter -> qrouter, and qrouter -> proton -> qrouter, with
    every type intact."""
    data = encode(value)
    assert same(ours(data), value)
    assert encode(ours(data)) == data
    if _proton_safe(value):
        assert same(decode(proton_reencode(data))[0], value)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=64))
def test_random_bytes_decode_or_raise_decode_error(data: bytes) -> None:
    """Random input: a value or DecodeError, never another exception."""
    try:
        decode_all(data)
    except DecodeError:
        pass
