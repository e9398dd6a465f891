# cython: language_level=3
"""The per-message part of a guaranteed topic's state machine (docs/exactly-once.md), compiled.

`qrouter.eo.protocol.TopicRouter` subclasses `EoCore`: what runs for every guaranteed
transfer, outcome and settlement (the publisher's transfer and settlement, a subscriber's
accept and settle, the inter-router FWD / ACCEPT / SETTLE / SEEN / PING / PONG, the records'
bookkeeping, the commit and the outputs) is here, as typed methods; subscriptions, views,
epochs, snapshots, ASK / ANSWER, ticks and recovery stay in protocol.py and call in through
the thin `def` wrappers below (`_drive`, `_flush`, ...). The semantics are protocol.py's
line for line: tests/eo/sim.py checks this code, since TopicRouter *is* it.

The records (`OriginRecord`, `LocalRecord`) are `cdef class`es re-exported by
qrouter/eo/records.py, with the same fields, constructor and durable encoding (STATE_V2) as
the dataclasses they replace.

It imports nothing of qrouter (DESIGN.md section 3): what the protocol's Python half shares
with it (the message schema and its error, the subscriber states, the tag key) is defined
here, and qrouter/eo's messages.py, records.py and tags.py re-export it.
"""

import json
import sys
from operator import itemgetter

cimport cython
from cpython.bytes cimport (
    PyBytes_AS_STRING, PyBytes_CheckExact, PyBytes_FromStringAndSize, PyBytes_GET_SIZE,
)
from cpython.set cimport PySet_Add, PySet_Discard
from cpython.mem cimport PyMem_Free, PyMem_Malloc, PyMem_Realloc
from cpython.ref cimport Py_INCREF, Py_XDECREF, Py_XINCREF, PyObject
from libc.stdint cimport UINT32_MAX, uint32_t, uint64_t
from cpython.dict cimport PyDict_GetItem, PyDict_SetDefault
from cpython.list cimport PyList_GET_ITEM
from cpython.tuple cimport PyTuple_GET_ITEM
from libc.string cimport memcmp, memcpy, memset
from enum import IntEnum

# SubState (records.py): a subscriber's state for one delivery, as the origin knows it
cdef enum:
    S_PENDING = 0
    S_ACCEPTED = 1
    S_SEEN = 2

# LocalState (records.py): one local subscriber attachment's state for one delivery
cdef enum:
    L_HELD = 0
    L_QUEUED = 1
    L_DELIVERED = 2
    L_ACCEPTED = 3
    L_SETTLING = 4
    L_SEEN = 5

cdef extern from *:
    """
    /* A dict's version (PEP 509): it changes with every change of the dict, and no two
       states of any dicts share one, so an equal version means the same dict, unchanged.
       0: unknown (Python 3.12 deprecated the field; there the callers compare contents). */
    static CYTHON_INLINE unsigned long long eo_dict_version(PyObject *d) {
    #if PY_VERSION_HEX < 0x030C0000 && !defined(PYPY_VERSION) && !defined(Py_LIMITED_API)
        return (unsigned long long)((PyDictObject *)d)->ma_version_tag;
    #else
        (void)d;
        return 0;
    #endif
    }
    """
    unsigned long long eo_dict_version(dict d)

cdef extern from *:
    """
    /* A bytes object that `holders` references (counted by the caller: every one is its
       own) are all there is to: no one else can see it change. Changed in place, its cached
       hash (none: a record's value is never a key, but cheap to be sure) is forgotten. Not
       on a build where the layout may differ: there, never unshared (the caller copies). */
    static CYTHON_INLINE int eo_bytes_unshared(PyObject *b, Py_ssize_t holders) {
    #if !defined(PYPY_VERSION) && !defined(Py_LIMITED_API) && !defined(Py_GIL_DISABLED)
        return PyBytes_CheckExact(b) && Py_REFCNT(b) == holders && PyBytes_GET_SIZE(b) > 1;
    #else
        (void)b; (void)holders;
        return 0;
    #endif
    }
    static CYTHON_INLINE void eo_bytes_forget_hash(PyObject *b) {
    #if !defined(PYPY_VERSION) && !defined(Py_LIMITED_API) && !defined(Py_GIL_DISABLED)
    #pragma GCC diagnostic push
    #pragma GCC diagnostic ignored "-Wdeprecated-declarations"
        ((PyBytesObject *)b)->ob_shash = -1;  /* (3.11 deprecated the field; it is there) */
    #pragma GCC diagnostic pop
    #else
        (void)b;
    #endif
    }
    """
    bint eo_bytes_unshared(object b, Py_ssize_t holders)
    void eo_bytes_forget_hash(object b)


cdef int EO_VERSION = 1
PROTOCOL_VERSION = EO_VERSION  # messages.EO_VERSION


class ProtocolError(ValueError):
    """A message that cannot be understood."""


# op -> {field: type}; every field is required, extra keys are ignored (messages.py)
FIELDS = {
    # on router_up: my instance, my local subscriber attachments, every subscriber I know
    "SUBS": {"instance": int, "attached": list, "known": list, "closed": list},
    "SUB": {"att": list, "sub": list, "map": list},  # a subscriber attached here
    "UNSUB": {"att": list, "sub": list, "closed": int},  # ... detached (closed: for good)
    "FWD": {"t": bytes, "pub": list, "tag": bytes, "body": bytes, "targets": list},
    "ACCEPT": {"t": bytes, "subs": list},  # these local subscribers accepted t
    "SETTLE": {"t": bytes, "targets": list},  # the publisher settled t
    "SEEN": {"t": bytes, "subs": list},  # these subscribers have seen t settled
    "ASK": {"pub": list, "tags": list},  # who holds this publisher? what became of these?
    "ANSWER": {"pub": list, "settled": list, "live": list},
    "PING": {"e": int},
    "PONG": {"e": int},
    # the answer to any message of a router without a guarantee for the topic (issue 15 b)
    "LACKING": {},
}


# The per-message ops travel as records, not maps (docs/exactly-once.md, "Messages"): tuples
# of typed values, headed by the op, which the envelopes' compact encoding writes as fixed
# binary records (qrouter/_fast/eo_wire.pxi) and decodes straight back into the same tuples.
#   ("FWD", topic, t, pub, tag, body, targets)    pub: (container, link)
#   ("ACCEPT", topic, t, subs)                     subs: ((container, link), ...)
#   ("SETTLE", topic, t, targets)                  targets: ((router, instance, n), ...)
#   ("SEEN", topic, t, subs)
# The maps of the same ops (a router before the records) are still understood.
RECORD_OPS = ("FWD", "ACCEPT", "SETTLE", "SEEN")


class SubState(IntEnum):
    """A subscriber's state for one delivery, as the origin knows it."""

    PENDING = S_PENDING  # in doubt: not known to have accepted
    ACCEPTED = S_ACCEPTED  # accepted (its client holds the delivery as accepted until settled)
    SEEN = S_SEEN  # settled, and known to have seen the settlement: nothing more is owed


# the outgoing tag's BLAKE2b key, size and personalisation (tags.py)
TAG_KEY = b"qrouter exactly-once pub/sub"
TAG_SIZE = 32
TAG_PERSON = b"qrouter-eo-tag1"

cdef dict _FIELDS = {op: tuple(fields.items()) for op, fields in FIELDS.items()}
cdef object _ProtocolError = ProtocolError
cdef object _SubState = SubState
cdef object _router_of = itemgetter(0)  # an attachment's router
cdef object _MISSING = object()  # a look-up's default: not held (None may be a value)
cdef bytes _TAG_KEY = TAG_KEY
cdef bytes _TAG_PERSON = TAG_PERSON
cdef int _TAG_SIZE = TAG_SIZE
cdef str _OP_ACCEPT = sys.intern("ACCEPT")  # (_c_handle_rec: the decoder's ops, interned)
cdef str _OP_SEEN = sys.intern("SEEN")


cdef dict _check_msg(msg):
    """messages.check, compiled: validate `msg`; raise ProtocolError with the reason."""
    if not isinstance(msg, dict):
        raise _ProtocolError("not a map")
    cdef dict m = <dict>msg
    op = m.get("op")
    fields = _FIELDS.get(op)
    if fields is None:
        raise _ProtocolError(f"unknown op {op!r}")
    if m.get("v") != EO_VERSION:
        raise _ProtocolError(f"{op}: version {m.get('v')!r}, expected {EO_VERSION}")
    for name, kind in <tuple>fields:
        value = m.get(name)
        if not isinstance(value, kind) or isinstance(value, bool):
            raise _ProtocolError(f"{op}: field {name!r} missing or not {kind.__name__}")
    return m


# -- encoding helpers --------------------------------------------------------------------------

cdef bytes _u32(Py_ssize_t n):
    cdef unsigned char b[4]
    b[0] = (n >> 24) & 255
    b[1] = (n >> 16) & 255
    b[2] = (n >> 8) & 255
    b[3] = n & 255
    return (<char *>b)[:4]


cdef bytes _lp(bytes raw):
    return _u32(len(raw)) + raw


cdef dict _PAIRS = {}
cdef dict _LAYOUTS = {}


cdef bytes _pair(tuple pair):
    """A subscriber's or publisher's (container, link), encoded once and reused."""
    cdef bytes out = _PAIRS.get(pair)
    if out is None:
        out = _lp(pair[0].encode()) + _lp(pair[1].encode())
        if len(_PAIRS) >= 4096:
            _PAIRS.clear()
        _PAIRS[pair] = out
    return out


cdef enum:
    LAYOUT_HINTS = 16  # a power of two: _Layout.c_pos's positions kept by subscriber object


cdef inline size_t _addr_slot(void *p, size_t n) noexcept:
    """A slot (0..n-1, n a power of two) of an object's address: a multiplicative hash, since
    the low bits repeat (objects of one size sit at multiples of it). The hint tables below
    look in the slot and its neighbour (slot ^ 1): two objects whose slots collide both stay."""
    return <size_t>(((<unsigned long long><size_t>p) * 0x9E3779B97F4A7C15ULL) >> 40) & (n - 1)


cdef class _Layout:
    """The subscribers of origin records, in a record's order, shared by every record with
    the same ones (a topic's records while its subscribers do not change): a record keeps one
    state byte per subscriber, indexed by its position here, instead of a dict. Immutable:
    a record whose subscribers change takes another layout, so a position means the same
    subscriber for as long as any record refers to the layout (its reference count)."""

    cdef readonly tuple subs  # in the record's order (the order the dict had)
    cdef dict index  # sub -> position
    cdef bytes count  # the STATE_V2 subscriber count
    cdef tuple encoded  # ((position, encoded sub), ...) in sorted order: STATE_V2's
    # STATE_V2's subscriber part with every state byte 0 (count, then each encoded sub and
    # its state byte), and where each state byte goes in it (`_at`) taken from which
    # position (`_pos`): `OriginRecord.encode_state` copies it and fills the state bytes
    cdef bytes template
    cdef Py_ssize_t *_at
    cdef Py_ssize_t *_pos
    # the positions of the subscriber ids the messages name, by the id object (c_pos): the
    # wire decoder hands the same tuple for the same octets, the local links their own, so
    # an ACCEPT or SEEN finds its subscribers with no hash. Each slot holds a reference to
    # its id (an address is never another object's) and only exact tuples go in (immutable,
    # so the position found for one stays right); a miss looks it up in `index`.
    cdef PyObject *_hint_sub[LAYOUT_HINTS]
    cdef Py_ssize_t _hint_pos[LAYOUT_HINTS]

    def __cinit__(self, tuple subs):
        self.subs = subs
        self.index = {sub: i for i, sub in enumerate(subs)}
        if len(self.index) != len(subs):
            raise ValueError("duplicate subscriber")
        self.count = _u32(len(subs))
        self.encoded = tuple([(self.index[sub], _pair(sub)) for sub in sorted(subs)])
        cdef Py_ssize_t n = len(subs), i = 0, at = 4
        cdef list parts = [self.count]
        self._at = <Py_ssize_t *>PyMem_Malloc((n + 1) * sizeof(Py_ssize_t))
        self._pos = <Py_ssize_t *>PyMem_Malloc((n + 1) * sizeof(Py_ssize_t))
        if self._at == NULL or self._pos == NULL:
            raise MemoryError()
        for pos, encoded in self.encoded:
            parts.append(encoded)
            parts.append(b"\x00")
            at += len(<bytes>encoded)
            self._at[i] = at
            self._pos[i] = pos
            at += 1
            i += 1
        self.template = b"".join(parts)

    def __dealloc__(self):
        cdef Py_ssize_t i
        PyMem_Free(self._at)
        PyMem_Free(self._pos)
        for i in range(LAYOUT_HINTS):
            Py_XDECREF(self._hint_sub[i])

    cdef inline Py_ssize_t c_pos(self, sub) except -2:
        """The position of `sub` (index.get(sub)), -1 if it is not one of the subscribers."""
        cdef size_t h = _addr_slot(<PyObject *>sub, LAYOUT_HINTS)
        cdef PyObject *old
        if self._hint_sub[h] == <PyObject *>sub:
            return self._hint_pos[h]
        if self._hint_sub[h ^ 1] == <PyObject *>sub:
            return self._hint_pos[h ^ 1]
        pos = self.index.get(sub)
        if pos is None:
            return -1
        if type(sub) is tuple:  # in slot h; the one there moves to h ^ 1 (and that one goes)
            old = self._hint_sub[h ^ 1]
            self._hint_sub[h ^ 1] = self._hint_sub[h]
            self._hint_pos[h ^ 1] = self._hint_pos[h]
            Py_INCREF(sub)
            self._hint_sub[h] = <PyObject *>sub
            self._hint_pos[h] = <Py_ssize_t>pos
            Py_XDECREF(old)
        return <Py_ssize_t>pos


cdef _Layout _layout_of(tuple subs):
    """The layout of `subs` (in that order), made once and reused."""
    cdef _Layout out = _LAYOUTS.get(subs)
    if out is None:
        out = _Layout(subs)
        if len(_LAYOUTS) >= 1024:
            _LAYOUTS.clear()  # (records keep theirs)
        _LAYOUTS[subs] = out
    return out


cdef _Layout _NO_SUBS = _layout_of(())
cdef enum:
    INLINE_SUBS = 16  # state bytes kept in the record itself; more are allocated


STATE_V2 = b"\x02"  # the origin record encoding (see qrouter/eo/records.py)
cdef tuple _SUB_STATES = tuple(SubState)


cdef class _Reader:
    cdef bytes raw
    cdef Py_ssize_t pos

    def __cinit__(self, bytes raw, Py_ssize_t pos):
        self.raw = raw
        self.pos = pos

    cdef Py_ssize_t u32(self) except -1:
        cdef Py_ssize_t end = self.pos + 4
        if end > len(self.raw):
            raise ValueError("truncated origin record")
        n = int.from_bytes(self.raw[self.pos:end], "big")
        self.pos = end
        return n

    cdef int byte(self) except -1:
        if self.pos >= len(self.raw):
            raise ValueError("truncated origin record")
        self.pos += 1
        return self.raw[self.pos - 1]

    cdef bytes field(self):
        cdef Py_ssize_t n = self.u32()
        cdef Py_ssize_t end = self.pos + n
        if end > len(self.raw):
            raise ValueError("truncated origin record")
        value = self.raw[self.pos:end]
        self.pos = end
        return value

    cdef str text(self):
        return self.field().decode()


# -- records ---------------------------------------------------------------------------------

# What the records keep of the dataclasses they replaced: equality and a repr over their
# fields (`_names()` of the class, in order). Not a shared base class: a freelist (one per
# record class) is only allowed on a class without a base.

cdef tuple _fields(rec):
    return tuple([getattr(rec, name) for name in rec._names()])


cdef _record_eq(rec, other):
    if type(other) is not type(rec):
        return NotImplemented
    return _fields(rec) == _fields(other)


cdef str _record_repr(rec):
    inner = ", ".join([f"{n}={v!r}" for n, v in zip(rec._names(), _fields(rec))])
    return f"{type(rec).__name__}({inner})"


cdef tuple _ORIGIN_NAMES = (
    "out_tag", "publisher", "tag", "body", "subs", "settled", "accepted_sent", "forwarded",
    "filled", "settle_sent",
)
cdef tuple _LOCAL_NAMES = (
    "out_tag", "body", "publisher", "tag", "drivers", "subs", "settled", "settled_epoch",
    "settled_by",
)


cdef enum:
    ATT_SLOTS = 64  # attachment slots of a topic: bits of a record's sent-sets


cdef bint _same_members(set s, tuple order):
    """set(order) == s, decided by identity: every member of `s` is one of the (distinct)
    objects of `order`, and they are as many. False when not so (the caller compares then):
    the view's sets hold the same id objects from one message to the next, so this hashes
    nothing."""
    cdef Py_ssize_t n = len(order), j
    if len(s) != n or n > 4:
        return False
    for a in s:
        for j in range(n):
            if <PyObject *>PyTuple_GET_ITEM(order, j) == <PyObject *>a:
                break
        else:
            return False
    return True


cdef class _AttSlots:
    """A topic's subscriber attachments by slot (0..63), for the origin records' sent-sets
    as bits (forwarded, filled, settle_sent). A slot is freed only by `EoCore._c_slot` when
    every slot is taken, and only if no record of the topic has its bit set and no claim of
    the view names its attachment: so a bit means the same attachment for as long as it is
    set. An attachment without a slot (more than 64 in use) goes in the record's sets."""

    cdef dict slot  # att -> slot
    cdef list atts  # slot -> att, or None
    cdef unsigned long long used
    # att object -> its slot, by the object's address (EoCore._c_slot): a hint, right only
    # if `atts` holds that very object in that slot (so nothing to keep in step)
    cdef unsigned char hint[ATT_SLOTS]

    def __cinit__(self):
        self.slot = {}
        self.atts = [None] * ATT_SLOTS
        self.used = 0


cdef set _bits_set(_AttSlots slots, unsigned long long bits, set extra):
    cdef set out = set() if extra is None else set(extra)
    cdef int i
    if slots is not None:
        for i in range(ATT_SLOTS):
            if bits & (1ULL << i):
                out.add(slots.atts[i])
    return out


