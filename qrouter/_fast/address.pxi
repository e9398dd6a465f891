# Addresses and their forwarders, and how outcomes travel back to producers. (Included by
# engine.pyx.)
#
# Credit is proxied from consumers (DESIGN.md section 4, seed credit-accounting): a producer is
# granted credit only while some consumer of its address has credit the router has not used
# up, so a producer of an address with no consumer gets none. Each producer is topped up to
# the link capacity (not to a share of the consumers' credit: a strict share lets the first
# producer hold all of it and starves the next, as an RPC reply address with one consumer and
# many servers would show). What producers send beyond the consumers' credit waits in the
# address's undelivered queue, which is therefore bounded by producers x link capacity.


cdef class Address:
    cdef readonly str name
    cdef readonly int distribution
    cdef Router router
    cdef list consumers          # Links, router role sender
    cdef list producers          # Links, router role receiver
    # anycast: a deque of inbound Deliveries waiting for credit, made on first use (most
    # addresses never need one)
    cdef object undelivered
    cdef Py_ssize_t rr           # round-robin position over consumers
    cdef readonly int64_t n_in, n_out, n_accepted, n_released, n_rejected, n_modified
    cdef readonly int64_t n_dropped   # presettled deliveries that lost their consumers in flight
    cdef readonly Diversion diversion   # fallback / dead letter (diversion.pxi); None: neither

    def __cinit__(self):
        self.consumers = []
        self.producers = []

    @property
    def consumer_count(self):
        return len(self.consumers)

    @property
    def producer_count(self):
        return len(self.producers)

    @property
    def undelivered_count(self):
        return len(self.undelivered) if self.undelivered is not None else 0

    @property
    def waiting_count(self):
        """Deliveries held in the router for this address: not yet routed, or queued on a
        consumer link (no credit, or its connection's write buffer full). Control plane only:
        it walks the consumers."""
        cdef Link c
        cdef Py_ssize_t total = len(self.undelivered) if self.undelivered is not None else 0
        for c in self.consumers:
            total += len(c.pending)
        return total

    @property
    def consumer_backlog(self):
        """The largest write backlog (Connection.write_backlog) among the connections of this
        address's consumers: what would still reach them is held there. Control plane only."""
        cdef Link c
        cdef Py_ssize_t most = 0, b
        for c in self.consumers:
            b = c.conn.write_backlog
            if b > most:
                most = b
        return most

    cdef int64_t capacity(self):
        """Deliveries the consumers will take now: the sum of their credit for anycast (less
        what already waits), the smallest for multicast (every copy needs credit)."""
        cdef Link c
        cdef int64_t total = 0, m = -1, k
        cdef Address f
        if not self.consumers:
            # no consumer anywhere in the mesh: the fallback's consumers' credit, if it has
            # one (diversion.pxi), else none
            f = fallback_target(self)
            return f.capacity() if f is not None else 0
        for c in self.consumers:
            if c.conn.write_paused:
                # backpressure.pxi: its connection's outbound buffer is full; nothing more
                # for it until it drains (multicast: the whole address waits for it)
                k = 0
            elif c.inter_router and self.distribution == DIST_MULTICAST:
                # mesh: a multicast copy for another router waits in a bounded queue on its
                # link (2 x link capacity) instead of for that router's credit. Waiting for
                # the credit would make it depend on itself around every loop of the mesh
                # (A's link to B has credit when B's to C has, which has when C's to A has).
                k = 2 * self.router.link_capacity - len(c.pending)
            else:
                k = c.credit - len(c.pending)
            if self.distribution == DIST_MULTICAST:
                if m < 0 or k < m:
                    m = k
            else:
                total += k
        if self.distribution == DIST_MULTICAST:
            return m if m > 0 else 0
        if self.undelivered is not None:
            total -= len(self.undelivered)
        return total if total > 0 else 0

    cdef int grant(self) except -1:
        """Top up producers whose credit fell below half the link capacity, while the
        consumers have credit to spare (2.6.7: the router is the receiver of producer links);
        and those of the addresses falling back to this one (diversion.pxi)."""
        self.grant_own()
        if self.router.diversions.dependents:
            grant_dependents(self)
        return 0

    cdef int grant_own(self) except -1:
        cdef int64_t cap = self.router.link_capacity, want
        cdef Link p
        if not self.producers or self.capacity() <= 0:
            return 0
        for p in self.producers:
            if p.credit > cap // 2 or p.state != LINK_ATTACHED:
                continue
            want = limit_credit(p, cap)       # limits.pxi: the unsettled limit's room
            if want <= p.credit:
                continue
            p.credit = want
            p.revoked = 0             # transfers still in flight now count against `cap`
            p.credit_changed()
            p.conn.write_flow(p.session, p, False)
        return 0

    cdef int revoke(self) except -1:
        """No consumer left: take back producers' credit (2.6.7: a receiver may lower
        link-credit at any time; transfers already in flight are released on arrival)."""
        cdef Link p
        for p in self.producers:
            if p.credit > 0 and p.state == LINK_ATTACHED:
                p.revoked += p.credit     # the producer may already be using it
                p.credit = 0
                p.credit_changed()
                p.conn.write_flow(p.session, p, False)
        return 0

    cdef int add_consumer(self, Link link) except -1:
        self.consumers.append(link)
        return 0

    cdef int remove_consumer(self, Link link) except -1:
        cdef Address f
        if link in self.consumers:
            self.consumers.remove(link)
        if not self.consumers:
            f = fallback_target(self)
            if f is not None:
                # no consumer anywhere now: what waited for one goes to the fallback, and
                # producers keep their credit, which the fallback's consumers honour
                self.divert_undelivered(f)
            else:
                self.revoke()
                self.release_undelivered()
            if self.router.diversions.dependents:
                revoke_dependents(self)
        self.router.maybe_drop(self)
        return 0

    cdef int divert_undelivered(self, Address f) except -1:
        cdef Delivery inb
        while self.undelivered:
            inb = self.undelivered.popleft()
            unheld(inb)
            if self.diversion is not None:
                self.diversion.n_fallback += 1
            f.forward(inb, NULL, 0)
        return 0

    cdef int add_producer(self, Link link) except -1:
        self.producers.append(link)
        self.grant()
        return 0

    cdef int remove_producer(self, Link link) except -1:
        if link in self.producers:
            self.producers.remove(link)
        self.router.maybe_drop(self)
        return 0

    cdef int release_undelivered(self) except -1:
        cdef Delivery inb
        while self.undelivered:
            inb = self.undelivered.popleft()
            unheld(inb)
            release_inbound(inb)
        return 0

    cdef int consumer_credit(self, Link link) except -1:
        """A consumer granted credit: move waiting deliveries to it, then proxy the rest."""
        cdef Delivery inb
        cdef bytes p
        link.send_pending()
        while self.undelivered and link.credit - len(link.pending) > 0 and \
                not link.conn.write_paused:
            inb = self.undelivered.popleft()
            if orphan(inb):
                continue          # its producer is gone: never delivered, nobody to tell
            if inb.transit and link.inter_router and not link.transit_ok:
                self.undelivered.appendleft(inb)
                break             # the gradient rule (pick): it waits for another consumer
            unheld(inb)
            p = inb.payload
            if link.inter_router and self.router.jbuf is not None and not inb.transit and \
                    inb.jorigin is not None:
                if not annotate(self.router, inb, <const uint8_t*>PyBytes_AS_STRING(p),
                                PyBytes_GET_SIZE(p), None, True):
                    continue          # its sections do not decode: rejected
                p = inb.payload
            inb.out = link.deliver(inb, <const uint8_t*>PyBytes_AS_STRING(p),
                                   PyBytes_GET_SIZE(p))
        self.grant()
        return 0

    cdef Link pick(self, Delivery inb):
        """The consumer for the next anycast delivery, or None if none (allowed) has credit.

        Every consumer has a cost: 0 for a local one, and for a per-address inter-router link
        the path cost to the nearest router with a consumer behind it (docs/mesh.md, "Data
        plane"). closest: the cheapest consumer with credit, ties round robin (on one router
        every local consumer is equally close). balanced: the fewest deliveries outstanding
        (unsettled or waiting) plus cost, ties round robin; so a slow consumer gets fewer.
        A consumer whose connection's outbound buffer is full (backpressure.pxi) is skipped:
        another with room takes the delivery, else it waits in the address.

        The gradient rule (mesh): a transit delivery (it arrived on an inter-router link) may
        take a local consumer, or an inter-router link whose neighbour is strictly closer to a
        consumer than this router (`transit_ok`). The distance falls at every hop, so no
        delivery loops, whatever the routers' tables say while routes converge."""
        cdef Py_ssize_t i, n = len(self.consumers), best_i = -1
        cdef Link c, best = None
        cdef int64_t load, best_load = 0
        cdef bint transit = inb is not None and inb.transit
        if n == 0:
            return None
        for i in range(n):
            c = self.consumers[(self.rr + i) % n]
            if c.credit - len(c.pending) <= 0 or c.state != LINK_ATTACHED or \
                    c.conn.write_paused:
                continue      # no credit, or its connection is paused (backpressure.pxi)
            if transit and c.inter_router and not c.transit_ok:
                continue
            if self.distribution == DIST_CLOSEST:
                load = c.cost
            else:
                load = c.unsettled_count + len(c.pending) + c.cost
            if best is None or load < best_load:
                best = c
                best_load = load
                best_i = i
                if load == 0:
                    break     # nothing beats an idle local consumer
        if best is not None:
            self.rr = (self.rr + best_i + 1) % n
        return best

    def recheck_transit(self):
        """Mesh: after the control plane changed `transit_ok` on some links (or a consumer
        went), RELEASE the waiting transit deliveries that no consumer may take any more, so
        the previous router tries again instead of their waiting for ever (see pick)."""
        cdef Delivery inb
        if not self.undelivered:
            return
        keep = deque()
        while self.undelivered:
            inb = self.undelivered.popleft()
            if self.may_take(inb):
                keep.append(inb)
            else:
                unheld(inb)
                release_inbound(inb)
        self.undelivered = keep

    cdef bint has_inter_router(self) noexcept:
        cdef Link c
        for c in self.consumers:
            if c.inter_router:
                return True
        return False

    cdef bint may_take(self, Delivery inb) noexcept:
        """Some consumer may ever take `inb` (credit aside): any, unless it is transit and
        only inter-router links that fail the gradient rule are left (see pick)."""
        cdef Link c
        if not inb.transit:
            return len(self.consumers) > 0
        for c in self.consumers:
            if not c.inter_router or c.transit_ok:
                return True
        return False

    cdef int forward(self, Delivery inb, const uint8_t* data, Py_ssize_t n) except -1:
        """Route a complete inbound delivery (data/n: its bytes, or NULL to use inb.payload)."""
        cdef Link c
        cdef Delivery out
        cdef list copies
        cdef Address f
        if data == NULL:
            data = <const uint8_t*>PyBytes_AS_STRING(inb.payload)
            n = PyBytes_GET_SIZE(inb.payload)
        if self.diversion is not None:
            if not self.consumers and self.distribution != DIST_MULTICAST:
                f = fallback_target(self)
                if f is not None:
                    # no consumer anywhere in the mesh: the fallback address routes it (its
                    # consumers' outcome is the producer's), diversion.pxi
                    self.n_in += 1
                    self.diversion.n_fallback += 1
                    return f.forward(inb, data, n)
            if keeps_payload(self) and inb.payload is None and not inb.presettled:
                inb.payload = PyBytes_FromStringAndSize(<char*>data, n)
        self.n_in += 1
        if self.distribution == DIST_MULTICAST:
            if not self.consumers:
                release_inbound(inb)
                return 0
            # mesh (docs/mesh.md, "Multicast"): a message entering the mesh here is marked
            # with this router's id for the routers it goes on to; a transit copy goes on only
            # on links whose valid origins hold its ingress, so copies follow the ingress's
            # shortest-path tree: none loops, no router gets two.
            ingress = None
            if inb.transit:
                ingress = message_ingress(data, n)
            elif self.has_inter_router():
                if not annotate(self.router, inb, data, n, self.router.container_id,
                                self.router.jbuf is not None):
                    return 0          # its sections do not decode: rejected
                data = <const uint8_t*>PyBytes_AS_STRING(inb.payload)
                n = PyBytes_GET_SIZE(inb.payload)
            copies = []
            sent = 0
            for c in self.consumers:
                if inb.transit and c.inter_router and (
                        ingress is None or c.valid_origins is None or
                        ingress not in c.valid_origins):
                    continue
                out = c.deliver(inb, data, n)
                sent += 1
                if not inb.presettled:
                    copies.append(out)
            self.n_out += sent
            if sent == 0:
                release_inbound(inb)
                return 0
            if not inb.presettled:
                inb.copies = copies
                inb.pending_copies = len(copies)
            return 0
        c = self.pick(inb)
        if c is None:
            if not self.may_take(inb):
                # no consumer, or (transit) none closer: RELEASED, so the previous router or
                # the producer tries again once routes settle
                release_inbound(inb)
                return 0
            # credit was promised by consumers that have not used it up yet (their pending or
            # flow in transit): hold it, bounded by that credit
            if inb.payload is None:
                inb.payload = PyBytes_FromStringAndSize(<char*>data, n)
            if self.undelivered is None:
                self.undelivered = deque()
            self.undelivered.append(inb)
            held(inb)
            return 0
        self.n_out += 1
        if c.inter_router and self.router.jbuf is not None and not inb.transit and \
                inb.jorigin is not None:
            # journal on: the next router journals this delivery's origin (journal.pxi)
            if not annotate(self.router, inb, data, n, None, True):
                return 0              # its sections do not decode: rejected
            data = <const uint8_t*>PyBytes_AS_STRING(inb.payload)
            n = PyBytes_GET_SIZE(inb.payload)
        inb.out = c.deliver(inb, data, n)
        return 0


