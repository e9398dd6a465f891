# Sessions (2.5) and links (2.6): windows, handles, credit, unsettled maps. (Included by
# engine.pyx.)

from collections import deque


cdef class Session:
    cdef Connection conn
    cdef readonly uint16_t channel          # ours
    cdef readonly uint16_t remote_channel
    cdef uint32_t next_outgoing_id           # 2.5.6 transfer-ids we send
    cdef uint32_t next_incoming_id           # transfer-ids we expect
    cdef int64_t remote_incoming_window      # frames the peer will still accept from us
    cdef uint32_t window_base                # next_incoming_id when we last advertised
    cdef uint32_t next_delivery_id           # delivery-ids of our outgoing deliveries
    cdef uint32_t handle_max
    cdef dict links                          # remote handle -> Link
    cdef list local_handles                  # our handle -> Link or None
    cdef Unsettled unsettled_out             # delivery-id -> Delivery we sent (unsettled.pxi)
    cdef Unsettled unsettled_in              # delivery-id -> Delivery we received
    cdef list blocked                        # links waiting for the session window to open
    cdef dict attaching                      # (name, router is sender) -> Link we attached
    cdef readonly bint ended
    cdef readonly bint mapped                # the peer's BEGIN is known (2.5.2)
    cdef readonly object end_error           # the error of the peer's END (2.7.7), if any

    def __cinit__(self):
        self.links = {}
        self.local_handles = []
        self.unsettled_out = Unsettled()
        self.unsettled_in = Unsettled()
        self.blocked = []
        self.attaching = {}
        self.remote_incoming_window = WINDOW_MAX
        self.handle_max = 0xffffffff

    def attach(self, str name not None, bint sender, dict fields):
        """Attach a link from our side (2.6.3): `sender` is our role; fields as in
        FIELDS[D_ATTACH] (name, handle, role are filled in). The peer's answer arrives at the
        handler's on_attach with `link.local_init` set."""
        cdef Link link = Link()
        link.name = name
        link.session = self
        link.conn = self.conn
        link.role = ROLE_SENDER if sender else ROLE_RECEIVER
        link.local_init = True
        link.state = LINK_ATTACHING
        link.handle = self.alloc_handle(link)
        ssm = fields.get("snd_settle_mode")
        link.snd_settle_mode = SND_MIXED if ssm is None else ssm
        rsm = fields.get("rcv_settle_mode")
        link.rcv_settle_mode = RCV_FIRST if rsm is None else rsm
        fields = dict(fields)
        fields["name"] = name
        fields["handle"] = UInt(link.handle)
        fields["role"] = not sender
        if sender:
            fields.setdefault("initial_delivery_count", UInt(0))
        for key in ("snd_settle_mode", "rcv_settle_mode"):
            if fields.get(key) is not None:
                fields[key] = UByte(fields[key])
        self.attaching[(name, sender)] = link
        self.conn.write_frame(FRAME_AMQP, self.channel, D_ATTACH, fields)
        return link

    def end(self):
        """End the session from our side (2.5.5; link routes end the session of a routed
        link with it); the peer's END answers."""
        if self.ended:
            return
        self.ended = True                    # frames on it are ignored until the peer's END
        self.conn.write_frame(FRAME_AMQP, self.channel, D_END, {})
        self.conn.touch()

    cdef uint32_t alloc_handle(self, Link link):
        cdef Py_ssize_t i
        for i in range(len(self.local_handles)):
            if self.local_handles[i] is None:
                self.local_handles[i] = link
                return <uint32_t>i
        self.local_handles.append(link)
        return <uint32_t>(len(self.local_handles) - 1)

    cdef void free_handle(self, Link link):
        if link.handle < <uint32_t>len(self.local_handles) and \
                self.local_handles[link.handle] is link:
            self.local_handles[link.handle] = None
        if self.links.get(link.remote_handle) is link:
            del self.links[link.remote_handle]