# Not tracked by the cyclic collector (no_gc): a record is made per message and lives until
# the message is done everywhere, so tracked records made the collector's young passes
# frequent and long (a router's records in flight, traversed at each). A record cannot be in
# a reference cycle: its fields hold bytes, ids (tuples of str), sets of ids and the shared
# layouts/keys, which hold ids and (a _Keys) a chain of strictly longer _Keys; nothing stores
# a record, or a container holding one, in a record. (Were Python code to do it, the cycle
# would leak, not crash: what an untracked object refers to counts as reachable.)
@cython.no_gc
@cython.freelist(256)
cdef class OriginRecord:
    """At the router that holds (or held) the publisher's link: see qrouter/eo/records.py."""

    cdef readonly bytes out_tag  # (readonly: _okey is made of it)
    cdef public tuple publisher
    cdef public bytes tag
    cdef public object body  # None: recovered from a store that lacked it (never sent empty)
    cdef bytes _okey  # b"o/" + out_tag, its store key (_origin_key), made once
    # its keys in the record log (`_log_keys`): `_lprefix` + b"o/" + out_tag and + b"m/" +
    # out_tag, made at its first logged save and kept while it lives, so that each of its
    # log entries (a put, patches, the deletes) reuses them and their cached hash in the
    # router's net changes; `_lprefix` is the topic prefix they were made with (held, so
    # an identity check cannot match another prefix at a reused address)
    cdef bytes _lokey
    cdef bytes _lmkey
    cdef bytes _lprefix
    # the record log's numbers (`LogRefs`) of a put of `_lokey` and of `_lmkey`, valid while
    # the log generation they were given in (`_lo_gen`, `_lm_gen`; 0: none) is the current
    # one: its patches and deletes name the record by that number, not by its key
    cdef uint32_t _lo_ref, _lm_ref
    cdef uint64_t _lo_gen, _lm_gen
    # the checkpoint interval (`LogRefs.interval`; 0: none) in which `_lokey`, `_lmkey` was
    # put while the store could not hold it (the records as of the last checkpoint lack
    # it): its delete in that interval only drops it from the net changes. What the
    # router's `jborn` set says of other keys, kept here so that a record made and deleted
    # between two checkpoints touches no set of the interval's keys
    cdef uint64_t _lo_new, _lm_new
    # the value of `_lokey` the log holds (its put whole this generation, patched since:
    # the router's net changes hold this very object) and what it was encoded from: the
    # layout, publisher and tag objects. While they all still hold, the next state change
    # is logged as a patch of its settled and state bytes (`_log_origin`) without encoding
    # the record again and comparing every byte of the two values
    cdef bytes _lval
    cdef _Layout _llayout
    cdef object _lpub
    cdef bytes _ltag
    # subs, Sub -> SubState: the subscribers' layout and one state byte each, by position
    cdef _Layout _layout
    cdef unsigned char *_st  # _inline, or allocated when there are more subscribers
    cdef unsigned char _inline[INLINE_SUBS]
    cdef public bint settled  # the publisher settled (or forgot) the delivery
    # the staging generation (EoCore._sgen) of its core's `_dirty` that holds it: 0, or an
    # older one, if `_dirty` does not (EoCore._c_save_origin)
    cdef unsigned long long _sgen
    # the `uid` of the TopicMemory whose `origins` holds it (commit_memory): 0 if none does
    cdef unsigned long long _mem_uid
    # the `_uid` of the core whose `_origins` holds it under its out tag, else 0: set where
    # the core puts it there (c_publisher_transfer), cleared where the core takes it out
    # (_c_delete_origin, the only place a record leaves `_origins`), so a hint that names
    # the record (an accept output, a local record's `_origin`) stands for that core's
    # look-up (EoCore._c_origin). 0 for a record put there by Python (recovery): looked up
    cdef unsigned long long _held_by
    # the core's staging generation (EoCore._sgen) when it put the record in `_origins`
    # (with `_held_by`): one held since an earlier generation has no tag in `_gone`
    # (EoCore._c_not_gone)
    cdef unsigned long long _put_sgen
    # Not persisted: what has been sent in the current connection incarnations.
    cdef public bint accepted_sent
    # as bits by attachment slot of the topic's `_slots` (set by the core when it sets a bit),
    # and sets for attachments without one (or given by Python): None until one goes in
    cdef _AttSlots _slots
    cdef unsigned long long _fwd_bits
    cdef unsigned long long _fill_bits
    cdef unsigned long long _settle_bits
    cdef set _forwarded
    cdef set _filled
    cdef set _settle_sent

    def __init__(
        self,
        bytes out_tag,
        tuple publisher,
        bytes tag,
        body,
        dict subs,
        bint settled=False,
        bint accepted_sent=False,
        set forwarded=None,
        set filled=None,
        set settle_sent=None,
    ):
        self.out_tag = out_tag
        self.publisher = publisher
        self.tag = tag
        self.body = body
        self._c_set_subs(subs)
        self.settled = settled
        self.accepted_sent = accepted_sent
        self._forwarded = set(forwarded) if forwarded else None
        self._filled = set(filled) if filled else None
        self._settle_sent = set(settle_sent) if settle_sent else None

    # the sent-sets read as new sets (assign to change them)
    @property
    def forwarded(self):
        return _bits_set(self._slots, self._fwd_bits, self._forwarded)

    @forwarded.setter
    def forwarded(self, set value):
        self._fwd_bits = 0
        self._forwarded = set(value) if value else None

    @property
    def filled(self):
        return _bits_set(self._slots, self._fill_bits, self._filled)

    @filled.setter
    def filled(self, set value):
        self._fill_bits = 0
        self._filled = set(value) if value else None

    @property
    def settle_sent(self):
        return _bits_set(self._slots, self._settle_bits, self._settle_sent)

    @settle_sent.setter
    def settle_sent(self, set value):
        self._settle_bits = 0
        self._settle_sent = set(value) if value else None

    def _names(self):
        return _ORIGIN_NAMES

    def _fields(self):
        return _fields(self)

    def __eq__(self, other):
        return _record_eq(self, other)

    def __repr__(self):
        return _record_repr(self)

    def __cinit__(self):
        self._layout = _NO_SUBS
        self._st = self._inline

    def __dealloc__(self):
        if self._st != NULL and self._st != self._inline:
            PyMem_Free(self._st)

    cdef int _c_layout(self, _Layout layout) except -1:
        """Take `layout`, every state PENDING (the caller fills them in)."""
        cdef Py_ssize_t i, n = len(layout.subs)
        cdef unsigned char *st = self._inline
        if n > INLINE_SUBS:
            st = <unsigned char *>PyMem_Malloc(n)
            if st == NULL:
                raise MemoryError()
        if self._st != NULL and self._st != self._inline:
            PyMem_Free(self._st)
        self._st = st
        for i in range(n):
            st[i] = S_PENDING
        self._layout = layout
        return 0

    cdef int _c_set_subs(self, dict subs) except -1:
        cdef Py_ssize_t i = 0, v
        for state in subs.values():
            v = state
            if not 0 <= v <= 2:
                raise ValueError(f"bad subscriber state {state!r}")
        self._c_layout(_layout_of(tuple(subs)))
        for state in subs.values():
            self._st[i] = <unsigned char>(<Py_ssize_t>state)
            i += 1
        return 0

    cdef int _c_relayout(self, tuple subs) except -1:
        """Take the layout of `subs`, keeping each remaining subscriber's state."""
        cdef _Layout old = self._layout
        cdef unsigned char saved[INLINE_SUBS]
        cdef unsigned char *prev = saved
        cdef Py_ssize_t i, n = len(old.subs)
        cdef dict index = old.index
        if n > INLINE_SUBS:
            prev = <unsigned char *>PyMem_Malloc(n)
            if prev == NULL:
                raise MemoryError()
        try:
            memcpy(prev, self._st, n)
            self._c_layout(_layout_of(subs))
            for i in range(len(subs)):
                pos = index.get(subs[i])
                if pos is not None:
                    self._st[i] = prev[<Py_ssize_t>pos]
        finally:
            if prev != saved:
                PyMem_Free(prev)
        return 0

    cdef inline int c_state(self, sub):
        """The state of `sub`, -1 if it is not one of the record's subscribers."""
        pos = self._layout.index.get(sub)
        if pos is None:
            return -1
        return self._st[<Py_ssize_t>pos]

    @property
    def subs(self):
        """Sub -> SubState, as a new dict (change it with set_subs / add_sub / pop_sub)."""
        cdef Py_ssize_t i
        cdef tuple subs = self._layout.subs
        return {subs[i]: _SUB_STATES[self._st[i]] for i in range(len(subs))}

    @subs.setter
    def subs(self, dict value):
        self._c_set_subs(value)

    def has_sub(self, sub):
        return sub in self._layout.index

    def add_sub(self, sub, state):
        """Add `sub` in `state` unless it is there already (True if added)."""
        cdef Py_ssize_t v = state
        if sub in self._layout.index:
            return False
        if not 0 <= v <= 2:
            raise ValueError(f"bad subscriber state {state!r}")
        self._c_relayout(self._layout.subs + (sub,))
        self._st[len(self._layout.subs) - 1] = <unsigned char>v
        return True

    def pop_sub(self, sub):
        """Remove `sub`: its state, or None if it was not there."""
        cdef int st = self.c_state(sub)
        if st < 0:
            return None
        self._c_relayout(tuple([s for s in self._layout.subs if s != sub]))
        return _SUB_STATES[st]

    cdef bint c_pending(self):
        cdef Py_ssize_t i
        for i in range(len(self._layout.subs)):
            if self._st[i] == S_PENDING:
                return True
        return False

    def pending(self):
        return self.c_pending()

    cdef bint c_done(self):
        cdef Py_ssize_t i
        if not self.settled:
            return False
        for i in range(len(self._layout.subs)):
            if self._st[i] != S_SEEN:
                return False
        return True

    def done(self):
        return self.c_done()

    def interested_routers(self, dict where):
        """The seed's per-router view: each router holding some of our subscribers, with the
        least advanced state among them. `where`: subscriber -> routers it is attached at."""
        cdef dict out = {}
        for sub, state in self.subs.items():
            for router in where.get(sub, ()):
                out[router] = min(out.get(router, state), state)
        return out

    def encode_state(self):
        """The durable state (`STATE_V2`): written once per loop iteration by the router's
        group commit, so it is a flat binary record rather than JSON."""
        return self._c_encode_state()

    cdef bytes _c_encode_state(self):
        # (one allocation: the layout's template copied, its state bytes filled in; a C call
        # from the group commit, not a Python method call)
        cdef _Layout layout = self._layout
        cdef bytes pub = _pair(self.publisher)
        cdef bytes tag = self.tag
        cdef bytes template = layout.template
        cdef Py_ssize_t n_pub = len(pub), n_tag = len(tag), i
        cdef Py_ssize_t base = 2 + n_pub + 4 + n_tag
        cdef bytes out = PyBytes_FromStringAndSize(NULL, base + len(template))
        cdef unsigned char *b = <unsigned char *>PyBytes_AS_STRING(out)
        b[0] = 2  # STATE_V2
        b[1] = 1 if self.settled else 0
        memcpy(b + 2, PyBytes_AS_STRING(pub), n_pub)
        b[2 + n_pub] = (n_tag >> 24) & 255
        b[3 + n_pub] = (n_tag >> 16) & 255
        b[4 + n_pub] = (n_tag >> 8) & 255
        b[5 + n_pub] = n_tag & 255
        memcpy(b + 6 + n_pub, PyBytes_AS_STRING(tag), n_tag)
        memcpy(b + base, PyBytes_AS_STRING(template), len(template))
        b += base
        for i in range(len(layout.subs)):
            if self._st[layout._pos[i]] > S_SEEN:
                raise IndexError("origin record state byte out of range")
            b[layout._at[i]] = self._st[layout._pos[i]]
        return out

    @classmethod
    def decode(cls, bytes out_tag, bytes state, body):
        if state[:1] == b"{":
            return cls._decode_json(out_tag, state, body)
        if state[:1] != STATE_V2 or len(state) < 2:
            raise ValueError("unknown origin record encoding")
        cdef _Reader r = _Reader(state, 2)
        publisher = (r.text(), r.text())
        tag = r.field()
        cdef dict subs = {}
        cdef Py_ssize_t _i, n = r.u32()
        for _i in range(n):
            sub = (r.text(), r.text())
            subs[sub] = _SubState(r.byte())
        if r.pos != len(state):
            raise ValueError("trailing bytes in origin record")
        return cls(out_tag, publisher, tag, body, subs, state[1] == 1)

    @classmethod
    def _decode_json(cls, bytes out_tag, bytes state, body):
        """The encoding of releases before STATE_V2 (a store written by one of them)."""
        d = json.loads(state)
        subs = {(c, link): _SubState(s) for c, link, s in d["subs"]}
        return cls(
            out_tag,
            (d["pub"][0], d["pub"][1]),
            bytes.fromhex(d["tag"]),
            body,
            subs,
            bool(d["settled"]),
        )


cdef class _Keys:
    """A local record's subscriber attachments, in the order they joined it, shared by every
    record with the same ones: the record keeps one state byte per attachment, by position.
    Immutable, as `_Layout`: a record that gains or loses one takes another."""

    cdef readonly tuple keys
    cdef dict index  # att -> position
    # the last _Keys made from this one by appending `succ_key`: a record's next, without a
    # tuple (one, so that what a record's keys keep alive is bounded by its attachments)
    cdef object succ_key
    cdef _Keys succ

    def __cinit__(self, tuple keys):
        self.keys = keys
        self.index = {k: i for i, k in enumerate(keys)}


cdef dict _KEYS = {}


cdef _Keys _keys_of(tuple keys):
    cdef _Keys out = _KEYS.get(keys)
    if out is None:
        out = _Keys(keys)
        if len(_KEYS) >= 1024:
            _KEYS.clear()  # (records keep theirs)
        _KEYS[keys] = out
    return out


cdef _Keys _keys_plus(_Keys keys, key):
    if keys.succ is not None and keys.succ_key == key:
        return keys.succ
    cdef _Keys out = _keys_of(keys.keys + (key,))
    keys.succ_key = key
    keys.succ = out
    return out


cdef _Keys _NO_KEYS = _keys_of(())


cdef enum:
    INLINE_ATTS = 8  # local state bytes kept in the record itself; more are allocated
    ATT_BY_ID = 4  # LocalRecord.c_pos: keys compared by identity before the index is asked


@cython.no_gc  # (see OriginRecord)
@cython.freelist(256)
cdef class LocalRecord:
    """At a router with subscribers: see qrouter/eo/records.py."""

    cdef public bytes out_tag
    cdef public object body  # None: a placeholder, or a settled tombstone
    cdef public object publisher
    cdef public object tag
    # drivers, routers that forwarded it (where ACCEPT goes), and settled_by, routers that
    # want SEEN: None, the one router (most records have one), or a set of them
    cdef object _drivers
    cdef object _settled_by
    # subs, AttId -> LocalState: the attachments and one state byte each, by position
    cdef _Keys _keys
    cdef unsigned char *_st
    cdef unsigned char _inline[INLINE_ATTS]
    cdef public bint settled
    cdef public long long settled_epoch  # barrier epoch when the settlement arrived
    # this router's origin record of the same out tag when this router drives it (its own
    # FWD made or reached this record): the ACCEPT and SEEN this record sends to its own
    # router name it, so that they need no look-up in `_origins` (EoCore._c_origin checks
    # it is held there); None otherwise, and once every subscriber here has seen the
    # settlement (no more of those to send)
    cdef OriginRecord _origin
    # the `_uid` of the core whose `_locals` holds it under its out tag, else 0: set where a
    # record goes in (EoCore._c_local_put, `_put_local`), cleared where one comes out
    # (EoCore._c_local_gone), so that `rec._held_by == core._uid` is `core._locals.get(
    # rec.out_tag) is rec` with no look-up (the rings' hints, _RecRing; the tick's walks)
    cdef unsigned long long _held_by

    def __cinit__(self):
        self._keys = _NO_KEYS
        self._st = self._inline

    def __dealloc__(self):
        if self._st != NULL and self._st != self._inline:
            PyMem_Free(self._st)

    def __init__(
        self,
        bytes out_tag,
        body=None,
        publisher=None,
        tag=None,
        set drivers=None,
        dict subs=None,
        bint settled=False,
        long long settled_epoch=0,
        set settled_by=None,
    ):
        self.out_tag = out_tag
        self.body = body
        self.publisher = publisher
        self.tag = tag
        self.drivers = drivers
        if subs:
            self.subs = subs
        self.settled = settled
        self.settled_epoch = settled_epoch
        self.settled_by = settled_by

    @property
    def drivers(self):
        return _routers_set(self._drivers)

    @drivers.setter
    def drivers(self, set value):
        self._drivers = set(value) if value else None

    @property
    def settled_by(self):
        return _routers_set(self._settled_by)

    @settled_by.setter
    def settled_by(self, set value):
        self._settled_by = set(value) if value else None

    @property
    def subs(self):
        """AttId -> LocalState, as a new dict (change it with set_sub / pop_sub)."""
        cdef Py_ssize_t i
        cdef tuple keys = self._keys.keys
        return {keys[i]: self._st[i] for i in range(len(keys))}

    @subs.setter
    def subs(self, dict value):
        self._c_take(_NO_KEYS)
        for att, state in value.items():
            self.c_set(att, state)

    def has_sub(self, att):
        return att in self._keys.index

    def set_sub(self, att, state):
        self.c_set(att, state)

    def pop_sub(self, att):
        """Remove `att`: its state, or None if it was not there."""
        cdef int st = self.c_pop_sub(att)
        return None if st < 0 else st

    cdef int c_pop_sub(self, att) except -2:
        """pop_sub: `att`'s state, -1 if it was not there."""
        cdef Py_ssize_t pos = self.c_pos(att)
        cdef unsigned char saved[INLINE_ATTS]
        cdef unsigned char *prev = saved
        cdef Py_ssize_t i, j = 0, n = len(self._keys.keys)
        cdef tuple old = self._keys.keys
        if pos < 0:
            return -1
        cdef int st = self._st[pos]
        if n > INLINE_ATTS:
            prev = <unsigned char *>PyMem_Malloc(n)
            if prev == NULL:
                raise MemoryError()
        try:
            memcpy(prev, self._st, n)
            # (the keys are distinct: only the one at `pos` equals `att`)
            self._c_take(_NO_KEYS if n == 1 else _keys_of(old[:pos] + old[pos + 1:]))
            for i in range(n):
                if i != pos:
                    self._st[j] = prev[i]
                    j += 1
        finally:
            if prev != saved:
                PyMem_Free(prev)
        return st

    cdef int _c_take(self, _Keys keys) except -1:
        """Take `keys`, keeping the states of the positions both have (a prefix)."""
        cdef Py_ssize_t n = len(keys.keys), old = len(self._keys.keys)
        cdef unsigned char *st
        if n > INLINE_ATTS and (n > old or old <= INLINE_ATTS):
            st = <unsigned char *>PyMem_Malloc(n if n > 2 * INLINE_ATTS else 2 * INLINE_ATTS)
            if st == NULL:
                raise MemoryError()
            memcpy(st, self._st, old if old < n else n)
            if self._st != self._inline:
                PyMem_Free(self._st)
            self._st = st
        self._keys = keys
        return 0

    cdef inline Py_ssize_t c_pos(self, att) except -2:
        """`att`'s position in the record, -1 if it is not one of its attachments. The first
        few keys are compared by identity before the index is asked: the callers pass the
        attachment's own id (LocalSub.att, the object the record was given), and an AttId is
        a tuple, whose hash is computed anew at every dict look-up. (The keys are distinct,
        so the object itself at i means index[att] == i: the same answer.)"""
        cdef tuple keys = self._keys.keys
        cdef Py_ssize_t i, n = len(keys)
        for i in range(n if n < ATT_BY_ID else ATT_BY_ID):
            if PyTuple_GET_ITEM(keys, i) == <PyObject *>att:
                return i
        if n == 0:
            return -1  # (a new record: no tuple hashed to ask an empty index)
        pos = self._keys.index.get(att)
        return -1 if pos is None else <Py_ssize_t>pos

    cdef inline int c_state(self, att) except -2:
        """The state of `att`, -1 if it is not one of the record's attachments."""
        cdef Py_ssize_t pos = self.c_pos(att)
        return -1 if pos < 0 else self._st[pos]

    cdef int c_set(self, att, state) except -1:
        cdef Py_ssize_t v = state
        if not L_HELD <= v <= L_SEEN:
            raise ValueError(f"bad local state {state!r}")
        cdef Py_ssize_t pos = self.c_pos(att)
        if pos < 0:
            self._c_take(_keys_plus(self._keys, att))
            pos = len(self._keys.keys) - 1
        self._st[pos] = <unsigned char>v
        return 0

    cdef inline int c_add(self, att, unsigned char state) except -1:
        """c_set(att, state) for an `att` the record does not have yet."""
        self._c_take(_keys_plus(self._keys, att))
        self._st[len(self._keys.keys) - 1] = state
        return 0

    cdef inline int c_add_alone(self, _Keys alone, unsigned char state) except -1:
        """c_add(alone.keys[0], state) to a record with no attachments yet, taking `alone`
        (a LocalSub's own, LocalSub.c_alone) as its keys."""
        self._c_take(alone)
        self._st[0] = state
        return 0

    def _names(self):
        return _LOCAL_NAMES

    def _fields(self):
        return _fields(self)

    def __eq__(self, other):
        return _record_eq(self, other)

    def __repr__(self):
        return _record_repr(self)

    @property
    def placeholder(self):
        return self.body is None and not self.settled

    cdef bint c_all_accepted(self):
        cdef Py_ssize_t i, n = len(self._keys.keys)
        if n == 0:
            return False
        for i in range(n):
            if self._st[i] < L_ACCEPTED:
                return False
        return True

    cdef bint c_all_seen(self):
        cdef Py_ssize_t i
        for i in range(len(self._keys.keys)):
            if self._st[i] != L_SEEN:
                return False
        return True

    def all_accepted(self):
        return self.c_all_accepted()

    def all_seen(self):
        return self.c_all_seen()


cdef set _routers_set(routers):
    if routers is None:
        return set()
    if type(routers) is set:
        return set(<set>routers)
    return {routers}


cdef object _routers_add(routers, router):
    """`routers` (None, one, or a set) with `router` added."""
    if routers is None:
        return router
    if type(routers) is set:
        (<set>routers).add(router)
        return routers
    if routers == router:
        return routers
    return {routers, router}


cdef inline bytes _origin_key(OriginRecord rec):
    """The record's store key, b"o/" + out_tag, made at its first save."""
    cdef bytes key = rec._okey
    if key is None:
        key = rec._okey = b"o/" + rec.out_tag
    return key


cdef object _closed_view = None  # the view whose `closed` is _closed_map (_view_closed)
cdef object _closed_map = None


cdef inline object _view_closed(view):
    """view.closed, without the attribute lookup for the view asked last (one topic's, as a
    rule, once per SEEN: _c_long_closed). A view's `closed` is one dict for its life (changed
    in place, never rebound: qrouter/eo/view.py); the view kept here stays alive, so another
    cannot take its address."""
    global _closed_view, _closed_map
    if view is not _closed_view:
        _closed_map = view.closed
        _closed_view = view
    return _closed_map


cdef LocalRecord _new_local(bytes out_tag):
    """LocalRecord(out_tag), without the call's argument parsing (one per delivery and
    subscriber router)."""
    cdef LocalRecord rec = LocalRecord.__new__(LocalRecord)
    rec.out_tag = out_tag
    return rec


cdef inline bytes _bytes(x):
    """bytes(x), without the call when it is bytes already (a transfer's tag and payload)."""
    return <bytes>x if type(x) is bytes else bytes(x)


cdef OriginRecord _new_origin(bytes out_tag, tuple publisher, bytes tag, body,
                              _Layout layout):
    """OriginRecord(out_tag, publisher, tag, body, {sub: PENDING for sub in layout}), without
    the call's argument parsing or a dict (one per guaranteed message)."""
    cdef OriginRecord rec = OriginRecord.__new__(OriginRecord)
    rec.out_tag = out_tag
    rec.publisher = publisher
    rec.tag = tag
    rec.body = body
    rec._c_layout(layout)
    return rec


cdef class PubLink:
    """A publisher link attached here (protocol.py's `_PubLink`)."""

    cdef public dict attach_map  # tag -> accepted, as the publisher reported on attach
    # tags of the attach map we asked the publisher to resend and it has not yet (protocol.py)
    cdef public set awaiting
    # tag -> subscribers an ex-driver owed it to (ASK `owed`), for the record its resend makes
    cdef public dict owed

    # the publisher's tag state (eo_tag.pxi), taken on its first transfer: a tag costs one
    # BLAKE2b compression, at the transfer and again at a settlement that does not come with
    # the record's out tag (cheaper than keeping each tag's result in a dict until the
    # settlement, as this link did; the accept output carries it: c_publisher_settled)
    cdef TagPrefix _prefix

    def __init__(self, dict attach_map, set awaiting, dict owed=None):
        self.attach_map = attach_map
        self.awaiting = awaiting
        self.owed = {} if owed is None else owed

    cdef bytes c_out_tag(self, tuple pub, tag):
        """_outgoing_tag(pub, tag) (pub: this link's)."""
        if self._prefix is None:
            self._prefix = _tag_prefix(pub)
        return self._prefix.c_tag(tag)

    cdef bytes c_take_out_tag(self, tuple pub, tag):
        """_outgoing_tag(pub, tag): the publisher settled `tag`."""
        return self.c_out_tag(pub, tag)


cdef enum:
    # a _RecRing's slots at first (8 octets each), and how many from its head a look-up
    # looks at (a record taken out of order passes a few)
    RING_FIRST = 64
    RING_LOOK = 8
    # at most: a subscriber's delivered records (LocalSub._dring), the core's (EoCore._fring)
    DRING_MOST = 4096
    FRING_MOST = 32768


