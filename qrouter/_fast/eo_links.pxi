# Guaranteed topics' client links in the engine (docs/exactly-once.md, "The client links in
# the engine"; issue 15 item 1: deliveries through the engine's link path). (Included by
# engine.pyx.)
#
# A publisher or subscriber link of a guaranteed topic carries one reference, `Link.eo`, to
# its entry here (`EoPub`, `EoSub`). The engine hands that entry the link's transfers,
# outcomes and settlements (connection.pxi) instead of calling the Python handler, and the
# entry feeds the topic's compiled state machine (`qrouter._fast.eo_core.EoCore`) directly.
# The outputs the state machine stages for after the loop iteration's commit (accept a
# publisher's delivery, deliver to a subscriber, settle a subscriber's delivery, a message to
# another router) are C structs in an `OutQueue` (eo_core.pxd), which `EoLinks.apply_outputs`
# runs in order as C calls into the link and delivery API (and the router outbox).
# `EoLinks` is the base of `qrouter.guarantee.Guarantees`, which keeps in Python what is not
# per message: attaching and detaching, the group commit, channels, recovery, ticks.

from collections import OrderedDict

from posix.time cimport CLOCK_MONOTONIC_COARSE, clock_getres

from qrouter._fast.eo_core cimport (
    EoOut,
    FlushDue,
    OUT_ACCEPT_PUBLISHER,
    OUT_DELIVER,
    OUT_PORT,
    OUT_RECORD,
    OUT_SETTLE_SUBSCRIBER,
    OUT_TO_ROUTER,
    OutQueue,
    RouterOutbox,
    eo_core_eo,
    eo_publisher_settled,
    eo_publisher_transfer,
    eo_subscriber_accepted,
    eo_subscriber_settled,
)

_eo_log = logging.getLogger("qrouter.guarantee")

# the items (72 bytes each) an empty output queue kept for reuse may hold room for
# (EoLinks._spare); a burst's larger array is freed once applied
cdef Py_ssize_t _SPARE_OUTPUTS = 2048

cdef extern from *:
    """
    /* A dict's version (PEP 509), as eo_core.pyx's eo_dict_version: an equal version means
       the same dict, unchanged; 0: unknown (Python 3.12 on), then the callers ask the dict. */
    static CYTHON_INLINE unsigned long long eol_dict_version(PyObject *d) {
    #if PY_VERSION_HEX < 0x030C0000 && !defined(PYPY_VERSION) && !defined(Py_LIMITED_API)
        return (unsigned long long)((PyDictObject *)d)->ma_version_tag;
    #else
        (void)d;
        return 0;
    #endif
    }
    """
    unsigned long long eol_dict_version(dict d)


cdef class EoEntry:
    """A guaranteed topic's link attached here (`Link.eo`)."""
    cdef readonly EoLinks owner
    cdef readonly str topic
    cdef readonly Link link
    cdef public dict deliveries  # tag -> engine Delivery
    # the topic's core (`owner.topics[topic]`) last found, and `topics`' version (PEP 509)
    # then: an equal version is the same dict unchanged, so the same answer without a look-up
    # per transfer, outcome or accept output (0: not known, looked up)
    cdef object _core
    cdef unsigned long long _core_version

    cdef object c_core(self):
        """owner.topics.get(topic): the last answer again while `topics` is unchanged."""
        cdef dict topics = self.owner.topics
        cdef unsigned long long version = eol_dict_version(topics)
        if version and version == self._core_version:
            return self._core
        t = topics.get(self.topic)
        if version:
            self._core = t
            self._core_version = version
        return t

    def bind(self):
        """Take the link's deliveries (from now on the engine calls us, not the handler)."""
        self.link.eo = self

    def unbind(self):
        if self.link.eo is self:
            self.link.eo = None

    # what the engine calls (connection.pxi); the def ones are the same for Python
    cdef int on_transfer(self, Delivery d) except -1:
        return 0

    cdef int on_outcome(self, Delivery d, int code, bint settled) except -1:
        return 0

    cdef int on_settled(self, Delivery d) except -1:
        return 0

    def transfer(self, Delivery d not None):
        self.on_transfer(d)

    def outcome(self, Delivery d not None, int code, bint settled):
        self.on_outcome(d, code, settled)

    def settled(self, Delivery d not None):
        self.on_settled(d)


