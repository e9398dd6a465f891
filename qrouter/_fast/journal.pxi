# The delivery journal (docs/journal.md): one row per delivery event, stored by the data path
# straight into column buffers and handed to qrouter/journal.py's writer in batches. Off unless
# the router runs with --journal: then Router.jbuf is a JournalBuffer, else None, and every
# hook is one pointer test. (Included by engine.pyx.)
#
# Nothing is allocated per event. A row is a few stores into arrays laid out as Arrow lays out
# its columns (the writer wraps them without copying) plus the delivery tags appended to two
# byte arenas. The strings of a row - link name, address, the publisher's "<container>/<link>/"
# - belong to a link: its JournalLink, made at the link's first event, holds them, they enter
# the batch's dictionaries at the link's first row in the batch, and a row stores their codes.
# Every batch starts new dictionaries (a new generation), so they hold only what the batch's
# rows name and nothing grows with the number of links the router has seen.
#
# Why these choices, and what a row costs: docs/journal.md "Cost".

from cpython.bytearray cimport (
    PyByteArray_AS_STRING, PyByteArray_FromStringAndSize, PyByteArray_GET_SIZE,
    PyByteArray_Resize,
)
from libc.stdint cimport int8_t
from posix.time cimport CLOCK_REALTIME


cdef extern from "Python.h":
    ctypedef struct PyByteArrayObject:
        Py_ssize_t ob_exports              # buffer views alive (an Arrow array holding it)

cdef enum:
    JOURNAL_BATCH_ROWS = 65536       # a batch is handed over once it holds this many rows
    # room for rows: the handover comes at the end of a loop iteration, so it leaves space for
    # the rows of one (a few thousand); more make it grow (copy) the buffers
    JOURNAL_ROOM = JOURNAL_BATCH_ROWS + JOURNAL_BATCH_ROWS // 4
    JOURNAL_TAG_BYTES = 16           # arena bytes reserved per row at first (tags are short)

# ... or once it is this old (Router.flush looks once per loop iteration)
cdef double JOURNAL_BATCH_SECONDS = 0.5


cdef inline int64_t wall_ns() noexcept:
    cdef timespec ts
    clock_gettime(CLOCK_REALTIME, &ts)
    return <int64_t>ts.tv_sec * 1000000000 + ts.tv_nsec


# --- sampling: the crc32 of the origin string, as zlib computes it (router.journal.sampled) --

cdef uint32_t CRC32_TABLE[256]
cdef const char* HEX_DIGITS = b"0123456789abcdef"


cdef void crc32_init() noexcept:
    cdef uint32_t c
    cdef int i, k
    for i in range(256):
        c = i
        for k in range(8):
            c = (c >> 1) ^ 0xEDB88320 if c & 1 else c >> 1
        CRC32_TABLE[i] = c


crc32_init()


cdef inline uint32_t crc32_update(uint32_t crc, const uint8_t* p, Py_ssize_t n) noexcept:
    # zlib.crc32(p[:n], crc): so crc32(b, crc32(a)) == crc32(a + b)
    cdef Py_ssize_t i
    crc = ~crc
    for i in range(n):
        crc = CRC32_TABLE[(crc ^ p[i]) & 0xff] ^ (crc >> 8)
    return ~crc


cdef uint32_t crc32_hex(uint32_t crc, bytes tag) noexcept:
    # continue `crc` over the lower-case hex of `tag` (the end of an origin string)
    cdef uint8_t buf[2 * MAX_TAG]
    cdef const uint8_t* p = <const uint8_t*>PyBytes_AS_STRING(tag)
    cdef Py_ssize_t i, n = PyBytes_GET_SIZE(tag)
    if n > MAX_TAG:
        n = MAX_TAG
    for i in range(n):
        buf[2 * i] = HEX_DIGITS[p[i] >> 4]
        buf[2 * i + 1] = HEX_DIGITS[p[i] & 15]
    return crc32_update(crc, buf, 2 * n)


def origin_crc32(str origin_prefix not None, bytes tag not None):
    """zlib.crc32 of origin_prefix + tag.hex() as the engine computes it (for the tests)."""
    cdef bytes p = origin_prefix.encode()
    return crc32_hex(crc32_update(0, <const uint8_t*>PyBytes_AS_STRING(p), len(p)), tag)


# --- the per-link strings -------------------------------------------------------------------