@cython.final
cdef class _RecRing:
    """Local records in the order they came (c_push), oldest first, for a look-up by out tag
    that expects them in about that order (c_take): a ring of `size` slots (a power of two,
    grown up to `most`, then the oldest overwritten) holding those from counter `head` to
    `tail`. Its records are read in order, not probed for in `_locals`, a table of every
    record in flight (cache misses on every router). A hint: a record is taken from it only
    while `_locals` holds it (LocalRecord._held_by) and it has the out tag asked."""

    cdef list ring
    cdef size_t head, tail, size, most

    def __cinit__(self, size_t most):
        self.most = most

    cdef int c_push(self, LocalRecord rec) except -1:
        cdef list ring = self.ring
        cdef size_t i, n
        if self.tail - self.head == self.size:
            if self.size < self.most:  # (full: twice as large, in order)
                n = RING_FIRST if self.size == 0 else 2 * self.size
                ring = [None] * n
                for i in range(self.head, self.tail):
                    ring[i & (n - 1)] = self.ring[i & (self.size - 1)]
                self.ring = ring
                self.size = n
            else:
                self.head += 1  # (the oldest overwritten: its look-up asks `_locals`)
        ring[self.tail & (self.size - 1)] = rec
        self.tail += 1
        return 0

    cdef LocalRecord c_take(self, out_tag, unsigned long long uid):
        """The record of `out_tag` among the first RING_LOOK (taken out of the ring) if
        `_locals` holds it (marked with `uid`, the core's), else None. The heads no longer
        held are let go first. One taken behind the head closes its gap: those before it
        move up a slot (fewer than RING_LOOK), so a record held at the head (a delivery left
        unaccepted, a SETTLE held up) leaves the look-ups behind it their RING_LOOK records,
        where gaps counted among them made every look-up from the RING_LOOK-th on miss."""
        cdef list ring = self.ring
        cdef size_t i, j, end, mask
        cdef PyObject *p
        cdef LocalRecord rec
        if ring is None:
            return None
        mask = self.size - 1
        self.c_let_go_heads(uid)
        end = self.head + RING_LOOK
        if end > self.tail:
            end = self.tail
        for i in range(self.head, end):
            p = PyList_GET_ITEM(ring, i & mask)
            if p == <PyObject *>None:
                continue
            rec = <LocalRecord>p
            if rec._held_by == uid and (rec.out_tag is out_tag or rec.out_tag == out_tag):
                j = i
                while j != self.head:  # (the ones before it, in order)
                    ring[j & mask] = <object>PyList_GET_ITEM(ring, (j - 1) & mask)
                    j -= 1
                ring[j & mask] = None
                self.head += 1
                return rec
        return None

    cdef inline int c_let_go_heads(self, unsigned long long uid) except -1:
        """The records at its head that `_locals` no longer holds let go."""
        cdef size_t mask = self.size - 1
        cdef PyObject *p
        while self.head != self.tail:
            p = PyList_GET_ITEM(self.ring, self.head & mask)
            if p != <PyObject *>None:
                if (<LocalRecord>p)._held_by == uid:
                    break
                self.ring[self.head & mask] = None
            self.head += 1
        return 0

    cdef int c_trim(self, unsigned long long uid, size_t keep) except -1:
        """(The tick.) The heads no longer held let go; then, if it holds more than `keep`
        entries, only its records `_locals` holds kept, in order: records dropped behind
        a held one (and their bodies) are not kept alive past a tick. Its slots go back to
        twice the entries left (RING_FIRST at least): a burst's, up to `most`, are not kept
        for the life of the attachment or topic."""
        cdef size_t i, j = 0, n, mask = self.size - 1
        cdef PyObject *p
        cdef list ring
        if self.ring is None:
            return 0
        self.c_let_go_heads(uid)
        n = RING_FIRST
        while n < 2 * (self.tail - self.head) and n < self.most:
            n *= 2
        if self.tail - self.head <= keep and n >= self.size:
            return 0
        ring = [None] * n  # (what it keeps fits: at most tail - head, at most `most`)
        for i in range(self.head, self.tail):
            p = PyList_GET_ITEM(self.ring, i & mask)
            if p != <PyObject *>None and (<LocalRecord>p)._held_by == uid:
                ring[j] = <object>p
                j += 1
        self.ring = ring
        self.size = n
        self.head = 0
        self.tail = j
        return 0

    def records(self):
        """The records it holds (tests)."""
        return [x for x in self.ring or () if x is not None]


cdef class LocalSub:
    """A subscriber attachment here (protocol.py's `_LocalSub`)."""

    cdef public tuple att
    cdef public tuple sub
    cdef public dict attach_map  # out tag -> accepted, as reported on attach
    cdef public object queue  # deque of out tags to deliver, in order; a HELD head blocks
    cdef public bint resumable  # False: the client cannot resume (e.g. proton)
    cdef public object stamp  # attach_stamp() when it attached: the order of attachments
    # the keys of a local record with this attachment alone, made of this very id object
    # (c_alone): not _keys_of's, shared by every equal id, whose tuple may hold an equal id
    # that is another object (a recovered record's, a placeholder's), which LocalRecord.c_pos
    # would then find only through its index, hashing the tuple at every look-up
    cdef _Keys _alone
    # (sub,): the subscribers an ACCEPT or SEEN of this attachment alone names, made once
    # (c_subs1), so the records of every message share it (and the origin's look-up of its
    # positions, _c_held_positions, which goes by the tuple object, finds it kept)
    cdef tuple _subs1
    # the local records delivered to it (_c_pump), oldest first: a subscriber accepts in
    # the order it was delivered to, as a rule, so its accept finds its record at the
    # ring's head (c_subscriber_accepted) rather than by a probe of `_locals`
    cdef _RecRing _dring

    cdef tuple c_subs1(self):
        cdef tuple subs1 = self._subs1
        if subs1 is None or PyTuple_GET_ITEM(subs1, 0) != <PyObject *>self.sub:
            subs1 = self._subs1 = (self.sub,)  # (made again if `sub` is replaced)
        return subs1

    cdef _Keys c_alone(self):
        cdef _Keys alone = self._alone
        if alone is None or PyTuple_GET_ITEM(alone.keys, 0) != <PyObject *>self.att:
            alone = self._alone = _Keys((self.att,))  # (made again if `att` is replaced)
        return alone

    def __init__(self, tuple att, tuple sub, dict attach_map, queue, bint resumable=True,
                 stamp=0):
        self.att = att
        self.sub = sub
        self.attach_map = attach_map
        self.queue = queue
        self.resumable = resumable
        self.stamp = stamp

    def detached(self):
        """It has left the core's `_subs` (TopicRouter.subscriber_detached): its ring of
        delivered records let go, which the tick's trim (of `_subs`' rings) no longer reaches
        while a hint (EoCore._ls_hint) keeps it alive."""
        self._dring = None


# -- message fields (messages.py's att_of / sub_of / att_wire / sub_list use these) -----------

cdef tuple _att_of(value):
    if not isinstance(value, (list, tuple)) or len(value) != 3:
        raise _ProtocolError(f"bad attachment id {value!r}")
    router, instance, n = value
    if not (isinstance(router, str) and isinstance(instance, int) and isinstance(n, int)):
        raise _ProtocolError(f"bad attachment id {value!r}")
    return (router, instance, n)


cdef tuple _sub_of(value):
    if type(value) is tuple and len(<tuple>value) == 2 and type((<tuple>value)[0]) is str and (
        type((<tuple>value)[1]) is str
    ):
        return <tuple>value
    if not isinstance(value, (list, tuple)) or len(value) != 2:
        raise _ProtocolError(f"bad subscriber id {value!r}")
    container, link = value
    if not (isinstance(container, str) and isinstance(link, str)):
        raise _ProtocolError(f"bad subscriber id {value!r}")
    return (container, link)


cdef tuple _atts_of(value):
    """A record's targets: a tuple of attachment ids (checked, not copied), or a map's list of
    them (converted)."""
    cdef Py_ssize_t i, n
    if type(value) is tuple:
        n = len(<tuple>value)
        for i in range(n):
            a = (<tuple>value)[i]
            if not (type(a) is tuple and len(<tuple>a) == 3 and type((<tuple>a)[0]) is str
                    and type((<tuple>a)[1]) is int and type((<tuple>a)[2]) is int):
                raise _ProtocolError(f"bad attachment id {a!r}")
        return <tuple>value
    if not isinstance(value, list):
        raise _ProtocolError("bad attachment list")
    return tuple([_att_of(a) for a in <list>value])


cdef tuple _subs_of(value):
    """A record's subscribers: a tuple of (container, link) (checked, not copied), or a map's
    list of them (converted)."""
    cdef Py_ssize_t i, n
    if type(value) is tuple:
        n = len(<tuple>value)
        for i in range(n):
            s = (<tuple>value)[i]
            if not (type(s) is tuple and len(<tuple>s) == 2 and type((<tuple>s)[0]) is str
                    and type((<tuple>s)[1]) is str):
                raise _ProtocolError(f"bad subscriber id {s!r}")
        return <tuple>value
    if not isinstance(value, list):
        raise _ProtocolError("bad subscriber list")
    return tuple([_sub_of(s) for s in <list>value])


cdef dict _record_map(tuple m):
    """A record as the map of the same op that routers before the records read."""
    op = m[0]
    cdef dict out = {"op": op, "v": EO_VERSION, "topic": m[1], "t": m[2]}
    if op == "FWD":
        out["pub"] = list(m[3])
        out["tag"] = m[4]
        out["body"] = m[5]
        out["targets"] = [list(a) for a in m[6]]
    elif op == "SETTLE":
        out["targets"] = [list(a) for a in m[3]]
    else:
        out["subs"] = [list(s) for s in m[3]]
    return out


def record_map(tuple record):
    """`_record_map`, for tests."""
    return _record_map(record)


def att_of(value):
    """An attachment id from a message: (router, instance, n); ProtocolError otherwise."""
    return _att_of(value)


def sub_of(value):
    """A subscriber id from a message: (container, link); ProtocolError otherwise."""
    return _sub_of(value)


include "eo_tag.pxi"

cdef dict _TAG_PREFIX = {}  # pub -> TagPrefix
# `_locals`' table rebuilt at the tick once over this many bytes (a table of 2,048 slots or
# more: 18 KiB and under is never worth a copy) ...
cdef Py_ssize_t _LOCALS_SHRINK_BYTES = 64 * 1024
# ... and over this many bytes per record it holds: a table sized by CPython for n records
# takes 30 to 60 bytes per record, so one rebuilt holds at most a tenth of what it could
cdef Py_ssize_t _LOCALS_SPARSE = 512


cdef TagPrefix _tag_prefix(tuple pub):
    """The publisher's tag state, computed once (bounded: cleared when full, the value is the
    same when computed again)."""
    cdef TagPrefix p = _TAG_PREFIX.get(pub)
    if p is None:
        p = _new_tag_prefix(pub)
        if len(_TAG_PREFIX) >= 4096:
            _TAG_PREFIX.clear()
        _TAG_PREFIX[pub] = p
    return p


cdef bytes _outgoing_tag(tuple pub, tag):
    """tags.outgoing_tag(pub[0], pub[1], tag) with the default key (eo_tag.pxi)."""
    return _tag_prefix(pub).c_tag(tag)


# -- the state machine's hot path ------------------------------------------------------------

# -- the outputs, compiled (eo_core.pxd) ----------------------------------------------------

# an output's port method, by kind (the port's interface, qrouter/eo/protocol.py's Port)
cdef tuple _OUT_NAMES = ("deliver", "settle_subscriber", "accept_publisher", "to_router")
cdef dict _OUT_KINDS = {name: i for i, name in enumerate(_OUT_NAMES)}


cdef inline EoOut *_out_slot(OutQueue q) except NULL:
    """The next free item of `q` (counted in), its fields past `c` cleared: the one place
    the queue grows, for each kind of push."""
    cdef EoOut *o
    if q.n == q.cap:
        q.reserve(q.n + 1)
    o = &q.items[q.n]
    q.n += 1
    o.op = 0
    o.flag = False
    o.d = o.e = o.f = NULL
    return o


cdef inline void _out_hold(PyObject **field, value) noexcept:
    """An output's field set to `value`, with a reference of its own (every push's)."""
    Py_INCREF(value)
    field[0] = <PyObject *>value


cdef inline void _out_release(EoOut *o) noexcept:
    Py_XDECREF(o.topic)
    Py_XDECREF(o.a)
    Py_XDECREF(o.b)
    Py_XDECREF(o.c)
    Py_XDECREF(o.d)
    Py_XDECREF(o.e)
    Py_XDECREF(o.f)


cdef class OutQueue:
    """A core's outputs of one input, or the router's of one loop iteration (the engine's
    `EoLinks.outputs`), in order: each output a C struct with its references, so staging one
    makes no tuple and moving an input's outputs to the router's is one memcpy. A core's
    loopback (`EoCore._own`, its messages to itself) is one too, taken from the front."""

    def __dealloc__(self):
        self.clear()
        PyMem_Free(self.items)

    cdef int reserve(self, Py_ssize_t n) except -1:
        cdef Py_ssize_t cap = self.cap
        cdef EoOut *items
        if n <= cap:
            return 0
        cap = cap * 2 if cap else 16
        if cap < n:
            cap = n
        items = <EoOut *>PyMem_Realloc(self.items, cap * sizeof(EoOut))
        if items == NULL:
            raise MemoryError()
        self.items = items
        self.cap = cap
        return 0

    cdef int push(self, int kind, topic, a, b, c, bint flag) except -1:
        cdef EoOut *o = _out_slot(self)
        o.kind = kind
        o.flag = flag
        _out_hold(&o.topic, topic)
        _out_hold(&o.a, a)
        _out_hold(&o.b, b)
        _out_hold(&o.c, c)
        if kind == OUT_PORT:
            self.n_port += 1
        return 0

    cdef int push_record(self, int op, topic, router, t, x, tag, body, targets) except -1:
        """An OUT_RECORD (eo_core.pxd): its fields as they are now, no tuple made."""
        cdef EoOut *o
        self.push(OUT_RECORD, topic, router, t, x, False)
        o = &self.items[self.n - 1]
        o.op = op
        _out_hold(&o.d, tag)
        _out_hold(&o.e, body)
        _out_hold(&o.f, targets)
        return 0

    cdef int push_copy(self, EoOut *o) except -1:
        """`o` (another queue's) appended, with references of its own."""
        cdef EoOut *q = _out_slot(self)
        q[0] = o[0]
        Py_XINCREF(q.topic)
        Py_XINCREF(q.a)
        Py_XINCREF(q.b)
        Py_XINCREF(q.c)
        Py_XINCREF(q.d)
        Py_XINCREF(q.e)
        Py_XINCREF(q.f)
        if q.kind == OUT_PORT:
            self.n_port += 1
        return 0

    cdef int move_to(self, OutQueue dst) except -1:
        """Append every output to `dst` (their references go with them), leaving this empty."""
        cdef Py_ssize_t n = self.n - self.head
        if not n:
            return 0
        dst.reserve(dst.n + n)
        memcpy(&dst.items[dst.n], &self.items[self.head], n * sizeof(EoOut))
        dst.n += n
        dst.n_port += self.n_port
        self.head = self.n = self.n_port = 0
        return 0

    cdef void trim(self, Py_ssize_t keep) noexcept:
        """Free the array of an empty queue that a burst grew past `keep` items (a queue kept
        for reuse holds no more than that at rest)."""
        if self.n == 0 and self.cap > keep:
            PyMem_Free(self.items)
            self.items = NULL
            self.head = self.cap = 0

    cdef void swap(self, OutQueue other):
        self.items, other.items = other.items, self.items
        self.head, other.head = other.head, self.head
        self.n, other.n = other.n, self.n
        self.cap, other.cap = other.cap, self.cap
        self.n_port, other.n_port = other.n_port, self.n_port

    cdef void clear(self):
        cdef Py_ssize_t i, head = self.head, n = self.n
        cdef EoOut *items = self.items
        self.head = self.n = self.n_port = 0
        for i in range(head, n):
            _out_release(&items[i])

    def __len__(self):
        return self.n - self.head

    def add(self, str name, topic, tuple args):
        """Stage the port's output `name` (what `qrouter.eo.Port` calls it) from Python."""
        kind = _OUT_KINDS.get(name)
        if kind == OUT_DELIVER:
            att, out_tag, body, resume = args
            self.push(OUT_DELIVER, topic, att, out_tag, body, resume)
        elif kind is not None:
            a, b = args
            self.push(kind, topic, a, b, None, False)
        else:
            raise ValueError(f"no staged output {name!r}")

    def call(self, apply, tuple args):
        """Stage `apply(*args)`, to run after the commit."""
        self.push(OUT_CALL, None, apply, args, None, False)

    def record(self, router, tuple message, bint compact=False):
        """Stage the record `message` (a FWD, ACCEPT, SETTLE or SEEN tuple) to `router` as its
        fields, as a core does for a router that takes records (compact: that reads compact
        records) (tests)."""
        cdef int op = _REC_NAMES.index(message[0])
        if op == REC_FWD:
            _, topic, t, pub, tag, body, targets = message
            self.push_record(op, topic, router, t, pub, tag, body, targets)
        else:
            _, topic, t, x = message
            self.push_record(op, topic, router, t, x, None, None, None)
        self.items[self.n - 1].flag = compact

    def entries(self):
        """[(name, topic, args)] in order (the port's names; "port" / "call" for the rest)."""
        cdef Py_ssize_t i
        cdef EoOut *o
        out = []
        for i in range(self.head, self.n):
            o = &self.items[i]
            out.append(_out_entry(o))
        return out

    def accepting(self, pub):
        """The tags of the accept_publisher outputs to `pub` staged here."""
        cdef Py_ssize_t i
        cdef EoOut *o
        out = set()
        for i in range(self.head, self.n):
            o = &self.items[i]
            if o.kind == OUT_ACCEPT_PUBLISHER and <object>o.a == pub:
                out.add(<object>o.b)
        return out


cdef tuple _out_entry(EoOut *o):
    cdef int kind = o.kind
    if kind == OUT_DELIVER:
        return ("deliver", <object>o.topic, (<object>o.a, <object>o.b, <object>o.c, o.flag))
    if kind < OUT_PORT:
        return (_OUT_NAMES[kind], <object>o.topic, (<object>o.a, <object>o.b))
    if kind == OUT_PORT:
        return (<object>o.a, <object>o.topic, <object>o.b)
    if kind == OUT_RECORD:
        return ("to_router", None, (<object>o.a, _rec_tuple(o)))
    return ("call", <object>o.topic, (<object>o.a, <object>o.b))


# a record's name by op (REC_*, eo_core.pxd): the head of its tuple
cdef tuple _REC_NAMES = (None, "FWD", "ACCEPT", "SETTLE", "SEEN")


cdef tuple _rec_tuple(EoOut *o):
    """An OUT_RECORD's message as the tuple a port is given (the simulation's to_router,
    `OutQueue.entries`, a router before the records): (name, topic, t, ...), the head of the
    compact encoding's record (eo_wire.pxi)."""
    if o.op == REC_FWD:
        return ("FWD", <object>o.topic, <object>o.b, <object>o.c, <object>o.d, <object>o.e,
                <object>o.f)
    return (_REC_NAMES[o.op], <object>o.topic, <object>o.b, <object>o.c)


# the attachments _c_grouped grouped last (each held, so compared by identity) and the groups
cdef tuple _grouped_outs = ()
cdef tuple _grouped_plan = ()


cdef tuple _c_grouped(list outs):
    """((router, targets), ...): the attachments of `outs` grouped by router, routers in
    sorted order, each router's attachments in their order in `outs` (a stable sort by
    router). Every message of a topic usually goes to the very same attachments (the same
    tuples, from _c_sub_atts), so the last grouping is kept and given again when `outs` holds
    the same objects in the same order: no sort check, no targets tuple made per message.
    (`outs` may be sorted in place.)"""
    global _grouped_outs, _grouped_plan
    cdef tuple was = _grouped_outs
    cdef Py_ssize_t n = len(outs), a = 0, b
    cdef list plan
    if len(was) == n:
        for b in range(n):
            if was[b] is not outs[b]:
                break
        else:
            return _grouped_plan
    cdef tuple key = tuple(outs)
    for b in range(1, n):  # (usually in order already: no sort then)
        if (<tuple>outs[b - 1])[0] > (<tuple>outs[b])[0]:
            outs.sort(key=_router_of)
            break
    plan = []
    while a < n:
        router = (<tuple>outs[a])[0]
        b = a + 1
        while b < n and (<tuple>outs[b])[0] == router:
            b += 1
        plan.append((router, (outs[a],) if b == a + 1 else tuple(outs[a:b])))
        a = b
    _grouped_outs = key
    _grouped_plan = tuple(plan)
    return _grouped_plan


cdef inline list _outs_add(list outs, Py_ssize_t *n, att):
    """Add `att` to a drive's attachments (EoCore._c_drive), `outs` and `n` of them so far.
    While they are `_grouped_outs`' first ones, the very objects in order, only counted (`n`,
    and None): a message that goes where the last one went makes no list, and its grouping
    is `_grouped_plan` (_c_grouped's answer for them). At the first that differs, the list,
    made of those first ones, is returned, and added to from then on."""
    cdef tuple was = _grouped_outs
    if outs is None:
        if n[0] < len(was) and PyTuple_GET_ITEM(was, n[0]) == <PyObject *>att:
            n[0] += 1
            return None
        outs = list(was[:n[0]])
    outs.append(att)
    return outs


# An ACCEPT's subscribers are, message after message, the very same tuple (the receive
# path keeps the tuple decoded from the same octets): their positions in a layout are kept
# for it, direct-mapped by address, once the tuple is met a second time (a tuple made for
# one message is not worth keeping). Each tuple named here is held, so an address names one
# object while kept; a layout is immutable.
cdef enum:
    POS_HELD = 8            # a power of two
cdef list _pos_subs = [None] * POS_HELD  # the subscribers tuple
cdef list _pos_layout = [None] * POS_HELD
cdef list _pos_at = [None] * POS_HELD  # their positions in the layout (-1: not in it)
cdef list _pos_met = [None] * POS_HELD  # a tuple met once


cdef tuple _c_held_positions(_Layout layout, tuple subs):
    """The position in `layout` of each of `subs` (-1: not in it) if kept or worth keeping
    (`subs` met before); None otherwise (the caller looks them up)."""
    cdef Py_ssize_t slot = (<Py_ssize_t><PyObject *>subs >> 4) & (POS_HELD - 1)
    cdef dict index
    cdef tuple at
    if _pos_subs[slot] is subs:
        if _pos_layout[slot] is layout:
            return <tuple>_pos_at[slot]
    elif _pos_met[slot] is not subs:
        _pos_met[slot] = subs
        return None
    index = layout.index
    at = tuple([index.get(sub, -1) for sub in subs])
    _pos_subs[slot] = subs
    _pos_layout[slot] = layout
    _pos_at[slot] = at
    return at


cdef bint _c_pending_open(OriginRecord rec, view) except -1:
    """Does a subscriber of `rec` still hold its acceptance: PENDING and not closed here
    (closed here: only an ex-driver's hand-over puts one in)? The closed map is looked at only
    once a pending subscriber is found, and not searched while empty."""
    cdef tuple subs = rec._layout.subs
    cdef Py_ssize_t i
    cdef dict closed = None
    for i in range(len(subs)):
        if rec._st[i] == S_PENDING:
            if closed is None:
                closed = _view_closed(view)
                if not closed:
                    return True
            if subs[i] not in closed:
                return True
    return False


cdef enum:
    SUB_HINTS = 16  # a power of two: EoCore._sub_hint's entries (see _addr_slot)


cdef inline bint _sub_hint_is(list hints, size_t i, sub):
    """Slot i of EoCore._sub_hint holds `sub`'s entry (the object itself)."""
    cdef PyObject *e = PyList_GET_ITEM(hints, i)
    return e != <PyObject *>None and PyTuple_GET_ITEM(<tuple>e, 2) == <PyObject *>sub


cdef inline tuple _sub_hint_get(list hints, size_t h, sub):
    """`sub`'s entry in slot h or h ^ 1 of EoCore._sub_hint, or None."""
    if _sub_hint_is(hints, h, sub):
        return <tuple>PyList_GET_ITEM(hints, h)
    if _sub_hint_is(hints, h ^ 1, sub):
        return <tuple>PyList_GET_ITEM(hints, h ^ 1)
    return None


