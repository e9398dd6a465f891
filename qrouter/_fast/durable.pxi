# Durable links (terminus durability 2, 3.5.5 unsettled-state): the unsettled deliveries of
# such a link are written to the terminus store, and a link that comes back (re-attach, or
# after a restart) resumes them (2.6.13). (Included by engine.pyx.)
#
# The data plane records what changed in `Router.journal` as (store key, store value or None)
# pairs, in order; Router.flush() hands them to the store in one transaction (group commit)
# BEFORE it writes any frame of that loop iteration to a socket. So no peer ever sees a
# transfer or disposition whose record could be lost by a crash: whatever a peer saw, the
# store holds. The store is never read on this path.
#
# Record layout (qrouter/stores/termini.py): key b"u/" + terminus digest + b"/" + record id; value
# b"U" version flags state-length state [tag-length tag] [origin-length origin] message.
# An outbound copy's id is its tag (durable_tag: a per-attachment nonce and a counter). An
# inbound delivery's id is made the same way on its producer link, and its tag (the producer's
# choice) goes into the value: so every record of a link lands at the end of its terminus's
# key range, next to the one before it, and a batch touches a few B-tree pages (LMDB) or
# memtable neighbours (LevelDB) instead of one per delivery, as a producer's tags (counters
# in either byte order, strings) would. `origin` names the inbound delivery an outbound copy
# was made from: its terminus digest + record id.

from libc.stdlib cimport free, rand, realloc


# The record log (qrouter/stores/termini.py): each loop iteration's changes are one entry appended
# to the store's log file, the concatenation of the items below - a put, a delete, a prefix
# dropped - in the order made. The records themselves change only at a checkpoint
# (Router.commit_log), with the net changes since the one before: most deliveries are made
# and settled in between and never touch them. So a loop iteration costs the store one
# write(2), not a B-tree update per record.
cdef enum:
    LOG_PUT = 0x50        # b"P" key-length(2) key value-length(4) value
    LOG_DEL = 0x44        # b"D" key-length(2) key
    LOG_DROP = 0x58       # b"X" prefix-length(2) prefix: every record under it goes

cdef Py_ssize_t LOG_CHECKPOINT_BYTES = 16 << 20
cdef double LOG_CHECKPOINT_SECONDS = 1.0


def _checkpoint_seconds_for_tests():
    # a test hook, as QROUTER_TEST_STORE_FAIL (qrouter/store_health.py): a longer interval,
    # so that a test can SIGKILL a router whose records are in the log and not checkpointed
    import os
    value = os.environ.get("QROUTER_TEST_CHECKPOINT_SECONDS")
    return float(value) if value else 1.0


LOG_CHECKPOINT_SECONDS = _checkpoint_seconds_for_tests()


cdef unsigned char* jlog_reserve(Router r, Py_ssize_t need) except NULL:
    """`Router.jlog` grown (doubling from 64 KiB) to hold `need` octets of this iteration's
    entries, the blob handed over whole (`jlog_blob`, eo_log.pxi) copied into it first;
    where the next entry goes (octet `jlog_n`)."""
    cdef Py_ssize_t cap
    cdef char* grown
    cdef bytes blob = r.jlog_blob
    if need > r.jlog_cap:
        cap = r.jlog_cap * 2 if r.jlog_cap else 65536
        while cap < need:
            cap *= 2
        grown = <char*>realloc(r.jlog, cap)
        if grown == NULL:
            raise MemoryError()
        r.jlog = grown
        r.jlog_cap = cap
    if blob is not None:  # (then it is all jlog_n counts)
        memcpy(r.jlog, PyBytes_AS_STRING(blob), r.jlog_n)
        r.jlog_blob = None
    return <unsigned char*>r.jlog + r.jlog_n


cdef int jlog_entry(Router r, int op, bytes key, bytes value) except -1:
    cdef Py_ssize_t nk = PyBytes_GET_SIZE(key)
    cdef Py_ssize_t nv = PyBytes_GET_SIZE(value) if value is not None else 0
    cdef Py_ssize_t need = r.jlog_n + 3 + nk + (4 + nv if op == LOG_PUT else 0)
    cdef unsigned char* p = jlog_reserve(r, need)
    p[0] = op
    p[1] = (nk >> 8) & 0xff
    p[2] = nk & 0xff
    memcpy(p + 3, PyBytes_AS_STRING(key), nk)
    if op == LOG_PUT:
        p += 3 + nk
        p[0] = (nv >> 24) & 0xff
        p[1] = (nv >> 16) & 0xff
        p[2] = (nv >> 8) & 0xff
        p[3] = nv & 0xff
        if nv:
            memcpy(p + 4, PyBytes_AS_STRING(value), nv)
    r.jlog_n = need
    return 0


