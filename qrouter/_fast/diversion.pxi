# Where an address diverts what it cannot deliver (docs/brokers.md, "Fallback and dead
# letters"): the seed credit-accounting calls these "message exceptions" and wants them handled
# "with the same mechanisms as deliveries", pushed forwards on an alternative route rather than
# returned to the sender. (Included by engine.pyx.)
#
# * fallback: while an anycast address has no consumer anywhere in the mesh (no local consumer
#   and no per-address link towards a router with one), its messages are routed to the
#   fallback address's consumers instead, and its producers get credit from those. One level
#   only: the fallback address's own fallback is never followed.
# * dead letter: an anycast delivery whose consumer (attached to this router) REJECTED it, or
#   MODIFIED it with undeliverable-here (3.4.5: "do not redeliver to this link"), is routed
#   once more, to the dead-letter address, with the original address and outcome in its
#   message-annotations. The producer's outcome is ACCEPTED once a dead-letter consumer
#   accepted it (like a MOVE in the seed, the acknowledgement of the new destination pays for
#   the message), and the original outcome otherwise (no dead-letter consumer, or it did not
#   accept). A message carrying x-opt-qr-dead-letter-address is never dead-lettered again, on
#   any router, so no message loops between dead-letter addresses.
#
# An Address holds one reference, `diversion`, None unless its entry names one of these; the
# router holds one `Diversions`, which resolves names (through the control plane, once per
# address) and knows which addresses fall back to which.

cdef object _DL_ADDRESS_KEY = Symbol("x-opt-qr-dead-letter-address")
cdef object _DL_OUTCOME_KEY = Symbol("x-opt-qr-dead-letter-outcome")
cdef object _DL_CONDITION_KEY = Symbol("x-opt-qr-dead-letter-condition")
cdef object _DL_DESCRIPTION_KEY = Symbol("x-opt-qr-dead-letter-description")


cdef class Diversion:
    """An address's fallback and dead-letter addresses (names; either may be None)."""
    cdef readonly str fallback
    cdef readonly str dead_letter
    cdef readonly int64_t n_fallback         # deliveries routed to the fallback address
    cdef readonly int64_t n_dead_lettered    # deliveries re-sent to the dead-letter address
    cdef readonly int64_t n_dead_letter_failed   # no dead-letter consumer: original outcome


cdef class Diversions:
    """The router's view of every address's diversion. `resolver(name)` (the control plane's
    address table) returns (fallback, dead_letter) or None; it is asked once per address (and
    once per anonymous `to`, cached), never per message."""
    cdef object resolver
    cdef dict dependents     # fallback name -> {Address falling back to it}
    cdef dict anonymous      # `to` of an anonymous message -> its fallback name, or None

    def __cinit__(self):
        self.dependents = {}
        self.anonymous = {}

    cdef Diversion resolve(self, str name):
        if self.resolver is None:
            return None
        found = self.resolver(name)
        if found is None:
            return None
        fallback, dead_letter = found
        if fallback is None and dead_letter is None:
            return None
        cdef Diversion d = Diversion()
        d.fallback = fallback
        d.dead_letter = dead_letter
        return d

    cdef int attach(self, Address a) except -1:
        """`a` was made: give it its diversion, and list it under its fallback."""
        a.diversion = self.resolve(a.name)
        if a.diversion is not None and a.diversion.fallback is not None:
            self.dependents.setdefault(a.diversion.fallback, set()).add(a)
        return 0

    cdef int detach(self, Address a) except -1:
        cdef set deps
        if a.diversion is not None and a.diversion.fallback is not None:
            deps = self.dependents.get(a.diversion.fallback)
            if deps is not None:
                deps.discard(a)
                if not deps:
                    del self.dependents[a.diversion.fallback]
        return 0

    cdef str anonymous_fallback(self, str to):
        if self.resolver is None:
            return None
        if to in self.anonymous:
            return self.anonymous[to]
        found = self.resolver(to)
        fallback = found[0] if found is not None else None
        if len(self.anonymous) > 10000:
            self.anonymous.clear()
        if len(to) <= 1024:
            self.anonymous[to] = fallback       # (as Router.unroutable: long ones not kept)
        return fallback


# --- fallback ----------------------------------------------------------------------------------

cdef Address fallback_target(Address a):
    """The address `a`'s deliveries go to now instead of its own consumers: its fallback,
    while `a` has no consumer anywhere in the mesh and the fallback has one; else None."""
    cdef Address f
    if a.diversion is None or a.diversion.fallback is None or a.consumers:
        return None
    f = a.router.addresses.get(a.diversion.fallback)
    if f is None or f is a or not f.consumers or f.distribution == DIST_UNAVAILABLE:
        return None
    return f


cdef int grant_dependents(Address f) except -1:
    """Consumers of `f` have credit: producers of addresses falling back to `f` (with no
    consumer of their own) get credit too. They are topped up by their own grant, which does
    not go on to their dependents: a fallback chain, or a cycle, costs one step."""
    cdef Address a
    deps = f.router.diversions.dependents.get(f.name)
    if deps:
        for a in list(deps):
            if not a.consumers and a.producers:
                a.grant_own()
    return 0


cdef int revoke_dependents(Address f) except -1:
    """`f` lost its last consumer: addresses falling back to it (with no consumer of their
    own) have nowhere to send either, so their producers' credit is taken back (2.6.7)."""
    cdef Address a
    deps = f.router.diversions.dependents.get(f.name)
    if deps:
        for a in list(deps):
            if not a.consumers:
                a.revoke()
    return 0


