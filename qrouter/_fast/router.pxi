# The router's data plane: address table (filled by the control plane), anonymous relay, and
# the once-per-loop-iteration output flush. (Included by engine.pyx.)


# the router durable records belong to (one router per process; tests may make more, the
# last one made records for deliveries whose link is gone)
cdef Router durable_router = None


DISTRIBUTION_CODES = {"closest": DIST_CLOSEST, "balanced": DIST_BALANCED,
                      "multicast": DIST_MULTICAST, "unavailable": DIST_UNAVAILABLE}
DISTRIBUTION_NAMES = {v: k for k, v in DISTRIBUTION_CODES.items()}


cdef class Router:
    cdef dict addresses              # name -> Address (only while links use it)
    cdef list dirty                  # connections with output to write
    cdef public object schedule      # callable(callback): run callback soon (loop.call_soon)
    cdef public object close_transport  # callable(transport) after our CLOSE; None: close()
    cdef bint flush_scheduled
    cdef bint eager                  # read_path.pxi: a small read is fed, its flush follows
    cdef public int64_t link_capacity
    cdef public object resolver      # callable(str) -> distribution name, for anonymous `to`
    cdef public str container_id
    cdef public dict open_properties
    cdef set anonymous               # producer links with a null target
    cdef dict unroutable             # `to` -> (condition, description): cache of refusals
    cdef int64_t next_conn_id
    cdef readonly int64_t n_anonymous_rejected
    cdef readonly int64_t n_decode_errors   # undecodable messages refused, connections closed
    cdef readonly int64_t n_write_pauses    # backpressure.pxi: pauses of every connection
    # durability 2 (durable.pxi): the store changes since the last checkpoint, net (a record
    # made and dropped in between is in neither), applied to the records at the checkpoint
    cdef public dict journal          # store key -> value to put
    cdef public set journal_del       # store keys to delete
    # guaranteed topics' keys put since the last checkpoint that the store cannot hold (made
    # in the interval, eo_log.pxi; an origin record's keys say so in the record instead):
    # deleted before the checkpoint, they leave no trace in it
    cdef public set jborn
    # the checkpoint interval's number: a delivery whose record was made in it has the same
    # (Delivery.jgen), and the store's records do not hold it yet
    cdef uint32_t jgen
    # committer(blob, None, None): this iteration's changes, one log entry, before any output;
    # committer(None, puts, deletes): a checkpoint (qrouter/stores/termini.py, "the record log")
    cdef public object committer
    cdef char* jlog                   # this iteration's log entries
    cdef Py_ssize_t jlog_n, jlog_cap
    # or, when not None, the entries themselves (jlog_n of them), as the guaranteed topics'
    # commit made them (eo_log.pxi, log_entries), for the committer without a copy
    cdef bytes jlog_blob
    cdef Py_ssize_t jlog_since        # bytes logged since the last checkpoint
    cdef double jckpt_at              # monotonic time of the last checkpoint
    # a commit failed (durable.pxi, "store failure"): the entries stay in jlog / journal,
    # output of connections with durable links is held in `held` until a retry commits them
    cdef readonly bint store_down
    cdef bint ckpt_failed             # the failed commit was a checkpoint
    cdef list held
    # the delivery journal (journal.pxi): the rows not handed over yet, None while it is off;
    # journal_sink(batch) takes a batch (JournalWriter.append_buffers)
    cdef JournalBuffer jbuf
    cdef object journal_sink
    # fallback and dead-letter addresses (diversion.pxi)
    cdef readonly Diversions diversions

    def __init__(self, str container_id not None, *, int64_t link_capacity=250,
                 resolver=None, dict open_properties=None, schedule=None, diversions=None):
        self.addresses = {}
        self.diversions = Diversions()
        self.diversions.resolver = diversions
        self.dirty = []
        self.anonymous = set()
        self.unroutable = {}
        self.container_id = container_id
        self.link_capacity = link_capacity
        self.resolver = resolver
        self.open_properties = open_properties
        self.schedule = schedule
        self.journal = {}
        self.journal_del = set()
        self.jborn = set()
        self.held = []
        self.jgen = 1
        self.jckpt_at = monotonic()
        global durable_router
        durable_router = self

    def __dealloc__(self):
        free(self.jlog)

    cdef double now(self) noexcept:
        return monotonic()

    cdef void schedule_flush(self) noexcept:
        if not self.flush_scheduled and not self.eager and self.schedule is not None:
            self.flush_scheduled = True
            try:
                self.schedule(self.flush)
            except Exception:
                self.flush_scheduled = False

    cdef inline void mark_dirty(self, Connection c) noexcept:
        self.dirty.append(c)
        if not self.flush_scheduled and not self.eager and self.schedule is not None:
            self.flush_scheduled = True
            try:
                self.schedule(self.flush)
            except Exception:
                self.flush_scheduled = False

    def flush(self):
        """Write every touched connection's output to its transport (one write each)."""
        self.flush_now()

    cdef int flush_now(self) except -1:
        cdef Connection c
        cdef list dirty
        self.flush_scheduled = False
        if self.store_down:
            pass  # no commit until the retry (retry_commit); dependent output is held below
        elif self.jlog_n or self.ckpt_failed:
            # group commit (DESIGN.md section 5): everything this iteration changed is in the
            # store, as one log entry, before any frame that depends on it leaves
            self.try_commit(self.ckpt_failed)
        elif self.committer is None and (self.journal or self.journal_del):
            self.journal = {}
            self.journal_del = set()
            self.jgen += 1
            if self.jgen == 0:
                self.jgen = 1
        if self.jbuf is not None and self.jbuf.n and (
                self.jbuf.n >= JOURNAL_BATCH_ROWS or
                monotonic() - self.jbuf.handed >= JOURNAL_BATCH_SECONDS):
            self.journal_sink(self.jbuf.take())
        while self.dirty:
            dirty = self.dirty
            self.dirty = []
            for c in dirty:
                if c.dirty:
                    if self.store_down and hold_output(self, c):
                        continue
                    try:
                        c.flush_output()
                    except Exception:
                        log.exception("[C%d] write failed", c.conn_id)

    cdef bint try_commit(self, bint force) except -1:
        # a failed commit (a full disk, a full LMDB map, EIO) must neither escape to the event
        # loop nor lose its entries: they stay for the retry, and from now on output that may
        # depend on them is held (durable.pxi, hold_output). The committer reports the failure
        # itself (qrouter/store_health.py).
        try:
            self.commit_log(force)
        except Exception:
            self.store_down = True
            self.ckpt_failed = force or self.ckpt_failed
            return False
        self.ckpt_failed = False
        return True

    def log_broken(self):
        """The net changes (`journal`) hold entries no append carries: a writer that applies
        its entries to them as it builds them (eo_core.log_records) raised part-way. The next
        commit is a checkpoint, which writes the net changes whole, so nothing that depends
        on them leaves before they are in the store."""
        self.ckpt_failed = True

    def retry_commit(self):
        """Commit what a failed commit left (a timer, with backoff: qrouter/store_health.py).
        Succeeded: the held output goes out. Returns True if something was pending."""
        cdef bint pending = self.jlog_n or self.ckpt_failed
        self.store_down = False
        if pending and not self.try_commit(self.ckpt_failed):
            return True
        if self.held:
            self.dirty.extend(self.held)
            self.held = []
        self.flush()
        return pending

    cdef int commit_log(self, bint force) except -1:
        # the state changes only once the committer returned: if it raises, everything stays
        # as it was, to be committed by the retry
        cdef bytes blob
        cdef Py_ssize_t since = self.jlog_since + self.jlog_n
        if not force:
            force = (since >= LOG_CHECKPOINT_BYTES or
                     monotonic() - self.jckpt_at >= LOG_CHECKPOINT_SECONDS)
        if not force:
            blob = self.jlog_blob
            if blob is None:
                blob = PyBytes_FromStringAndSize(self.jlog, self.jlog_n)
            self.committer(blob, None, None)
            self.jlog_n = 0
            self.jlog_blob = None
            self.jlog_since = since
            return 0
        # a checkpoint: the net changes go to the records, the log entries since the last
        # one go (this iteration's changes are in the net ones, so its entry is not written)
        puts = self.journal
        deletes = self.journal_del
        self.committer(None, puts, deletes)
        self.jlog_n = 0
        self.jlog_blob = None
        self.journal = {}
        self.journal_del = set()
        if self.jborn:
            self.jborn = set()
        self.jlog_since = 0
        self.jckpt_at = monotonic()
        self.jgen += 1
        if self.jgen == 0:
            self.jgen = 1
        return 0

    def checkpoint(self, bint due=False):
        """Apply the store changes logged since the last checkpoint to the records now (a
        timer while traffic is quiet, and before stopping): the log entries go. `due`: only
        if the checkpoint interval has passed since the last one (the timer)."""
        if due and monotonic() - self.jckpt_at < LOG_CHECKPOINT_SECONDS:
            return
        if self.committer is not None and not self.store_down and \
                (self.jlog_since or self.jlog_n):
            self.try_commit(True)

    def drop_records(self, bytes prefix not None):
        """A terminus is gone with its records (key prefix `prefix`): its changes waiting
        for the checkpoint go, and the log says so, so that replaying it after a crash does
        not bring back a record the terminus had before."""
        if self.committer is None:
            return
        for key in [k for k in self.journal if k.startswith(prefix)]:
            del self.journal[key]
        jlog_entry(self, LOG_DROP, prefix, None)
        self.schedule_flush()

    def journal_start(self, sink not None, uint64_t sample_threshold=1 << 32, spare=None):
        """Journal every delivery event from now on (docs/journal.md). `sink(batch)` gets the
        rows as column buffers (router.journal.JournalWriter.append_buffers) at most
        JOURNAL_BATCH_SECONDS after they happened while traffic flows, else at the next
        journal_flush(). A delivery is kept when the crc32 of its origin is below
        `sample_threshold` (router.journal.sample_threshold; 2**32 keeps them all). `spare`:
        a deque where the sink puts batches it is done with, to be filled again. Called once,
        before traffic (links keep a reference to the buffer)."""
        self.jbuf = JournalBuffer(sample_threshold, spare)
        self.journal_sink = sink

    def journal_flush(self):
        """Hand the rows gathered so far to the sink now (a timer, and before stopping)."""
        if self.jbuf is not None and (self.jbuf.n or self.jbuf.sampled_out):
            self.journal_sink(self.jbuf.take())

    @property
    def journal_rows(self):
        """Rows gathered and not handed over yet (0 while the journal is off)."""
        return self.jbuf.n if self.jbuf is not None else 0

    cdef Address get_address(self, str name, int distribution):
        cdef Address a = self.addresses.get(name)
        if a is None:
            a = Address()
            a.name = name
            a.distribution = distribution
            a.router = self
            self.diversions.attach(a)
            self.addresses[name] = a
            self.unroutable.clear()
        return a

    cdef int maybe_drop(self, Address a) except -1:
        if not a.consumers and not a.producers and not a.undelivered:
            if self.addresses.get(a.name) is a:
                del self.addresses[a.name]
                self.diversions.detach(a)
        return 0

    def refresh_diversions(self):
        """The address entries changed (management): every address in use asks for its
        fallback and dead-letter addresses again (diversion.pxi)."""
        cdef Address a
        self.diversions.dependents.clear()
        self.diversions.anonymous.clear()
        for a in self.addresses.values():
            self.diversions.attach(a)
        for a in list(self.addresses.values()):
            a.grant()

    cdef int anonymous_producer(self, Link link) except -1:
        # 2.6 / ANONYMOUS-RELAY: credit for a null-target link does not depend on one
        # address; each message is routed (or refused) on its own
        self.anonymous.add(link)
        link.credit = limit_credit(link, self.link_capacity)
        link.credit_changed()
        link.conn.write_flow(link.session, link, False)
        return 0

    cdef int route_anonymous(self, Delivery d, const uint8_t* data, Py_ssize_t n) except -1:
        cdef Address a
        try:
            to = message_to(data, n)
        except DecodeError as e:
            return reject_undecodable(self, d, "sections up to its 'to'", e)
        if to is None:
            return self.refuse(d, "amqp:precondition-failed",
                               "message on an anonymous link has no 'to' address")
        a = self.addresses.get(to)
        if a is not None and a.distribution != DIST_UNAVAILABLE and a.consumers:
            return a.forward(d, data, n)
        if a is None or not a.consumers:
            # nobody consumes `to` anywhere in the mesh: its fallback may (diversion.pxi)
            fb = self.diversions.anonymous_fallback(to)
            if fb is not None:
                a = self.addresses.get(fb)
                if a is not None and a.distribution != DIST_UNAVAILABLE and a.consumers:
                    return a.forward(d, data, n)
        refusal = self.unroutable.get(to)
        if refusal is None:
            dist = "balanced"
            if self.resolver is not None:
                dist = self.resolver(to)
            if dist == "unavailable":
                refusal = ("amqp:not-found", f"address '{to}' is unavailable")
            else:
                refusal = ("amqp:not-found", f"no route to destination '{to}'")
            if len(self.unroutable) > 10000:
                self.unroutable.clear()
            if len(to) <= 1024:
                # (a long `to` is not kept: 10,000 of them could be a gigabyte)
                self.unroutable[to] = refusal
        return self.refuse(d, refusal[0], refusal[1])

    cdef int refuse(self, Delivery d, condition, description) except -1:
        """REJECTED with an error condition (3.4.2): the message cannot be routed."""
        self.n_anonymous_rejected += 1
        if d.presettled:
            return 0
        state = encode_state(D_REJECTED, error_value(condition, description))
        apply_outcome(d, D_REJECTED, state)
        return 0

    def send(self, str to not None, bytes payload not None):
        """Route a message the router itself originates (the management node's replies):
        presettled, to the consumers of `to`. Returns False when nobody consumes `to`."""
        cdef Address a = self.addresses.get(to)
        cdef Delivery d
        if a is None or not a.consumers or a.distribution == DIST_UNAVAILABLE:
            return False
        d = Delivery.new(None, 0, None)
        d.presettled = True
        d.payload = payload
        a.forward(d, NULL, 0)
        return True

    # --- introspection for the control plane -------------------------------------------------

    def address(self, str name):
        return self.addresses.get(name)

    def address_names(self):
        return list(self.addresses)

    def refuse_to(self, str to, condition, description):
        """Remember that anonymous messages to `to` are refused with this error."""
        self.unroutable[to] = (condition, description)


cdef object message_to(const uint8_t* data, Py_ssize_t n):
    """The `to` of a bare message (3.2.4 properties), skipping the sections that may precede
    it; None when absent. Only the anonymous relay needs this."""
    cdef Reader r
    cdef uint64_t code
    cdef uint32_t count
    cdef Py_ssize_t end
    r.p = data
    r.n = n
    r.pos = 0
    while r.pos < r.n:
        r_descriptor(&r, &code)
        if code == D_PROPERTIES:
            if not r_list(&r, &count, &end) or count < 3:
                return None
            r_skip(&r)                # message-id
            r_skip(&r)                # user-id
            v = r_value(&r)
            if v is not None and not isinstance(v, str):
                # 3.2.4: `to` is an address-string
                raise DecodeError(f"'to' is a {type(v).__name__}, not a string")
            return str(v) if v is not None else None
        if code == D_HEADER or code == D_DELIVERY_ANNOTATIONS or \
                code == D_MESSAGE_ANNOTATIONS:
            r_skip(&r)
            continue
        return None
    return None