cdef int release_inbound(Delivery inb) except -1:
    """No consumer could take it: RELEASED to the producer (3.4.4: not delivered)."""
    if inb.presettled:
        if inb.link is not None and inb.link.address is not None:
            inb.link.address.n_dropped += 1
        return 0
    apply_outcome(inb, D_RELEASED, _STATE_RELEASED)
    return 0


cdef int copy_outcome(Delivery out, int code, bytes raw, int event=J_OUTCOME) except -1:
    """A consumer's outbound copy reached a terminal state: tell its inbound delivery.
    `event` is the journal row's: J_SETTLED when the same disposition settled the copy."""
    cdef Delivery inb = out.inbound
    if inb is None or out.outcome_sent:
        return 0
    out.outcome_sent = True
    out.remote_state = code
    out.remote_state_raw = raw
    if journaling(out.link):
        # released / modified: the delivery returns to the router (it may go out again)
        jr(out.link, out, inb, event, journal_outcome(code), 0,
           J_RELEASED_BACK if code == D_RELEASED or code == D_MODIFIED else -1)
    if inb.copies is None:
        if (code == D_REJECTED or code == D_MODIFIED) and out.link is not None and \
                out.link.address is not None and out.link.address.diversion is not None and \
                dead_letter(out, inb, code, raw):
            return 0              # re-sent to the dead-letter address (diversion.pxi)
        return apply_outcome(inb, code, raw)
    if outcome_rank(code) > outcome_rank(inb.best):
        inb.best = code
        inb.best_raw = raw
    inb.pending_copies -= 1
    if inb.pending_copies <= 0:
        return apply_outcome(inb, inb.best, inb.best_raw)
    return 0