@cython.final
cdef class JournalLink:
    """A link's strings in the journal, made at its first journalled event. A delivery that
    arrived on the link keeps it as its origin, so it outlives the link while needed."""
    cdef readonly int64_t connection
    cdef readonly str name
    cdef readonly str address
    cdef readonly str origin_prefix   # "<container>/<link>/" of a publisher's link, else ""
    cdef uint32_t prefix_crc          # crc32 of origin_prefix: sampling goes on with the tag
    cdef JournalBuffer buf            # its router's (one load in jr instead of four)
    # the codes of its strings in the dictionaries of batch `gen` (JournalBuffer.codes)
    cdef uint64_t gen
    cdef int32_t c_name, c_address, c_prefix


cdef JournalLink journal_link(Link link):
    cdef JournalLink jl = link.jlink
    cdef bytes prefix
    if jl is None:
        jl = JournalLink.__new__(JournalLink)
        jl.connection = link.conn.conn_id
        jl.name = link.name
        jl.address = link.address.name if link.address is not None else (
            link.journal_address if link.journal_address is not None else "")
        jl.origin_prefix = link.origin_prefix if link.origin_prefix is not None else ""
        prefix = jl.origin_prefix.encode()
        jl.prefix_crc = crc32_update(0, <const uint8_t*>PyBytes_AS_STRING(prefix), len(prefix))
        jl.buf = link.conn.router.jbuf
        link.jlink = jl
    return jl


cdef JournalLink journal_origin(JournalBuffer buf, str prefix):
    """The origin of a delivery Python sends on behalf of a publisher elsewhere (a guaranteed
    topic, qrouter/guarantee.py): its publisher's "<container>/<link>/" prefix, one per prefix."""
    cdef JournalLink jl = buf.origins.get(prefix)
    cdef bytes raw
    if jl is None:
        jl = JournalLink.__new__(JournalLink)
        jl.name = ""
        jl.address = ""
        jl.origin_prefix = prefix
        raw = prefix.encode()
        jl.prefix_crc = crc32_update(0, <const uint8_t*>PyBytes_AS_STRING(raw), len(raw))
        jl.buf = buf
        buf.origins[prefix] = jl
    return jl


cdef inline int32_t intern(dict codes, object value) except -1:
    cdef object code = codes.get(value)
    if code is None:
        code = len(codes)
        codes[value] = code
    return code


# --- the column buffers ---------------------------------------------------------------------

cdef bytearray new_column(dict spare, str name, Py_ssize_t nbytes):
    # the buffer of a batch the writer is done with (no Arrow array views it any more): its
    # pages are mapped already; else a new one
    cdef object old = spare.get(name) if spare is not None else None
    if (old is not None and PyByteArray_GET_SIZE(old) == nbytes and
            (<PyByteArrayObject*>old).ob_exports == 0):
        return <bytearray>old
    return PyByteArray_FromStringAndSize(NULL, nbytes)


cdef inline bint get_bit(const uint8_t* bits, Py_ssize_t i) noexcept:
    return (bits[i >> 3] >> (i & 7)) & 1


cdef inline void set_bit(uint8_t* bits, Py_ssize_t i, bint value) noexcept:
    # Arrow validity bitmaps: bit i of byte i // 8, least significant first
    if i & 7 == 0:
        bits[i >> 3] = 0
    if value:
        bits[i >> 3] |= 1 << (i & 7)