cdef class EoPub(EoEntry):
    """A publisher link (its deliveries are inputs of the topic's state machine)."""
    cdef readonly tuple pub  # (container-id, link name)
    cdef readonly bint settle_first  # receiver-settle-mode first: we settle on accept
    cdef public set presettled  # sent settled: settle on acceptance
    cdef public set accepted  # accepted before it was resent
    cdef readonly tuple key  # (topic, pub): its key in Guarantees.pubs

    def __init__(self, EoLinks owner, tuple pub, str topic, Link link, bint settle_first):
        self.owner = owner
        self.pub = pub
        self.topic = topic
        self.link = link
        self.settle_first = settle_first
        self.deliveries = {}
        self.presettled = set()
        self.accepted = set()
        self.key = (topic, pub)

    cdef int on_transfer(self, Delivery d) except -1:
        cdef EoLinks g = self.owner
        t = self.c_core()
        if t is None:
            raise KeyError(self.topic)  # (as g.topics[self.topic] would)
        tag = d.tag
        payload = d.payload
        cdef double now = g.c_now()
        if d.presettled and d.resume and not payload:
            self.accepted.discard(tag)  # settled, not resent: nothing to accept (issue 15 c)
            # (it knows the outcome: 2.6.13)
            eo_publisher_settled(t, self.pub, tag, None, None, now)
        elif not d.presettled and g.accepted_tags.accepted(self.key, tag, now):
            # a resend of a delivery we accepted (its outcome was lost with a connection):
            # the outcome it got, and nothing published again (qrouter/eo/dedup.py)
            self.accepted.discard(tag)
            if not self.settle_first:
                self.deliveries[tag] = d
            d.c_update(D_ACCEPTED, None, self.settle_first)
        else:
            if d.presettled:
                self.presettled.add(tag)  # at most once from its side: settle when accepted
            else:
                self.deliveries[tag] = d
            eo_publisher_transfer(t, self.pub, tag, payload, now)
            if self.accepted and tag in self.accepted:  # (empty but after a resend)
                self.accepted.discard(tag)
                g.outputs.push(OUT_ACCEPT_PUBLISHER, self.topic, self.pub, tag, None, False)
                if not g.scheduled:
                    g.schedule()
        self.top_up()
        return 0

    cdef int on_settled(self, Delivery d) except -1:
        """The publisher settled (receiver-settle-mode second: after our ACCEPTED)."""
        cdef EoLinks g = self.owner
        tag = d.tag
        if self.deliveries.get(tag) is d:
            del self.deliveries[tag]
        t = self.c_core()
        if t is None:
            raise KeyError(self.topic)  # (as g.topics[self.topic] would)
        eo_publisher_settled(t, self.pub, tag, None, None, g.c_now())
        self.top_up()
        return 0

    cpdef top_up(self):
        """Credit back to PUBLISHER_WINDOW unaccepted deliveries, a quarter at a time."""
        cdef int64_t want = self.owner.window - len(self.deliveries) - len(self.presettled)
        if want - self.link.credit >= self.owner.window // 4:
            self.link.flow(want)


cdef class EoSub(EoEntry):
    """A subscriber attachment (its outcomes and settlements are inputs)."""
    cdef readonly tuple att
    cdef readonly tuple sub
    cdef readonly bint resumable
    cdef public set settling  # settled by us, awaiting theirs
    # the subscriber settled first (exactly-once), awaiting the core's settle output: as a
    # rule its delivery, left in `deliveries` with its `remote_settled` (so that the output
    # finds it there with the look-up it makes anyway, not in a set added to and taken from
    # once a message); here only the out tags whose settled delivery another one of the same
    # out tag replaced in `deliveries` (c_deliver)
    cdef public set peer_settled

    def __init__(self, EoLinks owner, tuple att, tuple sub, str topic, Link link,
                 bint resumable):
        self.owner = owner
        self.att = att
        self.sub = sub
        self.topic = topic
        self.link = link
        self.resumable = resumable
        self.deliveries = {}
        self.settling = set()
        self.peer_settled = set()

    cdef int on_outcome(self, Delivery d, int code, bint settled) except -1:
        """A subscriber's disposition: its outcome, and/or its settlement."""
        if not code and not settled:
            return 0
        cdef EoLinks g = self.owner
        t = self.c_core()
        if t is None:
            raise KeyError(self.topic)  # (as g.topics[self.topic] would)
        tag = d.tag
        cdef double now = g.c_now()
        if is_terminal(code):
            # any terminal outcome means the application has dealt with it (docs)
            if code != D_ACCEPTED:
                _eo_log.info("subscriber %r answered %#x for %r: counted as done",
                             self.link.name, code, self.topic)
            eo_subscriber_accepted(t, self.att, tag, now)
        if settled:
            if self.settling and tag in self.settling:  # (empty unless resumable)
                self.settling.discard(tag)
                eo_subscriber_settled(t, self.att, tag, now)
            elif not eo_core_eo(t) and self.deliveries.get(tag) is d:
                del self.deliveries[tag]
            # (exactly-once: kept, its `remote_settled` says the subscriber settled first)
        return 0