cdef int _sub_hint_set(list hints, size_t h, sub, tuple entry) except -1:
    """`entry`, `sub`'s, where `sub`'s was in slot h or h ^ 1, or else in slot h with the
    one there moved to h ^ 1 (whose one goes)."""
    if _sub_hint_is(hints, h ^ 1, sub):
        hints[h ^ 1] = entry
        return 0
    if not _sub_hint_is(hints, h, sub):
        hints[h ^ 1] = hints[h]
    hints[h] = entry
    return 0


cdef enum:
    LS_HINTS = 8  # a power of two: EoCore._ls_hint's entries (see _addr_slot)


cdef tuple _id_hint(dict d, key, list hints, unsigned long long *version):
    """`key`'s entry in `hints` (LS_HINTS slots of entries whose item 2 is the key object,
    kept while the dict `d` has the version `*version`), or None. A dict changed since
    empties the hints and takes its new version; version 0 (Python 3.12 on) keeps none."""
    cdef unsigned long long v = eo_dict_version(d)
    cdef Py_ssize_t i
    if v != version[0]:
        for i in range(LS_HINTS):
            hints[i] = None
        version[0] = v
        return None
    if v:
        return _sub_hint_get(hints, _addr_slot(<PyObject *>key, LS_HINTS), key)
    return None


cdef enum:
    # EoCore._recent's slots (powers of two): at first, and at most. The table doubles
    # while `_origins` holds more than half as many records as it has slots (the records
    # in flight: its publishers' windows, and those settled awaiting SEEN), so it costs 16
    # octets a slot in proportion to the largest number seen in flight, up to 128 KiB
    RECENT_FIRST = 256
    RECENT_MOST = 8192


cdef inline bint _recent_key(bytes out_tag, uint64_t *key) noexcept:
    """`out_tag`'s key in EoCore._recent: its first 8 bytes, uniform (an out tag is a keyed
    BLAKE2b result, eo_tag.pxi), whose low bits are its slot; False for bytes of another
    length or not bytes (a peer's, not a tag of ours: the dict is asked)."""
    if not PyBytes_CheckExact(out_tag):
        return False
    if PyBytes_GET_SIZE(out_tag) != _TAG_SIZE or _TAG_SIZE < 8:
        return False
    memcpy(key, PyBytes_AS_STRING(out_tag), 8)
    return True


cdef inline void _recent_put(list recs, uint64_t *keys, Py_ssize_t n, OriginRecord rec,
                             uint64_t key) noexcept:
    """`rec` (of `key`) into EoCore._recent: a pair of slots per key (its low bits, the last
    one clear), the newest in the first: the first slot's record, if any, moves to the
    second, whose record (older, or none) goes (the dict still has it). One slot per key lost
    a record in flight to any later one of its slot, at the table's load (a half to a
    quarter) some 20-40% of the peers' look-ups, which then hash a fresh tag and probe the
    dict; two lose it only to two later ones while neither has gone. (Putting it into an
    empty second slot instead would leave the newer record second, the next one's to evict.)"""
    cdef Py_ssize_t i = <Py_ssize_t>(key & <uint64_t>(n - 2))
    if PyList_GET_ITEM(recs, i) != <PyObject *>None:
        recs[i + 1] = <object>PyList_GET_ITEM(recs, i)
        keys[i + 1] = keys[i]
    recs[i] = rec
    keys[i] = key


cdef unsigned long long _sgen_last = 0  # the last staging generation given (EoCore._sgen)
cdef unsigned long long _core_uid_last = 0  # the last EoCore._uid given


# Our own messages (to this router) go through the core's loopback (EoCore._own, an OutQueue
# taken from the front) as the outputs they would be to another router: a record as an
# OUT_RECORD, its fields as they were when sent, so one to ourselves builds no tuple to take
# apart again (_c_flush); anything else (a map, a record tuple: _c_own) as an OUT_TO_ROUTER.
# The router's id is not kept (None).


cdef class FlushDue:
    pass


cdef inline bint _flush_due(g) except -1:
    """`g.scheduled` (the router's flag that its flush is due): a C field of the router's
    EoLinks (a FlushDue), read after every input; any other object's attribute."""
    if isinstance(g, FlushDue):
        return (<FlushDue>g).scheduled
    return g.scheduled


