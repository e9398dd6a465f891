"""The compact records (type 0x0A of qrouter/_fast/eo_wire.pxi) written here from the format
at the top of that file, independently of the engine: what the tests compare the engine's
octets with, and hand its decoder."""

from __future__ import annotations

from typing import Any

_CODES = {"FWD": 1, "ACCEPT": 2, "SETTLE": 3, "SEEN": 4}
TOPIC, T, X, TARGETS = 0x08, 0x10, 0x20, 0x40  # the flags: this field as the previous record's


def varint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _s(v: str) -> bytes:
    raw = v.encode()
    return varint(len(raw)) + raw


def _b(v: bytes) -> bytes:
    return varint(len(v)) + v


def _i(v: int) -> bytes:
    return varint(((v << 1) ^ (v >> 63)) & (2**64 - 1))  # zigzag


def _atts(atts: tuple[Any, ...]) -> bytes:
    return varint(len(atts)) + b"".join(_s(r) + _i(i) + _i(n) for r, i, n in atts)


def _subs(subs: tuple[Any, ...]) -> bytes:
    return varint(len(subs)) + b"".join(_s(c) + _s(lnk) for c, lnk in subs)


def frame(flags: int, fields: bytes) -> bytes:
    """A compact record of these flags (op code included) and field octets."""
    body = bytes([flags]) + fields
    return b"\x0a" + varint(len(body)) + body


def run_octets(records: list[tuple[Any, ...]]) -> bytes:
    """Consecutive records of one list as compact records, each field that equals the
    previous record's (in the run) left out and flagged."""
    out = b""
    prev: dict[str, Any] = {}

    def same(name: str, v: Any) -> bool:
        return name in prev and type(prev[name]) is type(v) and prev[name] == v

    for rec in records:
        op = rec[0]
        flags = _CODES[op]
        fields = b""
        if same("topic", rec[1]):
            flags |= TOPIC
        else:
            fields += _s(rec[1])
        if same("t", rec[2]):
            flags |= T
        else:
            fields += _b(rec[2])
        if op == "FWD":
            if same("pub", rec[3]):
                flags |= X
            else:
                fields += _s(rec[3][0]) + _s(rec[3][1])
            fields += _b(rec[4]) + _b(rec[5])
            if same("atts", rec[6]):
                flags |= TARGETS
            else:
                fields += _atts(rec[6])
            prev.update(pub=rec[3], atts=rec[6])
        elif op == "SETTLE":
            if same("atts", rec[3]):
                flags |= X
            else:
                fields += _atts(rec[3])
            prev["atts"] = rec[3]
        else:
            if same("subs", rec[3]):
                flags |= X
            else:
                fields += _subs(rec[3])
            prev["subs"] = rec[3]
        prev.update(topic=rec[1], t=rec[2])
        out += frame(flags, fields)
    return out