cdef int apply_outcome(Delivery inb, int code, bytes raw) except -1:
    """Tell the producer the outcome of its delivery (end-to-end acknowledgement). With
    rcv-settle-mode first the router settles at once; with second (exactly-once, 3.8.3) it
    waits for the producer to settle and relays that settlement to the consumers."""
    cdef Link link = inb.link
    cdef Address a
    if inb.outcome_sent or inb.presettled:
        return 0
    inb.outcome_sent = True
    inb.outcome_code = code
    inb.outcome_raw = raw
    if link is None:
        if inb.dead_letter is not None:
            return dead_letter_done(inb, code)    # diversion.pxi
        if inb.durable_key is not None:
            # a durable producer is away: remember the outcome for when it resumes
            j_put(durable_router, inb, inb.durable_key, raw, None, None)
            return 0
        settle_copies(inb)        # the producer is gone: nobody to tell; finish the copies
        return 0
    a = link.address
    if a is not None:
        if code == D_ACCEPTED:
            a.n_accepted += 1
        elif code == D_RELEASED:
            a.n_released += 1
        elif code == D_REJECTED:
            a.n_rejected += 1
        elif code == D_MODIFIED:
            a.n_modified += 1
    if code == D_ACCEPTED:
        link.n_accepted += 1
    elif code == D_RELEASED:
        link.n_released += 1
    elif code == D_REJECTED:
        link.n_rejected += 1
    elif code == D_MODIFIED:
        link.n_modified += 1
    if journaling(link):
        # settled at once (rcv-settle-mode first): one row says both
        jr(link, inb, inb, J_SETTLED if link.rcv_settle_mode == RCV_FIRST else J_OUTCOME,
           journal_outcome(code), 0, -1)
    if link.rcv_settle_mode == RCV_FIRST:
        link.conn.queue_disposition(link.session, True, inb.delivery_id, True, raw)
        link.session.unsettled_in.pop(inb.delivery_id)
        link.unsettled_count -= 1
        limit_settled(link)
        inb.settled = True
        settle_copies(inb)
        if inb.durable_key is not None:
            j_del(link.conn.router, inb, inb.durable_key)
    else:
        link.conn.queue_disposition(link.session, True, inb.delivery_id, False, raw)
        if inb.durable_key is not None:
            j_put(link.conn.router, inb, inb.durable_key, raw, None, None)
    return 0


