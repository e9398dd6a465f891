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
# Record layout (stores/termini.py): key b"u/" + terminus digest + b"/" + delivery tag; value
# b"U" version flags state-length state [origin-length origin] message, where origin names the
# inbound delivery an outbound copy was made from (its terminus digest + tag).

from libc.stdlib cimport rand


cdef enum:
    REC_SETTLED = 1
    REC_HAS_STATE = 2
    REC_HAS_MESSAGE = 4
    REC_HAS_ORIGIN = 8
    REC_VERSION = 1


cdef bytes record_key(bytes dkey, bytes tag):
    # one allocation: b"u/" digest b"/" tag
    cdef Py_ssize_t nd = PyBytes_GET_SIZE(dkey), nt = PyBytes_GET_SIZE(tag)
    cdef bytes out = PyBytes_FromStringAndSize(NULL, 3 + nd + nt)
    cdef char* p = PyBytes_AS_STRING(out)
    p[0] = 0x75
    p[1] = 0x2f
    memcpy(p + 2, PyBytes_AS_STRING(dkey), nd)
    p[2 + nd] = 0x2f
    memcpy(p + 3 + nd, PyBytes_AS_STRING(tag), nt)
    return out


cdef bytes record_value(bytes state, bytes origin, bytes message):
    # one allocation: b"U", version, flags, state length (4, big-endian), state,
    # [origin length (1), origin], message - as stores/termini.py reads it
    cdef int flags = 0
    cdef Py_ssize_t ns = 0, no = 0, nm = 0, pos
    if state is not None:
        flags |= REC_HAS_STATE
        ns = PyBytes_GET_SIZE(state)
    if origin is not None:
        flags |= REC_HAS_ORIGIN
        no = PyBytes_GET_SIZE(origin)
    if message is not None:
        flags |= REC_HAS_MESSAGE
        nm = PyBytes_GET_SIZE(message)
    cdef bytes out = PyBytes_FromStringAndSize(NULL, 7 + ns + (1 + no if origin is not None
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
    if origin is not None:
        p[pos] = <char>no
        memcpy(p + pos + 1, PyBytes_AS_STRING(origin), no)
        pos += 1 + no
    if nm:
        memcpy(p + pos, PyBytes_AS_STRING(message), nm)
    return out


cdef inline int j_put(Router r, bytes dkey, bytes tag, bytes state, bytes origin,
                      bytes message, bint new=False) except -1:
    # `new`: the record did not exist before (a delivery just arrived or was just sent)
    cdef bytes key = record_key(dkey, tag)
    r.journal[key] = record_value(state, origin, message)
    if new:
        r.journal_new.add(key)
    elif r.journal_del:
        r.journal_del.discard(key)
    r.schedule_flush()
    return 0


cdef inline int j_del(Router r, bytes dkey, bytes tag) except -1:
    cdef bytes key = record_key(dkey, tag)
    if key in r.journal_new:
        # made and settled within one loop iteration: the store never needs to see it
        r.journal_new.discard(key)
        del r.journal[key]
        return 0
    r.journal.pop(key, None)
    r.journal_del.add(key)
    r.schedule_flush()
    return 0


cdef bytes durable_tag(Link link):
    # 8 bytes: a per-attachment nonce and a counter, so that tags of a resumed terminus
    # (kept in the store) never collide with new ones (2.8.7: unique among unsettled)
    cdef uint32_t n = link.next_tag
    link.next_tag += 1
    return bytes(((link.tag_nonce >> 24) & 0xff, (link.tag_nonce >> 16) & 0xff,
                  (link.tag_nonce >> 8) & 0xff, link.tag_nonce & 0xff,
                  (n >> 24) & 0xff, (n >> 16) & 0xff, (n >> 8) & 0xff, n & 0xff))


cdef int resume_inbound(Link link, Delivery d, Delivery old, bint settled) except -1:
    """A producer resent (2.6.13) a delivery the router already holds: the held one takes the
    new delivery-id; the router does not forward it again. If its outcome is known it is sent
    again; if the producer now settles it, the settlement goes on to the consumers."""
    cdef Session s = link.session
    old.link = link
    old.delivery_id = d.delivery_id
    old.resume = True
    if settled:
        if not d.presettled:
            s.unsettled_in.pop(d.delivery_id, None)
            link.unsettled_count -= 1
        old.settled = True
        settle_copies(old)
        if old.durable_key is not None:
            j_del(link.conn.router, old.durable_key, old.tag)
        return 0
    s.unsettled_in[d.delivery_id] = old
    if old.outcome_sent and old.outcome_raw is not None:
        old.outcome_sent = False
        apply_outcome(old, old.outcome_code, old.outcome_raw)
    return 0


# --- Python API: reconciliation on re-attach and rebuild after a restart ----------------------

def restore_inbound(Router router not None, bytes dkey not None, bytes tag not None,
                    bytes payload, bytes state):
    """An unsettled delivery of a durable producer terminus, from the store. `state` is the
    outcome the router had learnt (None: none yet)."""
    cdef Delivery d = Delivery.new(None, 0, tag)
    d.durable_key = dkey
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
        j_del(router, inbound.durable_key, inbound.tag)


def forget(Router router not None, bytes dkey not None, bytes tag not None):
    """Drop the store record of a held delivery (in this iteration's group commit)."""
    j_del(router, dkey, tag)


def abandon_copy(Delivery out not None):
    """A durable consumer terminus is gone for good: its held copy may have been seen, so
    the producer hears MODIFIED(delivery-failed) (3.4.5), as for any lost consumer."""
    copy_outcome(out, D_MODIFIED, _STATE_MODIFIED_FAILED, True)


def consumer_state(Delivery out not None, int code, bytes raw):
    """Re-attach showed the consumer holds this copy in a terminal state: that outcome
    travels to the producer as if it had just arrived."""
    if is_terminal(code):
        copy_outcome(out, code, raw, False)


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
