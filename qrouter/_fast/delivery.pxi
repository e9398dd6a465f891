# Deliveries (2.6.12): one object per message per link. An inbound delivery (from a producer)
# owns its outbound copies (to consumers); dispositions flow between them. (Included by
# engine.pyx.)


# 3.4 outcomes ranked for multicast: the producer gets the strongest terminal state of the
# copies (REJECTED > ACCEPTED > MODIFIED > RELEASED), as DESIGN.md section 4 states.
cdef inline int outcome_rank(int code) noexcept:
    if code == D_REJECTED:
        return 4
    if code == D_ACCEPTED:
        return 3
    if code == D_MODIFIED:
        return 2
    if code == D_RELEASED:
        return 1
    return 0


cdef inline bint is_terminal(int code) noexcept:
    return code == D_ACCEPTED or code == D_REJECTED or code == D_RELEASED or code == D_MODIFIED


@cython.freelist(4096)
cdef class Delivery:
    cdef Link link                # the link it travels on (None once that link is gone)
    cdef uint32_t delivery_id
    cdef bytes tag
    cdef object payload           # bytes once kept (queued, multi-frame); None while in the frame
    cdef object partial           # bytearray while a multi-frame delivery is arriving
    cdef uint32_t message_format
    cdef bint presettled          # the sender settled it on the first frame (at-most-once)
    cdef bint settled             # settled at our end (no longer in the session's unsettled map)
    cdef bint sent                # outbound: its first TRANSFER was written (the peer may have it)
    cdef bint settle_written      # outbound: settled awaiting the peer before it was written
    cdef Py_ssize_t offset        # outbound: payload bytes already written (frames split)
    cdef int remote_state         # last state the peer reported (descriptor code, 0 = none)
    cdef bytes remote_state_raw   # that state encoded, forwarded as it came
    cdef Delivery inbound         # outbound copy -> the delivery it copies
    cdef Delivery out             # inbound anycast -> its one copy
    cdef list copies              # inbound multicast -> its copies
    cdef int pending_copies       # multicast: copies not yet in a terminal state
    cdef int best                 # multicast: strongest terminal state so far
    cdef bytes best_raw
    cdef bint outcome_sent        # inbound: the producer has been told the outcome
    cdef bint remote_settled      # the peer settled it
    cdef bint resume              # 2.6.13: sent / received with resume=true
    cdef bytes send_state         # a state to carry in the TRANSFER itself (resumption)
    cdef bytes durable_key        # inbound on a durable link: its terminus digest (store key)
    cdef bytes skey               # durable: its record's store key, once made (durable.pxi)
    cdef uint32_t jgen            # durable: the batch (Router.jgen) that made its record
    cdef bint tag_in_value        # durable: its record is stored under an id, the tag inside
    cdef int outcome_code         # inbound: the outcome told (or to tell) the producer
    cdef bytes outcome_raw
    cdef bint own_payload         # outbound resent: its payload is its own (maybe empty)
    cdef JournalLink jorigin      # journal: the link it arrived on (origin = its prefix + tag)
    cdef bint jskip               # journal: sampled out, with every copy (journal.pxi)
    cdef uint32_t jtag            # journal: the router's tag when `tag` is None (outbound)
    cdef Delivery jsrc            # journal: the origin of one Python sends (Link.send)
    cdef bytes jotag              # journal: the origin's tag when not `tag` (from a router)
    cdef bint transit             # mesh: inbound on an inter-router link (not from a client)
    cdef DeadLetter dead_letter   # a dead-letter resend: what it stands for (diversion.pxi)

    @staticmethod
    cdef inline Delivery new(Link link, uint32_t delivery_id, bytes tag):
        cdef Delivery d = Delivery.__new__(Delivery)
        d.link = link
        d.delivery_id = delivery_id
        d.tag = tag
        return d

    # --- Python API (endpoint links: the client API, the management node) ------------------

    @property
    def delivery_tag(self):
        return self.tag

    @property
    def id(self):
        return self.delivery_id

    @property
    def remote_state_code(self):
        """The descriptor code of the peer's last state (0x24 accepted ...), 0 for none."""
        return self.remote_state

    @property
    def remote_state_bytes(self):
        return self.remote_state_raw

    @property
    def is_settled(self):
        return self.settled

    @property
    def was_sent(self):
        """Outbound: its first TRANSFER was written (the peer may have it)."""
        return self.sent

    @property
    def is_remote_settled(self):
        return self.remote_settled

    @property
    def is_presettled(self):
        return self.presettled

    @property
    def outcome_bytes(self):
        """Inbound: the encoded outcome the producer was (or will be) told; None if none."""
        return self.outcome_raw

    @property
    def inbound_delivery(self):
        """Outbound copy: the delivery it copies (None once that one is gone)."""
        return self.inbound

    @property
    def resumed(self):
        """It arrived with resume=true (2.6.13): the peer resends one the link knew."""
        return self.resume

    def update(self, int code, detail=None, bint settle=True):
        """Receiver side: report a state for this delivery (3.4), settling it unless told
        otherwise (exactly-once receivers settle after the sender, 3.8.3)."""
        self.c_update(code, detail, settle)

    cdef int c_update(self, int code, object detail, bint settle) except -1:
        cdef Link link = self.link
        if link is None or self.settled or self.presettled:
            return 0
        raw = encode_state(code, detail) if code else None
        if settle:
            self.settled = True
            link.session.unsettled_in.pop(self.delivery_id)
            link.unsettled_count -= 1
        link.conn.queue_disposition(link.session, True, self.delivery_id, settle, raw)
        return 0

    def settle(self, bint await_peer=False):
        """Sender side: settle a delivery Python sent (e.g. once its outcome is known).
        `await_peer`: keep it until the receiver settles in return, which on_outcome reports
        (settled, no state): exactly-once topics take that as proof that the subscriber has
        seen the settlement. One not yet written is dropped unseen (send_pending), unless the
        peer is awaited: then it is written first and settled once written."""
        self.c_settle(await_peer)

    cdef int c_settle(self, bint await_peer) except -1:
        cdef Link link = self.link
        if link is None or self.settled:
            return 0
        if not self.sent and await_peer:
            # The settlement is what this delivery carries (eo_links.pxi c_settle_subscriber: an
            # empty resumed transfer, 2.6.13, naming a delivery the subscriber reported on
            # attach), and it waits for the peer's credit. Dropped unseen, it would leave the
            # peer holding the delivery and us waiting for its settle in return, for ever:
            # write_transfer settles it once it is written.
            self.settle_written = True
            return 0
        self.settled = True
        if not self.sent:
            return 0
        if not await_peer or self.remote_settled:
            if link.session.unsettled_out.pop(self.delivery_id) is not None:
                link.unsettled_count -= 1
        link.conn.queue_disposition(link.session, False, self.delivery_id, True,
                                    self.remote_state_raw)
        return 0

    def confirm_settled(self):
        """Receiver side, once the sender has settled (receiver-settle-mode second, 3.8.3):
        settle in return, so the sender knows we have seen its settlement."""
        cdef Link link = self.link
        if link is None or not self.remote_settled:
            return
        link.conn.queue_disposition(link.session, True, self.delivery_id, True, None)


cdef inline bint orphan(Delivery inb) noexcept:
    """An unsettled inbound delivery whose producer is gone, and that nobody waits for: no
    durable terminus holds it, and it is no dead-letter resend (the router's own message)."""
    return inb.link is None and not inb.presettled and inb.durable_key is None and \
        inb.dead_letter is None