cdef int _uv_clock_of(loop) except -2:
    """The clock libuv's loop time reads (uv_update_time: uv__hrtime(UV_CLOCK_FAST), the
    coarse monotonic clock if its resolution is 1 ms or finer, else the monotonic one) if
    `loop.time` is uvloop's own (`self._time() / 1000`, the ms since that clock's epoch); -1
    for any other loop (its `time` is called)."""
    cdef timespec res
    try:
        from uvloop.loop import Loop as UvLoop
    except ImportError:
        return -1
    if not isinstance(loop, UvLoop) or getattr(type(loop), "time", None) is not UvLoop.time:
        return -1
    if clock_getres(CLOCK_MONOTONIC_COARSE, &res) == 0 and res.tv_sec == 0 and \
            res.tv_nsec <= 1000000:
        return CLOCK_MONOTONIC_COARSE
    return CLOCK_MONOTONIC


cdef inline double _uv_time(int clock) noexcept:
    """uvloop's `Loop.time()`: uv_now(), whole ms of `clock`, over 1000 (the same double)."""
    cdef timespec ts
    clock_gettime(clock, &ts)
    return <double>(<uint64_t>ts.tv_sec * 1000 + <uint64_t>ts.tv_nsec // 1000000) / 1000


cdef class EoLinks(FlushDue):  # (FlushDue: its `scheduled`, read by the cores in C)
    """The per-message half of `qrouter.guarantee.Guarantees` (its base)."""
    cdef public dict topics  # topic -> TopicRouter (an EoCore)
    cdef public dict ports  # topic -> its port (qrouter/guarantee.py's _Port)
    cdef public dict pubs  # (topic, pub) -> EoPub
    cdef public dict subs  # AttId -> EoSub
    cdef public OutQueue outputs  # to apply after the iteration's commit, in order
    cdef public RouterOutbox outbox  # applies the to_router outputs (Guarantees sets it)
    cdef public AcceptedTags accepted_tags  # idempotent publishing (qrouter/eo/dedup.py)
    cdef public object loop
    cdef public bint journal  # the delivery journal is on (qrouter/server.py)
    cdef public int64_t window  # a publisher's unaccepted deliveries in flight per link
    cdef object _clock_of  # the loop whose `time` `_clock` is (c_now: no lookup per input)
    cdef object _clock
    cdef int _uv_clock  # -1: call `_clock`; else the clock id uvloop's `time` reads (c_now)
    # c_sub's last answer: the attachment id object it was asked for (held, so its address is
    # never another object's), its EoSub, and `subs`' version (PEP 509) then. The core's
    # deliver and settle outputs name a subscriber by its LocalSub's own id, the same object
    # output after output, and a tuple's hash is computed anew at every dict look-up
    cdef object _sub_att
    cdef EoSub _sub_hit
    cdef unsigned long long _sub_version
    # c_pub's last answer, the same way: the topic and publisher id objects it was asked for
    # (held), its EoPub and `pubs`' version. The core's accept outputs name them by the
    # core's topic and the record's publisher, the same objects output after output, and a
    # look-up by (topic, pub) makes that tuple and hashes it and the id tuple in it afresh
    cdef object _pub_topic
    cdef object _pub_pub
    cdef EoPub _pub_hit
    cdef unsigned long long _pub_version
    # apply_outputs' queue of the batch it applies, kept between batches (None while one is
    # applied): swapped with `outputs`, its array and `outputs`' are reused iteration after
    # iteration, not grown from nothing by doubling (a realloc and a copy each time) for every
    # batch; trimmed to _SPARE_OUTPUTS items once applied
    cdef OutQueue _spare
    # while apply_outputs applies a batch: the loop's time, read once at the first output
    # that wants it (c_now), so that a batch of accept outputs reads the clock once, not once
    # per output; the outputs of one batch run in one go, within the loop's iteration
    cdef bint _batching
    cdef bint _batch_has_now
    cdef double _batch_now
    # while a socket read is parsed (connection.pxi's `_reading`): the loop's time, read at the
    # read's first input that wants it, and that read's number (`_read_serial`)
    cdef unsigned long long _read_at
    cdef double _read_now

    def __cinit__(self, *args, **kwargs):
        self.topics = {}
        self.ports = {}
        self.pubs = {}
        self.subs = {}
        self.outputs = OutQueue()
        self.window = 500

    def schedule(self):
        """Have the iteration's commit and outputs run (Guarantees.schedule)."""

    def journal_origin(self, topic, out_tag):
        """(origin prefix, tag) of the publisher's delivery `out_tag` copies, for the journal;
        (None, None) if unknown (Guarantees.journal_origin)."""
        return None, None

    cdef double c_now(self) except? -1:
        """The loop's `time()` (what the tick and Python see), per input: for uvloop's own
        `time`, the same value read in C (_uv_time) rather than through a Python call; within
        a batch of outputs (apply_outputs), the value read for its first output that asked;
        within a socket read (Connection.consume), the value read for its first input that
        asked (a read's transfers and outcomes: one clock read, not one each)."""
        if self._batching:
            if not self._batch_has_now:
                self._batch_now = self.c_read_now()
                self._batch_has_now = True
            return self._batch_now
        if _reading:
            if self._read_at != _read_serial:
                self._read_now = self.c_read_now()
                self._read_at = _read_serial
            return self._read_now
        return self.c_read_now()

    cdef double c_read_now(self) except? -1:
        loop = self.loop
        if loop is not None:
            if loop is not self._clock_of:
                self._clock = loop.time
                self._clock_of = loop
                self._uv_clock = _uv_clock_of(loop)
            if self._uv_clock >= 0:
                return _uv_time(self._uv_clock)
            return self._clock()
        return monotonic()

    def now(self):
        """c_now() from Python (tests: the value read in C is the loop's own `time()`)."""
        return self.c_now()

    def apply_outputs(self, OutQueue outputs not None):
        """Apply `outputs` in order (after their records are committed), leaving it empty;
        one that fails is logged and does not stop the others. What they stage (their
        records, more outputs) goes to `self.outputs` for the next commit."""
        cdef OutQueue batch = self._spare
        cdef EoOut *o
        cdef Py_ssize_t i
        cdef int kind
        cdef bint batching = self._batching
        if batch is None:  # (one applying already: an output that applies outputs)
            batch = OutQueue()
        self._spare = None
        batch.swap(outputs)
        self._batching = True
        self._batch_has_now = False
        try:
            for i in range(batch.n):
                o = &batch.items[i]  # (batch is ours alone: what they stage goes elsewhere)
                kind = o.kind
                try:
                    if kind == OUT_DELIVER:
                        self.c_deliver(<object>o.a, <bytes>o.b, <bytes>o.c, o.flag)
                    elif kind == OUT_SETTLE_SUBSCRIBER:
                        self.c_settle_subscriber(<object>o.a, <bytes>o.b)
                    elif kind == OUT_ACCEPT_PUBLISHER:
                        self.c_accept_publisher(<str>o.topic, <object>o.a, <object>o.b,
                                                <object>o.c,
                                                <object>o.d if o.d != NULL else None)
                    elif kind == OUT_RECORD:
                        eo_send_record(self.outbox, o)
                    elif kind == OUT_TO_ROUTER:
                        self.outbox.c_send(<object>o.a, <object>o.b)
                    elif kind == OUT_PORT:
                        getattr(self.ports[<object>o.topic], <object>o.a)(*<object>o.b)
                    else:
                        (<object>o.a)(*<object>o.b)
                except Exception:
                    _eo_log.exception("guaranteed topics: applying %r failed",
                                      batch.entries()[i])
        finally:
            batch.clear()
            batch.trim(_SPARE_OUTPUTS)
            self._spare = batch
            self._batching = batching
            self._batch_has_now = False

    # -- the outputs ---------------------------------------------------------------------------

    def _out_deliver(self, att, out_tag, body, resume):
        self.c_deliver(att, out_tag, body, resume)

    def _out_settle_subscriber(self, att, out_tag):
        self.c_settle_subscriber(att, out_tag)

    def _out_accept_publisher(self, topic, pub, tag):
        self.c_accept_publisher(topic, pub, tag, None, None)

    cdef EoSub c_sub(self, att):
        """self.subs.get(att): the last answer again while `subs` is unchanged and `att` is
        the same object."""
        cdef dict subs = self.subs
        cdef unsigned long long version = eol_dict_version(subs)
        if version and version == self._sub_version and att is self._sub_att:
            return self._sub_hit
        cdef EoSub s = subs.get(att)
        if version:  # (kept when None too: a gone EoSub is let go at the next miss)
            self._sub_att = att
            self._sub_hit = s
            self._sub_version = version
        return s

    cdef EoPub c_pub(self, topic, pub):
        """self.pubs.get((topic, pub)): the last answer again while `pubs` is unchanged and
        `topic` and `pub` are the same objects."""
        cdef dict pubs = self.pubs
        cdef unsigned long long version = eol_dict_version(pubs)
        if (
            version and version == self._pub_version and pub is self._pub_pub
            and topic is self._pub_topic
        ):
            return self._pub_hit
        cdef EoPub p = pubs.get((topic, pub))
        if version:  # (kept when None too: a gone EoPub is let go at the next miss)
            self._pub_topic = topic
            self._pub_pub = pub
            self._pub_hit = p
            self._pub_version = version
        return p

    cdef int c_deliver(self, att, bytes out_tag, bytes body, bint resume) except -1:
        cdef EoSub s = self.c_sub(att)
        if s is None:
            return 0
        prefix = tag = None
        if body is None:
            raise TypeError(f"no body for {out_tag!r}")  # (as Link.send would refuse it)
        if self.journal:
            # the journal names the publisher's delivery, so rows join across routers
            prefix, tag = self.journal_origin(s.topic, out_tag)
        cdef Delivery d = s.link.c_send(out_tag, body, False, 0, resume, None, prefix, tag)
        cdef dict deliveries = s.deliveries
        old = deliveries.setdefault(out_tag, d)  # (one look-up: a new out tag, as a rule)
        if old is not d:  # the out tag delivered again on this attachment
            if (<Delivery>old).remote_settled:
                s.peer_settled.add(out_tag)  # (the settled one's mark, kept)
            deliveries[out_tag] = d
        return 0

    cdef int c_settle_subscriber(self, att, bytes out_tag) except -1:
        cdef EoSub s = self.c_sub(att)
        if s is None:
            return 0
        cdef Delivery d = s.deliveries.pop(out_tag, None)
        cdef bint first = d is not None and d.remote_settled  # (EoSub.peer_settled)
        if first or (s.peer_settled and out_tag in s.peer_settled) or (
            d is not None and not d.sent
        ):
            # it settled first (or never saw it): nothing more to tell it
            if s.peer_settled:
                s.peer_settled.discard(out_tag)
            if d is not None and not first:
                d.c_settle(False)
            if s.resumable:
                t = s.c_core()
                if t is not None:
                    eo_subscriber_settled(t, att, out_tag, self.c_now())
            return 0
        if d is None:
            if not s.resumable:
                return 0  # delivered on an attachment that is gone; nothing to settle here
            # reported on attach, delivered on an earlier attachment: resume it, empty, so
            # that the settlement has a delivery to name (2.6.13)
            d = s.link.c_send(out_tag, b"", False, 0, True, None, None, None)
        if s.resumable:
            s.settling.add(out_tag)
            d.c_settle(True)
        else:
            d.c_settle(False)
        return 0

    cdef int c_accept_publisher(self, str topic, pub, tag, out_tag, origin) except -1:
        """ACCEPTED to the publisher's delivery `tag`; `out_tag`: its outgoing tag if known
        (the core's output carries it), else None; `origin`: the output's record, handed on
        to the core as it is (a hint it checks), or None."""
        cdef EoPub p = self.c_pub(topic, pub)
        if p is None:
            return 0
        # (the topic's core: the one p keeps, p being the link of `topic` here)
        if p.presettled and tag in p.presettled:  # (empty unless it sends settled)
            p.presettled.discard(tag)
            t = p.c_core() if p.topic is topic else self.topics.get(topic)
            if t is not None:
                eo_publisher_settled(t, pub, tag, out_tag, origin, self.c_now())
            return 0
        cdef Delivery d = p.deliveries.get(tag)
        if d is None:
            p.accepted.add(tag)  # it is being resent: accept it when it arrives
            return 0
        d.c_update(D_ACCEPTED, None, p.settle_first)
        cdef double now = self.c_now()
        self.accepted_tags.add(p.key, tag, now)
        if p.settle_first:
            del p.deliveries[tag]
            t = p.c_core() if p.topic is topic else self.topics.get(topic)
            if t is not None:
                eo_publisher_settled(t, pub, tag, out_tag, origin, now)
            p.top_up()
        return 0


include "eo_accepted.pxi"


cdef class AcceptedTags:
    """Idempotent publishing's memory (qrouter/eo/dedup.py, which documents it and re-exports
    this): (link key, tag) -> the time it was accepted, forgotten after `ttl` seconds; at
    most `per_link` tags per publisher link and `total` in all (docs/security.md)."""
    cdef public double ttl
    cdef public Py_ssize_t per_link
    cdef public Py_ssize_t total
    cdef public Py_ssize_t size
    cdef public Py_ssize_t evicted  # tags forgotten early because of a cap
    # link key -> its tags in the order accepted (a `_LinkTags`, eo_accepted.pxi); links in
    # the order last accepted to (an OrderedDict: dropping the oldest is O(1))
    cdef object _links
    # the link key added to last and its tags (so last in `_links`; None once that link is
    # dropped): a link that goes on publishing skips the move to the end, and its adds and
    # look-ups skip hashing the key (a tuple: its hash is not cached) and the dict look-up
    cdef object _last
    cdef _LinkTags _last_tags

    def __init__(self, double ttl, Py_ssize_t per_link=1000, Py_ssize_t total=100_000):
        self.ttl = ttl
        self.per_link = per_link
        self.total = total
        self.size = 0
        self.evicted = 0
        self._links = OrderedDict()
        self._last = None
        self._last_tags = None

    cpdef add(self, key, bytes tag, double now):
        links = self._links
        cdef _LinkTags tags = self._last_tags
        if tags is None or key is not self._last:
            tags = links.get(key)
            if tags is None:
                tags = links[key] = _LinkTags()
            else:
                links.move_to_end(key)
            self._last = key
            self._last_tags = tags
        if tags.c_add(tag, now):
            self.size += 1
        if len(tags.at) > self.per_link:
            tags.c_drop_oldest(now, self.ttl, False)
            self.size -= 1
            self.evicted += 1
        cdef _LinkTags oldest
        while self.size > self.total:
            oldest_key, oldest = next(iter(links.items()))
            if oldest_key == key and len(links) == 1:
                oldest.c_drop_oldest(now, self.ttl, False)  # (only with total < per_link)
                self.size -= 1
                self.evicted += 1
                continue
            del links[oldest_key]
            if oldest is self._last_tags:
                self._last_tags = None
            self.size -= len(oldest.at)
            self.evicted += len(oldest.at)

    cpdef bint accepted(self, key, bytes tag, double now):
        """Was `tag` accepted on this link within the last `ttl` seconds?"""
        cdef _LinkTags tags = self._last_tags
        if tags is None or key is not self._last:
            tags = self._links.get(key)
            if tags is None:
                return False
        cdef PyObject *at = PyDict_GetItem(tags.at, tag)
        return at != NULL and now - PyFloat_AS_DOUBLE(<object>at) <= self.ttl

    def expire(self, double now):
        """Forget what is older than `ttl` (called on the router's tick)."""
        links = self._links
        cdef _LinkTags tags
        for key in list(links):
            tags = links[key]
            while tags.c_drop_oldest(now, self.ttl, True):
                self.size -= 1
            if not tags.at:
                del links[key]
                if tags is self._last_tags:
                    self._last_tags = None

    def __len__(self):
        return self.size