cdef class Link:
    cdef readonly str name
    cdef readonly Session session
    cdef readonly Connection conn
    cdef readonly uint32_t handle            # ours
    cdef readonly uint32_t remote_handle
    cdef readonly int role                   # the router's role: ROLE_SENDER or ROLE_RECEIVER
    cdef readonly int snd_settle_mode
    cdef readonly int rcv_settle_mode
    cdef readonly int state
    cdef readonly Address address            # None: anonymous relay (per-message `to`)
    cdef readonly int64_t credit             # sender: consumer's credit; receiver: ours granted
    cdef int64_t revoked                     # receiver: revoked credit the peer may still use
    # receiver: transfers past its credit taken from the peer after each FLOW of ours, at most
    # `overshoot` (0 but for broker autolinks, qrouter/brokers.py); `overshot`: used since
    cdef public int64_t overshoot
    cdef int64_t overshot
    cdef int64_t waiting                     # receiver: its deliveries in address queues
    cdef readonly uint32_t delivery_count
    cdef bint drain
    cdef Delivery current                    # receiver: the delivery whose frames are arriving
    # sender: Delivery not yet written, in order. A list, not a deque: an empty deque costs
    # ~600 bytes per link, and this one stays within the link's credit.
    cdef list pending
    cdef uint32_t next_tag
    cdef readonly int64_t unsettled_count
    cdef readonly uint64_t max_message_size  # the peer's (sender) / ours (receiver); 0 none
    cdef bint in_blocked
    cdef readonly bint local_init            # we sent the first ATTACH
    cdef readonly bint endpoint              # deliveries go to / come from Python, not routing
    cdef readonly int64_t n_delivered, n_accepted, n_released, n_rejected, n_modified
    cdef readonly double no_credit_since     # monotonic seconds; 0 while credit > 0
    cdef public object info                  # the control plane's own data about the link
    # durability 2 (durable.pxi): the terminus digest that keys its records in the store, the
    # deliveries held for resumption, and the nonce of this attachment's delivery tags
    cdef public bytes durable_key
    cdef public str origin_prefix            # journal: "<container>/<link>/" of a producer
    cdef JournalLink jlink                   # journal: its strings, made at its first row
    cdef public str journal_address          # journal: an endpoint link's address (no Address)
    cdef EoEntry eo                          # a guaranteed topic's link (eo_links.pxi)
    cdef dict resumable
    cdef uint32_t tag_nonce
    # --- mesh (issue 4, docs/mesh.md "Data plane"): set by qrouter/inter_router.py ---
    # inter_router: a per-address link on an inter-router connection (either role).
    # cost: path cost to the nearest consumer behind it (0 for local consumers);
    # transit_ok: a delivery that arrived from another router may take it (the neighbour is
    # strictly closer to a consumer than we are: the gradient rule, loop-free);
    # valid_origins: multicast copies that entered the mesh at one of these routers may take it
    cdef public bint inter_router
    cdef public int64_t cost
    cdef public bint transit_ok
    cdef public frozenset valid_origins
    # --- end mesh ---
    # link routes (linkroute.pxi): the link on the other connection this one is paired with
    cdef readonly Link route_peer

    def __cinit__(self):
        self.pending = []
        self.tag_nonce = <uint32_t>rand() ^ (<uint32_t>(monotonic() * 1000003) << 7)

    @property
    def address_name(self):
        return self.address.name if self.address is not None else None

    @property
    def pending_count(self):
        return len(self.pending)

    @property
    def is_sender(self):
        return self.role == ROLE_SENDER

    # --- control API (called by qrouter/core.py) ---------------------------------------------

    def attach(self, dict fields):
        """Send the router's ATTACH for this link (2.6.3); fields as in FIELDS[D_ATTACH]
        (name, handle and role are filled in)."""
        if self.state != LINK_ATTACHING or self.local_init:
            raise RuntimeError("link already attached")
        fields = dict(fields)
        fields["name"] = self.name
        fields["handle"] = UInt(self.handle)
        fields["role"] = self.role == ROLE_RECEIVER
        if self.role == ROLE_SENDER:
            fields.setdefault("initial_delivery_count", UInt(0))
            snd = fields.get("snd_settle_mode")
            if snd is not None:
                self.snd_settle_mode = snd
        else:
            rcv = fields.get("rcv_settle_mode")
            if rcv is not None:
                self.rcv_settle_mode = rcv
            mms = fields.get("max_message_size")
            if mms:
                self.max_message_size = mms
        for key in ("snd_settle_mode", "rcv_settle_mode"):
            if fields.get(key) is not None:
                fields[key] = UByte(fields[key])
        self.conn.write_frame(FRAME_AMQP, self.session.channel, D_ATTACH, fields)
        self.state = LINK_ATTACHED
        self.conn.touch()

    def bind(self, str address not None, int distribution):
        """Join the address (created on first use with this distribution): a consumer link
        (router sender) receives its deliveries; a producer link feeds it and gets credit
        proxied from its consumers."""
        cdef Address a = self.conn.router.get_address(address, distribution)
        self.address = a
        if self.role == ROLE_SENDER:
            a.add_consumer(self)
        else:
            a.add_producer(self)

    def bind_anonymous(self):
        """A producer link with a null target: each message is routed by its `to`."""
        self.address = None
        self.conn.router.anonymous_producer(self)

    def detach(self, condition=None, description=None, bint closed=True):
        """Detach from the router's side (2.6.4), e.g. to refuse an attach or on link stealing."""
        if self.state == LINK_DETACHED:
            return
        if self.state == LINK_ATTACHING and not self.local_init:
            # 2.6.3: a refused link is still attached first (null terminus), then detached
            self.attach({"source": None, "target": None})
        self.conn.write_frame(FRAME_AMQP, self.session.channel, D_DETACH, {
            "handle": UInt(self.handle), "closed": closed,
            "error": error_value(condition, description)})
        self.state = LINK_DETACHED
        self.conn.touch()
        self.lost()
        # the handles stay reserved until the peer's DETACH answers ours (2.6.4)

    def bind_endpoint(self):
        """Deliveries on this link are Python's (a client, the management node): received
        ones go to handler.on_message, sent ones come from send()."""
        self.endpoint = True

    def send(self, bytes tag not None, bytes payload not None, bint settled=False,
             uint32_t message_format=0, bint resume=False, bytes state=None,
             str origin_prefix=None, bytes origin_tag=None):
        """Send a message on an endpoint link; it waits in order for credit and window.
        `resume` and `state` resend a delivery after re-attach (2.6.13): e.g. settled with
        the receiver's terminal state and no payload. `origin_prefix` and `origin_tag`: the
        publisher it comes from, for the journal (guaranteed topics)."""
        return self.c_send(tag, payload, settled, message_format, resume, state, origin_prefix,
                           origin_tag)

    cdef Delivery c_send(self, bytes tag, bytes payload, bint settled, uint32_t message_format,
                         bint resume, bytes state, str origin_prefix, bytes origin_tag):
        cdef Delivery out, src
        cdef JournalBuffer jb = self.conn.router.jbuf
        if self.role != ROLE_SENDER or not self.endpoint:
            raise RuntimeError("send() needs an endpoint link where we are the sender")
        if len(tag) > MAX_TAG:
            raise ValueError("a delivery-tag is at most 32 bytes (2.8.7)")
        out = Delivery.new(self, 0, tag)
        out.payload = payload
        out.presettled = settled
        out.message_format = message_format
        out.resume = resume
        out.send_state = state
        if jb is not None and origin_prefix is not None and origin_tag is not None:
            src = Delivery.new(None, 0, origin_tag)
            src.jorigin = journal_origin(jb, origin_prefix)
            if jb.sampling:
                src.jskip = not jb.keep(src.jorigin, origin_tag)
            out.jsrc = src
        if len(self.pending) == 0 and self.credit > 0 and \
                self.session.remote_incoming_window > 0 and self.conn.state == CS_OPENED and \
                self.state == LINK_ATTACHED and not self.conn.write_paused:
            self.conn.write_transfer(self, out, <const uint8_t*>PyBytes_AS_STRING(payload),
                                     PyBytes_GET_SIZE(payload))
        else:
            self.pending.append(out)
            self.block()
        return out

    def take_resumable(self):
        """The unsettled deliveries a durable link held when it went away (tag -> Delivery),
        for its terminus to keep until the link resumes."""
        out = self.resumable or {}
        self.resumable = None
        return out

    def set_resumable(self, dict held):
        """A resumed durable producer link: deliveries the router holds, by tag; a transfer
        with one of these tags re-binds to it instead of being routed again (2.6.13)."""
        self.resumable = held if held else None
        resume_credit(self)

    def resend(self, Delivery out not None, bint resume, bint with_payload, bytes state=None,
               bint settled=False):
        """A resumed durable consumer link: send a held copy again under its tag (2.6.13):
        with its payload, or none when the consumer has a terminal state already."""
        cdef bytes p
        out.link = self
        out.sent = False
        out.offset = 0
        out.settled = False
        out.resume = resume
        out.send_state = state
        if settled:
            out.presettled = True
        if with_payload:
            p = out.inbound.payload if out.inbound is not None and \
                out.inbound.payload is not None else out.payload
            out.payload = p if p is not None else b""
        else:
            out.payload = b""
        out.own_payload = True
        self.pending.append(out)
        self.block()
        self.send_pending()

    def flow(self, int64_t credit):
        """Grant credit to a producer (control path: e.g. a link the core wants to feed)."""
        self.credit = credit
        # as every engine grant does: else a link once at zero (a guaranteed topic's
        # publisher, whose window fills) stays stamped, reported stalled while it has credit
        self.credit_changed()
        self.conn.write_flow(self.session, self, False)
        self.conn.touch()

    # --- data path ----------------------------------------------------------------------------

    cdef int lost(self) except -1:
        """The link is gone (detached, session ended, connection lost): settle what it held.
        2.6.12: an outbound delivery the peer may have seen returns MODIFIED(delivery-failed);
        one never written returns RELEASED, or goes to another consumer (anycast)."""
        cdef Delivery d
        cdef Address a = self.address
        cdef list mine
        if self.role == ROLE_SENDER:
            if a is not None:
                a.remove_consumer(self)
            pend = self.pending
            self.pending = []
            mine = [d for d in self.session.unsettled_out.values() if d.link is self]
            for d in mine:
                self.session.unsettled_out.pop(d.delivery_id)
                d.link = None
                if self.durable_key is not None:
                    # suspended, not gone: the copy waits for the consumer to resume
                    if self.resumable is None:
                        self.resumable = {}
                    self.resumable[d.tag] = d
                    continue
                d.settled = True
                if d.inbound is not None:
                    copy_outcome(d, D_MODIFIED, _STATE_MODIFIED_FAILED)
            for d in pend:
                d.link = None
                if d.inbound is None:
                    continue
                if d.offset == 0 and not d.own_payload:
                    unheld(d.inbound)         # backpressure.pxi: it leaves this queue
                if a is not None and a.distribution != DIST_MULTICAST and d.inbound.copies is None:
                    d.inbound.out = None
                    a.forward(d.inbound, NULL, 0)
                else:
                    copy_outcome(d, D_RELEASED, _STATE_RELEASED)
            if a is not None:
                a.grant()
        else:
            if a is not None:
                a.remove_producer(self)
            else:
                self.conn.router.anonymous.discard(self)
            self.current = None
            mine = [d for d in self.session.unsettled_in.values() if d.link is self]
            for d in mine:
                self.session.unsettled_in.pop(d.delivery_id)
                d.link = None
                if self.durable_key is not None:
                    if self.resumable is None:
                        self.resumable = {}
                    self.resumable[d.tag] = d
        self.state = LINK_DETACHED
        return 0

    cdef inline void credit_changed(self) noexcept:
        if self.credit > 0:
            self.no_credit_since = 0
        elif self.no_credit_since == 0:
            self.no_credit_since = self.conn.router.now()

    cdef Delivery deliver(self, Delivery inb, const uint8_t* data, Py_ssize_t n):
        """Send a copy of `inb` to this consumer (or queue it behind earlier ones)."""
        cdef Delivery out = Delivery.new(self, 0, None)
        out.inbound = inb
        out.presettled = inb.presettled
        out.message_format = inb.message_format
        if len(self.pending) == 0 and self.credit > 0 and \
                self.session.remote_incoming_window > 0 and self.conn.state == CS_OPENED and \
                not self.conn.write_paused:
            if not self.conn.write_transfer(self, out, data, n):
                # 2.5.6: the session window closed mid-message; keep the rest (write_transfer
                # blocked the link) so send_pending resumes it at out.offset
                if inb.payload is None:
                    inb.payload = PyBytes_FromStringAndSize(<char*>data, n)
                self.pending.append(out)
        else:
            if inb.payload is None:
                inb.payload = PyBytes_FromStringAndSize(<char*>data, n)
            self.pending.append(out)
            self.block()
            held(inb)        # backpressure.pxi: a copy waiting in the router
        return out

    cdef inline void block(self) noexcept:
        if not self.in_blocked:
            self.in_blocked = True
            self.session.blocked.append(self)

    cdef int send_pending(self) except -1:
        cdef Delivery out
        cdef bytes p
        while len(self.pending) and self.session.remote_incoming_window > 0:
            out = self.pending[0]
            if out.offset == 0 and (self.credit <= 0 or self.conn.write_paused):
                # 2.6.7: a new delivery needs credit (and room in the connection's outbound
                # buffer, backpressure.pxi); a started one may finish
                break
            if out.offset == 0 and out.inbound is not None and not out.own_payload:
                unheld(out.inbound)  # a copy deliver() queued leaves the queue (held)
            if out.offset == 0 and (out.settled or (
                    not out.own_payload and out.inbound is not None and
                    orphan(out.inbound))):
                # the producer went away before this copy was written: drop it (never seen);
                # a durable producer's delivery is held for it, not gone
                del self.pending[0]
                continue
            p = out.payload if out.inbound is None or out.own_payload else out.inbound.payload
            if not self.conn.write_transfer(self, out, <const uint8_t*>PyBytes_AS_STRING(p),
                                            PyBytes_GET_SIZE(p)):
                break        # window closed mid-message; resumes at out.offset
            del self.pending[0]
        return 0


cdef bytes _STATE_MODIFIED_FAILED = b"\x00\x53\x27\xc0\x03\x02\x41\x42"