cdef enum:
    REC_SETTLED = 1
    REC_HAS_STATE = 2
    REC_HAS_MESSAGE = 4
    REC_HAS_ORIGIN = 8
    REC_HAS_TAG = 16
    REC_VERSION = 1


cdef bytes record_key(bytes dkey, bytes rid):
    # one allocation: b"u/" digest b"/" record id
    cdef Py_ssize_t nd = PyBytes_GET_SIZE(dkey), nt = PyBytes_GET_SIZE(rid)
    cdef bytes out = PyBytes_FromStringAndSize(NULL, 3 + nd + nt)
    cdef char* p = PyBytes_AS_STRING(out)
    p[0] = 0x75
    p[1] = 0x2f
    memcpy(p + 2, PyBytes_AS_STRING(dkey), nd)
    p[2 + nd] = 0x2f
    memcpy(p + 3 + nd, PyBytes_AS_STRING(rid), nt)
    return out


cdef bytes record_origin(bytes skey, Py_ssize_t nd):
    # what an outbound copy's record names its inbound delivery by: the digest (`nd` bytes)
    # and record id of that delivery's key (b"u/" digest b"/" id), without the separators
    cdef Py_ssize_t n = PyBytes_GET_SIZE(skey)
    cdef bytes out = PyBytes_FromStringAndSize(NULL, n - 3)
    cdef char* p = PyBytes_AS_STRING(out)
    cdef const char* k = PyBytes_AS_STRING(skey)
    memcpy(p, k + 2, nd)
    memcpy(p + nd, k + 3 + nd, n - 3 - nd)
    return out


cdef bytes record_value(bytes state, bytes tag, bytes origin, bytes message):
    # one allocation: b"U", version, flags, state length (4, big-endian), state,
    # [tag length (1), tag], [origin length (1), origin], message - as qrouter/stores/termini.py
    # reads it
    cdef int flags = 0
    cdef Py_ssize_t ns = 0, nt = 0, no = 0, nm = 0, pos
    if state is not None:
        flags |= REC_HAS_STATE
        ns = PyBytes_GET_SIZE(state)
    if tag is not None:
        flags |= REC_HAS_TAG
        nt = PyBytes_GET_SIZE(tag)
    if origin is not None:
        flags |= REC_HAS_ORIGIN
        no = PyBytes_GET_SIZE(origin)
    if message is not None:
        flags |= REC_HAS_MESSAGE
        nm = PyBytes_GET_SIZE(message)
    cdef bytes out = PyBytes_FromStringAndSize(
        NULL, 7 + ns + (1 + nt if tag is not None else 0) + (1 + no if origin is not None
                                                             else 0) + nm)
    cdef char* p = PyBytes_AS_STRING(out)
    p[0] = 0x55
    p[1] = REC_VERSION
    p[2] = flags
    p[3] = (ns >> 24) & 0xff
    p[4] = (ns >> 16) & 0xff
    p[5] = (ns >> 8) & 0xff
    p[6] = ns & 0xff
    pos = 7
    if ns:
        memcpy(p + pos, PyBytes_AS_STRING(state), ns)
        pos += ns
    if tag is not None:
        p[pos] = <char>nt
        memcpy(p + pos + 1, PyBytes_AS_STRING(tag), nt)
        pos += 1 + nt
    if origin is not None:
        p[pos] = <char>no
        memcpy(p + pos + 1, PyBytes_AS_STRING(origin), no)
        pos += 1 + no
    if nm:
        memcpy(p + pos, PyBytes_AS_STRING(message), nm)
    return out


cdef inline bytes delivery_key(Delivery d, bytes dkey):
    # a delivery's record key never changes once made: kept on the delivery, so the dict and
    # set below reuse its cached hash. Unless given an id (an inbound delivery, see above),
    # a record is named by the delivery's tag.
    if d.skey is None:
        d.skey = record_key(dkey, d.tag)
    return d.skey