# --- dead letters ------------------------------------------------------------------------------

cdef class DeadLetter:
    """A dead-letter resend (Delivery.dead_letter): the delivery it stands for, and the
    outcome that delivery's consumer gave."""
    cdef Delivery original
    cdef int code
    cdef bytes raw


cdef inline bint keeps_payload(Address a) noexcept:
    """A dead-lettering address keeps the bytes of its unsettled deliveries until their
    outcome (the only cost of dead letters on the forwarding path: one copy per message)."""
    return a.diversion is not None and a.diversion.dead_letter is not None


cdef bint undeliverable_here(bytes raw):
    """3.4.5 modified: its undeliverable-here field (the second) is true."""
    try:
        state, _ = decode(raw)
    except Exception:
        return False
    if not isinstance(state, Described) or not isinstance(state.value, list):
        return False
    fields = state.value
    return len(fields) >= 2 and fields[1] is True


cdef dict dead_letter_annotations(str address, int code, bytes raw):
    """The annotations a dead-letter resend carries: the address and outcome it had, the
    rejection's error (3.4.3) where there is one, and a modified outcome's own
    message-annotations (3.4.5: to be merged into the message's)."""
    extra = {}
    try:
        state, _ = decode(raw)
    except Exception:
        state = None
    fields = state.value if isinstance(state, Described) and isinstance(state.value, list) \
        else []
    if code == D_MODIFIED and len(fields) >= 3 and isinstance(fields[2], dict):
        extra.update(fields[2])
    extra[_DL_ADDRESS_KEY] = address
    extra[_DL_OUTCOME_KEY] = "rejected" if code == D_REJECTED else "modified"
    if code == D_REJECTED and fields and isinstance(fields[0], Described) and \
            isinstance(fields[0].value, list):
        error = fields[0].value
        if len(error) >= 1 and error[0] is not None:
            extra[_DL_CONDITION_KEY] = error[0]
        if len(error) >= 2 and isinstance(error[1], str):
            extra[_DL_DESCRIPTION_KEY] = error[1]
    return extra


cdef bint dead_letter(Delivery out, Delivery inb, int code, bytes raw) except -1:
    """`out`, the copy of `inb` sent to a consumer, ended with `code`: re-send `inb` to its
    address's dead-letter address if this outcome and delivery qualify. True if it did (the
    producer's outcome then waits for the dead-letter consumer's), False to apply `code`."""
    cdef Link link = out.link
    cdef Address a, target
    cdef Diversion dv
    cdef Delivery dl
    cdef DeadLetter rec
    cdef bytes p
    if code != D_REJECTED and not (code == D_MODIFIED and raw is not None and
                                   undeliverable_here(raw)):
        return False
    if link is None or link.inter_router or inb.copies is not None or inb.presettled or \
            inb.dead_letter is not None or inb.payload is None:
        # only at the router of the consumer that said it (an outcome relayed from another
        # router was that router's to divert), only anycast, only once
        return False
    a = link.address
    if a is None or a.diversion is None or a.diversion.dead_letter is None:
        return False
    dv = a.diversion
    p = inb.payload
    ann = message_annotations(<const uint8_t*>PyBytes_AS_STRING(p), PyBytes_GET_SIZE(p))
    if isinstance(ann, dict) and _DL_ADDRESS_KEY in ann:
        return False              # dead-lettered once already (perhaps on another router)
    target = a.router.addresses.get(dv.dead_letter)
    if target is None or not target.consumers or target.distribution == DIST_UNAVAILABLE or \
            target.distribution == DIST_MULTICAST:
        dv.n_dead_letter_failed += 1
        return False
    try:
        p = add_annotations(<const uint8_t*>PyBytes_AS_STRING(p), PyBytes_GET_SIZE(p),
                            dead_letter_annotations(a.name, code, raw))
    except (ValueError, TypeError, OverflowError) as e:
        log.info("dead letter for %r not sent: the message's annotations do not encode: %s",
                 a.name, e)
        dv.n_dead_letter_failed += 1
        return False
    dv.n_dead_lettered += 1
    rec = DeadLetter()
    rec.original = inb
    rec.code = code
    rec.raw = raw
    dl = Delivery.new(None, 0, None)
    dl.payload = p
    dl.message_format = inb.message_format
    dl.dead_letter = rec
    dl.jorigin = inb.jorigin          # journal: the same origin as the message it stands for
    dl.jotag = inb.jotag if inb.jotag is not None else inb.tag
    dl.jskip = inb.jskip
    target.forward(dl, NULL, 0)
    return True


cdef int dead_letter_done(Delivery dl, int code) except -1:
    """The dead-letter resend `dl` has its outcome: the producer of the original is told
    ACCEPTED if the dead-letter consumer accepted, else the original outcome."""
    cdef DeadLetter rec = dl.dead_letter
    settle_copies(dl)
    if code == D_ACCEPTED:
        return apply_outcome(rec.original, D_ACCEPTED, _STATE_ACCEPTED)
    return apply_outcome(rec.original, rec.code, rec.raw)


def _test_dead_letter_annotations(str address, int code, bytes raw not None):
    """For tests: the annotations a dead-letter resend gets for this outcome."""
    return dead_letter_annotations(address, code, raw)
