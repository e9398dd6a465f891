"""A small tagged binary encoding for the simple values in terminus records.

Why not pickle: a store file must never be able to run code when read. Why not JSON: terminus
fields carry bytes (raw AMQP filter values), which JSON can only hold through an escape
convention that a peer-chosen map key could collide with, and base64 costs a third more.
msgpack would do but is one more dependency for ~100 lines.

Values: None, bool, int (any size up to 2040 bits), float, str, bytes, list and dict with str
keys, nested at most `MAX_DEPTH` deep. Each value is one tag byte and its body:

    N  None             T / F  True / False        d  float: 8 bytes, IEEE 754 big-endian
    i  int: 1-byte length n, then n bytes, big-endian two's complement
    s  str: 4-byte big-endian length, UTF-8        b  bytes: 4-byte length, the bytes
    l  list: 4-byte count, the items               m  dict: 4-byte count, (str key, value)*

`unpack` checks every length against what is left and rejects trailing bytes, so a damaged
record raises `ValueError` rather than decoding into something else.
"""

from __future__ import annotations

import struct
from typing import TypeAlias

Value: TypeAlias = "None | bool | int | float | str | bytes | list[Value] | dict[str, Value]"

MAX_DEPTH = 32
_U32 = struct.Struct(">I")
_F64 = struct.Struct(">d")


def pack(value: Value) -> bytes:
    out = bytearray()
    _pack(value, out, 0)
    return bytes(out)


def _pack(value: Value, out: bytearray, depth: int) -> None:
    if depth > MAX_DEPTH:
        raise ValueError(f"value nested deeper than {MAX_DEPTH}")
    if value is None:
        out += b"N"
    elif value is True:
        out += b"T"
    elif value is False:
        out += b"F"
    elif isinstance(value, int):
        n = (value.bit_length() + 8) // 8 if value else 0  # +8: room for the sign bit
        if n > 255:
            raise ValueError("int too large to pack")
        out += b"i" + bytes([n]) + value.to_bytes(n, "big", signed=True)
    elif isinstance(value, float):
        out += b"d" + _F64.pack(value)
    elif isinstance(value, str):
        data = value.encode()
        out += b"s" + _U32.pack(len(data)) + data
    elif isinstance(value, bytes | bytearray | memoryview):
        data = bytes(value)
        out += b"b" + _U32.pack(len(data)) + data
    elif isinstance(value, list | tuple):
        out += b"l" + _U32.pack(len(value))
        for item in value:
            _pack(item, out, depth + 1)
    elif isinstance(value, dict):
        out += b"m" + _U32.pack(len(value))
        for key, item in value.items():
            if not isinstance(key, str):
                raise ValueError(f"dict keys must be str, not {type(key).__name__}")
            _pack(key, out, depth + 1)
            _pack(item, out, depth + 1)
    else:
        raise ValueError(f"cannot pack a {type(value).__name__}")


def unpack(data: bytes) -> Value:
    value, end = _unpack(memoryview(data), 0, 0)
    if end != len(data):
        raise ValueError(f"{len(data) - end} trailing bytes")
    return value


def _take(buf: memoryview, pos: int, n: int) -> tuple[bytes, int]:
    if n > len(buf) - pos:
        raise ValueError("truncated")
    return bytes(buf[pos : pos + n]), pos + n


def _unpack(buf: memoryview, pos: int, depth: int) -> tuple[Value, int]:
    if depth > MAX_DEPTH:
        raise ValueError(f"nested deeper than {MAX_DEPTH}")
    tag, pos = _take(buf, pos, 1)
    if tag == b"N":
        return None, pos
    if tag == b"T":
        return True, pos
    if tag == b"F":
        return False, pos
    if tag == b"i":
        size, pos = _take(buf, pos, 1)
        raw, pos = _take(buf, pos, size[0])
        return int.from_bytes(raw, "big", signed=True), pos
    if tag == b"d":
        raw, pos = _take(buf, pos, 8)
        return _F64.unpack(raw)[0], pos
    if tag in (b"s", b"b", b"l", b"m"):
        raw, pos = _take(buf, pos, 4)
        (n,) = _U32.unpack(raw)
        if tag == b"s":
            raw, pos = _take(buf, pos, n)
            return raw.decode(), pos  # UnicodeDecodeError is a ValueError
        if tag == b"b":
            return _take(buf, pos, n)
        if n > len(buf) - pos:  # every item is at least one byte: cheap bound on a bad count
            raise ValueError("truncated")
        if tag == b"l":
            items: list[Value] = []
            for _ in range(n):
                item, pos = _unpack(buf, pos, depth + 1)
                items.append(item)
            return items, pos
        mapping: dict[str, Value] = {}
        for _ in range(n):
            key, pos = _unpack(buf, pos, depth + 1)
            if not isinstance(key, str):
                raise ValueError("dict key is not a str")
            mapping[key], pos = _unpack(buf, pos, depth + 1)
        return mapping, pos
    raise ValueError(f"unknown tag {tag!r}")