cdef class EoCore:
    """The per-message half of `TopicRouter` (qrouter/eo/protocol.py, which sets every field
    in its __init__ and keeps the rest of the protocol)."""

    cdef public object router_id
    cdef public object topic
    cdef public bint eo
    cdef public double terminus_timeout
    cdef public object _port
    cdef public object _store
    cdef public double _now
    cdef public object _view
    cdef public dict _origins  # out tag -> OriginRecord
    cdef public dict _locals  # out tag -> LocalRecord
    cdef public dict _pubs  # Pub -> PubLink
    cdef public dict _subs  # AttId -> LocalSub
    cdef public dict _pub_resend
    cdef public dict _resent
    cdef public dict _closed_since
    cdef public set _up
    cdef public set _lacking
    cdef public set _records_ok  # peers that read records; the others get maps (protocol.py)
    cdef public set _compact_ok  # of those, the peers that read compact records (eo_wire.pxi)
    cdef public dict _barrier
    cdef public long long _epoch
    cdef OutQueue _own  # our own messages, in order (_c_to_router, _c_flush)
    cdef public dict _puts
    cdef public set _dels
    # origin records staged by out_tag (no key made per save; the store keys are made at
    # the commit, collect_writes/commit_memory): `_dirty` to put (b"o/" + out_tag, encoded
    # at the commit), `_bodies` their bodies to put (b"m/" + out_tag), `_gone` the records
    # deleted (both keys). `_puts`/`_dels` hold every other key (k/, c/), and a body's key
    # when a record is deleted and saved again without it in one commit (`_m_dels`)
    cdef public dict _dirty
    # `_dirty`'s generation: a new one (unique among the cores) each time `_dirty` empties at
    # a commit; a record whose `_sgen` is it is in `_dirty` (saving it again changes nothing)
    cdef unsigned long long _sgen
    cdef dict _bodies
    cdef dict _gone
    cdef bint _m_dels
    # tags in `_bodies` whose o/ record the store may hold already (a record recovered without
    # its body, or deleted and saved again in one commit): not new to the record log's
    # checkpoint interval (`collect_writes`, `born`)
    cdef set _known
    cdef public OutQueue _out  # this input's outputs, in order (_c_flush hands them on)
    # the router's staging (qrouter/guarantee.py, `bind_router`): its Guarantees; None: every
    # output is a call of the port
    cdef public object _stage
    cdef OutQueue _staged  # the router's outputs (EoLinks.outputs), applied after its commit
    # the router's group commit (`bind_router`): its Guarantees, whose commit walks the cores
    # with records staged (`_commit_list`, Guarantees.writes; see `collect_writes`); None:
    # commits go to the store object at the end of each input
    cdef public object _commit_to
    cdef list _commit_list
    cdef public bytes _prefix  # the topic's key prefix in the store (qrouter/eo/keys.py)
    cdef public bytes _mark  # the topic's mark key (put with any commit that puts)
    cdef public bint _marked  # the staged writes put something: the mark is due
    cdef public bint _committing  # in _commit_list
    cdef public dict _mem  # no store: the topic's records in the router's memory, by key
    cdef object _unsafe
    # sub -> (its attachments in the view, as a frozenset; the same in order; sub): _c_sub_atts
    cdef dict _sub_order
    # the same entries by the sub object's address (SUB_HINTS of them: the layout's subs are
    # the same objects from one message to the next), found with no hash; the entry's sub
    # says whose it is (and holds it: an address is never another object's)
    cdef list _sub_hint
    cdef _AttSlots _att_slots  # the origin records' sent-sets' bits (_AttSlots)
    cdef object _known_order  # (view.known's subscribers as a frozenset, their layout): or None
    # the view `_known_map` is the `known` of (_c_known_layout: no attribute look-up per
    # message). A view's `known` is one dict for its life, changed in place (qrouter/eo/view.py);
    # the view is held here, so its address is not another's
    cdef object _known_view
    cdef object _known_map
    cdef tuple _drive_plan  # (layout, view, view.gen, entries): _c_drive_plan's, or None
    # view.known's version (eo_dict_version) when `_known_order` was found equal to it: 0 if
    # unknown; the same version again means the same dict, unchanged (no compare needed)
    cdef unsigned long long _known_version
    cdef bint _accept_early
    cdef bint _drop_on_settle
    # the settled records of `_locals` (tombstones) from `_settled_head` on, in the order they
    # settled, so by epoch: what the tick walks (`_drop_settled_locals`), not every local
    # record. A list of references (8 bytes a tombstone, not a dict's entry): a record
    # dropped another way (`_c_maybe_drop_local`) stays until a walk reaches it
    cdef list _settled_l
    cdef Py_ssize_t _settled_head
    # the str a peer's records named this topic with, found equal to `_topic_was` (the topic
    # then): the decoder hands the same object record after record (eo_wire.pxi's names), so
    # it is compared once, then by identity (_c_our_topic; both held)
    cdef object _topic_seen
    cdef object _topic_was
    # `_subs`'s look-ups by the attachment id object's address (_c_local_sub): entries
    # (LocalSub, None, the id looked up), as `_sub_hint`'s (the entry holds the id, so an
    # address is never another object's), valid while `_subs` has the version (PEP 509)
    # `_ls_version`; a peer's FWD and SETTLE name the same id objects message after message
    # (the wire decoder's span cache), and a tuple's hash is not cached
    cdef list _ls_hint
    cdef unsigned long long _ls_version
    # `_pubs`' look-ups by the publisher id object's address (_c_pub_link), as `_ls_hint`'s:
    # entries (PubLink or None, whether `_pubs` holds the id, the id looked up), valid while
    # `_pubs` has the version `_pl_version`. A publisher's transfers and its records name the
    # link's own id object (EoPub.pub, OriginRecord.publisher), and the transfer, the drive
    # and the accept check each ask `_pubs` for it: a tuple hashed afresh each time
    cdef list _pl_hint
    cdef unsigned long long _pl_version
    # the origin records made here by their out tag's slot (_recent_key), each held (a list
    # of `_recent_n`, and each one's key in `_recent_keys`, compared before the record is
    # read): _c_origin's answer for the peers' ACCEPT and SEEN, which name a record by its
    # out tag alone, a new bytes object each (no hash cached), looked up in a table of every
    # record in flight. A record found is taken while `_origins` holds it (`_held_by`) and
    # its out tag equals the one asked, so the answer is `_origins.get`'s; a deleted one is
    # let go (_c_delete_origin), so the slots hold no record beyond those `_origins` holds;
    # a key has a pair of slots, and a newer record takes the older one's when both are taken
    # (that one: the dict; _recent_put). None (and NULL)
    # until this core makes a record: a topic's routers without its publishers pay nothing
    cdef list _recent
    cdef uint64_t *_recent_keys
    cdef Py_ssize_t _recent_n
    # this core's, unique among the cores (never 0): what a record `_origins` holds says
    # (OriginRecord._held_by), so a hint from another core (a topic made again) is not taken
    cdef unsigned long long _uid
    # the local records the FWDs made, in order (_c_on_fwd): the SETTLEs come in about the
    # order of the FWDs (the publisher's), so a SETTLE finds its record at the ring's head
    # rather than by a probe of `_locals` (None until a FWD makes a record here)
    cdef _RecRing _fring

    def __cinit__(self):
        self._sub_order = {}
        self._sub_hint = [None] * SUB_HINTS
        self._ls_hint = [None] * LS_HINTS
        self._pl_hint = [None] * LS_HINTS
        self._settled_l = []
        self._att_slots = _AttSlots()
        self._out = OutQueue()
        self._own = OutQueue()
        self._bodies = {}
        self._gone = {}
        self._known = set()
        self._c_new_sgen()
        global _core_uid_last
        _core_uid_last += 1
        self._uid = _core_uid_last

    def bind_router(self, g, bytes prefix, bytes mark):
        """Stage commits and outputs in the router `g` (qrouter/guarantee.py's Guarantees):
        records stay here until its commit walks `g.writes`; outputs go to `g.outputs`."""
        self._stage = self._commit_to = g
        self._staged = <OutQueue?>g.outputs
        self._commit_list = <list?>g.writes
        self._prefix = prefix
        self._mark = mark
        if g.store is None:
            self._mem = _topic_memory(<dict?>g.topic_memory, prefix)

    @property
    def unsafe(self):
        return self._unsafe

    @unsafe.setter
    def unsafe(self, value):
        self._unsafe = value
        self._accept_early = "accept-early" in value
        self._drop_on_settle = "drop-on-settle" in value

    # -- publisher link events -------------------------------------------------------------

    def publisher_transfer(self, pub, tag, body, double now):
        self.c_publisher_transfer(pub, tag, body, now)

    cdef c_publisher_transfer(self, pub, tag, body, double now):
        self._now = now
        cdef PubLink link = self._c_pub_link(pub)
        cdef OriginRecord rec
        cdef uint64_t key
        if link is None:
            self._c_log("warning", f"transfer from {pub} which is not attached, dropped")
            self._c_flush()
            return
        if link.awaiting:
            link.awaiting.discard(tag)
        cdef bytes out_tag = link.c_out_tag(pub, tag)
        rec = self._origins.get(out_tag)
        if rec is None:
            # every subscriber of view.subscribers() PENDING
            rec = _new_origin(out_tag, pub, _bytes(tag), _bytes(body), self._c_known_layout())
            self._origins[out_tag] = rec
            rec._held_by = self._uid
            if _recent_key(out_tag, &key):
                if self._recent_n < RECENT_MOST and 2 * len(self._origins) > self._recent_n:
                    self._c_recent_grow()
                _recent_put(self._recent, self._recent_keys, self._recent_n, rec, key)
            rec._put_sgen = self._sgen
            owed = link.owed.pop(tag, None) if link.owed else None
            if owed:  # (empty: nothing to merge)
                self._merge_owed(rec, owed)
            self._c_save_origin(rec, True)
        elif rec.settled:
            self._c_log("warning", f"{pub} reused settled tag {tag!r}: ignored")
            self._c_flush()
            return
        else:
            if pub in self._pub_resend:  # resent within the window: not abandoned
                self._resent.setdefault(pub, set()).add(bytes(tag))
            if rec.body is None:
                rec.body = bytes(body)  # the resend of a record recovered without its body
                self._known.add(rec.out_tag)
                self._c_save_origin(rec, True)
        self._c_drive(rec)
        self._c_check_accept(rec)
        self._c_flush()

    def publisher_settled(self, pub, tag, double now):
        self.c_publisher_settled(pub, tag, None, None, now)

    cdef c_publisher_settled(self, pub, tag, bytes out_tag, origin, double now):
        """`out_tag`: the delivery's outgoing tag when the caller has it (the accept output
        carries its record's, the very key of `_origins`: no BLAKE2b again, and its hash
        cached), else None: computed from `pub` and `tag`, which it is a function of.
        `origin`: the accept output's record (with `out_tag`), or None: a hint, taken for
        the look-up while `_origins` holds it (_c_origin)."""
        self._now = now
        cdef PubLink link
        if out_tag is None:
            # (the link only for its tag state: a publisher's tuple id is hashed afresh at
            # each look-up, so not looked up when the caller brings the out tag)
            link = self._c_pub_link(pub)
            out_tag = (
                _outgoing_tag(pub, tag) if link is None else link.c_take_out_tag(pub, tag)
            )
        cdef OriginRecord rec = self._c_origin(
            out_tag, <OriginRecord>origin if type(origin) is OriginRecord else None
        )
        if rec is not None and not rec.settled:
            self._c_settle_origin(rec)
        self._c_flush()

    # -- subscriber link events ------------------------------------------------------------

    def subscriber_accepted(self, att, out_tag, double now):
        self.c_subscriber_accepted(att, out_tag, now)

    cdef c_subscriber_accepted(self, att, out_tag, double now):
        self._now = now
        cdef LocalRecord rec = None
        cdef LocalSub ls = self._c_local_sub(att)
        cdef Py_ssize_t pos
        cdef int st
        if ls is not None:
            # `_locals.get(out_tag)`: as a rule the head of the records delivered to it
            rec = ls._dring.c_take(out_tag, self._uid) if ls._dring is not None else None
            if rec is None:
                rec = self._locals.get(out_tag)
            if rec is not None:
                pos = rec.c_pos(ls.att)  # (ls.att, the object the record holds)
                st = rec._st[pos] if pos >= 0 else -1
                if st == L_DELIVERED:
                    rec._st[pos] = L_ACCEPTED
                    st = L_ACCEPTED
                if st == L_ACCEPTED:
                    self._c_check_local_accept(rec)
        self._c_flush()

    def subscriber_settled(self, att, out_tag, double now):
        """The subscriber settled `out_tag` after we did: it has seen the settlement."""
        self.c_subscriber_settled(att, out_tag, now)

    cdef c_subscriber_settled(self, att, out_tag, double now):
        self._now = now
        cdef LocalRecord rec = self._locals.get(out_tag)
        cdef LocalSub ls = self._c_local_sub(att)
        cdef Py_ssize_t pos = rec.c_pos(ls.att) if rec is not None and ls is not None else -1
        if pos >= 0 and rec._st[pos] == L_SETTLING:
            rec._st[pos] = L_SEEN
            seen = ls.c_subs1()
            settled_by = rec._settled_by
            if type(settled_by) is set:
                for router in sorted(<set>settled_by):
                    self._c_rec_to(router, REC_SEEN, out_tag, seen, rec._origin)
            elif settled_by is not None:
                self._c_rec_to(settled_by, REC_SEEN, out_tag, seen, rec._origin)
            if rec._origin is not None and rec.c_all_seen():
                rec._origin = None  # (no more ACCEPT or SEEN from here: not kept alive)
            # (rec: `_locals`' record of its out tag, found above; _c_rec_to only queues)
            self._c_drop_local_found(rec)
        self._c_flush()

    # -- inter-router messages -------------------------------------------------------------

    def receive(self, peer, message, double now):
        self._now = now
        self._c_receive(peer, message)
        self._c_flush()

    cdef _c_receive(self, peer, message):
        if peer not in self._up:
            self._c_log("debug", f"message from {peer} whose channel is not up, dropped")
        elif type(message) is tuple:
            if len(<tuple>message) < 2 or not self._c_our_topic((<tuple>message)[1]):
                self._c_log("warning", "record for another topic dropped")
                return
            try:
                self._c_handle_rec(peer, <tuple>message)
            except (_ProtocolError, ValueError, TypeError) as exc:
                self._c_log("warning", f"bad record from {peer} dropped: {exc}")
        elif not isinstance(message, dict):
            self._c_log("warning", f"message of type {type(message).__name__} dropped")
        elif (<dict>message).get("topic") != self.topic:
            self._c_log("warning", f"message for topic {message.get('topic')!r} dropped")
        else:
            try:
                self._c_handle(peer, _check_msg(message))
            except (_ProtocolError, ValueError, TypeError) as exc:
                self._c_log("warning", f"bad message from {peer} dropped: {exc}")

    cdef bint _c_our_topic(self, topic) except -1:
        """`topic == self.topic`, by identity for the str the peers' records name it with."""
        if topic is self._topic_seen and self._topic_was is self.topic:
            return True
        if topic != self.topic:
            return False
        self._topic_seen = topic
        self._topic_was = self.topic
        return True

    cdef _c_handle_rec(self, sender, tuple m):
        """A per-message record (RECORD_OPS): its fields are checked here, whoever made it."""
        cdef Py_ssize_t n = len(m)
        op = m[0] if n else None
        # the peers' ACCEPT and SEEN (most records a publisher's router gets) first, their op
        # found by identity: the decoder's ops are EO_WORDS' interned str (eo_wire.pxi), as
        # these literals are; anything else goes the ladder below, its checks and errors
        if n == 4 and type(m[2]) is bytes:
            if op is _OP_ACCEPT:
                self._c_on_accept(m[2], _subs_of(m[3]))
                return
            if op is _OP_SEEN:
                self._c_on_seen(m[2], _subs_of(m[3]))
                return
        if n == 7 and op == "FWD":
            if not (type(m[2]) is bytes and type(m[4]) is bytes and type(m[5]) is bytes):
                raise _ProtocolError("FWD: bad field")
            self._c_on_fwd(sender, m[2], _sub_of(m[3]), m[4], m[5], _atts_of(m[6]))
        elif n != 4 or type(m[2]) is not bytes:
            raise _ProtocolError(f"bad record {op!r}")
        elif op == "ACCEPT":
            self._c_on_accept(m[2], _subs_of(m[3]))
        elif op == "SETTLE":
            self._c_on_settle(sender, m[2], _atts_of(m[3]))
        elif op == "SEEN":
            self._c_on_seen(m[2], _subs_of(m[3]))
        else:
            raise _ProtocolError(f"unknown record {op!r}")

    cdef _c_own(self, msg):
        """One of our own messages, from the loopback (_c_flush). A record goes straight to its
        handler: this core made it of values it had checked already (a view's attachments, a
        subscriber's id, a record's publisher and tag), so none of the checks of a peer's
        (_c_handle_rec) and no copy; the same handler, sender and arguments as through
        _c_handle, so the same decisions. A map (protocol.py's) goes through _c_handle."""
        cdef tuple m
        if type(msg) is not tuple:
            self._c_handle(self.router_id, msg)
            return
        m = <tuple>msg
        if len(m) == 7:  # (only FWD has seven fields)
            self._c_on_fwd(self.router_id, m[2], m[3], m[4], m[5], m[6])
            return
        op = m[0]
        if op == "SETTLE":
            self._c_on_settle(self.router_id, m[2], m[3])
        elif op == "SEEN":
            self._c_on_seen(m[2], m[3])
        elif op == "ACCEPT":
            self._c_on_accept(m[2], m[3])
        else:
            self._c_handle_rec(self.router_id, m)  # (none today: its error, as before)

    cdef _c_handle(self, sender, msg):
        if type(msg) is tuple:
            self._c_handle_rec(sender, <tuple>msg)
            return
        op = msg["op"]
        if op == "FWD":
            self._c_on_fwd(
                sender, msg["t"], _sub_of(msg["pub"]), msg["tag"], msg["body"],
                _atts_of(msg["targets"]),
            )
        elif op == "ACCEPT":
            self._c_on_accept(msg["t"], _subs_of(msg["subs"]))
        elif op == "SETTLE":
            self._c_on_settle(sender, msg["t"], _atts_of(msg["targets"]))
        elif op == "SEEN":
            self._c_on_seen(msg["t"], _subs_of(msg["subs"]))
        elif op == "PING":
            self._c_to_router(
                sender, {"op": "PONG", "v": EO_VERSION, "topic": self.topic, "e": msg["e"]}
            )
        elif op == "PONG":
            self._barrier[sender] = max(self._barrier.get(sender, 0), msg["e"])
        else:
            self._handle_other(sender, msg)  # protocol.py: SUB, UNSUB, SUBS, ASK, ANSWER, ...

    def _handle(self, sender, msg):
        self._c_handle(sender, msg)

    cdef _c_on_fwd(self, sender, bytes out_tag, tuple pub, bytes tag, bytes body,
                   tuple targets, OriginRecord origin=None):
        """`origin`: our own FWD's origin record (the loopback's), else None."""
        cdef LocalRecord rec = self._locals.get(out_tag)
        cdef LocalSub ls
        cdef list touched = None  # the attachments to pump, once more than one
        cdef LocalSub first_ls = None  # the first's, when it is a new one of `targets`
        cdef bint first_alone = False  # first_ls's queue was empty: out_tag not put in yet
        cdef tuple keys
        cdef Py_ssize_t i
        cdef bint live = False
        if rec is not None and rec.settled:
            return  # a tombstone: whatever this FWD was for is over
        if rec is None:
            for att in targets:
                if self._c_local_sub(att) is not None:
                    live = True
                    break
            if not live:
                return
            rec = _new_local(out_tag)
            self._c_local_put(out_tag, rec)
            if self.eo:  # (at least once: a record goes at its accept, before any SETTLE)
                if self._fring is None:
                    self._fring = _RecRing(FRING_MOST)
                self._fring.c_push(rec)
        if rec.body is None:
            rec.body, rec.publisher, rec.tag = body, pub, tag
        if origin is not None:
            rec._origin = origin  # (the FWD's record, of this out tag)
        rec._drivers = _routers_add(rec._drivers, sender)
        first = None  # the first attachment to pump
        keys = rec._keys.keys
        for i in range(len(keys)):
            if rec._st[i] == L_HELD:
                rec._st[i] = L_QUEUED
                if first is None:
                    first = keys[i]
                else:
                    if touched is None:
                        touched = [first]
                    touched.append(keys[i])
        for att in targets:  # (the live ones: attached here)
            ls = self._c_local_sub(att)
            if ls is None:
                continue
            # the record keeps the attachment's own id object (equal to the peer's `att`):
            # what the later look-ups pass, found by identity (LocalRecord.c_pos)
            att = ls.att
            if rec.c_pos(att) < 0:
                if rec._keys is _NO_KEYS:  # (the first: the attachment's own keys)
                    rec.c_add_alone(ls.c_alone(), L_QUEUED)
                else:
                    rec.c_add(att, L_QUEUED)
                # (not one of the HELD: those were in the record)
                if first is None:
                    first = att
                    first_ls = ls
                    # an empty queue: out_tag would be its head and only entry, which the
                    # pump below takes at once, so it is put in only if another attachment
                    # comes (no deque append and popleft, method calls, per message)
                    first_alone = not ls.queue
                    if not first_alone:
                        ls.queue.append(out_tag)
                else:
                    ls.queue.append(out_tag)
                    if touched is None:
                        if first_alone:
                            first_ls.queue.append(out_tag)  # (its place: the queue was empty)
                            first_alone = False
                        touched = [first]
                    touched.append(att)
        # (rec is `_locals[out_tag]`, and pumping changes no entry of `_locals`: the queues
        # that name this very out_tag object take it from here, not from `_locals` again)
        if touched is not None:
            touched.sort()
            for att in touched:
                self._c_pump(self._c_sub_here(att), out_tag, rec)
        elif first_alone:
            # _c_pump(first_ls, out_tag, rec) of a queue that is [out_tag]: the same output
            # (and none without a body: the pump drops such a head, leaving it QUEUED)
            if rec.body is not None:
                rec._st[rec.c_pos(first)] = L_DELIVERED  # (added QUEUED above)
                if first_ls._dring is None:  # (as the pump: the accept finds it there)
                    first_ls._dring = _RecRing(DRING_MOST)
                first_ls._dring.c_push(rec)
                self._out.push(OUT_DELIVER, None, first, out_tag, rec.body,
                               out_tag in first_ls.attach_map)
        elif first_ls is not None:
            self._c_pump(first_ls, out_tag, rec)
        elif first is not None:
            self._c_pump(self._c_sub_here(first), out_tag, rec)
        self._c_check_local_accept(rec)

    cdef _c_on_accept(self, bytes out_tag, tuple accepted, OriginRecord hint=None):
        """`hint`: our own ACCEPT's record (its local record's `_origin`), else None."""
        cdef OriginRecord rec = self._c_origin(out_tag, hint)
        cdef bint changed = False
        cdef _Layout layout
        cdef tuple at
        cdef Py_ssize_t i, k, pos
        if rec is None or rec.settled:
            return
        layout = rec._layout
        at = _c_held_positions(layout, accepted)
        if at is not None:  # (the same subscribers' ACCEPT again: their positions known)
            for i in range(len(at)):
                k = <Py_ssize_t>at[i]
                if k >= 0 and rec._st[k] == S_PENDING:
                    rec._st[k] = S_ACCEPTED
                    changed = True
        else:
            for sub in accepted:
                pos = layout.c_pos(sub)
                if pos >= 0 and rec._st[pos] == S_PENDING:
                    rec._st[pos] = S_ACCEPTED
                    changed = True
        if changed:
            self._c_save_origin(rec, False)
            self._c_check_accept(rec)

    cdef _c_on_settle(self, sender, bytes out_tag, tuple targets):
        # `_locals.get(out_tag)`: as a rule at the head of the records the FWDs made
        cdef LocalRecord rec = self._fring.c_take(out_tag, self._uid) if (
            self._fring is not None
        ) else None
        if rec is None:
            rec = self._locals.get(out_tag)
        cdef LocalSub ls
        cdef int st
        cdef set seen
        if rec is None:
            rec = _new_local(out_tag)
            self._c_local_put(out_tag, rec)
        if not rec.settled:
            rec.settled = True
            rec.settled_epoch = self._epoch
            rec.body = None
            if self.eo:  # (the tick's walk: exactly-once only, as its tombstones)
                self._settled_l.append(rec)
        rec._settled_by = _routers_add(rec._settled_by, sender)
        cdef tuple keys = rec._keys.keys
        cdef Py_ssize_t i, pos, n = len(keys)
        for i in range(n):
            att = keys[i]
            st = rec._st[i]
            if st == L_SETTLING or st == L_SEEN:
                continue  # (settled before: nothing to do, no lookup)
            ls = self._c_sub_here(att)
            if st == L_HELD or st == L_DELIVERED or st == L_ACCEPTED or (
                st == L_QUEUED and out_tag in ls.attach_map
            ):
                rec._st[i] = L_SETTLING if ls.resumable else L_SEEN
                # (the record's own out tag, equal to the peer's: the object the subscriber's
                # delivery is kept under, found by identity in EoSub.deliveries)
                self._out.push(OUT_SETTLE_SUBSCRIBER, None, att, rec.out_tag, None, False)
            elif st == L_QUEUED:
                rec._st[i] = L_SEEN  # never sent: nothing to see
        # the subscribers of `targets` here that have seen it: usually one, sent as is
        first = None
        cdef LocalSub first_ls = None
        seen = None
        for att in targets:
            ls = self._c_local_sub(att)
            if ls is not None:
                pos = rec.c_pos(ls.att)  # (by identity, as a rule: the record's own object)
                st = rec._st[pos] if pos >= 0 else -1
                if st == -1 or st == L_SEEN:
                    if first is None:
                        first = ls.sub
                        first_ls = ls
                    elif seen is None:
                        seen = {first, ls.sub}
                    else:
                        seen.add(ls.sub)
        # (staged as a record's fields, as c_subscriber_settled's SEEN: the same message, in
        # the same place, written octet for octet as its tuple would be, with no tuple made)
        if seen is not None and len(seen) > 1:
            self._c_rec_to(sender, REC_SEEN, out_tag, tuple(sorted(seen)), rec._origin)
        elif first is not None:
            self._c_rec_to(sender, REC_SEEN, out_tag, first_ls.c_subs1(), rec._origin)
        if rec._origin is not None and rec.c_all_seen():
            rec._origin = None  # (settled, and no SEEN left to send from here)
        # _c_maybe_drop_local(rec) of a settled record still in `_locals` (found or put there
        # above; _c_to_router only queues our own messages), without looking it up again
        if self._drop_on_settle or (
            rec.c_all_seen() and self._c_barrier_passed(rec.settled_epoch)
        ):
            self._c_local_del(rec)

    cdef _c_on_seen(self, bytes out_tag, tuple seen, OriginRecord hint=None):
        """`hint`: our own SEEN's record (its local record's `_origin`), else None."""
        cdef OriginRecord rec = self._c_origin(out_tag, hint)
        cdef bint changed = False
        cdef _Layout layout
        cdef Py_ssize_t pos
        if rec is None or not rec.settled:
            return
        layout = rec._layout
        for sub in seen:
            pos = layout.c_pos(sub)
            if pos >= 0 and rec._st[pos] != S_SEEN:
                rec._st[pos] = S_SEEN
                changed = True
        if changed:
            if rec.c_done() and not (
                self._gone and not self._c_not_gone(rec) and rec.out_tag in self._gone
            ):
                # the last one: _c_maybe_drop_origin would delete it right after the save,
                # undoing all the save stages (unless a record of its tag went before it)
                self._c_delete_origin(rec)
                return
            self._c_save_origin(rec, False)
            self._c_maybe_drop_origin(rec)

    # -- the driver side -------------------------------------------------------------------

    cdef inline bint _c_not_gone(self, OriginRecord rec) noexcept:
        """`rec.out_tag not in self._gone`, known without the look-up: True when `_origins`
        has held `rec` since before this staging generation began (`_gone` holds the tags
        deleted in this generation, emptied with each new one; a deletion takes its tag's
        record out of `_origins`, so a record held now and put there earlier was not
        deleted since, nor any other of its tag). False: not known (look it up)."""
        return rec._held_by == self._uid and rec._put_sgen != self._sgen

    cdef inline OriginRecord _c_origin(self, bytes out_tag, OriginRecord hint):
        """self._origins.get(out_tag), which is `hint` (a record of that out tag) while
        `_origins` holds it (OriginRecord._held_by): then with no hash and no probe of a table
        of every record in flight."""
        if hint is not None and hint._held_by == self._uid:
            return hint
        cdef uint64_t key
        cdef Py_ssize_t i
        cdef PyObject *p
        cdef OriginRecord rec
        cdef int w
        if self._recent is not None and _recent_key(out_tag, &key):
            i = <Py_ssize_t>(key & <uint64_t>(self._recent_n - 2))  # (the pair's first slot)
            for w in range(2):
                p = PyList_GET_ITEM(self._recent, i + w)
                if self._recent_keys[i + w] == key and p != <PyObject *>None:
                    rec = <OriginRecord>p
                    if rec._held_by == self._uid and (
                        rec.out_tag is out_tag
                        or PyBytes_GET_SIZE(rec.out_tag) == PyBytes_GET_SIZE(out_tag)
                        and memcmp(PyBytes_AS_STRING(rec.out_tag), PyBytes_AS_STRING(out_tag),
                                   PyBytes_GET_SIZE(out_tag)) == 0
                    ):
                        return rec
        return self._origins.get(out_tag)

    cdef int _c_recent_grow(self) except -1:
        """`_recent` made (the first record made here), or twice as large, its records moved
        to their pairs there (_recent_put: of three that meet, one goes; the dict has it)."""
        cdef Py_ssize_t j, old = self._recent_n
        cdef Py_ssize_t n = RECENT_FIRST if old == 0 else 2 * old
        cdef uint64_t *keys = <uint64_t *>PyMem_Malloc(n * sizeof(uint64_t))
        cdef list recs
        if keys == NULL:
            raise MemoryError()
        memset(keys, 0, n * sizeof(uint64_t))
        recs = [None] * n
        for j in range(old):
            # (a pair's older record first, the newer one put after it: the newer first in
            # its new pair, as before; a new pair takes the records of one old pair alone)
            rec = self._recent[j ^ 1]
            if rec is not None:
                _recent_put(recs, keys, n, <OriginRecord>rec, self._recent_keys[j ^ 1])
        PyMem_Free(self._recent_keys)
        self._recent_keys = keys
        self._recent = recs
        self._recent_n = n
        return 0

    def __dealloc__(self):
        PyMem_Free(self._recent_keys)

    # -- `_locals`: every insertion and removal goes through these (the cdef paths, and
    # protocol.py's placeholders through `_put_local`), so LocalRecord._held_by is exact

    cdef inline int _c_local_put(self, bytes out_tag, LocalRecord rec) except -1:
        """`_locals[out_tag] = rec`, `_locals` holding no record of `out_tag` (the caller
        looked): marked held."""
        self._locals[out_tag] = rec
        rec._held_by = self._uid
        return 0

    cdef inline int _c_local_gone(self, LocalRecord rec) except -1:
        """`rec` no longer held by `_locals` (the caller took it out): unmarked."""
        rec._held_by = 0
        return 0

    cdef inline int _c_local_del(self, LocalRecord rec) except -1:
        """`del self._locals[rec.out_tag]` of a record `_locals` holds."""
        del self._locals[rec.out_tag]
        self._c_local_gone(rec)
        return 0

    def _put_local(self, bytes out_tag, LocalRecord rec):
        """`_locals[out_tag] = rec` (protocol.py's placeholders), `_locals` holding none."""
        if out_tag in self._locals:
            raise ValueError("a local record of that out tag is held already")
        self._c_local_put(out_tag, rec)

    def _trim_rings(self):
        """(The tick.) The rings of local records keep no more than about what `_locals`
        holds (_RecRing.c_trim)."""
        cdef size_t keep = 2 * len(self._locals) + RING_LOOK
        cdef LocalSub ls
        if self._fring is not None:
            self._fring.c_trim(self._uid, keep)
        for x in self._subs.values():
            ls = <LocalSub>x
            if ls._dring is not None:
                ls._dring.c_trim(self._uid, keep)

    def _ring_records(self):
        """The records its rings hold, one list a ring (tests)."""
        rings = [self._fring] + [(<LocalSub>x)._dring for x in self._subs.values()]
        return [(<_RecRing>r).records() for r in rings if r is not None]

    def _drop_local(self, LocalRecord rec):
        """`del self._locals[rec.out_tag]` of a record it holds (tests)."""
        if self._locals.get(rec.out_tag) is not rec:
            raise KeyError(rec.out_tag)
        self._c_local_del(rec)

    def _check_locals(self, others=()):
        """Tests: LocalRecord._held_by is exact for every record this core can still reach
        (`_locals`, the settled index, its subscribers' rings of delivered records) and for
        `others` (any local records: those of other cores are not marked with its `_uid`)."""
        cdef LocalRecord rec
        for x in others:
            rec = <LocalRecord?>x
            if rec._held_by == self._uid:
                assert self._locals.get(rec.out_tag) is rec, (
                    f"a record marked held, not held: {rec.out_tag!r}"
                )
        for tag, rec in self._locals.items():
            assert rec._held_by == self._uid, f"a record of _locals not marked: {tag!r}"
            assert rec.out_tag == tag, f"a record under another out tag: {tag!r}"
        cdef LocalSub ls
        held = list(self._settled_l)
        if self._fring is not None:
            held.extend(self._fring.records())
        for x in self._subs.values():
            ls = <LocalSub>x
            if ls._dring is not None:
                held.extend(ls._dring.records())
        for x in held:
            if x is not None:
                rec = <LocalRecord>x
                assert (rec._held_by == self._uid) == (self._locals.get(rec.out_tag) is rec), (
                    f"a local record marked wrongly: {rec.out_tag!r}"
                )

    cdef _Layout _c_known_layout(self):
        """The layout of sorted(view.known) (view.subscribers()), found once per change of the
        view's subscribers rather than once per message."""
        view = self._view
        if view is not self._known_view:
            self._known_map = view.known
            self._known_view = view
        known = self._known_map
        cached = self._known_order
        cdef frozenset was
        cdef unsigned long long version = 0
        if type(known) is dict:
            version = eo_dict_version(<dict>known)
            if version and version == self._known_version and cached is not None:
                return <_Layout>(<tuple>cached)[1]  # (unchanged since it was compared)
        if cached is not None:
            was = <frozenset>(<tuple>cached)[0]
            if type(known) is dict:
                # was == known.keys(), without the keys view (same size, every key in it)
                if len(was) == len(<dict>known):
                    for sub in <dict>known:
                        if sub not in was:
                            break
                    else:
                        self._known_version = version
                        return <_Layout>(<tuple>cached)[1]
            elif was == known.keys():
                return <_Layout>(<tuple>cached)[1]
        cdef tuple order = tuple(sorted(known))
        cdef _Layout layout = _layout_of(order)
        self._known_order = (frozenset(order), layout)
        self._known_version = version
        return layout

    cdef LocalSub _c_local_sub(self, att):
        """self._subs.get(att), the attachment here whose id equals `att`, or None: from
        `_ls_hint` while `_subs` is unchanged, so with no hash of the tuple."""
        cdef tuple entry = _id_hint(self._subs, att, self._ls_hint, &self._ls_version)
        if entry is not None:
            return <LocalSub>PyTuple_GET_ITEM(entry, 0)
        ls = self._subs.get(att)
        if ls is not None and self._ls_version:
            _sub_hint_set(self._ls_hint, _addr_slot(<PyObject *>att, LS_HINTS), att,
                          (ls, None, att))
        return ls

    cdef tuple _c_pub_entry(self, pub):
        """(self._pubs.get(pub), pub in self._pubs, pub): from `_pl_hint` while `_pubs` is
        unchanged, so with no hash of the tuple (as _c_local_sub)."""
        cdef tuple entry = _id_hint(self._pubs, pub, self._pl_hint, &self._pl_version)
        if entry is not None:
            return entry
        link = self._pubs.get(pub, _MISSING)
        entry = (None, False, pub) if link is _MISSING else (link, True, pub)
        if self._pl_version:
            _sub_hint_set(self._pl_hint, _addr_slot(<PyObject *>pub, LS_HINTS), pub, entry)
        return entry

    cdef inline PubLink _c_pub_link(self, pub):
        """self._pubs.get(pub) (_c_pub_entry)."""
        cdef tuple entry = self._c_pub_entry(pub)
        return entry[0]

    cdef inline bint _c_has_pub(self, pub) except -1:
        """pub in self._pubs (_c_pub_entry)."""
        cdef tuple entry = self._c_pub_entry(pub)
        return entry[1] is True

    cdef LocalSub _c_sub_here(self, att):
        """self._subs[att] (KeyError if it is not there): through _c_local_sub."""
        cdef LocalSub ls = self._c_local_sub(att)
        return ls if ls is not None else self._subs[att]

    cdef tuple _c_sub_atts(self, sub, set sub_atts):
        """sorted(sub_atts), the attachments of `sub` in the view's order (view.claims_of):
        computed once per change of the view's claims of `sub`, not once per message."""
        cdef size_t h = _addr_slot(<PyObject *>sub, SUB_HINTS)
        cdef tuple cached = _sub_hint_get(self._sub_hint, h, sub)
        cdef bint hinted = cached is not None
        cdef tuple order
        if not hinted:
            cached = self._sub_order.get(sub)
        if cached is not None:
            # (each entry's order is sorted(its frozenset): right whichever entry it is)
            order = <tuple>cached[1]
            if _same_members(sub_atts, order) or (<frozenset>cached[0]) == sub_atts:
                if not hinted:
                    _sub_hint_set(self._sub_hint, h, sub, cached)
                return order
        order = tuple(sorted(sub_atts))
        if len(self._sub_order) >= 2 * len(self._view._by_sub) + 64:
            self._sub_order.clear()  # subscribers gone: bounded by the view's
        cached = (frozenset(sub_atts), order, sub)
        self._sub_order[sub] = cached
        _sub_hint_set(self._sub_hint, h, sub, cached)
        return order

    cdef tuple _c_drive_plan(self, _Layout layout):
        """What _c_drive looks up per subscriber, once per change of the view's claims rather
        than per message: for each position of `layout`, None (no attachment claims the
        subscriber) or (its attachments in the view's order (_c_sub_atts), their slots then,
        -1 for none). Kept while the layout, the view and its claims' generation
        (`SubscriberView.gen`) are the same; None for a view without one. A slot is only
        read here (a kept one is checked against the slot table where used)."""
        cdef tuple plan = self._drive_plan
        cdef tuple subs, order
        cdef dict by_sub, slot_of
        cdef list entries
        cdef Py_ssize_t i
        view = self._view
        gen = getattr(view, "gen", None)
        if gen is None:
            return None
        if plan is not None and plan[0] is layout and plan[1] is view and plan[2] == gen:
            return <tuple>plan[3]
        by_sub = view._by_sub
        slot_of = self._att_slots.slot
        subs = layout.subs
        entries = []
        for i in range(len(subs)):
            sub = subs[i]
            sub_atts = by_sub.get(sub)
            if not sub_atts:
                entries.append(None)
                continue
            order = self._c_sub_atts(sub, sub_atts)
            entries.append((order, tuple([slot_of.get(att, -1) for att in order])))
        self._drive_plan = (layout, view, gen, tuple(entries))
        return <tuple>self._drive_plan[3]

    cdef int _c_slot(self, att) except -2:
        """The slot of `att`, given one if it has none; -1 if every slot is in use."""
        cdef _AttSlots slots = self._att_slots
        cdef unsigned long long keep = 0
        cdef OriginRecord rec
        cdef int i
        cdef size_t h = _addr_slot(<PyObject *>att, ATT_SLOTS)
        # (the attachment ids of a view's claims are the same objects: no hash)
        i = slots.hint[h]
        if <PyObject *>PyList_GET_ITEM(slots.atts, i) == <PyObject *>att:
            return i
        i = slots.hint[h ^ 1]
        if <PyObject *>PyList_GET_ITEM(slots.atts, i) == <PyObject *>att:
            return i
        got = slots.slot.get(att)
        if got is not None:
            slots.hint[h ^ 1] = slots.hint[h]  # (in slot h; the one there moves to h ^ 1)
            slots.hint[h] = <unsigned char>(<int>got)
            return <int>got
        if slots.used == 0xFFFFFFFFFFFFFFFFULL:
            # full: free the slots no record's bit and no claim of the view holds
            for r in self._origins.values():
                rec = <OriginRecord>r
                keep |= rec._fwd_bits | rec._fill_bits | rec._settle_bits
            claims = self._view.claims
            for i in range(ATT_SLOTS):
                if not keep & (1ULL << i) and slots.atts[i] not in claims:
                    del slots.slot[slots.atts[i]]
                    slots.atts[i] = None
                    slots.used &= ~(1ULL << i)
        for i in range(ATT_SLOTS):
            if not slots.used & (1ULL << i):
                slots.used |= 1ULL << i
                slots.atts[i] = att
                slots.slot[att] = i
                slots.hint[h ^ 1] = slots.hint[h]
                slots.hint[h] = <unsigned char>i
                return i
        return -1

    def _forget_sent_to(self, peer):
        """router_down(peer): every record's sent-sets lose the attachments at `peer`."""
        cdef _AttSlots slots = self._att_slots
        cdef unsigned long long mask = 0
        cdef OriginRecord rec
        cdef int i
        for i in range(ATT_SLOTS):
            att = slots.atts[i]
            if att is not None and att[0] == peer:
                mask |= 1ULL << i
        mask = ~mask
        for r in self._origins.values():
            rec = <OriginRecord>r
            rec._fwd_bits &= mask
            rec._fill_bits &= mask
            rec._settle_bits &= mask
            if rec._forwarded is not None:
                rec._forwarded = {a for a in rec._forwarded if a[0] != peer} or None
            if rec._filled is not None:
                rec._filled = {a for a in rec._filled if a[0] != peer} or None
            if rec._settle_sent is not None:
                rec._settle_sent = {a for a in rec._settle_sent if a[0] != peer} or None

    cdef _c_drive(self, OriginRecord rec):
        """Send each subscriber's attachments what they still need from this record.

        A record is either settled (SETTLE to the attachments not yet sent it), or driven here
        (FWD with the body), or neither (an empty FWD to each router with a placeholder to
        fill): one kind per call, so one list of attachments (`outs`) or of routers (`fill`),
        sent grouped by router in sorted order, each router's attachments in the order
        found."""
        cdef bint driving = self._c_has_pub(rec.publisher)
        # the attachments to send FWD (driving) or SETTLE (settled): `n_outs` of them, in
        # `outs` unless they are `_grouped_outs`' first ones (_outs_add)
        cdef list outs = None
        cdef Py_ssize_t n_outs = 0
        cdef set fill = None
        cdef bint settled = rec.settled
        cdef bint no_body = rec.body is None
        cdef int st
        cdef tuple att
        cdef tuple order
        # view.claims_of(sub), inlined: the claims of `sub`, in attachment order
        cdef object view = self._view
        cdef dict by_sub = None
        cdef dict claims = None
        cdef tuple plan = self._c_drive_plan(rec._layout)  # None: none (by_sub below)
        cdef tuple entry = None
        cdef set sub_atts
        cdef set done
        cdef int slot
        cdef unsigned long long bit
        cdef _AttSlots slots = self._att_slots
        cdef tuple subs = rec._layout.subs
        cdef Py_ssize_t i, j
        for i in range(len(subs)):
            st = rec._st[i]
            if st == S_SEEN or (not settled and (st != S_PENDING or no_body)):
                continue  # (no body: recovered without it, the publisher resends it)
            if plan is not None:
                entry = <tuple>plan[i]
                if entry is None:
                    continue
                order = <tuple>entry[0]
            else:
                sub = subs[i]
                if by_sub is None:
                    by_sub = view._by_sub
                sub_atts = by_sub.get(sub)
                if not sub_atts:
                    continue
                order = self._c_sub_atts(sub, sub_atts)
            for j in range(len(order)):
                att = <tuple>order[j]
                slot = -1 if plan is None else <int>(<tuple>entry[1])[j]
                if slot < 0 or (slots.atts[slot] is not att and slots.atts[slot] != att):
                    slot = self._c_slot(att)
                    if plan is not None and slot >= 0:
                        self._drive_plan = None  # (a slot given or moved: kept next time)
                bit = (1ULL << slot) if slot >= 0 else 0
                if settled:
                    if bit:
                        if rec._settle_bits & bit or (
                            rec._settle_sent is not None and att in rec._settle_sent
                        ):
                            continue
                        rec._settle_bits |= bit
                        rec._slots = slots
                    else:
                        done = rec._settle_sent
                        if done is None:
                            done = rec._settle_sent = set()
                        if att in done:
                            continue
                        done.add(att)
                    outs = _outs_add(outs, &n_outs, att)
                elif driving:
                    if bit:
                        if rec._fwd_bits & bit or (
                            rec._forwarded is not None and att in rec._forwarded
                        ):
                            continue
                        rec._fwd_bits |= bit
                        rec._slots = slots
                    else:
                        done = rec._forwarded
                        if done is None:
                            done = rec._forwarded = set()
                        if att in done:
                            continue
                        done.add(att)
                    outs = _outs_add(outs, &n_outs, att)
                else:
                    if claims is None:
                        claims = view.claims
                    if claims[att].unsettled.get(rec.out_tag) is False and not (
                        rec._fill_bits & bit or (rec._filled is not None and att in rec._filled)
                    ):
                        # a placeholder to fill: safe from anyone (rule 1)
                        if bit:
                            rec._fill_bits |= bit
                            rec._slots = slots
                        else:
                            if rec._filled is None:
                                rec._filled = set()
                            rec._filled.add(att)
                        if fill is None:
                            fill = set()
                        fill.add(att[0])
        if fill is not None:
            for router in sorted(fill):
                self._c_fwd_to(router, rec, ())
        elif outs is not None:
            self._c_send_grouped(rec, _c_grouped(outs), settled)
        elif n_outs:
            self._c_send_grouped(
                rec,
                _grouped_plan if n_outs == len(_grouped_outs)
                else _c_grouped(list(_grouped_outs[:n_outs])),
                settled,
            )

    cdef int _c_send_grouped(self, OriginRecord rec, tuple plan, bint settle) except -1:
        """FWD (or SETTLE) to each router of `plan` (_c_grouped's) its attachments, in
        order."""
        cdef tuple group
        cdef Py_ssize_t i
        for i in range(len(plan)):
            group = <tuple>plan[i]
            if settle:
                self._c_rec_to(group[0], REC_SETTLE, rec.out_tag, group[1])
            else:
                self._c_fwd_to(group[0], rec, group[1])
        return 0

    cdef int _c_fwd_to(self, router, OriginRecord rec, targets) except -1:
        """("FWD", topic, t, pub, tag, body, targets) to `router`, as its fields."""
        if router is self.router_id or router == self.router_id:
            # (the record itself, in the loopback's unused router field: see _c_own_next)
            self._own.push_record(REC_FWD, None, rec, rec.out_tag, rec.publisher, rec.tag,
                                  rec.body, targets)
        else:
            self._c_record_to_peer(router, REC_FWD, rec.out_tag, rec.publisher, rec.tag,
                                   rec.body, targets)
        return 0

    cdef int _c_rec_to(self, router, int op, out_tag, subs, OriginRecord hint=None) except -1:
        """(name, topic, t, subs) to `router` for op REC_SETTLE, REC_ACCEPT or REC_SEEN (the
        name: SETTLE, ACCEPT, SEEN), as its fields. `hint`: the origin record of `out_tag`
        a local record knows (its `_origin`), for the loopback's ACCEPT and SEEN."""
        if _same_router(router, self.router_id):
            self._own.push_record(op, None, hint, out_tag, subs, None, None, None)
        else:
            self._c_record_to_peer(router, op, out_tag, subs, None, None, None)
        return 0

    cdef int _c_record_to_peer(self, router, int op, t, x, tag, body, targets) except -1:
        """A record to another router (if up), as _c_to_peer its tuple: staged as its fields
        (the engine writes them into the router's envelope in the compact encoding: eo_wire.pxi,
        `eo_send_record`), or as a map to a router before the records."""
        cdef EoOut o
        if router in self._up:
            if router in self._records_ok:
                self._out.push_record(op, self.topic, router, t, x, tag, body, targets)
                if router in self._compact_ok:  # (the flag: written as a compact record)
                    self._out.items[self._out.n - 1].flag = True
            else:
                o.op = op
                o.topic = <PyObject *>self.topic
                o.b = <PyObject *>t
                o.c = <PyObject *>x
                o.d = <PyObject *>tag
                o.e = <PyObject *>body
                o.f = <PyObject *>targets
                self._out.push(OUT_TO_ROUTER, None, router, _record_map(_rec_tuple(&o)), None,
                               False)
        return 0

    cdef _c_check_accept(self, OriginRecord rec):
        cdef set local
        cdef tuple subs = rec._layout.subs
        cdef Py_ssize_t i
        if rec.settled or rec.accepted_sent:
            return
        if self._accept_early:
            if not self._c_has_pub(rec.publisher):
                return
            local = {(<LocalSub>ls).sub for ls in self._subs.values()}
            for i in range(len(subs)):
                if rec._st[i] == S_PENDING and subs[i] in local:
                    return
        elif _c_pending_open(rec, self._view) or not self._c_has_pub(rec.publisher):
            return  # (the subscribers first: the usual answer, and no lookup)
        rec.accepted_sent = True
        # (with its out tag: the publisher's settlement, which this outcome brings at once
        # from a settle-first publisher, looks the record up by it: eo_publisher_settled)
        self._out.push(OUT_ACCEPT_PUBLISHER, self.topic, rec.publisher, rec.tag, rec.out_tag,
                       False)
        # (and the record, a hint the settlement's look-up may take: _c_origin)
        _out_hold(&self._out.items[self._out.n - 1].d, rec)

    cdef _c_settle_origin(self, OriginRecord rec):
        rec.settled = True
        if not self.eo:
            self._c_delete_origin(rec)  # subscribers settled on accept: nothing to relay
            return
        self._c_save_origin(rec, False)
        rec._settle_sent = None
        rec._settle_bits = 0
        self._c_drive(rec)
        if self._drop_on_settle:
            self._c_delete_origin(rec)
        else:
            self._c_maybe_drop_origin(rec)

    cdef _c_maybe_drop_origin(self, OriginRecord rec):
        cdef bint done = rec.c_done()
        cdef tuple subs = rec._layout.subs
        cdef Py_ssize_t i
        if not done and rec.settled:
            done = True
            for i in range(len(subs)):
                if not (rec._st[i] == S_SEEN or self._c_long_closed(subs[i])):
                    done = False
                    break
        if done and self._origins.get(rec.out_tag) is rec:
            self._c_delete_origin(rec)

    cdef bint _c_long_closed(self, sub) except -1:
        """A subscriber an ex-driver handed over (_merge_owed) though closed here: owed
        nothing more once it stayed closed for the terminus timeout (until then, the claim
        that re-opens it may be on its way, and the record waits for it, as for one in
        limbo)."""
        closed = _view_closed(self._view)
        if not closed or sub not in closed:  # (none closed, as a rule: no hash of `sub`)
            return False
        since = self._closed_since.get(sub)
        return since is None or self._now - since > self.terminus_timeout

    # -- the subscriber side ---------------------------------------------------------------

    cdef _c_pump(self, LocalSub ls, known_tag=None, LocalRecord known=None):
        """Deliver the attachment's queue in order, up to the first unfilled placeholder.
        `known`: the record `_locals` holds under `known_tag` (the caller just looked it up
        or put it there; nothing here changes `_locals`), so the queue's entry that is that
        very tag object, as a rule its head, is not looked up again."""
        cdef LocalRecord rec
        cdef int st
        cdef Py_ssize_t pos
        queue = ls.queue
        att = ls.att
        while queue:
            out_tag = queue[0]
            if known is not None and out_tag is known_tag:
                rec = known
            else:
                rec = self._locals.get(out_tag)
            pos = rec.c_pos(att) if rec is not None else -1
            st = rec._st[pos] if pos >= 0 else -1
            if st == L_HELD:
                return
            queue.popleft()
            if rec is not None and rec.body is not None and st == L_QUEUED:
                rec._st[pos] = L_DELIVERED
                if ls._dring is None:
                    ls._dring = _RecRing(DRING_MOST)
                ls._dring.c_push(rec)
                resume = out_tag in ls.attach_map
                self._out.push(OUT_DELIVER, None, ls.att, out_tag, rec.body, resume)

    cdef _c_check_local_accept(self, LocalRecord rec):
        """Accept upstream once every local subscriber of the delivery has accepted."""
        if rec.settled or rec._drivers is None or not rec.c_all_accepted():
            return
        cdef tuple keys = rec._keys.keys
        if len(keys) == 1:
            subs = self._c_sub_here(keys[0]).c_subs1()
        else:
            subs = tuple(sorted({self._c_sub_here(att).sub for att in keys}))
        drivers = rec._drivers
        if type(drivers) is set:
            for router in sorted(<set>drivers):
                self._c_rec_to(router, REC_ACCEPT, rec.out_tag, subs, rec._origin)
        else:  # (one router, not None: checked above)
            self._c_rec_to(drivers, REC_ACCEPT, rec.out_tag, subs, rec._origin)
        if not self.eo:  # subscribers settle on accept (mode first)
            was = self._locals.pop(rec.out_tag, None)
            if was is not None:
                self._c_local_gone(<LocalRecord>was)

    cdef _c_maybe_drop_local(self, LocalRecord rec):
        if rec._held_by != self._uid:  # (not `_locals`' record of its out tag)
            return
        self._c_drop_local_found(rec)

    cdef _c_drop_local_found(self, LocalRecord rec):
        """_c_maybe_drop_local(rec) of a record the caller knows `_locals` holds."""
        if rec.settled:
            if self._drop_on_settle or (
                rec.c_all_seen() and self._c_barrier_passed(rec.settled_epoch)
            ):
                self._c_local_del(rec)
        elif not rec._keys.keys:
            self._c_local_del(rec)

    cdef bint _c_barrier_passed(self, long long epoch) except -1:
        cdef dict barrier = self._barrier
        cdef set lacking = self._lacking
        cdef object at = epoch  # (made once, not once per peer)
        for p in self._up:  # peers not up, or lacking the guarantee, are not waited for
            if p not in lacking and barrier.get(p, 0) <= at:
                return False
        return True

    # -- plumbing --------------------------------------------------------------------------

    cdef int _c_save_origin(self, OriginRecord rec, bint body) except -1:
        cdef bytes tag
        cdef bint with_body
        cdef PyObject *was
        if self.eo:
            tag = rec.out_tag
            with_body = body and rec.body is not None
            if rec._sgen != self._sgen:  # (else in `_dirty` already, so not in `_gone`)
                if (
                    self._gone
                    and not self._c_not_gone(rec)
                    and self._gone.pop(tag, None) is not None
                ):
                    if not with_body:
                        # deleted and saved again in one commit, without its body: that
                        # stays deleted
                        self._dels.add(b"m/" + tag)
                        self._m_dels = True
                    else:
                        self._known.add(tag)
                # encoded once, at the commit (see _flush)
                was = PyDict_SetDefault(self._dirty, tag, rec)
                if was != <PyObject *>rec:  # another record of the tag's: it goes
                    (<OriginRecord>was)._sgen = 0
                    self._dirty[tag] = rec
                rec._sgen = self._sgen
            if with_body:
                if self._m_dels:
                    self._dels.discard(b"m/" + tag)
                self._bodies[tag] = rec.body
        return 0

    cdef void _c_new_sgen(self) noexcept:
        """`_dirty` emptied (a commit): a generation no record holds."""
        global _sgen_last
        _sgen_last += 1
        self._sgen = _sgen_last

    cdef _c_delete_origin(self, OriginRecord rec):
        cdef bytes tag = rec.out_tag
        was = self._origins.pop(tag, None)
        rec._held_by = 0
        if was is not None:
            (<OriginRecord>was)._held_by = 0
        cdef uint64_t key
        cdef Py_ssize_t i
        cdef int w
        cdef PyObject *p
        if self._recent is not None and _recent_key(tag, &key):
            i = <Py_ssize_t>(key & <uint64_t>(self._recent_n - 2))
            for w in range(2):
                p = PyList_GET_ITEM(self._recent, i + w)
                if p == <PyObject *>rec or p == <PyObject *>was:
                    self._recent[i + w] = None  # (not held past `_origins`)
                    self._recent_keys[i + w] = 0
        if self.eo:
            if self._dirty:
                was = self._dirty.pop(tag, None)
                if was is not None:
                    (<OriginRecord>was)._sgen = 0
            if self._bodies:
                self._bodies.pop(tag, None)
            self._gone[tag] = rec  # (its o/ and m/ keys; _puts never holds them)

    cdef _c_put(self, key, value):
        self._dels.discard(key)
        self._puts[key] = value

    cdef _c_del(self, key):
        self._puts.pop(key, None)
        self._dels.add(key)

    cdef _c_to_router(self, router, msg):
        # (our own id is the object the core was given: most calls to ourselves pass it)
        if router is self.router_id or router == self.router_id:
            self._own.push(OUT_TO_ROUTER, None, None, msg, None, False)
        else:
            self._c_to_peer(router, msg)

    cdef int _c_to_peer(self, router, msg) except -1:
        """`msg` to another router (if up)."""
        if router in self._up:
            if type(msg) is tuple and router not in self._records_ok:
                msg = _record_map(<tuple>msg)  # a router before the records
            self._out.push(OUT_TO_ROUTER, None, router, msg, None, False)
        return 0

    cdef int _c_own_next(self, OutQueue own) except -1:
        """Handle our oldest own message (taken off first: a handler may push more, and an
        error leaves the rest for the next flush, as the deque did)."""
        cdef EoOut *o = &own.items[own.head]
        cdef int op = o.op
        cdef bint record = o.kind == OUT_RECORD
        # (a loopback record's router field, unused, holds its origin record: a FWD's, or the
        # hint of an ACCEPT or SEEN, else None; _c_fwd_to, _c_rec_to)
        cdef OriginRecord hint = (
            <OriginRecord><object>o.a if o.a != NULL and type(<object>o.a) is OriginRecord
            else None
        )
        b = <object>o.b
        c = <object>o.c
        d = e = f = None
        if record and op == REC_FWD:
            d = <object>o.d
            e = <object>o.e
            f = <object>o.f
        _out_release(o)
        own.head += 1
        if own.head == own.n:
            own.head = own.n = 0
        if not record:
            self._c_own(b)
        elif op == REC_FWD:  # as _c_own a FWD tuple
            self._c_on_fwd(self.router_id, b, c, d, e, f, hint)
        elif op == REC_SETTLE:
            self._c_on_settle(self.router_id, b, c)
        elif op == REC_ACCEPT:
            self._c_on_accept(b, c, hint)
        else:
            self._c_on_seen(b, c, hint)
        return 0

    cdef _c_log(self, level, text):
        self._out.push(OUT_PORT, None, "log", (level, f"{self.router_id}/{self.topic}: {text}"),
                       None, False)

    cdef _c_flush(self):
        """End of an input: our own messages, then the commit, then every output in order."""
        cdef OutQueue own = self._own
        while own.n:
            self._c_own_next(own)
        cdef dict puts, dirty, bodies, gone
        cdef set dels
        g = self._commit_to
        if self._puts or self._dels or self._dirty or self._gone:
            if g is not None:
                # the router's group commit: the records stay here, staged, until it walks
                # the cores that have some (collect_writes); the topic's mark is due if any
                # input of the iteration put something (as the merged batch had it)
                if self._puts or self._dirty:  # (_bodies: of records in _dirty)
                    self._marked = True
                if not self._committing:
                    self._committing = True
                    self._commit_list.append(self)
                if not _flush_due(g):
                    g.schedule()
            else:
                puts, dels, dirty = self._puts, self._dels, self._dirty
                bodies, gone = self._bodies, self._gone
                self._puts, self._dels, self._dirty = {}, set(), {}
                self._c_new_sgen()
                self._bodies, self._gone, self._m_dels = {}, {}, False
                if self._known:
                    self._known.clear()
                for tag, rec in gone.items():
                    dels.add(_origin_key(<OriginRecord>rec))
                    dels.add(b"m/" + tag)
                for tag, body in bodies.items():
                    puts[b"m/" + tag] = body
                dirty = {_origin_key(<OriginRecord>rec): rec for rec in dirty.values()}
                commit_records = getattr(self._store, "commit_records", None)
                if commit_records is not None:
                    commit_records(puts, dirty, dels)
                else:
                    for key, rec in dirty.items():
                        puts[key] = rec.encode_state()
                    self._store.commit(puts, dels)
        cdef OutQueue out = self._out
        if not out.n:
            return
        g = self._stage
        if g is None:
            self._c_port_calls(out, None)
            return
        # the router applies the outputs after its commit (EoLinks.apply_outputs): they go
        # to its queue as they are, in order; a port's own (log, resend) are called now
        if out.n_port:
            self._c_port_calls(out, self._staged)
        else:
            out.move_to(self._staged)
        if not _flush_due(g):
            g.schedule()

    cdef _c_port_calls(self, OutQueue out, OutQueue staged):
        """The outputs in order: with `staged` (a router), the port's own (log, resend) called
        now and the others moved to `staged`; without (the simulation, tests/eo/sim.py),
        every output a call of the port."""
        cdef OutQueue batch = OutQueue()
        cdef EoOut *o
        cdef Py_ssize_t i
        cdef int kind
        batch.swap(out)  # (a port's call could reach this core again)
        port = self._port
        try:
            for i in range(batch.n):
                o = &batch.items[i]
                kind = o.kind
                if kind == OUT_PORT:
                    getattr(port, <object>o.a)(*<object>o.b)
                elif staged is not None:
                    staged.push_copy(o)
                elif kind == OUT_DELIVER:
                    port.deliver(<object>o.a, <object>o.b, <object>o.c, o.flag)
                elif kind == OUT_SETTLE_SUBSCRIBER:
                    port.settle_subscriber(<object>o.a, <object>o.b)
                elif kind == OUT_ACCEPT_PUBLISHER:
                    port.accept_publisher(<object>o.a, <object>o.b)
                elif kind == OUT_TO_ROUTER:
                    port.to_router(<object>o.a, <object>o.b)
                elif kind == OUT_RECORD:
                    port.to_router(<object>o.a, _rec_tuple(o))
                else:
                    (<object>o.a)(*<object>o.b)
        finally:
            batch.clear()

    # -- the same, for protocol.py ---------------------------------------------------------

    def _drive(self, OriginRecord rec):
        self._c_drive(rec)

    def _check_accept(self, OriginRecord rec):
        self._c_check_accept(rec)

    def _settle_origin(self, OriginRecord rec):
        self._c_settle_origin(rec)

    def _maybe_drop_origin(self, OriginRecord rec):
        self._c_maybe_drop_origin(rec)

    def _long_closed(self, sub):
        return self._c_long_closed(sub)

    def _delete_origin(self, OriginRecord rec):
        self._c_delete_origin(rec)

    def _save_origin(self, OriginRecord rec, body=False):
        self._c_save_origin(rec, body)

    def _pump(self, LocalSub ls):
        self._c_pump(ls)

    def _check_local_accept(self, LocalRecord rec):
        self._c_check_local_accept(rec)

    def _maybe_drop_local(self, LocalRecord rec):
        self._c_maybe_drop_local(rec)

    def _detach_locals(self, att):
        """A subscriber attachment `att` has gone (TopicRouter.subscriber_detached): take it
        out of every local record, in the records' order, accepting upstream for those whose
        other subscribers all accepted and dropping those left with nothing. Every record is
        looked at (the settled ones too), so it is per-message work: here, not in Python."""
        cdef LocalRecord rec
        cdef dict locals_ = self._locals
        # _c_barrier_passed's answer for the last epoch asked: the barrier, the peers up and
        # the lacking ones do not change during the walk (what it sends is only queued), and
        # the tombstones it meets come in runs of one epoch
        cdef long long memo_epoch = 0
        cdef bint memo_set = False, memo_passed = False
        for rec in list(locals_.values()):
            if rec.c_pop_sub(att) < 0:
                continue
            self._c_check_local_accept(rec)
            # _c_maybe_drop_local(rec), with the memo
            if rec._held_by != self._uid:
                continue
            if rec.settled:
                if not self._drop_on_settle:
                    if not rec.c_all_seen():
                        continue
                    if not memo_set or memo_epoch != rec.settled_epoch:
                        memo_passed = self._c_barrier_passed(rec.settled_epoch)
                        memo_epoch = rec.settled_epoch
                        memo_set = True
                    if not memo_passed:
                        continue
                self._c_local_del(rec)
            elif not rec._keys.keys:
                self._c_local_del(rec)

    def _recent_records(self):
        """The origin records `_recent` holds (tests: none but those `_origins` holds)."""
        return [rec for rec in self._recent or () if rec is not None]

    def _settled_index(self):
        """The records `_settled_l` holds from its head (tests: the live ones are exactly
        the settled records of `_locals`, in epoch order)."""
        return self._settled_l[self._settled_head:]

    def _any_settled_local(self):
        """Any settled record in `_locals` (a tombstone waiting): the first live one held,
        past those dropped another way (let go here)."""
        cdef list held = self._settled_l
        cdef Py_ssize_t i = self._settled_head
        cdef Py_ssize_t n = len(held)
        cdef LocalRecord rec
        while i < n:
            rec = <LocalRecord>held[i]
            if rec._held_by == self._uid:  # (`_locals`' record of its out tag)
                break
            held[i] = None
            i += 1
        self._c_settled_from(i)
        return i < n

    cdef _c_settled_from(self, Py_ssize_t head):
        """`_settled_l`'s entries before `head` are done: the list compacted once they are
        half of it (and more than a few)."""
        cdef list held = self._settled_l
        if head >= 1024 and 2 * head >= len(held):
            del held[:head]
            head = 0
        elif head == len(held):
            del held[:]
            head = 0
        self._settled_head = head

    def _drop_settled_locals(self):
        """`_maybe_drop_local` of every settled record in `_locals` (the tick), walking the
        settled ones only (`_settled_l`), not every record in flight, and of those only the
        ones that passed the barrier: they are held in the order they settled, so by
        `settled_epoch` (the epoch only grows), and the first that has not passed it ends the
        walk (none after it has). The ones it keeps (not seen by all) stay in order."""
        cdef list held = self._settled_l
        cdef dict barrier = self._barrier
        cdef set lacking = self._lacking
        cdef LocalRecord rec
        cdef object below = None  # _c_barrier_passed(e) is e < below: made once per tick
        cdef long long lim = 0
        cdef bint limited = False
        cdef list kept = None
        cdef Py_ssize_t i = self._settled_head
        cdef Py_ssize_t n = len(held)
        cdef Py_ssize_t k
        if i >= n:
            self._c_shrink_locals()
            return
        for p in self._up:
            if p not in lacking:
                b = barrier.get(p, 0)
                if below is None or b < below:
                    below = b
        if below is not None and not self._drop_on_settle and below < (1 << 62):
            limited = True
            lim = below if below > 0 else 0  # (an epoch is >= 0: below 1, none passed)
        while i < n:
            rec = <LocalRecord>held[i]
            if rec._held_by != self._uid or not rec.settled:
                pass  # (dropped another way: not a record of `_locals` now)
            elif limited and rec.settled_epoch >= lim:
                break
            elif self._drop_on_settle or rec.c_all_seen():
                self._c_local_del(rec)  # (as _c_maybe_drop_local drops a settled record)
            else:
                if kept is None:
                    kept = []
                kept.append(rec)
            held[i] = None
            i += 1
        if kept is not None:
            k = len(kept)
            held[i - k:i] = kept
            i -= k
        self._c_settled_from(i)
        self._c_shrink_locals()

    cdef _c_shrink_locals(self):
        """`_locals` rebuilt when its table is far larger than what it holds (the tick).

        The local records in flight are the rate times the barrier's delay (a settled record
        waits for the PING barrier, TICK to 3 TICKs): 5,000 to 19,000 on each router of the
        bench's triangle at 22-26k msg/s. A dict's table only shrinks when it has to grow
        (CPython then sizes it for the records it holds), so the table of the largest burst
        (1.3 MiB at 19,000, 2.5 MiB past 43,690) stayed resident once traffic went quiet, and
        until as many inserts again under traffic. The copy keeps the order (insertion order:
        the walks over `_locals` see the same sequence) and costs at most 1/_LOCALS_SPARSE of
        the table's slots, once per burst; the check is one call a tick."""
        cdef dict locals_ = self._locals
        cdef Py_ssize_t size = locals_.__sizeof__()
        if size > _LOCALS_SHRINK_BYTES and len(locals_) * _LOCALS_SPARSE < size:
            self._locals = {tag: rec for tag, rec in locals_.items()}

    def _barrier_passed(self, long long epoch):
        return self._c_barrier_passed(epoch)

    def _put(self, key, value):
        self._c_put(key, value)

    def _del(self, key):
        self._c_del(key)

    def _to_router(self, router, msg):
        self._c_to_router(router, msg)

    def _emit(self, method, *args):
        kind = _OUT_KINDS.get(method)
        if kind is None:
            self._out.push(OUT_PORT, None, method, args, None, False)
        elif kind == OUT_ACCEPT_PUBLISHER:
            self._out.push(OUT_ACCEPT_PUBLISHER, self.topic, args[0], args[1], None, False)
        else:
            self._out.add(method, None, args)

    def _log(self, level, text):
        self._c_log(level, text)

    def _tag(self, pub, tag):
        return _outgoing_tag(pub, tag)

    def _flush(self):
        self._c_flush()


