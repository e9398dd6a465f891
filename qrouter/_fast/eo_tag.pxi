# The outgoing delivery tag of a guaranteed topic, compiled (qrouter/eo/tags.py defines it;
# docs/exactly-once.md, "Outgoing tags"). (Included by eo_core.pyx.)
#
#     BLAKE2b-256(key = TAG_KEY, person = TAG_PERSON,
#                 len(container) | container | len(link) | link | len(tag) | tag)
#
# with 4-byte big-endian lengths. Everything before the tag is the publisher's, so its state
# (the key block, compressed or not, and the prefix) is computed once per publisher and kept
# in a `TagPrefix`; a message copies that C struct and absorbs only its own length and tag:
# one BLAKE2b compression when they fit the prefix's last block (eo_blake2b.h), and no Python
# object but the 32-byte result. The hash is the RFC 7693 one that hashlib.blake2b computes,
# byte for byte (tests/eo/test_tag_hash.py): the tag is a wire and store fact that every
# router, old or new, must compute alike.

from libc.stdint cimport uint8_t

cdef extern from "eo_blake2b.h" nogil:
    ctypedef struct qr_b2b:
        size_t buflen
    int qr_b2b_init(qr_b2b *s, size_t outlen, const uint8_t *key, size_t keylen,
                    const uint8_t *person, size_t personlen)
    void qr_b2b_update(qr_b2b *s, const uint8_t *data, size_t n)
    void qr_b2b_final(qr_b2b *s, uint8_t *out)


cdef inline void _b2b_u32(qr_b2b *s, Py_ssize_t n) noexcept:
    """Absorb `n` as the 4 big-endian bytes of a length (as _u32)."""
    cdef uint8_t b[4]
    b[0] = (n >> 24) & 255
    b[1] = (n >> 16) & 255
    b[2] = (n >> 8) & 255
    b[3] = n & 255
    qr_b2b_update(s, b, 4)


cdef inline void _b2b_part(qr_b2b *s, bytes raw) noexcept:
    """Absorb len(raw) | raw."""
    cdef Py_ssize_t n = PyBytes_GET_SIZE(raw)
    _b2b_u32(s, n)
    qr_b2b_update(s, <const uint8_t *>PyBytes_AS_STRING(raw), <size_t>n)


@cython.final
@cython.no_gc
cdef class TagPrefix:
    """One publisher's tag state: BLAKE2b after the key block, len(container) | container |
    len(link) | link (C data only: no reference to collect)."""
    cdef qr_b2b state

    cdef bytes c_tag(self, tag):
        """The outgoing tag of this publisher's delivery `tag` (bytes(tag), as tags.py)."""
        cdef bytes raw = _bytes(tag)
        cdef qr_b2b s = self.state  # (a copy: the prefix serves the next message too)
        _b2b_part(&s, raw)
        cdef bytes out = PyBytes_FromStringAndSize(NULL, _TAG_SIZE)
        qr_b2b_final(&s, <uint8_t *>PyBytes_AS_STRING(out))
        return out


cdef TagPrefix _new_tag_prefix(tuple pub):
    cdef TagPrefix p = TagPrefix.__new__(TagPrefix)
    if qr_b2b_init(&p.state, _TAG_SIZE, <const uint8_t *>PyBytes_AS_STRING(_TAG_KEY),
                   PyBytes_GET_SIZE(_TAG_KEY), <const uint8_t *>PyBytes_AS_STRING(_TAG_PERSON),
                   PyBytes_GET_SIZE(_TAG_PERSON)) < 0:
        raise ValueError("tag key or personalisation too long for BLAKE2b")
    cdef bytes container = pub[0].encode()
    cdef bytes link = pub[1].encode()
    _b2b_part(&p.state, container)
    _b2b_part(&p.state, link)
    return p


def blake2b_digest(data, Py_ssize_t digest_size=64, key=b"", person=b""):
    """BLAKE2b of `data` through eo_blake2b.h, as hashlib.blake2b(data, digest_size=...,
    key=..., person=...).digest(): for the tests that hold the two equal."""
    cdef bytes raw = bytes(data)
    cdef bytes k = bytes(key)
    cdef bytes p = bytes(person)
    cdef qr_b2b s
    if qr_b2b_init(&s, <size_t>digest_size if digest_size > 0 else 0,
                   <const uint8_t *>PyBytes_AS_STRING(k), PyBytes_GET_SIZE(k),
                   <const uint8_t *>PyBytes_AS_STRING(p), PyBytes_GET_SIZE(p)) < 0:
        raise ValueError("digest_size, key or person out of BLAKE2b's range")
    qr_b2b_update(&s, <const uint8_t *>PyBytes_AS_STRING(raw), PyBytes_GET_SIZE(raw))
    cdef bytes out = PyBytes_FromStringAndSize(NULL, digest_size)
    qr_b2b_final(&s, <uint8_t *>PyBytes_AS_STRING(out))
    return out


def compiled_outgoing_tag(container, link, tag):
    """The engine's outgoing tag (`_outgoing_tag`) of (container, link)'s delivery `tag`: the
    tests hold it equal to tags.outgoing_tag."""
    return _outgoing_tag((container, link), tag)