@cython.final
cdef class JournalBuffer:
    """The rows gathered since the last handover, column by column (see `take`). The string
    columns hold codes into this batch's dictionaries: `names`, `addresses` and `prefixes`
    map each value to its code, in code order."""
    cdef Py_ssize_t n, cap                     # rows, room for rows
    cdef Py_ssize_t tag_n, tag_cap, otag_n, otag_cap
    cdef bytearray c_time, c_connection, c_name, c_address, c_prefix, c_size
    cdef bytearray c_event, c_outcome, c_has_origin, c_has_outcome
    cdef bytearray c_tag_end, c_tag, c_otag_end, c_otag
    cdef int64_t* time
    cdef int64_t* connection
    cdef int32_t* name
    cdef int32_t* address
    cdef int32_t* prefix                       # the origin's prefix; valid where has_origin
    cdef int32_t* size
    cdef int8_t* event
    cdef int8_t* outcome                       # valid where has_outcome
    cdef uint8_t* has_origin
    cdef uint8_t* has_outcome
    cdef int32_t* tag_end                      # Arrow binary offsets: n + 1 of them
    cdef char* tag
    cdef int32_t* otag_end
    cdef char* otag
    cdef dict names, addresses, prefixes
    cdef dict origins                          # prefix -> JournalLink (journal_origin)
    cdef uint64_t gen
    cdef bint sampling
    cdef uint64_t threshold                    # crc32 bound of the kept origins
    cdef int64_t sampled_out                   # rows skipped since the last handover
    cdef double handed                         # monotonic time of the last handover
    # The rows one frame causes share one clock reading (-1: in a frame, not read yet; 0: not
    # in a frame), except `forwarded`, which reads its own: its time minus the `received`
    # time is the delivery's time in the router.
    cdef int64_t frame_ns
    # batches the writer has written, handed back so their buffers are filled again instead
    # of new ones (whose pages would all fault in again): a deque the writer appends to
    cdef object spare

    def __cinit__(self, uint64_t threshold, spare):
        self.origins = {}
        self.threshold = threshold
        self.sampling = threshold < (<uint64_t>1 << 32)
        self.handed = monotonic()
        self.spare = spare
        self.start()

    cdef int start(self) except -1:
        cdef dict old = None
        if self.spare:
            try:
                old = self.spare.pop()
            except IndexError:            # the writer's thread took it meanwhile: none
                pass
        self.n = self.tag_n = self.otag_n = 0
        self.cap = JOURNAL_ROOM
        self.tag_cap = self.otag_cap = JOURNAL_ROOM * JOURNAL_TAG_BYTES
        self.c_time = new_column(old, "time_ns", self.cap * 8)
        self.c_connection = new_column(old, "connection", self.cap * 8)
        self.c_name = new_column(old, "link", self.cap * 4)
        self.c_address = new_column(old, "address", self.cap * 4)
        self.c_prefix = new_column(old, "origin_prefix", self.cap * 4)
        self.c_size = new_column(old, "size", self.cap * 4)
        self.c_event = new_column(old, "event", self.cap)
        self.c_outcome = new_column(old, "outcome", self.cap)
        self.c_has_origin = new_column(old, "has_origin", self.cap // 8)
        self.c_has_outcome = new_column(old, "has_outcome", self.cap // 8)
        self.c_tag_end = new_column(old, "tag_end", (self.cap + 1) * 4)
        self.c_otag_end = new_column(old, "origin_tag_end", (self.cap + 1) * 4)
        self.c_tag = new_column(old, "tag", self.tag_cap)
        self.c_otag = new_column(old, "origin_tag", self.otag_cap)
        self.point()
        self.tag_end[0] = 0
        self.otag_end[0] = 0
        self.gen += 1
        self.names = {}
        self.addresses = {}
        self.prefixes = {}
        self.sampled_out = 0
        return 0

    cdef void point(self) noexcept:
        self.time = <int64_t*>PyByteArray_AS_STRING(self.c_time)
        self.connection = <int64_t*>PyByteArray_AS_STRING(self.c_connection)
        self.name = <int32_t*>PyByteArray_AS_STRING(self.c_name)
        self.address = <int32_t*>PyByteArray_AS_STRING(self.c_address)
        self.prefix = <int32_t*>PyByteArray_AS_STRING(self.c_prefix)
        self.size = <int32_t*>PyByteArray_AS_STRING(self.c_size)
        self.event = <int8_t*>PyByteArray_AS_STRING(self.c_event)
        self.outcome = <int8_t*>PyByteArray_AS_STRING(self.c_outcome)
        self.has_origin = <uint8_t*>PyByteArray_AS_STRING(self.c_has_origin)
        self.has_outcome = <uint8_t*>PyByteArray_AS_STRING(self.c_has_outcome)
        self.tag_end = <int32_t*>PyByteArray_AS_STRING(self.c_tag_end)
        self.otag_end = <int32_t*>PyByteArray_AS_STRING(self.c_otag_end)
        self.tag = PyByteArray_AS_STRING(self.c_tag)
        self.otag = PyByteArray_AS_STRING(self.c_otag)

    cdef int grow(self) except -1:
        # one loop iteration gathered more than a batch: make room rather than hand over in
        # the middle of a frame
        self.cap *= 2
        PyByteArray_Resize(self.c_time, self.cap * 8)
        PyByteArray_Resize(self.c_connection, self.cap * 8)
        PyByteArray_Resize(self.c_name, self.cap * 4)
        PyByteArray_Resize(self.c_address, self.cap * 4)
        PyByteArray_Resize(self.c_prefix, self.cap * 4)
        PyByteArray_Resize(self.c_size, self.cap * 4)
        PyByteArray_Resize(self.c_event, self.cap)
        PyByteArray_Resize(self.c_outcome, self.cap)
        PyByteArray_Resize(self.c_has_origin, self.cap // 8)
        PyByteArray_Resize(self.c_has_outcome, self.cap // 8)
        PyByteArray_Resize(self.c_tag_end, (self.cap + 1) * 4)
        PyByteArray_Resize(self.c_otag_end, (self.cap + 1) * 4)
        self.point()
        return 0

    cdef int grow_tags(self, Py_ssize_t need) except -1:
        while self.tag_n + need > self.tag_cap:
            self.tag_cap *= 2
        while self.otag_n + need > self.otag_cap:
            self.otag_cap *= 2
        PyByteArray_Resize(self.c_tag, self.tag_cap)
        PyByteArray_Resize(self.c_otag, self.otag_cap)
        self.point()
        return 0

    cdef int codes(self, JournalLink jl) except -1:
        # a link's strings enter this batch's dictionaries at its first row in the batch
        jl.gen = self.gen
        jl.c_name = intern(self.names, jl.name)
        jl.c_address = intern(self.addresses, jl.address)
        jl.c_prefix = intern(self.prefixes, jl.origin_prefix)
        return 0

    cdef inline bint keep(self, JournalLink jl, bytes tag) noexcept:
        return crc32_hex(jl.prefix_crc, tag) < self.threshold

    cdef dict take(self):
        """The batch so far, for JournalWriter.append_buffers; a new one starts."""
        batch = {"rows": self.n, "sampled_out": self.sampled_out,
                 "names": list(self.names),
                 "addresses": list(self.addresses), "prefixes": list(self.prefixes),
                 "time_ns": self.c_time, "connection": self.c_connection,
                 "link": self.c_name, "address": self.c_address,
                 "origin_prefix": self.c_prefix, "has_origin": self.c_has_origin,
                 "size": self.c_size, "event": self.c_event, "outcome": self.c_outcome,
                 "has_outcome": self.c_has_outcome, "tag_end": self.c_tag_end,
                 "tag": self.c_tag, "origin_tag_end": self.c_otag_end,
                 "origin_tag": self.c_otag}
        self.handed = monotonic()
        self.start()
        return batch


cdef inline void put_tag(char* dst, const char* src, Py_ssize_t n) noexcept:
    # the usual tag sizes as fixed-size copies (one move each), not a memcpy call
    if n == 8:
        memcpy(dst, src, 8)
    elif n == 4:
        memcpy(dst, src, 4)
    elif n == 16:
        memcpy(dst, src, 16)
    else:
        memcpy(dst, src, n)


cdef int jr(Link link, Delivery d, Delivery inb, int event, int outcome, Py_ssize_t size,
            int then) except -1:
    """One row: `event` on `link` for its delivery `d`; `inb` is the inbound delivery `d`
    copies (or `d` itself on the link it arrived on): the origin. None for a delivery the
    router made itself. `then` (unless -1): a second row, the event that follows at once
    (settled after a pre-settled received, released-back after a released or modified
    outcome), copied from the first rather than built again."""
    cdef JournalLink jl = link.jlink
    cdef JournalBuffer b
    cdef JournalLink origin = None
    cdef bytes otag = None
    cdef Py_ssize_t i, tn = 4, on = 0
    cdef int64_t t
    cdef uint32_t tag = d.jtag
    if jl is None:
        jl = journal_link(link)
    b = jl.buf
    if inb is not None:
        if inb.jskip:
            b.sampled_out += 1 if then < 0 else 2
            return 0
        origin = inb.jorigin
    i = b.n
    if i + 1 >= b.cap:
        b.grow()
    if d.tag is not None:
        tn = PyBytes_GET_SIZE(d.tag)
    if origin is not None:
        otag = inb.jotag if inb.jotag is not None else inb.tag
        on = PyBytes_GET_SIZE(otag)
        if origin.gen != b.gen:
            b.codes(origin)
    if b.tag_n + 2 * tn > b.tag_cap or b.otag_n + 2 * on > b.otag_cap:
        b.grow_tags(2 * (tn if tn > on else on))
    t = b.frame_ns
    if t <= 0 or event == J_FORWARDED or event == J_RESUMED:
        t = wall_ns()
        if b.frame_ns < 0:
            b.frame_ns = t
    b.time[i] = t
    if jl.gen != b.gen:
        b.codes(jl)
    b.connection[i] = jl.connection
    b.name[i] = jl.c_name
    b.address[i] = jl.c_address
    b.event[i] = <int8_t>event
    b.outcome[i] = <int8_t>outcome
    set_bit(b.has_outcome, i, outcome != J_NO_OUTCOME)
    b.size[i] = <int32_t>size
    if d.tag is not None:
        put_tag(b.tag + b.tag_n, PyBytes_AS_STRING(d.tag), tn)
    else:
        # the router's own tag (connection.pxi write_transfer): 4 bytes, big-endian
        b.tag[b.tag_n] = <char>(tag >> 24)
        b.tag[b.tag_n + 1] = <char>((tag >> 16) & 0xff)
        b.tag[b.tag_n + 2] = <char>((tag >> 8) & 0xff)
        b.tag[b.tag_n + 3] = <char>(tag & 0xff)
    b.tag_n += tn
    b.tag_end[i + 1] = <int32_t>b.tag_n
    set_bit(b.has_origin, i, origin is not None)
    if origin is not None:
        b.prefix[i] = origin.c_prefix
        put_tag(b.otag + b.otag_n, PyBytes_AS_STRING(otag), on)
        b.otag_n += on
    else:
        b.prefix[i] = 0
    b.otag_end[i + 1] = <int32_t>b.otag_n
    b.n = i + 1
    if then >= 0:
        copy_row(b, i, then)
    return 0


cdef inline void copy_row(JournalBuffer b, Py_ssize_t i, int event) noexcept:
    # row i + 1 = row i with another event and no outcome (room was made by jr)
    cdef Py_ssize_t j = i + 1
    cdef int32_t tn = b.tag_end[j] - b.tag_end[i], on = b.otag_end[j] - b.otag_end[i]
    b.time[j] = b.time[i]
    b.connection[j] = b.connection[i]
    b.name[j] = b.name[i]
    b.address[j] = b.address[i]
    b.event[j] = <int8_t>event
    b.outcome[j] = J_NO_OUTCOME
    set_bit(b.has_outcome, j, False)
    b.size[j] = b.size[i]
    put_tag(b.tag + b.tag_n, b.tag + b.tag_end[i], tn)   # right after the row it copies
    b.tag_n += tn
    b.tag_end[j + 1] = <int32_t>b.tag_n
    set_bit(b.has_origin, j, get_bit(b.has_origin, i))
    b.prefix[j] = b.prefix[i]
    put_tag(b.otag + b.otag_n, b.otag + b.otag_end[i], on)
    b.otag_n += on
    b.otag_end[j + 1] = <int32_t>b.otag_n
    b.n = j + 1


cdef int journal_received(Link link, Delivery d, const uint8_t* payload,
                          Py_ssize_t size) except -1:
    """A delivery arrived on `link`: it is its own origin (the link's publisher prefix and its
    tag) unless it comes from another router with the origin its first router gave it
    (`x-opt-qr-origin`, annotations.pxi); with sampling on this decides whether all of its
    rows are kept."""
    cdef JournalLink jl = link.jlink
    cdef JournalLink origin
    if jl is None:
        jl = journal_link(link)
    origin = jl
    if link.inter_router:
        found = message_origin(payload, size)
        if found is not None:
            origin = journal_origin(jl.buf, found[0])
            d.jotag = found[1]
    d.jorigin = origin
    if jl.buf.sampling:
        d.jskip = not jl.buf.keep(origin, d.jotag if d.jotag is not None else d.tag)
    # pre-settled: settled as it arrives
    jr(link, d, d, J_RECEIVED, J_NO_OUTCOME, size, J_SETTLED if d.presettled else -1)
    return 0


cdef inline int journal_outcome(int code) noexcept:
    if code == D_ACCEPTED:
        return J_ACCEPTED
    if code == D_REJECTED:
        return J_REJECTED
    if code == D_RELEASED:
        return J_RELEASED
    if code == D_MODIFIED:
        return J_MODIFIED
    return J_NO_OUTCOME


cdef inline bint journaling(Link link) noexcept:
    return link is not None and link.conn.router.jbuf is not None