# -- the router's group commit (qrouter/guarantee.py) ----------------------------------------

def stage_writes(dict writes, bytes prefix, puts, records, deletes):
    """A topic's commit into the router's batch `writes` (key -> bytes, None to delete, or an
    origin record to encode at the batch's commit): deletes first, then puts, then records,
    every key under `prefix`. True if anything was put (the topic's mark is then due)."""
    return _stage_writes(writes, prefix, puts, records, deletes)


cdef bint _stage_writes(dict writes, bytes prefix, puts, records, deletes) except -1:
    for key in deletes:
        writes[prefix + key] = None
    for key, value in puts.items():
        writes[prefix + key] = value
    if records is None:
        return bool(puts)
    for key, rec in records.items():
        writes[prefix + key] = rec
    return bool(puts) or bool(records)


def split_writes(dict writes):
    """The batch `writes` as (puts, deletes) for the store: each origin record encoded once,
    in the state the loop iteration left it in."""
    cdef dict puts = {}
    cdef set deletes = set()
    for key, value in writes.items():
        if value is None:
            deletes.add(key)
        elif isinstance(value, bytes):
            puts[key] = value
        else:
            puts[key] = value.encode_state()
    return puts, deletes


def collect_writes(list cores, dict loose):
    """The router's group commit as (puts, deletes) for its store (disjoint key sets): the
    writes staged from Python (`loose`, as `stage_writes` left them), then every core's
    staged records under its prefix, each origin record encoded once, in the state the loop
    iteration left it in, and the mark of a topic that put something. The same keys and
    bytes as merging every input's commit into one batch would give."""
    cdef dict puts
    cdef set deletes
    cdef EoCore core
    cdef bytes prefix, okp, mkp
    cdef bint mixed = bool(loose)
    if mixed:
        puts, deletes = split_writes(loose)
    else:
        puts, deletes = {}, set()
    for c in cores:
        core = <EoCore>c
        prefix = core._prefix
        for key in core._dels:
            full = prefix + key
            deletes.add(full)
            if mixed:
                puts.pop(full, None)
        for key, value in core._puts.items():
            full = prefix + key
            puts[full] = value
            if mixed:
                deletes.discard(full)
        # the origin records staged by out_tag: their keys made here, once per commit
        okp = prefix + b"o/"
        mkp = prefix + b"m/"
        for tag in core._gone:
            deletes.add(okp + tag)
            deletes.add(mkp + tag)
            if mixed:
                puts.pop(okp + tag, None)
                puts.pop(mkp + tag, None)
        for tag, rec in core._dirty.items():
            full = okp + tag
            puts[full] = (<OriginRecord>rec).encode_state()
            if mixed:
                deletes.discard(full)
        for tag, body in core._bodies.items():
            full = mkp + tag
            puts[full] = body
            if mixed:
                deletes.discard(full)
        if core._marked:
            puts[core._mark] = b""
            if mixed:
                deletes.discard(core._mark)
    return puts, deletes