cdef int settle_copies(Delivery inb) except -1:
    """The inbound delivery is settled: settle its copies the consumers still hold (the
    producer's settlement travels forward)."""
    cdef Delivery out = inb.out
    if out is not None:
        # The inbound is done and lets go of its copy; the copy still names its inbound (its
        # later outcome, settlement and journal rows need it). So no reference cycle is left
        # and both are freed by reference count as soon as the session maps drop them, not
        # by the cyclic garbage collector, which cost about a sixth of the router's CPU.
        inb.out = None
        settle_out(out)
    elif inb.copies is not None:
        for out in inb.copies:
            settle_out(out)
        del inb.copies[:]         # as above; the list stays: it marks a multicast delivery
    return 0


cdef int settle_out(Delivery out) except -1:
    cdef Link link = out.link
    if out.settled or link is None:
        return 0
    if not out.sent and out.own_payload:
        # a copy resent to a resuming consumer, still waiting for credit: it goes out settled
        out.presettled = True
        if link.durable_key is not None and out.tag is not None:
            j_del(link.conn.router, out, link.durable_key)
        return 0
    out.settled = True
    if not out.sent:
        return 0
    link.session.unsettled_out.pop(out.delivery_id)
    link.unsettled_count -= 1
    if journaling(link):
        # also when the consumer's settling disposition brought us here (copy_outcome):
        # the copy is settled now, and on_disposition finds it so
        jr(link, out, out.inbound, J_SETTLED, J_NO_OUTCOME, 0, -1)
    if link.durable_key is not None and out.tag is not None:
        j_del(link.conn.router, out, link.durable_key)
    if link.state == LINK_ATTACHED and link.conn.state == CS_OPENED:
        link.conn.queue_disposition(link.session, False, out.delivery_id, True,
                                    out.remote_state_raw)
    return 0