cdef inline int j_put(Router r, Delivery d, bytes dkey, bytes state, bytes origin,
                      bytes message, bint new=False) except -1:
    # `new`: the record did not exist before (a delivery just arrived or was just sent)
    cdef bytes key = delivery_key(d, dkey)
    cdef bytes value = record_value(state, d.tag if d.tag_in_value else None, origin, message)
    r.journal[key] = value
    if r.journal_del and key in r.journal_del:
        # a delete of this key earlier in the interval (a tag reused once settled, 2.8.7):
        # the put replaces it, and the records may still hold the old one, so not "new"
        r.journal_del.discard(key)
        d.jgen = 0
    elif new:
        d.jgen = r.jgen
    if r.committer is not None:
        jlog_entry(r, LOG_PUT, key, value)
    r.schedule_flush()
    return 0


cdef inline int j_del(Router r, Delivery d, bytes dkey) except -1:
    cdef bytes key = delivery_key(d, dkey)
    if r.committer is not None:
        jlog_entry(r, LOG_DEL, key, None)
    if d.jgen == r.jgen:
        # made and settled within one checkpoint interval: the records never see it
        d.jgen = 0
        r.journal.pop(key, None)
        r.schedule_flush()
        return 0
    if r.journal:
        r.journal.pop(key, None)
    r.journal_del.add(key)
    r.schedule_flush()
    return 0


cdef bytes durable_tag(Link link):
    # 8 bytes: a per-attachment nonce and a counter, so that tags of a resumed terminus
    # (kept in the store) never collide with new ones (2.8.7: unique among unsettled)
    cdef uint32_t n = link.next_tag
    cdef uint32_t nonce = link.tag_nonce
    cdef bytes out = PyBytes_FromStringAndSize(NULL, 8)
    cdef unsigned char* p = <unsigned char*>PyBytes_AS_STRING(out)
    link.next_tag += 1
    p[0] = nonce >> 24
    p[1] = (nonce >> 16) & 0xff
    p[2] = (nonce >> 8) & 0xff
    p[3] = nonce & 0xff
    p[4] = n >> 24
    p[5] = (n >> 16) & 0xff
    p[6] = (n >> 8) & 0xff
    p[7] = n & 0xff
    return out


cdef int resume_inbound(Link link, Delivery d, Delivery old, bint settled) except -1:
    """A producer resent (2.6.13) a delivery the router already holds: the held one takes the
    new delivery-id; the router does not forward it again, unless no copy of it was ever made.
    If its outcome is known it is sent again; if the producer now settles it, the settlement
    goes on to the consumers."""
    cdef Session s = link.session
    old.link = link
    old.delivery_id = d.delivery_id
    old.resume = True
    if settled:
        if not d.presettled:
            s.unsettled_in.pop(d.delivery_id)
            link.unsettled_count -= 1
        old.settled = True
        settle_copies(old)
        if old.durable_key is not None:
            j_del(link.conn.router, old, old.durable_key)
        return 0
    s.unsettled_in.put(d.delivery_id, old)
    if old.outcome_sent and old.outcome_raw is not None:
        old.outcome_sent = False
        apply_outcome(old, old.outcome_code, old.outcome_raw)
    elif not old.outcome_sent and old.out is None and old.copies is None and \
            old.payload is not None and link.address is not None and \
            not (link.address.undelivered and old in link.address.undelivered):
        # held and never forwarded, and not waiting in the address's queue either: it was
        # waiting for a consumer's credit when the router stopped, so no copy of it was made
        # (the queue is not kept). It goes out now, as if it had just arrived.
        link.address.forward(old, <const uint8_t*>PyBytes_AS_STRING(old.payload),
                             PyBytes_GET_SIZE(old.payload))
    return 0


# --- Python API: reconciliation on re-attach and rebuild after a restart ----------------------

def restore_inbound(Router router not None, bytes dkey not None, bytes tag not None,
                    bytes payload, bytes state, bytes rid=None):
    """An unsettled delivery of a durable producer terminus, from the store. `state` is the
    outcome the router had learnt (None: none yet); `rid` the id its record is stored under
    when that is not its tag."""
    cdef Delivery d = Delivery.new(None, 0, tag)
    d.durable_key = dkey
    if rid is not None and rid != tag:
        d.skey = record_key(dkey, rid)
        d.tag_in_value = True
    d.payload = payload
    if state is not None:
        d.outcome_sent = True
        d.outcome_raw = state
        d.outcome_code = state_code(state)
    return d