cdef class TopicMemory(dict):
    """No store: one topic's records in the router's memory (`commit_memory`), by key under
    its prefix, as a dict (the subscriber keys, k/ and c/), with the origin records beside
    it by out_tag: `origins` (b"o/" + out_tag) each as the record itself, encoded by the
    scan that reads it (`scan_memory`), not at every commit (bytes when Python staged it
    encoded), and `bodies` (b"m/" + out_tag) their bodies. Recovery (the only reader) scans
    a topic when it is made, so a scan never reads the records of a live topic: the
    record's state is then the one its last commit left."""

    # (readonly, and changed only here: a record in it as itself knows, OriginRecord._mem_uid)
    cdef readonly dict origins
    cdef public dict bodies
    cdef unsigned long long uid  # this one's, unique (OriginRecord._mem_uid)

    def __cinit__(self, *args, **kwargs):
        global _mem_uid_last
        self.origins = {}
        self.bodies = {}
        _mem_uid_last += 1
        self.uid = _mem_uid_last


cdef unsigned long long _mem_uid_last = 0  # the last TopicMemory.uid given


cdef inline int _mem_left(value) except -1:
    """`value` left a TopicMemory's `origins` (or was replaced there): a record no longer
    says it is in one."""
    if isinstance(value, OriginRecord):
        (<OriginRecord>value)._mem_uid = 0
    return 0


cdef TopicMemory _topic_memory(dict topic_memory, bytes prefix):
    """The `TopicMemory` of `prefix` in `topic_memory`, made (or made of a plain dict's keys)."""
    cdef object mem = topic_memory.get(prefix)
    cdef TopicMemory tm
    if type(mem) is TopicMemory:
        return <TopicMemory>mem
    tm = TopicMemory()
    if mem:
        for key, value in (<dict?>mem).items():
            _memory_put(tm, key, value)
    topic_memory[prefix] = tm
    return tm


cdef int _memory_put(dict mem, bytes sub, value) except -1:
    """mem[sub] = value, an origin record's key (o/, m/) in its `TopicMemory` dict."""
    if type(mem) is TopicMemory:
        if sub.startswith(b"o/"):
            _mem_left((<TopicMemory>mem).origins.get(sub[2:]))
            (<TopicMemory>mem).origins[sub[2:]] = value
            return 0
        if sub.startswith(b"m/"):
            (<TopicMemory>mem).bodies[sub[2:]] = value
            return 0
    mem[sub] = value
    return 0


cdef int _memory_pop(dict mem, bytes sub) except -1:
    """mem.pop(sub, None), an origin record's key (o/, m/) from its `TopicMemory` dict."""
    if type(mem) is TopicMemory:
        if sub.startswith(b"o/"):
            _mem_left((<TopicMemory>mem).origins.pop(sub[2:], None))
            return 0
        if sub.startswith(b"m/"):
            (<TopicMemory>mem).bodies.pop(sub[2:], None)
            return 0
    mem.pop(sub, None)
    return 0

# -- the router's group commit through its record log (the engine's eo_log.pxi) -------------

# a log entry's kinds (qrouter/stores/termini.py, "the record log"; the engine's durable.pxi)
cdef enum:
    _LOG_PUT = 0x50
    _LOG_DEL = 0x44
    _LOG_PATCH = 0x55  # b"U" key-length(2) key count(2) count x [offset(4) byte]
    # a patch and a delete naming their record by its number (`LogRefs`), not its key:
    # b"u" number(4) count(1) count x [offset(2) byte]; b"d" number(4)
    _LOG_PATCH_REF = 0x75
    _LOG_DEL_REF = 0x64
    # the most bytes a patch changes: an origin record's state change touches its settled
    # byte and a subscriber's state byte or two; more, and the whole record is put
    _PATCH_MAX = 16

cdef char* _lbuf = NULL  # the entries of one `log_records`, made into its bytes at the end
cdef Py_ssize_t _lcap = 0
# while `log_records` runs with a `LogRefs`: the number the next guaranteed topic's put gets
# and the generation the numbers belong to (0: numbers off, every entry names its key)
cdef uint32_t _lputs = 0
cdef uint64_t _lgen = 0
cdef uint64_t _lgen_last = 0  # the last generation given, across routers
# while `log_records` runs with a `LogRefs`: its checkpoint interval (an origin record's
# `_lo_new`, `_lm_new`; 0: off, the `born` set alone) and its filter of `gone` (NULL: off)
cdef uint64_t _lint = 0
cdef uint64_t _lint_last = 0  # the last interval given, across routers
cdef uint64_t* _lgbits = NULL
# the filter's size in bits (a power of two): 32 KiB, some thousands of keys deleted in an
# interval that the records held at its start, with few false hits
DEF _GONE_BITS = 1 << 18


cdef class LogRefs:
    """Numbers for a router's record log, so that an origin record's patches and deletes
    name it in five bytes instead of its key (some 50: the topic prefix and the 32-byte out
    tag). Every put of a guaranteed topic's key (b"eo/", b"eot/") in the log gets the next
    number, from 0 at the log's start; the replay (qrouter/stores/termini.py, `read_log`)
    counts them in the same order, so a number names the key of that put. The numbers start
    again when the log does: at a checkpoint, which empties the log and gives the router a
    new `journal` dict, seen here (`journal`, held, so that a new dict at a reused address
    cannot pass for the old one) as a new generation; a record's numbers from an older
    generation are not used (it names its key). Numbers begin at the first checkpoint this
    object sees (the log it found may hold puts it did not count), or at once after `begin`
    (the router at start-up, its log just folded). Only `log_records` counts
    puts, so the router's log takes the guaranteed topics' entries from it alone, with this
    one object (`Guarantees.log_refs`; the durable links write only b"u/" keys)."""

    cdef object journal  # the router's net changes when the generation began
    cdef uint64_t gen
    cdef uint32_t nput  # the number of the next put
    cdef bint fresh  # `begin`: the log holds no put of a guaranteed topic's key
    # the checkpoint interval `journal` belongs to (unique across routers), and a filter of
    # the guaranteed topics' keys its `gone` set may hold: a bit per key hash, set for
    # every key in `gone` when the interval was first seen and for each key `_log_del`
    # adds since (only `log_records` deletes these keys: the durable links' are b"u/"),
    # so that a put of a new record's key, whose bit is clear, skips the set's probe
    cdef uint64_t interval
    cdef uint64_t* gone_bits

    def __init__(self):
        self.journal = None
        self.gen = 0
        self.nput = 0
        self.fresh = False
        self.interval = 0

    def __dealloc__(self):
        PyMem_Free(self.gone_bits)

    def begin(self):
        """The router's log holds no put of a guaranteed topic's key now (its previous
        run's log folded into the records at start-up, and nothing logged for the topics
        since): numbers from 0 at once, not from the first checkpoint."""
        self.journal = None
        self.gen = 0
        self.fresh = True

    def suspend(self):
        """A commit of the log failed: its blob may yet be appended twice (a committer that
        raised after its append succeeded, then the retry), and the replay would count its
        puts twice, so every number after it would name another put's key. Numbers stay off
        (every entry names its key) until a checkpoint empties the log."""
        self.gen = 0


cdef inline bint _is_guarantee_key(bytes key) noexcept:
    # as the replay counts (GUARANTEE_PREFIXES of qrouter/stores/termini.py)
    cdef Py_ssize_t n = PyBytes_GET_SIZE(key)
    cdef const char* k = PyBytes_AS_STRING(key)
    return n >= 3 and k[0] == 0x65 and k[1] == 0x6f and (
        k[2] == 0x2f or (n >= 4 and k[2] == 0x74 and k[3] == 0x2f))


cdef unsigned char* _lreserve(Py_ssize_t n, Py_ssize_t need) except NULL:
    """`_lbuf` grown (doubling from 64 KiB) to hold `need` octets; where octet `n` goes."""
    global _lbuf, _lcap
    cdef Py_ssize_t cap
    cdef char* grown
    if need > _lcap:
        cap = _lcap * 2 if _lcap else 65536
        while cap < need:
            cap *= 2
        grown = <char*>PyMem_Realloc(_lbuf, cap)
        if grown == NULL:
            raise MemoryError()
        _lbuf = grown
        _lcap = cap
    return <unsigned char*>_lbuf + n


cdef inline void _put32(unsigned char* p, uint32_t v) noexcept:
    p[0] = (v >> 24) & 0xff
    p[1] = (v >> 16) & 0xff
    p[2] = (v >> 8) & 0xff
    p[3] = v & 0xff


cdef Py_ssize_t _lentry(Py_ssize_t n, int op, bytes key, bytes value) except -1:
    """Append one entry at `n` of `_lbuf`; the new length. A put of a guaranteed topic's
    key takes the next number (`LogRefs`) while they are on."""
    global _lputs, _lgen
    cdef Py_ssize_t nk = PyBytes_GET_SIZE(key)
    cdef Py_ssize_t nv = PyBytes_GET_SIZE(value) if value is not None else 0
    cdef Py_ssize_t need = n + 3 + nk + (4 + nv if op == _LOG_PUT else 0)
    cdef unsigned char* p
    if nk > 0xffff:
        raise ValueError("a record key longer than a log entry holds")
    p = _lreserve(n, need)
    p[0] = op
    p[1] = (nk >> 8) & 0xff
    p[2] = nk & 0xff
    memcpy(p + 3, PyBytes_AS_STRING(key), nk)
    if op == _LOG_PUT:
        _put32(p + 3 + nk, <uint32_t>nv)
        if nv:
            memcpy(p + 7 + nk, PyBytes_AS_STRING(value), nv)
        if _lgen and _is_guarantee_key(key):
            if _lputs == UINT32_MAX:  # (a C constant: the literal made an int each put)
                _lgen = 0  # (not in a 16 MiB log: numbers off until the next checkpoint)
            else:
                _lputs += 1
    return need


