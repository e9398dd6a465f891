# One publisher link's memory for idempotent publishing (`AcceptedTags`, eo_links.pxi;
# qrouter/eo/dedup.py documents it). (Included by eo_links.pxi.)
#
# What it keeps is an ordered map tag -> time accepted, in the order accepted (a tag accepted
# again moves to the end), from which the oldest is dropped: the `OrderedDict` it was. Here it
# is a plain dict for the look-ups and a ring of (tag, time object) for the order, so that an
# accept costs plain dict operations and C, not an OrderedDict's linked nodes and a `popitem`
# method call. A tag accepted again leaves its earlier ring entry behind, superseded: an entry
# is the tag's current one exactly when the dict holds that very time object (each accept
# boxes a new float, which the ring keeps alive, so identity cannot be reused). Superseded
# entries are skipped when met at the front, and the ring is compacted when they are more
# than half of it: memory stays O(tags held).

from cpython.dict cimport PyDict_GetItem, PyDict_SetDefault
from cpython.float cimport PyFloat_AS_DOUBLE
from cpython.mem cimport PyMem_Free, PyMem_Malloc
from cpython.ref cimport Py_DECREF, Py_INCREF, PyObject


cdef struct _TagAt:
    PyObject *tag  # a bytes (owned)
    PyObject *at  # the float it was accepted at (owned): current iff `_LinkTags.at[tag] is at`


@cython.final
cdef class _LinkTags:
    """A publisher link's accepted tags: `at` (tag -> time), and their order in a ring."""
    cdef dict at
    cdef _TagAt *ring
    cdef Py_ssize_t head  # the oldest entry's index
    cdef Py_ssize_t n  # entries, superseded ones included
    cdef Py_ssize_t cap

    def __cinit__(self):
        self.at = {}

    def __dealloc__(self):
        cdef Py_ssize_t i
        cdef _TagAt *e
        for i in range(self.n):
            e = &self.ring[(self.head + i) % self.cap]
            Py_DECREF(<object>e.tag)
            Py_DECREF(<object>e.at)
        PyMem_Free(self.ring)

    cdef inline bint _current(self, _TagAt *e):
        return PyDict_GetItem(self.at, <object>e.tag) == e.at

    cdef int _relayout(self, Py_ssize_t cap) except -1:
        """A new ring of `cap` entries holding the current entries only, in order."""
        cdef _TagAt *ring = <_TagAt *>PyMem_Malloc(cap * sizeof(_TagAt))
        if ring == NULL:
            raise MemoryError()
        cdef Py_ssize_t i, j = 0
        cdef _TagAt *e
        for i in range(self.n):
            e = &self.ring[(self.head + i) % self.cap]
            if self._current(e):
                ring[j] = e[0]  # (the references move)
                j += 1
            else:
                Py_DECREF(<object>e.tag)
                Py_DECREF(<object>e.at)
        PyMem_Free(self.ring)
        self.ring = ring
        self.head = 0
        self.n = j
        self.cap = cap
        return 0

    cdef bint c_add(self, bytes tag, double now) except -1:
        """Accept `tag` at `now` (to the end, again if it was held); True if it is new."""
        cdef dict at = self.at
        cdef object when = now  # (a new float object: this entry's identity)
        # (a new tag, as a rule: put with the one look-up that finds it absent)
        cdef bint new = PyDict_SetDefault(at, tag, when) == <PyObject *>when
        if not new:
            at[tag] = when
        if self.n == self.cap:
            # grow, or compact when superseded entries are the larger part
            self._relayout(max(8, self.cap * 2 if 2 * len(at) > self.cap else self.cap))
        cdef _TagAt *e = &self.ring[(self.head + self.n) % self.cap]
        Py_INCREF(tag)
        Py_INCREF(when)
        e.tag = <PyObject *>tag
        e.at = <PyObject *>when
        self.n += 1
        return new

    cdef int c_drop_oldest(self, double now, double ttl, bint only_expired) except -1:
        """Forget the oldest tag (if `only_expired`: only if `now - its time > ttl`); 1 if one
        was forgotten, 0 if none (superseded entries met at the front are dropped too)."""
        cdef _TagAt *e
        cdef bint current
        while self.n:
            e = &self.ring[self.head]
            if only_expired:
                current = self._current(e)
                if current and now - PyFloat_AS_DOUBLE(<object>e.at) <= ttl:
                    return 0
                if current:
                    del self.at[<object>e.tag]
            else:
                # (one look-up, taking the tag out: a cap's drop, once per accept when full;
                # a superseded entry's tag, accepted again since, is put back as it was)
                was = self.at.pop(<object>e.tag, None)
                current = was is <object>e.at
                if not current and was is not None:
                    self.at[<object>e.tag] = was
            Py_DECREF(<object>e.tag)
            Py_DECREF(<object>e.at)
            self.head = (self.head + 1) % self.cap
            self.n -= 1
            if current:
                return 1
        return 0