def restore_copy(Delivery inbound, bytes tag not None, bytes payload):
    """An unsettled copy of a durable consumer terminus, from the store; `inbound` is the
    delivery it copies (None when that one is gone: its producer settled it)."""
    cdef Delivery out = Delivery.new(None, 0, tag)
    out.payload = payload
    out.sent = True
    if inbound is not None and payload is None:
        out.payload = inbound.payload      # the copy's record named its origin's bytes
    if inbound is not None:
        out.inbound = inbound
        out.presettled = inbound.presettled
        out.message_format = inbound.message_format
        if inbound.out is None and inbound.copies is None:
            inbound.out = out
        else:
            if inbound.copies is None:
                inbound.copies = [inbound.out]
                inbound.out = None
                inbound.pending_copies = 1
            inbound.copies.append(out)
            inbound.pending_copies += 1
    return out


def producer_forgot(Router router not None, Delivery inbound not None):
    """Re-attach showed the producer no longer has this delivery: it settled it (2.6.13), so
    the settlement goes on to the consumers and the record goes."""
    if inbound.settled:
        return
    inbound.settled = True
    inbound.outcome_sent = True
    settle_copies(inbound)
    if inbound.durable_key is not None:
        j_del(router, inbound, inbound.durable_key)


def forget(Router router not None, bytes dkey not None, bytes tag not None):
    """Drop the store record of a held delivery (in this iteration's group commit)."""
    cdef bytes key = record_key(dkey, tag)
    if router.committer is not None:
        jlog_entry(router, LOG_DEL, key, None)
    router.journal.pop(key, None)
    router.journal_del.add(key)
    router.schedule_flush()


def abandon_copy(Delivery out not None):
    """A durable consumer terminus is gone for good: its held copy may have been seen, so
    the producer hears MODIFIED(delivery-failed) (3.4.5), as for any lost consumer."""
    copy_outcome(out, D_MODIFIED, _STATE_MODIFIED_FAILED)


def consumer_state(Delivery out not None, int code, bytes raw):
    """Re-attach showed the consumer holds this copy in a terminal state: that outcome
    travels to the producer as if it had just arrived."""
    if is_terminal(code):
        copy_outcome(out, code, raw)


def state_code(bytes raw):
    """The descriptor code of an encoded delivery state (0x24 accepted ...)."""
    cdef Reader r
    cdef uint64_t code = 0
    if raw is None or len(raw) == 0:
        return 0
    r.p = <const uint8_t*>PyBytes_AS_STRING(raw)
    r.n = PyBytes_GET_SIZE(raw)
    r.pos = 0
    r_descriptor(&r, &code)
    return <int>code


# --- store failure (docs/architecture.md, "store failure") -------------------------------
#
# When a group commit fails (Router.try_commit), its entries stay in the router and are
# committed by a retry with backoff; until then no frame that may depend on them is written.
# Which frames may: those to peers of durable links (a transfer whose record is not stored,
# a disposition or flow after one), so the output of every connection that has a durable
# link, or had one when the store failed, is held whole (heartbeats included). A connection
# without one is written as usual: nothing it is told depends on a record.

cdef bint hold_output(Router r, Connection c) except -1:
    cdef Session s
    cdef Link link
    if c in r.held:
        return True
    for s in c.sessions.values():
        for link in s.links.values():
            if link.durable_key is not None and not link.endpoint:
                r.held.append(c)
                return True
    return False


cdef int resume_credit(Link link) except -1:
    """A resuming durable producer (2.6.13) must send again the deliveries the router holds
    and its unsettled map named: credit for those already copied to a consumer or with an
    outcome, whatever the consumers have to spare. Such a transfer re-binds to the held
    delivery (resume_inbound) and takes no consumer credit, while the consumers' may all go
    to the router's own resumed copies. One held but never copied goes out as new on its
    resume: the consumers' credit covers it (Address.grant). Bounded: the map came in one
    ATTACH frame."""
    cdef int64_t n = 0
    cdef Delivery d
    if not link.resumable or link.state != LINK_ATTACHED:
        return 0
    for d in link.resumable.values():
        if d.out is not None or d.copies is not None or d.outcome_sent:
            n += 1
    if n <= link.credit:
        return 0
    link.credit = n
    link.revoked = 0
    link.credit_changed()
    link.conn.write_flow(link.session, link, False)
    return 0
