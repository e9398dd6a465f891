# A session's unsettled deliveries of one direction, keyed by delivery-id (2.6.12). Ids are
# sequential per session (2.7.5: the sender numbers its deliveries), so the live ones fit a
# ring indexed by delivery-id modulo its size: a lookup, insert or removal is an array access
# and an id compare, with no int object made, hashed or compared (the dicts this replaces
# cost about a tenth of a router's CPU at full speed, docs/performance.md, "Fifth round").
# The ring is made on the first insert (an idle session has none), UNSETTLED_MIN slots, and
# doubles when an id finds its slot taken while at least half the slots are live (more
# unsettled than it spans: the peer's credit and the unsettled limits bound how many), up to
# UNSETTLED_MAX slots (12 bytes each). An id whose slot holds another live id (a full ring,
# or a peer's ids out of sequence, repeated or huge, which never grow it while sparse) goes
# to a dict beside it: the same answers, at a dict's cost. (Included by engine.pyx.)

from cpython.mem cimport PyMem_Free, PyMem_Malloc
from cpython.list cimport PyList_GET_ITEM, PyList_SET_ITEM
from cpython.ref cimport Py_DECREF, Py_INCREF, PyObject

cdef enum:
    UNSETTLED_MIN = 16                        # slots (powers of two)
    UNSETTLED_MAX = 4096


@cython.final
cdef class Unsettled:
    cdef list ring                            # slot -> Delivery or None (None until first use)
    cdef uint32_t mask                        # slots - 1
    cdef uint32_t* keys                       # slot -> the delivery-id its Delivery is under
    cdef dict extra                           # delivery-id -> Delivery that did not fit the ring
    cdef Py_ssize_t n                         # how many, ring and extra
    cdef uint32_t last                        # the delivery-id last put (for values' order)

    def __dealloc__(self):
        PyMem_Free(self.keys)

    cdef inline Delivery get(self, uint32_t did):
        cdef PyObject* o
        cdef uint32_t i = did & self.mask
        if self.ring is not None:
            o = PyList_GET_ITEM(self.ring, i)
            if <object>o is not None and self.keys[i] == did:
                return <Delivery>o
        if self.extra:
            return self.extra.get(did)
        return None

    cdef int put(self, uint32_t did, Delivery d) except -1:
        """Hold `d` under `did`, replacing what was under it (as a dict's item assignment)."""
        cdef PyObject* o
        cdef uint32_t i = did & self.mask
        self.last = did
        if self.ring is None:
            self.make(UNSETTLED_MIN)
            i = did & self.mask
        o = PyList_GET_ITEM(self.ring, i)
        if <object>o is not None:
            if self.keys[i] == did:
                self.set_slot(i, d)           # replaced: the count stays
                return 0
            if self.n * 2 >= <Py_ssize_t>self.mask + 1 and self.mask + 1 < UNSETTLED_MAX:
                self.grow()
                return self.put(did, d)
        elif not self.extra or did not in self.extra:
            self.keys[i] = did
            self.set_slot(i, d)
            self.n += 1
            return 0
        if self.extra is None:
            self.extra = {}
        if did not in self.extra:
            self.n += 1
        self.extra[did] = d
        return 0

    cdef int make(self, uint32_t slots) except -1:
        cdef uint32_t* keys = <uint32_t*>PyMem_Malloc(slots * sizeof(uint32_t))
        if keys == NULL:
            raise MemoryError()
        PyMem_Free(self.keys)
        self.keys = keys
        self.ring = [None] * slots
        self.mask = slots - 1
        return 0

    cdef int grow(self) except -1:
        """Twice the slots; everything held is put again (some of `extra` now fits)."""
        cdef list held = []
        cdef uint32_t i
        cdef PyObject* o
        for i in range(self.mask + 1):
            o = PyList_GET_ITEM(self.ring, i)
            if <object>o is not None:
                held.append((self.keys[i], <object>o))
        if self.extra:
            held.extend(self.extra.items())
        last = self.last
        self.make((self.mask + 1) * 2)
        self.extra = None
        self.n = 0
        for did, d in held:
            self.put(did, d)
        self.last = last
        return 0

    cdef inline void set_slot(self, uint32_t i, object d) noexcept:
        cdef PyObject* o = PyList_GET_ITEM(self.ring, i)
        Py_INCREF(d)
        PyList_SET_ITEM(self.ring, i, d)
        Py_DECREF(<object>o)

    cdef Delivery pop(self, uint32_t did):
        """Remove and return what is under `did` (None if nothing)."""
        cdef PyObject* o
        cdef Delivery d
        cdef uint32_t i = did & self.mask
        if self.ring is not None:
            o = PyList_GET_ITEM(self.ring, i)
            if <object>o is not None and self.keys[i] == did:
                d = <Delivery>o
                self.set_slot(i, None)
                self.n -= 1
                return d
        if self.extra:
            d = self.extra.pop(did, None)
            if d is not None:
                self.n -= 1
            return d
        return None

    cdef list values(self):
        """All of them, oldest delivery-id first (as a dict's insertion order had them)."""
        cdef list out = []
        if self.n == 0:
            return out
        if self.ring is not None:
            for x in self.ring:
                if x is not None:
                    out.append(x)
        if self.extra:
            out.extend(self.extra.values())
        if len(out) > 1:
            # serial-number order (2.7.5's delivery-numbers wrap, RFC 1982): by the distance
            # back from the id last put, farthest first
            order = sorted([(<uint32_t>((<Delivery>x).delivery_id - self.last - 1), i)
                            for i, x in enumerate(out)])
            out = [out[i] for _, i in order]
        return out

    def __len__(self):
        return self.n
