"""AMQP 1.0 messages (part 3.2) over the engine's codec: a `Message` dataclass and
`encode_message` / `decode_message` between it and the bare-message bytes a TRANSFER carries.

Sections, in wire order: header (3.2.1), delivery-annotations (3.2.2), message-annotations
(3.2.3), properties (3.2.4), application-properties (3.2.5), the body — data (3.2.6),
amqp-sequence (3.2.7) or amqp-value (3.2.8) — and footer (3.2.9).

Python values map as the codec maps them (``int`` long, ``str`` string, ``bytes`` binary ...;
use the codec's wrappers ``UInt``, ``Symbol`` ... for other AMQP types). Times follow
python-qpid-proton: ``ttl`` in seconds (milliseconds on the wire), ``creation_time`` and
``absolute_expiry_time`` in seconds since the epoch (a timestamp in milliseconds on the wire).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

from qrouter._fast.codec import (
    DecodeError,
    Described,
    Symbol,
    Timestamp,
    UByte,
    UInt,
    ULong,
    decode,
    decode_all,
    encode,
    skip,
)

__all__ = ["Message", "decode_message", "decode_leading", "encode_message", "DecodeError"]

# 3.2 section descriptors
HEADER = 0x70
DELIVERY_ANNOTATIONS = 0x71
MESSAGE_ANNOTATIONS = 0x72
PROPERTIES = 0x73
APPLICATION_PROPERTIES = 0x74
DATA = 0x75
AMQP_SEQUENCE = 0x76
AMQP_VALUE = 0x77
FOOTER = 0x78

_SYMBOLIC = {
    "amqp:header:list": HEADER,
    "amqp:delivery-annotations:map": DELIVERY_ANNOTATIONS,
    "amqp:message-annotations:map": MESSAGE_ANNOTATIONS,
    "amqp:properties:list": PROPERTIES,
    "amqp:application-properties:map": APPLICATION_PROPERTIES,
    "amqp:data:binary": DATA,
    "amqp:amqp-sequence:list": AMQP_SEQUENCE,
    "amqp:amqp-value:*": AMQP_VALUE,
    "amqp:footer:map": FOOTER,
}

BODY_TYPES = ("data", "sequence", "value")

# 3.2.4 properties, in list order
_PROPERTY_FIELDS = (
    "message_id",
    "user_id",
    "to",
    "subject",
    "reply_to",
    "correlation_id",
    "content_type",
    "content_encoding",
    "absolute_expiry_time",
    "creation_time",
    "group_id",
    "group_sequence",
    "reply_to_group_id",
)


@dataclass
class Message:
    """One AMQP message. ``body``: ``bytes`` goes in a data section, anything else in an
    amqp-value section, unless ``body_type`` says otherwise ("data": bytes or a list of bytes,
    one data section each; "sequence": a list, or a list of lists with ``multiple``;
    "value")."""

    body: Any = None
    body_type: str | None = None
    # header (3.2.1)
    durable: bool | None = None
    priority: int | None = None
    ttl: float | None = None
    first_acquirer: bool | None = None
    delivery_count: int | None = None
    # properties (3.2.4)
    message_id: Any = None
    user_id: bytes | None = None
    to: str | None = None
    subject: str | None = None
    reply_to: str | None = None
    correlation_id: Any = None
    content_type: str | None = None
    content_encoding: str | None = None
    absolute_expiry_time: float | None = None
    creation_time: float | None = None
    group_id: str | None = None
    group_sequence: int | None = None
    reply_to_group_id: str | None = None
    # annotations, application properties, footer
    application_properties: dict[str, Any] | None = None
    message_annotations: dict[Any, Any] | None = None
    delivery_annotations: dict[Any, Any] | None = None
    footer: dict[Any, Any] | None = None
    multiple: bool = field(default=False, repr=False)


# --- encoding --------------------------------------------------------------------------------


def _message_id(v: Any) -> Any:
    # 3.2.11 message-id: ulong, uuid, binary or string
    if isinstance(v, bool):
        raise TypeError("a message-id cannot be a bool")
    if isinstance(v, int):
        return ULong(v)
    if isinstance(v, uuid.UUID | bytes | str):
        return v
    raise TypeError(f"a message-id is an int, UUID, bytes or str, not {type(v).__name__}")


def _timestamp(seconds: float | None) -> Timestamp | None:
    return None if seconds is None else Timestamp(int(round(seconds * 1000)))


def _annotations(d: dict[Any, Any]) -> dict[Any, Any]:
    # 3.2.10 annotations: keys are symbols (or ulongs)
    return {(Symbol(k) if isinstance(k, str) else k): v for k, v in d.items()}


def _trim(items: list[Any]) -> list[Any]:
    while items and items[-1] is None:
        items.pop()
    return items


def _header(m: Message) -> list[Any]:
    return _trim(
        [
            m.durable,
            None if m.priority is None else UByte(m.priority),
            None if m.ttl is None else UInt(int(round(m.ttl * 1000))),
            m.first_acquirer,
            None if m.delivery_count is None else UInt(m.delivery_count),
        ]
    )


def _properties(m: Message) -> list[Any]:
    return _trim(
        [
            None if m.message_id is None else _message_id(m.message_id),
            None if m.user_id is None else bytes(m.user_id),
            m.to,
            m.subject,
            m.reply_to,
            None if m.correlation_id is None else _message_id(m.correlation_id),
            None if m.content_type is None else Symbol(m.content_type),
            None if m.content_encoding is None else Symbol(m.content_encoding),
            _timestamp(m.absolute_expiry_time),
            _timestamp(m.creation_time),
            m.group_id,
            None if m.group_sequence is None else UInt(m.group_sequence),
            m.reply_to_group_id,
        ]
    )


def _body_sections(m: Message) -> list[Described]:
    kind = m.body_type
    if kind is None:
        kind = "data" if isinstance(m.body, bytes | bytearray | memoryview) else "value"
    if kind not in BODY_TYPES:
        raise ValueError(f"body_type must be one of {BODY_TYPES}, not {kind!r}")
    if kind == "data":
        parts = m.body if isinstance(m.body, list) else [m.body]
        return [Described(ULong(DATA), bytes(p)) for p in parts]
    if kind == "sequence":
        if not isinstance(m.body, list | tuple):
            raise TypeError("an amqp-sequence body is a list")
        seqs = m.body if m.multiple else [m.body]
        return [Described(ULong(AMQP_SEQUENCE), list(s)) for s in seqs]
    return [Described(ULong(AMQP_VALUE), m.body)]


def encode_message(m: Message) -> bytes:
    """The bare message (with header and annotations) as it goes in a TRANSFER."""
    out = bytearray()
    header = _header(m)
    if header:
        out += encode(Described(ULong(HEADER), header))
    if m.delivery_annotations:
        out += encode(Described(ULong(DELIVERY_ANNOTATIONS), _annotations(m.delivery_annotations)))
    if m.message_annotations:
        out += encode(Described(ULong(MESSAGE_ANNOTATIONS), _annotations(m.message_annotations)))
    props = _properties(m)
    if props:
        out += encode(Described(ULong(PROPERTIES), props))
    if m.application_properties:
        for k in m.application_properties:
            if not isinstance(k, str):
                raise TypeError("application-properties keys are strings (3.2.5)")
        out += encode(Described(ULong(APPLICATION_PROPERTIES), dict(m.application_properties)))
    for section in _body_sections(m):
        out += encode(section)
    if m.footer:
        out += encode(Described(ULong(FOOTER), _annotations(m.footer)))
    return bytes(out)


# --- decoding --------------------------------------------------------------------------------


def _code(d: Any) -> int:
    if not isinstance(d, Described):
        raise DecodeError("a message section is not a described type")
    desc = d.descriptor
    if isinstance(desc, str):
        code = _SYMBOLIC.get(str(desc))
        if code is None:
            raise DecodeError(f"unknown message section {desc!r}")
        return code
    if isinstance(desc, bool) or not isinstance(desc, int):
        # 1.5: a descriptor is a symbol or a ulong; anything else names no section
        raise DecodeError(f"message section descriptor {desc!r} is not a symbol or a ulong")
    return int(desc)


def _number(v: Any, name: str) -> int | None:
    """An integer field of the header or properties (3.2.1, 3.2.4), or None."""
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        raise DecodeError(f"{name} is not an integer ({type(v).__name__})")
    return int(v)


def _seconds(v: Any, name: str = "a time") -> float | None:
    n = _number(v, name)
    return None if n is None else n / 1000.0


def _list(v: Any, name: str) -> list[Any]:
    if v is None:
        return []
    if not isinstance(v, list):
        raise DecodeError(f"the {name} section is not a list")
    return v


def _map(v: Any, name: str) -> dict[Any, Any]:
    if v is None:
        return {}
    if not isinstance(v, dict):
        raise DecodeError(f"the {name} section is not a map")
    return v


def _apply_header(m: Message, items: list[Any]) -> None:
    items = items + [None] * (5 - len(items))
    m.durable, prio, ttl, m.first_acquirer, dc = items[:5]
    m.priority = _number(prio, "priority")
    m.ttl = _seconds(ttl, "ttl")
    m.delivery_count = _number(dc, "delivery-count")


def _apply_properties(m: Message, items: list[Any]) -> None:
    items = items + [None] * (len(_PROPERTY_FIELDS) - len(items))
    for name, v in zip(_PROPERTY_FIELDS, items, strict=False):
        if name in ("absolute_expiry_time", "creation_time"):
            v = _seconds(v, name)
        elif name in ("content_type", "content_encoding") and v is not None:
            v = str(v)
        setattr(m, name, v)


def decode_message(data: bytes | bytearray | memoryview) -> Message:
    """A message from its encoded sections; raises DecodeError for bytes that are not one."""
    try:
        sections = decode_all(bytes(data))
    except (IndexError, OverflowError, TypeError) as e:  # defensive: codec edge cases
        raise DecodeError(str(e)) from e
    m = Message()
    data_parts: list[bytes] = []
    seqs: list[list[Any]] = []
    for s in sections:
        code = _code(s)
        v = s.value
        if code == HEADER:
            _apply_header(m, _list(v, "header"))
        elif code == DELIVERY_ANNOTATIONS:
            m.delivery_annotations = _map(v, "delivery-annotations")
        elif code == MESSAGE_ANNOTATIONS:
            m.message_annotations = _map(v, "message-annotations")
        elif code == PROPERTIES:
            _apply_properties(m, _list(v, "properties"))
        elif code == APPLICATION_PROPERTIES:
            m.application_properties = _map(v, "application-properties")
        elif code == DATA:
            if not isinstance(v, bytes):
                raise DecodeError("a data section is not binary")
            data_parts.append(v)
        elif code == AMQP_SEQUENCE:
            seqs.append(_list(v, "amqp-sequence"))
        elif code == AMQP_VALUE:
            m.body, m.body_type = v, "value"
        elif code == FOOTER:
            m.footer = _map(v, "footer")
        else:
            raise DecodeError(f"unknown message section 0x{code:x}")
    if data_parts:
        m.body_type = "data"
        m.body = data_parts[0] if len(data_parts) == 1 else data_parts
    elif seqs:
        m.body_type = "sequence"
        m.multiple = len(seqs) > 1
        m.body = seqs[0] if len(seqs) == 1 else seqs
    return m


def decode_leading(data: bytes | bytearray | memoryview) -> Message:
    """The sections of a message that decode, up to the first that does not (which
    `decode_message` refuses whole): a request whose body is malformed still names its
    reply-to and message-id in the properties before it (3.2), so it can be answered."""
    raw = bytes(data)
    m = Message()
    pos = 0
    while pos < len(raw):
        start = pos
        try:
            pos = skip(raw, start)  # bounded: sizes only, so a bad section is passed over
        except DecodeError:
            break
        try:
            section = decode(raw[start:pos])[0]
            code = _code(section)
            if code == HEADER:
                _apply_header(m, _list(section.value, "header"))
            elif code == PROPERTIES:
                _apply_properties(m, _list(section.value, "properties"))
        except (DecodeError, TypeError, ValueError, OverflowError):
            continue
        if code >= PROPERTIES:
            break
    return m
