"""The engine's BLAKE2b (qrouter/_fast/eo_blake2b.h) and the outgoing tag it computes
(eo_tag.pxi) against hashlib: the tag is a wire and store fact, so every router, old (hashlib)
or new, must compute the same 32 bytes for the same delivery (docs/exactly-once.md,
"Outgoing tags")."""

from __future__ import annotations

import hashlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qrouter._fast.eo_core import blake2b_digest, compiled_outgoing_tag
from qrouter.eo.tags import TAG_KEY, outgoing_tag

# RFC 7693 Appendix A: BLAKE2b-512 of "abc", unkeyed
RFC_ABC = bytes.fromhex(
    "ba80a53f981c4d0d6a2797b69f12f6e94c212f14685ac4b74b12bb6fdbffa2d1"
    "7d87c5392aab792dc252d5de4533cc9518d38aa8dbf1925ab92386edd4009923"
)

# containers and links up to a few blocks long, so that the prefix ends anywhere in a block,
# exactly on a boundary, and the tag's 4 + n bytes fit its last block or cross it
names = st.text(max_size=300) | st.sampled_from(["", "a", "x" * 54, "x" * 55, "x" * 56])
tags = st.binary(max_size=40) | st.sampled_from([b"", b"\x00", b"t" * 28, b"t" * 32])


def test_rfc_7693_appendix_a() -> None:
    assert blake2b_digest(b"abc") == RFC_ABC == hashlib.blake2b(b"abc").digest()


@pytest.mark.parametrize("size", [0, 1, 127, 128, 129, 255, 256, 257, 1000])
def test_block_boundaries(size: int) -> None:
    data = bytes(range(256)) * 4
    for key in (b"", b"k", bytes(64)):
        for person in (b"", b"p" * 16):
            for digest_size in (1, 32, 64):
                want = hashlib.blake2b(
                    data[:size], digest_size=digest_size, key=key, person=person
                ).digest()
                assert blake2b_digest(data[:size], digest_size, key, person) == want


def test_out_of_range_parameters_are_refused() -> None:
    for kwargs in ({"digest_size": 0}, {"digest_size": 65}, {"key": bytes(65)}):
        with pytest.raises(ValueError):
            blake2b_digest(b"", **kwargs)
    with pytest.raises(ValueError):
        blake2b_digest(b"", person=bytes(17))


@settings(max_examples=400, deadline=None)
@given(
    data=st.binary(max_size=600),
    digest_size=st.integers(1, 64),
    key=st.binary(max_size=64),
    person=st.binary(max_size=16),
)
def test_blake2b_is_hashlibs(data: bytes, digest_size: int, key: bytes, person: bytes) -> None:
    want = hashlib.blake2b(data, digest_size=digest_size, key=key, person=person).digest()
    assert blake2b_digest(data, digest_size, key, person) == want


@settings(max_examples=600, deadline=None)
@given(container=names, link=names, tag=tags)
def test_compiled_outgoing_tag_is_tags_py(container: str, link: str, tag: bytes) -> None:
    want = outgoing_tag(container, link, tag)
    assert compiled_outgoing_tag(container, link, tag) == want
    assert compiled_outgoing_tag(container, link, tag) == want  # the cached prefix, again
    assert len(want) == 32


def test_the_tag_is_the_documented_hash() -> None:
    """tags.py's definition, spelled out with hashlib: the lengths are 4 bytes big-endian."""
    container, link, tag = "container-1", "link-é", b"\x01\x02"
    h = hashlib.blake2b(digest_size=32, key=TAG_KEY, person=b"qrouter-eo-tag1")
    for part in (container.encode(), link.encode(), tag):
        h.update(len(part).to_bytes(4, "big") + part)
    assert compiled_outgoing_tag(container, link, tag) == h.digest()
    assert compiled_outgoing_tag(container, link, bytearray(tag)) == h.digest()