cdef inline uint64_t* _gone_bit(bytes key, uint64_t* bit) except NULL:
    """The word of `_lgbits` that holds `key`'s bit (its mask in `bit`)."""
    cdef size_t h = <size_t>hash(key)  # (a bytes object's hash is kept: the dict reuses it)
    bit[0] = (<uint64_t>1) << (h & 63)
    return _lgbits + ((h >> 6) & (_GONE_BITS // 64 - 1))


cdef inline bint _maybe_gone(set gone, bytes key) except -1:
    """`gone` may hold `key` (the filter, LogRefs, when on and `key` a guaranteed topic's)."""
    cdef uint64_t bit
    if not gone:
        return False
    if _lgbits == NULL or not _is_guarantee_key(key):
        return True
    return (_gone_bit(key, &bit)[0] & bit) != 0


cdef Py_ssize_t _log_put(Py_ssize_t n, bytes key, bytes value, dict journal, set gone,
                         set born, bint new, uint64_t* made=NULL) except -1:
    """A put. `new`: the records as of the last checkpoint lack `key` (so its delete in
    this interval only drops it), said in `made[0]` (an origin record's `_lo_new`,
    `_lm_new`) while intervals are on, else in `born`."""
    n = _lentry(n, _LOG_PUT, key, value)
    journal[key] = value
    if _maybe_gone(gone, key) and PySet_Discard(gone, key):
        pass  # deleted earlier in the interval: the records may hold the old one
    elif new:
        if made != NULL and _lint:
            made[0] = _lint
        else:
            PySet_Add(born, key)
    return n


cdef Py_ssize_t _log_del(Py_ssize_t n, bytes key, dict journal, set gone, set born,
                         uint64_t gen=0, uint32_t ref=0, uint64_t made=0) except -1:
    """A delete; by the record's number `ref` (`_LOG_DEL_REF`) when `gen` is the current
    generation (a put of `key` is in the log: see LogRefs). `made`: the interval in which
    the record put `key` new (`_log_put`), if any."""
    cdef unsigned char* p
    cdef uint64_t bit
    if gen and gen == _lgen:
        p = _lreserve(n, n + 5)
        p[0] = _LOG_DEL_REF
        _put32(p + 1, ref)
        n += 5
    else:
        n = _lentry(n, _LOG_DEL, key, None)
    if journal:
        journal.pop(key, None)
    if made and made == _lint:
        return n  # made in the interval: the records lack it
    if not (born and PySet_Discard(born, key)):  # (the same, said by the set)
        if _lgbits != NULL:
            _gone_bit(key, &bit)[0] |= bit  # (first: the filter never misses a key of `gone`)
        PySet_Add(gone, key)
    return n


cdef Py_ssize_t _log_state(Py_ssize_t n, bytes key, bytes value, dict journal, set gone,
                           set born, bint new, uint64_t gen=0, uint32_t ref=0,
                           uint64_t* made=NULL) except -1:
    """An origin record's state put (or a topic's mark): as a patch of the bytes that
    changed (`_LOG_PATCH`, or `_LOG_PATCH_REF` naming the record by its number `ref` when
    `gen` is the current generation; nothing if no byte changed) when this checkpoint
    interval put the record already (`journal` holds it, so the log since the last
    checkpoint holds its whole value before this entry), else whole. The net change
    (`journal`) is the whole value either way. Most of a message's records change only a
    state byte or two after the first put, so the log carries a few bytes a change instead
    of the whole record (its publisher, tag and every subscriber's name)."""
    cdef object old = journal.get(key) if journal and not new else None
    cdef Py_ssize_t nv = PyBytes_GET_SIZE(value)
    cdef Py_ssize_t nk = PyBytes_GET_SIZE(key)
    cdef Py_ssize_t i = 0, j, end, count = 0, need
    cdef Py_ssize_t at[_PATCH_MAX]  # where the bytes differ
    cdef uint64_t wa, wb
    cdef const unsigned char* a
    cdef const unsigned char* b
    cdef unsigned char* p
    if old is None or type(old) is not bytes or PyBytes_GET_SIZE(<bytes>old) != nv:
        return _log_put(n, key, value, journal, gone, born, new, made)
    a = <const unsigned char*>PyBytes_AS_STRING(<bytes>old)
    b = <const unsigned char*>PyBytes_AS_STRING(value)
    while i < nv:  # eight bytes at a time; those that differ byte by byte
        end = i + 8
        if end <= nv:
            memcpy(&wa, a + i, 8)
            memcpy(&wb, b + i, 8)
            if wa == wb:
                i = end
                continue
        else:
            end = nv
        for j in range(i, end):
            if a[j] != b[j]:
                if count == _PATCH_MAX:
                    return _log_put(n, key, value, journal, gone, born, new, made)
                at[count] = j
                count += 1
        i = end
    if count == 0:
        return n  # the log holds this value already
    if gen and gen == _lgen and at[count - 1] <= 0xffff:  # (`at` ascends)
        need = n + 6 + 3 * count
        p = _lreserve(n, need)
        p[0] = _LOG_PATCH_REF
        _put32(p + 1, ref)
        p[5] = <unsigned char>count
        p += 6
        for j in range(count):
            i = at[j]
            p[0] = (i >> 8) & 0xff
            p[1] = i & 0xff
            p[2] = b[i]
            p += 3
        journal[key] = value
        return need
    if nk > 0xffff:
        raise ValueError("a record key longer than a log entry holds")
    need = n + 3 + nk + 2 + 5 * count
    p = _lreserve(n, need)
    p[0] = _LOG_PATCH
    p[1] = (nk >> 8) & 0xff
    p[2] = nk & 0xff
    memcpy(p + 3, PyBytes_AS_STRING(key), nk)
    p += 3 + nk
    p[0] = (count >> 8) & 0xff
    p[1] = count & 0xff
    p += 2
    for j in range(count):
        i = at[j]
        _put32(p, <uint32_t>i)
        p[4] = b[i]
        p += 5
    journal[key] = value  # (in `journal`: neither in `gone` nor to be added to `born`)
    return need


cdef Py_ssize_t _log_origin(Py_ssize_t n, OriginRecord rec, dict journal, set gone,
                            set born, bint new) except -1:
    """An origin record's state (`_log_state`), its keys made already (`_log_keys`).

    When the value the log holds for it is the one it last logged (`_lval`: put whole under
    a number of the current generation, or patched since, and still what `journal` holds)
    and it was encoded from the layout, publisher and tag the record has now, the record's
    encoding now differs from it only in the settled byte and the subscribers' state bytes:
    those alone are compared, and a change is logged as the same patch (the same bytes)
    `_log_state` would make from the whole encoding, with no encoding made and compared.
    Anything else (a first put, numbers off, a new generation, more than a patch holds)
    goes the whole way."""
    cdef _Layout layout = rec._layout
    cdef bytes old = rec._lval
    cdef bytes value
    cdef PyObject *held
    cdef Py_ssize_t nv, base, i, j, count = 0, need
    cdef Py_ssize_t at[_PATCH_MAX]  # where the bytes differ, ascending
    cdef unsigned char to[_PATCH_MAX]  # and what they become
    cdef const unsigned char *a
    cdef unsigned char *p
    cdef unsigned char *q
    cdef unsigned char v
    cdef bint copied
    cdef uint32_t before
    if (old is not None and not new and _lgen and rec._lo_gen == _lgen
            and rec._llayout is layout and rec._lpub is rec.publisher
            and rec._ltag is rec.tag):
        held = PyDict_GetItem(journal, rec._lokey)
        if held == <PyObject *>old:
            nv = PyBytes_GET_SIZE(old)
            base = nv - PyBytes_GET_SIZE(layout.template)
            a = <const unsigned char *>PyBytes_AS_STRING(old)
            v = 1 if rec.settled else 0
            if a[1] != v:  # (offset 1: the settled byte, before every state byte)
                at[0] = 1
                to[0] = v
                count = 1
            for i in range(len(layout.subs)):  # (`_at` ascends)
                v = rec._st[layout._pos[i]]
                j = base + layout._at[i]
                if v > S_SEEN or (a[j] != v and count == _PATCH_MAX):
                    count = -1  # bad (the encoding raises), or a put: the whole way
                    break
                if a[j] != v:
                    at[count] = j
                    to[count] = v
                    count += 1
            if count == 0:
                return n  # the log holds this value already
            if count > 0 and at[count - 1] <= 0xffff:
                need = n + 6 + 3 * count
                p = _lreserve(n, need)  # (first: should it raise, nothing has changed)
                # `journal`, `_lval` and `old` here hold the value and no one else: it is
                # changed where it is (no copy of the record, no store into `journal`, which
                # holds it already). Else (a checkpoint or a reader holding it) a changed copy
                if eo_bytes_unshared(old, 3):
                    value = old
                    eo_bytes_forget_hash(value)
                    copied = False
                else:
                    value = PyBytes_FromStringAndSize(<const char *>a, nv)
                    copied = True
                q = <unsigned char *>PyBytes_AS_STRING(value)
                for i in range(count):
                    q[at[i]] = to[i]
                p[0] = _LOG_PATCH_REF
                _put32(p + 1, rec._lo_ref)
                p[5] = <unsigned char>count
                p += 6
                for i in range(count):
                    p[0] = (at[i] >> 8) & 0xff
                    p[1] = at[i] & 0xff
                    p[2] = to[i]
                    p += 3
                if copied:
                    journal[rec._lokey] = value
                    rec._lval = value
                return need
    value = rec._c_encode_state()
    before = _lputs
    need = _log_state(n, rec._lokey, value, journal, gone, born, new, rec._lo_gen,
                      rec._lo_ref, &rec._lo_new)
    if _lputs != before:  # put whole: its number
        rec._lo_ref = before
        rec._lo_gen = _lgen
    if need != n:  # put or patched: `journal` holds this value now, encoded from these
        rec._lval = value
        rec._llayout = layout
        rec._lpub = rec.publisher
        rec._ltag = rec.tag
    return need


cdef bytes _log_key(bytes prefix, char kind, bytes tag):
    """prefix + kind + b"/" + tag, in one allocation (not two concatenations)."""
    cdef Py_ssize_t np = PyBytes_GET_SIZE(prefix), nt = PyBytes_GET_SIZE(tag)
    cdef bytes out = PyBytes_FromStringAndSize(NULL, np + 2 + nt)
    cdef char* p = PyBytes_AS_STRING(out)
    memcpy(p, PyBytes_AS_STRING(prefix), np)
    p[np] = kind
    p[np + 1] = 0x2f
    memcpy(p + np + 2, PyBytes_AS_STRING(tag), nt)
    return out


cdef inline int _log_keys(OriginRecord rec, bytes prefix) except -1:
    """`rec`'s record-log keys under `prefix`, made unless it holds them already."""
    if rec._lprefix is not prefix:
        rec._lokey = _log_key(prefix, 0x6f, rec.out_tag)  # b"o/"
        rec._lmkey = _log_key(prefix, 0x6d, rec.out_tag)  # b"m/"
        rec._lprefix = prefix
        rec._lo_gen = rec._lm_gen = 0  # (numbers of other keys)
        rec._lo_new = rec._lm_new = 0
    return 0


def log_records(list cores, dict loose, dict journal, set gone, set born,
                LogRefs refs=None):
    """The router's group commit into its record log: what `collect_writes` would give, as
    one blob of log entries (the engine appends it, `log_entries`), and applied to the net
    changes since the last checkpoint: `journal` (key -> value to put), `gone` (keys to
    delete), `born` (keys made since the checkpoint: the records cannot hold them, so their
    delete only drops them). An origin record saved with its body for the first time is
    made (unless the store may hold it: `_known`). Then `committed`. None if nothing.
    `refs`: the router's numbers for its log (see LogRefs; None: every entry names its
    key); the blob must then be appended to that log, or dropped by a checkpoint. With
    `refs`, an origin record's keys made new say so in the record (`_lo_new`, `_lm_new`),
    not in `born`: only `refs` sees when a checkpoint begins a new interval."""
    global _lputs, _lgen, _lgen_last, _lint, _lint_last, _lgbits
    cdef EoCore core
    cdef OriginRecord rec
    cdef bytes prefix, mkp, key
    cdef Py_ssize_t n = 0
    cdef dict bodies, dirty
    cdef set known
    cdef uint32_t before
    cdef uint64_t bit
    _lgen = 0
    _lint = 0
    _lgbits = NULL
    if refs is not None:
        if refs.gone_bits == NULL:
            refs.gone_bits = <uint64_t*>PyMem_Malloc(_GONE_BITS // 8)
            if refs.gone_bits == NULL:
                raise MemoryError()
            refs.interval = 0  # (a new filter: begins with the next interval)
        if refs.journal is not journal:
            if refs.journal is None and not refs.fresh:
                # the router's log seen for the first time: it may hold puts counted by no
                # one, so numbers are off until a checkpoint empties it
                refs.gen = 0
            else:  # a checkpoint emptied the log (or `begin`): numbers from 0
                _lgen_last += 1
                refs.gen = _lgen_last
            refs.fresh = False
            refs.journal = journal
            refs.nput = 0
            refs.interval = 0
        if refs.interval == 0:  # (a checkpoint interval first seen: `gone` as it is now)
            memset(refs.gone_bits, 0, _GONE_BITS // 8)
            _lgbits = refs.gone_bits
            for key in gone:
                _gone_bit(key, &bit)[0] |= bit
            _lint_last += 1
            refs.interval = _lint_last
        _lgen = refs.gen
        _lputs = refs.nput
        _lint = refs.interval
        _lgbits = refs.gone_bits
        # numbers off until the next checkpoint should this fail half-way (the entries
        # made are lost, not the numbers they took)
        refs.gen = 0
    if loose:
        puts, deletes = split_writes(loose)
        for key in deletes:
            n = _log_del(n, key, journal, gone, born)
        for key, value in puts.items():
            n = _log_put(n, key, value, journal, gone, born, False)
    for c in cores:
        core = <EoCore>c
        prefix = core._prefix
        for key in core._dels:
            n = _log_del(n, prefix + key, journal, gone, born)
        for key, value in core._puts.items():
            n = _log_put(n, prefix + key, value, journal, gone, born, False)
        # (an origin record's keys are the ones `_log_keys` made for it: see OriginRecord)
        for r in core._gone.values():
            rec = <OriginRecord>r
            _log_keys(rec, prefix)
            n = _log_del(n, rec._lokey, journal, gone, born, rec._lo_gen, rec._lo_ref,
                         rec._lo_new)
            n = _log_del(n, rec._lmkey, journal, gone, born, rec._lm_gen, rec._lm_ref,
                         rec._lm_new)
            rec._lokey = rec._lmkey = rec._lprefix = None  # (gone: not logged again)
            rec._lo_gen = rec._lm_gen = 0
            rec._lo_new = rec._lm_new = 0
            rec._lval = None
        bodies = core._bodies
        known = core._known
        dirty = core._dirty
        for tag, r in dirty.items():
            rec = <OriginRecord>r
            _log_keys(rec, prefix)
            n = _log_origin(n, rec, journal, gone, born,
                            tag in bodies and not (known and tag in known))
        mkp = None
        for tag, body in bodies.items():
            r = dirty.get(tag)  # (a body's record is in `_dirty`, which made its keys)
            if r is not None and (<OriginRecord>r)._lprefix is prefix:
                rec = <OriginRecord>r
                before = _lputs
                n = _log_put(n, rec._lmkey, body, journal, gone, born,
                             not (known and tag in known), &rec._lm_new)
                if _lputs != before:
                    rec._lm_ref = before
                    rec._lm_gen = _lgen
                continue
            if mkp is None:
                mkp = prefix + b"m/"
            n = _log_put(n, mkp + tag, body, journal, gone, born, not (known and tag in known))
        if core._marked:  # (once a checkpoint interval: the same put again logs nothing)
            n = _log_state(n, core._mark, b"", journal, gone, born, False)
    if refs is not None and _lgen:
        refs.gen = _lgen
        refs.nput = _lputs
    _lgen = 0
    _lint = 0
    _lgbits = NULL
    committed(cores)
    if not n:
        return None
    return PyBytes_FromStringAndSize(_lbuf, n)


def commit_memory(list cores, dict loose, dict memory, dict topic_memory):
    """`collect_writes` applied to the records kept in memory (no store), then `committed`:
    each topic's records in its `TopicMemory` of `topic_memory` (its prefix -> key -> bytes;
    the origin records and bodies by out_tag, the records encoded only when a scan reads
    them), so no key is made and nothing is encoded per record; the marks (and what `loose`
    holds for no topic) in `memory`."""
    cdef EoCore core
    cdef TopicMemory mem
    cdef dict origins, bodies
    cdef OriginRecord rec
    cdef unsigned long long uid
    cdef PyObject *was
    if loose:
        puts, deletes = split_writes(loose)
        for key in deletes:
            m, sub = _memory_of(key, memory, topic_memory)
            _memory_pop(<dict>m, sub)
        for key, value in puts.items():
            m, sub = _memory_of(key, memory, topic_memory)
            _memory_put(<dict>m, sub, value)
    for c in cores:
        core = <EoCore>c
        if type(core._mem) is TopicMemory:
            mem = <TopicMemory>core._mem
        else:  # (bound before the router had no store, or a plain dict: not in this router)
            mem = _topic_memory(topic_memory, core._prefix)
            core._mem = mem
        origins = mem.origins
        bodies = mem.bodies
        uid = mem.uid
        if core._gone:
            for tag in core._gone:
                _mem_left(origins.pop(tag, None))
                bodies.pop(tag, None)
        if core._dels:
            for key in core._dels:  # (k/, c/; m/ when `_m_dels`)
                _memory_pop(mem, key)
        if core._puts:
            for key, value in core._puts.items():  # (k/, c/: never o/ or m/)
                _memory_put(mem, key, value)
        # (disjoint from _gone: a save takes it out). A record is kept as itself, so one
        # that `origins` holds already (saved at an earlier commit) is not stored again
        for tag, r in core._dirty.items():
            rec = <OriginRecord>r
            if rec._mem_uid != uid:
                was = PyDict_SetDefault(origins, tag, rec)
                if was != <PyObject *>rec:
                    _mem_left(<object>was)
                    origins[tag] = rec
                rec._mem_uid = uid
        if core._bodies:
            bodies.update(core._bodies)
        if core._marked:
            memory[core._mark] = b""
    committed(cores)


cdef tuple _memory_of(bytes key, dict memory, dict topic_memory):
    """(the dict a full key is kept in, its key there): its topic's, the longest prefix."""
    cdef bytes best = None
    for prefix in topic_memory:
        if key.startswith(prefix) and (best is None or len(<bytes>prefix) > len(best)):
            best = prefix
    if best is None:
        return memory, key
    return topic_memory[best], key[len(best):]


def scan_memory(bytes prefix, dict memory, dict topic_memory):
    """What `commit_memory` keeps under `prefix`, as (full key, value) in key order: an
    origin record encoded here (`encode_state`), the records read and no other."""
    cdef bytes p, sub
    out = [(k, v) for k, v in memory.items() if k.startswith(prefix)]
    for p, mem in topic_memory.items():
        if p.startswith(prefix):
            sub = b""
        elif prefix.startswith(p):
            sub = prefix[len(p):]
        else:
            continue
        out.extend([(p + k, v) for k, v in (<dict>mem).items() if k.startswith(sub)])
        if type(mem) is TopicMemory:
            for tag, rec in (<TopicMemory>mem).origins.items():
                key = b"o/" + tag
                if key.startswith(sub):
                    out.append((p + key, rec if type(rec) is bytes else rec.encode_state()))
            for tag, body in (<TopicMemory>mem).bodies.items():
                key = b"m/" + tag
                if key.startswith(sub):
                    out.append((p + key, body))
    out.sort()
    return out


cdef extern from "Python.h":
    object _PyDict_NewPresized(Py_ssize_t minused)

cdef enum:
    # a staging dict that held more than STAGING_SMALL entries at a commit is replaced by
    # one sized for as many (at most STAGING_KEEP: a burst's table goes at the next commit)
    # rather than cleared: clear() frees its table (keys here are bytes: CPython keeps no
    # free list of such tables), and refilling it grew a new one 8 -> 16 -> 32 ... each loop
    # iteration, a malloc, a rehash and a free per step. Up to STAGING_SMALL, clear() is the
    # cheaper (the first insert makes the minimal table)
    STAGING_SMALL = 5
    STAGING_KEEP = 4096


cdef inline dict _staging_emptied(dict d):
    """`d` emptied, or an empty dict sized for as many entries (see STAGING_SMALL)."""
    cdef Py_ssize_t n = len(d)
    if n <= STAGING_SMALL:
        d.clear()
        return d
    return <dict>_PyDict_NewPresized(n if n < STAGING_KEEP else STAGING_KEEP)


def committed(list cores):
    """The cores' staged records are in the store: empty their staging, and `cores`."""
    cdef EoCore core
    for c in cores:
        core = <EoCore>c
        if core._puts:
            core._puts = _staging_emptied(core._puts)
        core._dels.clear()
        if core._dirty:
            core._dirty = _staging_emptied(core._dirty)
        core._c_new_sgen()
        if core._bodies:
            core._bodies = _staging_emptied(core._bodies)
        if core._gone:
            core._gone = _staging_emptied(core._gone)
        if core._known:
            core._known.clear()
        core._m_dels = False
        core._marked = False
        core._committing = False
    del cores[:]


# -- the per-message inputs, for the engine (eo_links.pxi) ------------------------------------
# The client links' transfers, outcomes and settlements reach a topic's core (a TopicRouter, an
# EoCore) through these C calls rather than its Python methods of the same names: no attribute
# lookup through the Python subclass, no argument tuple, no float boxed per input. Each is the
# method of the same name (which the simulation and the tests call), nothing more.

cdef int eo_publisher_transfer(core, pub, tag, body, double now) except -1:
    (<EoCore?>core).c_publisher_transfer(pub, tag, body, now)
    return 0


cdef inline bint _same_router(a, b) except -1:
    """a == b of router ids: str as a rule, compared as such (no rich comparison's bool)."""
    if a is b:
        return True
    if type(a) is str and type(b) is str:
        return <str>a == <str>b
    return a == b


cdef int eo_publisher_settled(core, pub, tag, out_tag, origin, double now) except -1:
    (<EoCore?>core).c_publisher_settled(pub, tag, out_tag, origin, now)
    return 0


cdef int eo_subscriber_accepted(core, att, out_tag, double now) except -1:
    (<EoCore?>core).c_subscriber_accepted(att, out_tag, now)
    return 0


cdef int eo_subscriber_settled(core, att, out_tag, double now) except -1:
    (<EoCore?>core).c_subscriber_settled(att, out_tag, now)
    return 0


cdef bint eo_core_eo(core) except -1:
    return (<EoCore?>core).eo


# -- the router's receive loop and outbox (qrouter/guarantee.py) -----------------------------

def receive_envelopes(g, list envelopes, double now):
    """`Guarantees.receive_batch`, compiled for its common case: an envelope to this router,
    in its channel's epoch and with the sequence number expected, has its messages handed to
    `receive_messages` without a Python frame; any other (to relay, of another epoch, out of
    sequence, malformed, a router before "ms") goes to `g.receive(envelope)`, which applies
    the channel's rules (qrouter/guarantee.py) before anything here has touched it."""
    cdef dict channels = g.channels
    cdef dict d
    me = g.router_id
    for envelope in envelopes:
        if type(envelope) is dict:
            d = <dict>envelope
            src = d.get("from")
            e = d.get("e")
            n = d.get("n")
            messages = d.get("ms")
            if (type(src) is str and type(e) is int and type(n) is int
                    and type(messages) is list and d.get("to") == me):
                ch = channels.get(src)
                if ch is not None and ch.link_id is not None and ch.epoch == e and (
                    ch.in_n == n
                ):
                    ch.in_n = n + 1
                    receive_messages(g, src, <list>messages, now)
                    continue
        g.receive(envelope)


def receive_messages(g, src, list messages, double now):
    """`Guarantees.receive`'s loop over one envelope's messages, compiled: a record (the
    per-message ops) for a topic the router has goes straight to that topic's core, with no
    Python frame; anything else (the control maps, a topic to make, a malformed message)
    goes to `g.receive_one(src, message, now)`."""
    cdef dict topics = g.topics
    cdef EoCore core = None
    name = None  # the topic of `core` (the messages of an envelope are mostly one topic's)
    for m in messages:
        if type(m) is tuple and len(<tuple>m) >= 2 and type((<tuple>m)[1]) is str:
            if (<tuple>m)[1] is not name:  # (the decoder's names are the same objects)
                t = topics.get((<tuple>m)[1])
                if t is None:
                    name = None
                    g.receive_one(src, m, now)
                    continue
                core = <EoCore?>t
                name = (<tuple>m)[1]
            core._now = now
            core._c_receive(src, m)
            core._c_flush()
            continue
        name = None  # (Python may make or drop topics)
        g.receive_one(src, m, now)


cdef class RouterOutbox:
    """`Guarantees._out_to_router`, compiled for its common case: a message to a router
    whose envelope of this loop iteration is already open goes into it (its channel, epoch and
    next hop unchanged); the first one of an iteration, or to a router that is down, goes to
    `g._out_to_router`, which opens the envelope (or drops the message). The engine applies
    the to_router outputs through `c_send` (eo_links.pxi). The envelope found for a router is
    remembered until `forget`, which the router calls when it sends the iteration's
    envelopes and when a channel's route or epoch changes (a new envelope is due then)."""

    def __init__(self, g):
        self.g = g
        self.open = {}
        self.direct = set()

    def __call__(self, router_id, message):
        self.c_send(router_id, message)

    def forget(self):
        """The envelopes remembered are sent, or a channel changed (qrouter/guarantee.py)."""
        self.open.clear()
        self._last = self._last_group = None

    cdef object c_open(self, router_id):
        """self.open.get(router_id), the last answer again without a look-up for an equal
        id: the records of an iteration go to a router or two (a router id decoded from a
        peer's envelope is a str made afresh: equal, so compared as a str). An entry of `open`
        is only added, or all of them cleared with `_last`: the one remembered stays right."""
        last = self._last
        if last is not None and (
            router_id is last
            or (type(router_id) is str and type(last) is str and <str>router_id == <str>last)
        ):
            return self._last_group
        group = self.open.get(router_id)
        if group is not None:
            self._last = router_id
            self._last_group = group
        return group

    cdef int c_send(self, router_id, message) except -1:
        group = self.c_open(router_id)
        if group is not None:
            (<list>group).append(message)
            return 0
        g = self.g
        ch = (<dict?>g.channels).get(router_id)
        if ch is None or ch.link_id is None:
            g._out_to_router(router_id, message)  # (down: dropped)
            return 0
        key = (router_id, ch.epoch, ch.link_id)
        groups = <dict?>g.groups
        group = groups.get(key)
        if group is not None:
            (<list?>group).append(message)
        else:
            g._out_to_router(router_id, message)
            group = groups.get(key)
        if group is not None:
            self.open[router_id] = group
        return 0
