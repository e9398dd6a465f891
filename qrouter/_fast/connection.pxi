# One AMQP connection (2.4): protocol headers, SASL (5.3), frames (2.3), sessions and the
# per-message performatives. (Included by engine.pyx.)

from cpython.bytearray cimport PyByteArray_AS_STRING, PyByteArray_FromStringAndSize
from posix.time cimport CLOCK_MONOTONIC, clock_gettime, timespec


class ProtocolError(Exception):
    """A peer broke the protocol: the connection is closed with this condition (2.8.15/16)."""
    def __init__(self, condition, description):
        super().__init__(f"{condition}: {description}")
        self.condition = condition
        self.description = description


cdef inline double monotonic() noexcept:
    cdef timespec ts
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return ts.tv_sec + ts.tv_nsec * 1e-9


# A socket read being parsed (Connection.consume; nested reads counted), and a number new to
# each read: the guaranteed topics' clock (EoLinks.c_now) is read once per read rather than
# once per transfer or outcome in it, so every input of a read is stamped with the time of
# its first input that asked. That time lags the true one by at most the read's processing
# (uvloop's time() is read afresh at each call, eo_links.pxi's _uv_clock_of): the
# idempotent-publishing dedup window and the terminus timers an input starts can end that
# much earlier, no more (and an expiry judged at such an input is judged that much later).
cdef Py_ssize_t _reading = 0
cdef unsigned long long _read_serial = 0


cdef inline uint16_t be16(const uint8_t* p) noexcept:
    return (<uint16_t>p[0] << 8) | p[1]


cdef inline uint32_t be32(const uint8_t* p) noexcept:
    return (<uint32_t>p[0] << 24) | (<uint32_t>p[1] << 16) | (<uint32_t>p[2] << 8) | p[3]


cdef class Connection:
    cdef readonly Router router
    cdef public object handler                 # the control plane's callbacks (qrouter/core.py)
    cdef public object transport               # has write(bytes) and close(); None in tests
    cdef public object info                    # the control plane's own data
    cdef Writer out
    cdef bytearray inbuf                       # an incomplete frame carried to the next feed
    cdef Py_ssize_t inbuf_need                 # the bytes inbuf must hold to be worth a parse
    cdef readonly int state
    cdef readonly int64_t conn_id
    cdef tuple sasl_mechanisms
    cdef bint require_sasl
    cdef readonly bint sasl_done
    cdef readonly str user                     # authenticated identity (None: anonymous)
    cdef readonly uint32_t max_frame_size      # ours: the largest frame we accept
    cdef readonly uint32_t remote_max_frame_size
    cdef public uint16_t channel_max    # the policy may lower it before our OPEN (2.7.1)
    cdef readonly uint16_t remote_channel_max
    cdef readonly uint32_t idle_timeout_ms     # ours
    cdef readonly uint32_t remote_idle_timeout_ms
    cdef readonly uint64_t max_message_size
    cdef readonly str remote_container_id
    cdef readonly object remote_open           # the peer's OPEN fields (dict)
    cdef dict sessions                         # remote channel -> Session
    cdef list local_sessions                   # our channel -> Session or None
    cdef bint dirty
    cdef readonly bint open_sent
    cdef bint closing                          # close the transport once output is written
    cdef readonly double last_read
    cdef readonly double last_write
    cdef readonly int64_t bytes_in, bytes_out, frames_in
    cdef readonly object error                 # (condition, description) we closed with
    cdef readonly object remote_error          # the peer's CLOSE error
    # one DISPOSITION being coalesced (consecutive ids, same role/settled/state: 2.7.6 ranges)
    cdef bint d_pending
    cdef Session d_session
    cdef bint d_role
    cdef bint d_settled
    cdef uint32_t d_first, d_last
    cdef bytes d_state
    # client side (the router's connectors, the client API)
    cdef readonly bint client
    cdef object sasl_client                    # (mechanism, initial-response, hostname, step)
    cdef bint sasl_challenged                  # server: a sasl-challenge awaits its response
    cdef public dict open_properties           # mesh: our OPEN's properties; None: the router's
    cdef public Limits limits                  # limits.pxi; None: not limited (inter-router)
    # deadlines.pxi: the handshake deadline, the partial-frame clock, a deferred SASL check
    cdef readonly double created
    cdef readonly double partial_since         # when the frame held in `inbuf` began; 0: none
    cdef public double handshake_timeout       # seconds for header + SASL + OPEN; 0: none
    cdef readonly bint sasl_pending            # a SASL check runs elsewhere (defer_sasl)
    # backpressure.pxi: the transport's write buffer is above its high-water mark
    cdef readonly bint write_paused
    cdef readonly int64_t n_write_pauses
    # trace.pxi: log every frame read and written (qrouter.trace); set per connection
    cdef public bint trace
    # fairness: at most `control_budget` control frames (anything but TRANSFER, FLOW and
    # DISPOSITION) per feed; the rest waits in `inbuf` and `yielded` tells the server to
    # feed again on a later loop turn (0: no budget, as the client library uses it)
    cdef public int control_budget
    cdef readonly int control_used
    cdef readonly bint yielded

    def __init__(self, Router router not None, handler, *, sasl_mechanisms=("ANONYMOUS", "PLAIN"),
                 bint require_sasl=False, uint32_t max_frame_size=65536,
                 uint16_t channel_max=32767, double idle_timeout=16.0,
                 uint64_t max_message_size=0):
        self.router = router
        self.handler = handler
        self.out = Writer(16384)
        self.state = CS_HEADER
        self.sasl_mechanisms = tuple(sasl_mechanisms)
        self.require_sasl = require_sasl
        self.max_frame_size = max_frame_size if max_frame_size >= MIN_MAX_FRAME_SIZE \
            else MIN_MAX_FRAME_SIZE
        self.remote_max_frame_size = MIN_MAX_FRAME_SIZE
        self.channel_max = channel_max
        self.remote_channel_max = 0
        self.idle_timeout_ms = <uint32_t>(idle_timeout * 1000)
        self.max_message_size = max_message_size
        self.sessions = {}
        self.local_sessions = []
        router.next_conn_id += 1
        self.conn_id = router.next_conn_id
        self.last_read = self.last_write = self.created = monotonic()

    # --- Python API ---------------------------------------------------------------------------

    cpdef feed(self, data):
        """Consume bytes read from the socket."""
        cdef bytes b
        if self.state == CS_CLOSED or self.closing:
            return
        b = data if type(data) is bytes else bytes(data)
        self.control_used = 0
        self.yielded = False
        if b:
            self.bytes_in += len(b)
            self.last_read = monotonic()
        if self.inbuf is not None:
            if 8 <= len(self.inbuf) < self.inbuf_need < len(self.inbuf) + len(b):
                # a big read that completes the held frame and goes on: the frame is made
                # whole on its own and the rest parsed in place, so a stream's every read is
                # not copied twice more
                return self.complete_held(b)
            # appended in place, parsed only once the frame can be whole: a frame that comes a
            # byte at a time costs its size once, not its size squared
            self.inbuf += b
            if len(self.inbuf) < self.inbuf_need:
                return
            b = bytes(self.inbuf)
            self.inbuf = None
        self.consume(b, 0)

    cdef int complete_held(self, bytes b) except -1:
        cdef Py_ssize_t have = len(self.inbuf), take = self.inbuf_need - have
        cdef bytes head = PyBytes_FromStringAndSize(NULL, self.inbuf_need)
        memcpy(PyBytes_AS_STRING(head), PyByteArray_AS_STRING(self.inbuf), have)
        memcpy(PyBytes_AS_STRING(head) + have, PyBytes_AS_STRING(b), take)
        self.inbuf = None
        self.consume(head, 0)
        if self.state == CS_CLOSED or self.closing:
            return 0
        if self.inbuf is not None:            # held again (yielded, SASL pending): keep the rest
            self.inbuf += b[take:]
            return 0
        return self.consume(b, take)

    cdef int consume(self, bytes b, Py_ssize_t start) except -1:
        global _reading, _read_serial
        cdef Py_ssize_t pos = start
        if self.sasl_pending and PyBytes_GET_SIZE(b) - start > self.max_frame_size:
            # bytes pipelined behind a sasl-init are held, not read, until the outcome
            self.fail("amqp:connection:framing-error",
                      f"more than {self.max_frame_size} bytes sent before the SASL outcome")
            return 0
        _read_serial += 1
        _reading += 1
        try:
            pos = self.parse(b, start)
            if pos < len(b) and self.state != CS_CLOSED and not self.closing:
                self.inbuf = PyByteArray_FromStringAndSize(PyBytes_AS_STRING(b) + pos,
                                                           len(b) - pos)
                self.inbuf_need = self.partial_need(self.inbuf)
        except DecodeError as e:
            self.router.n_decode_errors += 1
            self.fail("amqp:decode-error", str(e))
        except ProtocolError as e:
            self.fail(e.condition, e.description)
        except Exception as e:
            log.exception("[C%d] internal error", self.conn_id)
            self.fail("amqp:internal-error", f"{type(e).__name__}: {e}")
        finally:
            _reading -= 1
        if self.router.jbuf is not None:
            self.router.jbuf.frame_ns = 0         # a frame that failed: no reading left behind
        note_partial(self, pos - start)
        return 0

    def defer_sasl(self):
        """Called by the handler's on_sasl or on_sasl_response: the outcome comes later, from
        complete_sasl. Until then nothing after the sasl-init (or -response) is read (5.3.2:
        the outcome ends the SASL layer); the bytes are held, at most max-frame-size of them."""
        self.sasl_pending = True

    def received(self, data, Py_ssize_t flush_now_bytes):
        """A socket read (the server's data_received): `feed(data)`, and after a read of at
        most `flush_now_bytes` the router's flush at once (read_path.pxi). True when the
        control plane has work: the read held control frames, or the engine yielded."""
        return read_received(self, data, flush_now_bytes)

    def complete_sasl(self, result):
        """The outcome of a deferred SASL check: a user name or True (accepted), False
        (5.3.3.6 code 1, auth) or an outcome code (4, sys-temp); then the held bytes are read."""
        cdef bytes held = None
        if not self.sasl_pending:
            return
        self.sasl_pending = False
        if self.state != CS_SASL or self.closing:
            return                            # closed meanwhile (deadline, peer gone)
        self.sasl_answer(result)
        if self.inbuf is not None:
            held = bytes(self.inbuf)              # the partial-frame buffer is a bytearray
        self.inbuf = None
        if held is not None and self.state != CS_CLOSED and not self.closing:
            self.consume(held, 0)

    def start(self, mechanism=None, initial_response=None, hostname=None, step=None):
        """Client side: send our protocol header (2.2); with a SASL mechanism, the SASL
        header first (5.3.2), and the AMQP header once the server accepted us.

        `step(kind, data)`, for mechanisms with challenges (SCRAM): called with
        ("challenge", bytes) it returns the sasl-response bytes (5.3.3.4); with ("outcome",
        additional-data or None) after a successful outcome, whether the server proved itself
        (False or an exception closes the connection)."""
        self.client = True
        if mechanism is not None:
            self.sasl_client = (mechanism, initial_response, hostname, step)
            self.out.put_raw(<const uint8_t*>b"AMQP\x03\x01\x00\x00", 8)
        else:
            self.out.put_raw(<const uint8_t*>b"AMQP\x00\x01\x00\x00", 8)
        self.touch()

    def begin(self):
        """Client side: begin a session (2.5.2); links may be attached before the reply."""
        cdef Session s = Session()
        cdef Py_ssize_t i
        s.conn = self
        for i in range(len(self.local_sessions)):
            if self.local_sessions[i] is None:
                break
        else:
            i = len(self.local_sessions)
            self.local_sessions.append(None)
        self.local_sessions[i] = s
        s.channel = <uint16_t>i
        self.write_frame(FRAME_AMQP, s.channel, D_BEGIN, {
            "next_outgoing_id": UInt(0),
            "incoming_window": UInt(WINDOW_MAX),
            "outgoing_window": UInt(WINDOW_MAX),
            "handle_max": UInt(s.handle_max),
        })
        return s

    def take_output(self):
        """The bytes written since the last call (tests drive the engine with this)."""
        if self.d_pending:
            self.flush_disp()
        self.dirty = False
        if self.trace:
            trace_out(self)
        return self.out.take()

    def connection_lost(self):
        """The socket is gone: every link is lost (its deliveries go back, 2.6.12)."""
        if self.state == CS_CLOSED:
            return
        self.state = CS_CLOSED
        self.teardown()

    def close(self, condition=None, description=None):
        """Close from the router's side (2.4.3), with an optional error."""
        if condition is None:
            if self.state == CS_OPENED:
                self.write_frame(FRAME_AMQP, 0, D_CLOSE, {})
                self.state = CS_CLOSE_SENT
                self.touch()
            else:
                self.closing = True
                self.touch()
            return
        self.fail(condition, description)

    def tick(self, double now=0):
        """Heartbeats and idle detection (2.4.5); called about once a second."""
        if now == 0:
            now = monotonic()
        if self.state == CS_CLOSED:
            return
        if check_deadlines(self, now):
            return
        if self.idle_timeout_ms and now - self.last_read > self.idle_timeout_ms / 1000.0:
            self.fail("amqp:resource-limit-exceeded", "local-idle-timeout expired")
            return
        if self.state == CS_OPENED and self.remote_idle_timeout_ms and \
                now - self.last_write >= self.remote_idle_timeout_ms / 2000.0:
            begin_frame(self.out, FRAME_AMQP, 0)
            self.out.patch_u32(self.out.length - 8, 8)
            self.touch()

    def pause_writing(self):
        """The transport's write buffer rose above its high-water mark (asyncio's
        Protocol.pause_writing): no new deliveries go out, producers get no more credit
        for it (backpressure.pxi)."""
        conn_pause(self)

    def resume_writing(self):
        """The write buffer fell below its low-water mark: deliveries flow again."""
        conn_resume(self)

    @property
    def write_backlog(self):
        """Octets written for the peer and not yet on the wire: the engine's output of this
        loop iteration plus the transport's buffer. Control plane only."""
        size = getattr(self.transport, "get_write_buffer_size", None)
        return self.out.length + (size() if size is not None else 0)

    @property
    def session_count(self):
        return len(self.sessions)

    def links(self):
        out = []
        for s in self.sessions.values():
            out.extend((<Session>s).links.values())
        return out

    @property
    def closed(self):
        return self.state == CS_CLOSED

    # --- output -------------------------------------------------------------------------------

    cdef inline void touch(self) noexcept:
        if not self.dirty:
            self.dirty = True
            self.router.mark_dirty(self)

    cdef int flush_output(self) except -1:
        self.dirty = False
        if self.d_pending:
            self.flush_disp()
        if self.out.length and self.transport is not None:
            if self.trace:
                trace_out(self)
            self.bytes_out += self.out.length
            self.last_write = monotonic()
            self.transport.write(self.out.take())
        if self.closing and self.transport is not None:
            t = self.transport
            self.transport = None
            if self.router.close_transport is not None:
                self.router.close_transport(t)    # the server's: reads on for the peer's end
            else:
                t.close()
        return 0

    cdef int write_frame(self, int ftype, uint16_t channel, int code, dict fields) except -1:
        cdef Py_ssize_t start
        if self.state == CS_CLOSED:
            return 0                          # nothing follows our CLOSE (2.4.3)
        if self.d_pending:
            self.flush_disp()
        start = self.out.length
        write_control(self.out, ftype, channel, code, fields)
        if self.out.length - start > self.remote_max_frame_size:
            fit_control(self, start, ftype, channel, code, fields)   # frame_size.pxi
        self.touch()
        return 0

    cdef int write_flow(self, Session s, Link link, bint echo) except -1:
        # 2.7.4 flow: the session window (we always re-open ours to WINDOW_MAX) and the link's
        # credit state
        cdef Py_ssize_t start, lst
        cdef uint32_t count = 4
        if self.state != CS_OPENED or s.ended:
            return 0
        if self.d_pending:
            self.flush_disp()
        start = begin_frame(self.out, FRAME_AMQP, s.channel)
        self.out.w_descriptor(D_FLOW)
        lst = self.out.begin_list()
        self.out.w_uint(s.next_incoming_id)
        self.out.w_uint(WINDOW_MAX)
        self.out.w_uint(s.next_outgoing_id)
        self.out.w_uint(WINDOW_MAX)
        s.window_base = s.next_incoming_id
        if link is not None:
            link.overshot = 0
            self.out.w_uint(link.handle)
            self.out.w_uint(link.delivery_count)
            self.out.w_uint(<uint32_t>(link.credit if link.credit > 0 else 0))
            self.out.w_null()
            self.out.w_bool(link.drain)
            count = 9
        if echo:
            while count < 9:
                self.out.w_null()
                count += 1
            self.out.w_bool(True)
            count = 10
        self.out.end_list(lst, count)
        end_frame(self.out, start)
        self.touch()
        return 0

    cdef int queue_disposition(self, Session s, bint role_receiver, uint32_t delivery_id,
                               bint settled, bytes state) except -1:
        if self.state != CS_OPENED or s.ended:
            return 0
        if self.d_pending:
            if self.d_session is s and self.d_role == role_receiver and \
                    self.d_settled == settled and self.d_state is state and \
                    delivery_id == self.d_last + 1:
                self.d_last = delivery_id
                return 0
            self.flush_disp()
        self.d_pending = True
        self.d_session = s
        self.d_role = role_receiver
        self.d_settled = settled
        self.d_first = self.d_last = delivery_id
        self.d_state = state
        self.touch()
        return 0

    cdef int flush_disp(self) except -1:
        # 2.7.6 disposition: role, first, last, settled, state
        cdef Py_ssize_t start, lst
        self.d_pending = False
        start = begin_frame(self.out, FRAME_AMQP, self.d_session.channel)
        self.out.w_descriptor(D_DISPOSITION)
        lst = self.out.begin_list()
        self.out.w_bool(self.d_role)
        self.out.w_uint(self.d_first)
        if self.d_last != self.d_first:
            self.out.w_uint(self.d_last)
        else:
            self.out.w_null()
        self.out.w_bool(self.d_settled)
        # 2.7.1 max-frame-size: a state too large for the peer's frames is cut down
        self.d_state = fit_state(self.d_state, <Py_ssize_t>self.remote_max_frame_size - 40)
        if self.d_state is not None:
            self.out.put_raw(<const uint8_t*>PyBytes_AS_STRING(self.d_state),
                             PyBytes_GET_SIZE(self.d_state))
            self.out.end_list(lst, 5)
        else:
            self.out.end_list(lst, 4)
        end_frame(self.out, start)
        self.d_session = None
        self.d_state = None
        return 0

    cdef int write_transfer(self, Link link, Delivery out, const uint8_t* data,
                            Py_ssize_t n) except -1:
        """Write `out` (its payload: data/n) on `link`, split to the peer's max-frame-size
        (2.6.14). Returns 1 when fully written, 0 when the session window closed first."""
        cdef Session s = link.session
        cdef Delivery inb = out.inbound
        cdef Py_ssize_t start, lst, chunk, room, tail
        cdef bint more, first, presettled
        cdef bytes state
        cdef uint8_t tag[4]
        if self.d_pending:
            self.flush_disp()
        presettled = out.presettled or link.snd_settle_mode == SND_SETTLED
        if out.offset == 0 and not out.sent:
            out.sent = True
            out.delivery_id = s.next_delivery_id
            s.next_delivery_id += 1
            out.link = link
            link.credit -= 1
            link.delivery_count += 1
            link.n_delivered += 1
            if link.credit <= 0:
                link.credit_changed()
            if presettled:
                out.settled = True
            else:
                s.unsettled_out.put(out.delivery_id, out)
                link.unsettled_count += 1
                if link.durable_key is not None and not link.endpoint:
                    if out.tag is None:
                        out.tag = durable_tag(link)
                    if not out.resume:
                        # a copy of a durable delivery names it (its record holds the bytes);
                        # a copy of any other keeps the bytes itself
                        if inb is not None and inb.durable_key is not None:
                            j_put(self.router, out, link.durable_key, None,
                                  record_origin(delivery_key(inb, inb.durable_key),
                                                PyBytes_GET_SIZE(inb.durable_key)), None,
                                  True)
                        else:
                            j_put(self.router, out, link.durable_key, None, None,
                                  PyBytes_FromStringAndSize(<char*>data, n), True)
        # 2.7.1 max-frame-size: no frame may exceed it. A state that would leave no room for
        # payload under it (a resend's terminal state, 2.6.13) is left out: it is optional.
        state = out.send_state
        if state is not None and \
                PyBytes_GET_SIZE(state) > <Py_ssize_t>self.remote_max_frame_size - 128:
            state = None
        while True:
            if s.remote_incoming_window <= 0:
                link.block()
                return 0
            first = out.offset == 0
            start = begin_frame(self.out, FRAME_AMQP, s.channel)
            self.out.w_descriptor(D_TRANSFER)
            lst = self.out.begin_list()
            self.out.w_uint(link.handle)
            if first:
                self.out.w_uint(out.delivery_id)
                if out.tag is not None:
                    self.out.w_binary(<const uint8_t*>PyBytes_AS_STRING(out.tag),
                                      PyBytes_GET_SIZE(out.tag))
                else:
                    # the router's tag: a per-link counter (unique among the link's unsettled)
                    tag[0] = link.next_tag >> 24
                    tag[1] = (link.next_tag >> 16) & 0xff
                    tag[2] = (link.next_tag >> 8) & 0xff
                    tag[3] = link.next_tag & 0xff
                    out.jtag = link.next_tag     # the journal's record of it
                    link.next_tag += 1
                    self.out.w_binary(tag, 4)
                if self.router.jbuf is not None:
                    # a resumed delivery continues one the receiver had (2.6.13)
                    jr(link, out, inb if inb is not None else out.jsrc,
                       J_RESUMED if out.resume else J_FORWARDED, J_NO_OUTCOME, n, -1)
                self.out.w_uint(out.message_format)
            else:
                self.out.w_null()
                self.out.w_null()
                self.out.w_null()
            self.out.w_bool(presettled)
            tail = self.out.length
            self.out.w_bool(False)            # more: set below, once the room is known
            if first and (out.resume or state is not None):
                # 2.7.5 rcv-settle-mode (null), state, resume
                self.out.w_null()
                if state is not None:
                    self.out.put_raw(<const uint8_t*>PyBytes_AS_STRING(state),
                                     PyBytes_GET_SIZE(state))
                else:
                    self.out.w_null()
                self.out.w_bool(out.resume)
            tail = self.out.length - tail     # bytes from `more` to the end of the list
            self.out.end_list(lst, 9 if first and (out.resume or state is not None) else 6)
            # 2.6.14 split: the room is what the peer's max-frame-size leaves after this
            # performative as written (tag, state and list encoding all vary)
            room = <Py_ssize_t>self.remote_max_frame_size - (self.out.length - start)
            chunk = n - out.offset
            more = chunk > room
            if more:
                chunk = room
                self.out.data[self.out.length - tail] = 0x41   # 1.6.2 true
            self.out.put_raw(data + out.offset, chunk)
            end_frame(self.out, start)
            s.next_outgoing_id += 1
            s.remote_incoming_window -= 1
            out.offset += chunk
            if not more:
                break
        self.touch()
        if out.settle_written:
            # settled awaiting the peer before it could be written (Delivery.c_settle): the
            # TRANSFER is out, the settling DISPOSITION follows it
            out.settle_written = False
            out.c_settle(True)
        if presettled and inb is not None:
            if not inb.presettled:
                # the consumer asked for settled deliveries (at-most-once): its copy is done
                copy_outcome(out, D_ACCEPTED, _STATE_ACCEPTED)
            elif inb.out is out:
                # at-most-once end to end: both are done; no reference cycle left (settle_copies)
                inb.out = None
        return 1

    # --- input --------------------------------------------------------------------------------

    cdef Py_ssize_t parse(self, bytes b, Py_ssize_t pos) except -1:
        # the frames of b from pos; returns where the first incomplete one starts
        cdef const uint8_t* p = <const uint8_t*>PyBytes_AS_STRING(b)
        cdef Py_ssize_t n = PyBytes_GET_SIZE(b)
        cdef uint32_t size
        cdef int doff, ftype
        cdef uint16_t channel
        cdef JournalBuffer jb = self.router.jbuf
        while pos < n:
            if self.state == CS_CLOSED or self.closing:
                return n
            if self.sasl_pending:
                return pos                    # held until complete_sasl (deadlines.pxi)
            if self.state == CS_HEADER or self.state == CS_SASL_DONE:
                if n - pos < 8:
                    # an incomplete header: check what we have so garbage fails at once
                    if memcmp(p + pos, b"AMQP", n - pos if n - pos < 4 else 4) != 0:
                        self.bad_header()
                        return n
                    return pos
                if self.trace:
                    trace_in(self, p + pos, 8)
                self.on_header(p + pos)
                pos += 8
                continue
            if n - pos < 8:
                return pos
            size = be32(p + pos)
            if size < 8:
                raise ProtocolError("amqp:connection:framing-error",
                                    f"frame size {size} is below the 8-byte header")
            if size > self.max_frame_size:
                raise ProtocolError("amqp:connection:framing-error",
                                    f"frame of {size} bytes exceeds max-frame-size "
                                    f"{self.max_frame_size}")
            if n - pos < size:
                return pos
            doff = p[pos + 4]
            ftype = p[pos + 5]
            channel = be16(p + pos + 6)
            if doff < 2 or <uint32_t>doff * 4 > size:
                raise ProtocolError("amqp:connection:framing-error", f"bad data offset {doff}")
            if self.control_budget and not is_hot_frame(p + pos + doff * 4, size - doff * 4):
                if self.control_used >= self.control_budget:
                    # one peer's burst of attaches (Python each) must not hold the event loop
                    # for everyone: the rest of its bytes wait for a later turn
                    self.yielded = True
                    return pos
                self.control_used += 1
            self.frames_in += 1
            if self.trace:
                trace_in(self, p + pos, size)
            if size > <uint32_t>doff * 4:          # an empty frame is a heartbeat (2.4.5)
                if jb is not None:
                    jb.frame_ns = -1                # journal: its rows share a clock reading
                self.on_frame(ftype, channel, p + pos + doff * 4, size - doff * 4)
                if jb is not None:
                    jb.frame_ns = 0
            pos += size
        return pos

    cdef Py_ssize_t partial_need(self, bytearray part) noexcept:
        # (a yielded buffer starts with a whole frame: its size is what it needs, so an empty
        # feed parses it)
        # What parse() needs before it can do more with `part`, the start of a frame (2.3.1):
        # its size, once the 8-byte header is there (parse checked it is <= max-frame-size);
        # else 8. A protocol header (2.2) is re-checked at every byte so garbage fails at once.
        cdef const uint8_t* p = <const uint8_t*>PyByteArray_AS_STRING(part)
        if self.state == CS_HEADER or self.state == CS_SASL_DONE:
            return 0
        if len(part) < 8:
            return 8
        return be32(p)

    cdef int bad_header(self) except -1:
        # 2.2: answer an unsupported header with the one we support, then close
        # (after a SASL outcome only the AMQP header can follow: 5.3.2)
        self.out.put_raw(<const uint8_t*>(b"AMQP\x03\x01\x00\x00" if self.sasl_mechanisms
                                          and self.state != CS_SASL_DONE
                                          else b"AMQP\x00\x01\x00\x00"), 8)
        self.closing = True
        self.state = CS_CLOSED
        self.teardown()
        self.touch()
        return 0

    cdef int on_header(self, const uint8_t* h) except -1:
        cdef bint sasl = memcmp(h, b"AMQP\x03\x01\x00\x00", 8) == 0
        cdef bint amqp = memcmp(h, b"AMQP\x00\x01\x00\x00", 8) == 0
        if self.client:
            # the server answers the header we sent: SASL first if we asked for it
            if self.state == CS_HEADER and self.sasl_client is not None and sasl:
                self.state = CS_SASL
                return 0
            if amqp and (self.state == CS_SASL_DONE or self.sasl_client is None):
                self.state = CS_OPEN_WAIT
                self.send_open()
                return 0
            self.error = ("amqp:connection:framing-error", "the server sent an unexpected "
                          f"protocol header {bytes(h[:8])!r}")
            self.closing = True
            self.state = CS_CLOSED
            self.teardown()
            return 0
        if self.state == CS_SASL_DONE:
            if not amqp:
                return self.bad_header()
            self.out.put_raw(<const uint8_t*>b"AMQP\x00\x01\x00\x00", 8)
            self.state = CS_OPEN_WAIT
            self.touch()
            return 0
        if sasl and self.sasl_mechanisms:
            # 5.3.2: our header, then the mechanisms we offer
            self.out.put_raw(<const uint8_t*>b"AMQP\x03\x01\x00\x00", 8)
            write_control(self.out, FRAME_SASL, 0, D_SASL_MECHANISMS, {
                "sasl_server_mechanisms": symbol_array(self.sasl_mechanisms)})
            self.state = CS_SASL
            self.touch()
            return 0
        if amqp and not self.require_sasl:
            self.out.put_raw(<const uint8_t*>b"AMQP\x00\x01\x00\x00", 8)
            self.state = CS_OPEN_WAIT
            self.touch()
            return 0
        return self.bad_header()

    cdef int on_frame(self, int ftype, uint16_t channel, const uint8_t* body,
                      Py_ssize_t n) except -1:
        cdef Reader r
        cdef uint64_t code
        cdef Session s
        r.p = body
        r.n = n
        r.pos = 0
        r_descriptor(&r, &code)
        if ftype == FRAME_SASL:
            if self.state != CS_SASL:
                raise ProtocolError("amqp:connection:framing-error",
                                    "SASL frame outside the SASL exchange")
            return self.on_sasl(code, r_value(&r))
        if ftype != FRAME_AMQP:
            raise ProtocolError("amqp:connection:framing-error", f"unknown frame type {ftype}")
        if self.state == CS_SASL:
            raise ProtocolError("amqp:connection:framing-error",
                                "AMQP frame during the SASL exchange")
        if self.state == CS_CLOSE_SENT and code != D_CLOSE:
            return 0                          # 2.4.3: after our CLOSE, wait for theirs
        if code == D_TRANSFER or code == D_FLOW or code == D_DISPOSITION:
            if self.state != CS_OPENED:
                raise ProtocolError("amqp:connection:framing-error",
                                    "performative before OPEN")
            s = self.sessions.get(channel)
            if s is None:
                raise ProtocolError("amqp:connection:framing-error",
                                    f"frame on channel {channel}, which has no session")
            if s.ended:
                return 0                      # a session we refused (limits.pxi): until END
            if code == D_TRANSFER:
                return self.on_transfer(s, &r)
            if code == D_FLOW:
                return self.on_flow(s, &r)
            return self.on_disposition(s, &r)
        if code > D_CLOSE or code < D_OPEN:
            raise ProtocolError("amqp:connection:framing-error",
                                f"unknown performative 0x{code:x}")
        fields = described_to_dict(Described(ULong(code), r_value(&r)))
        if not isinstance(fields, dict):
            raise DecodeError("performative body is not a list")
        if code == D_OPEN:
            return self.on_open(fields)
        if self.state == CS_OPEN_WAIT:
            raise ProtocolError("amqp:connection:framing-error", "first frame is not OPEN")
        if code == D_CLOSE:
            return self.on_close(fields)
        if code == D_BEGIN:
            return self.on_begin(channel, fields)
        s = self.sessions.get(channel)
        if s is None:
            raise ProtocolError("amqp:connection:framing-error",
                                f"frame on channel {channel}, which has no session")
        if s.ended and code != D_END:
            return 0                          # a session we refused (limits.pxi): until END
        if code == D_ATTACH:
            return self.on_attach(s, fields)
        if code == D_DETACH:
            return self.on_detach(s, fields)
        return self.on_end(s, fields)

    # --- control performatives (Python objects are fine here: once per link/connection) ----

    cdef int on_sasl(self, uint64_t code, object value) except -1:
        fields = described_to_dict(Described(ULong(code), value))
        if not isinstance(fields, dict):
            raise DecodeError("SASL frame body is not a list")  # 5.3.3: each is a list
        if self.client:
            return self.on_sasl_client(code, fields)
        if code == D_SASL_RESPONSE and self.sasl_challenged:
            # 5.3.3.4: the answer to our challenge; the handler bounds the round trips
            self.sasl_challenged = False
            try:
                ok = self.handler.on_sasl_response(self, fields.get("response"))
            except Exception:
                log.exception("[C%d] SASL handler failed", self.conn_id)
                self.sasl_pending = False
                ok = False
            if self.sasl_pending:
                return 0                      # the handler answers later: complete_sasl
            return self.sasl_answer(ok)
        if code != D_SASL_INIT or self.sasl_challenged:
            # out of sequence: a response nobody asked for, a second init, a challenge
            write_control(self.out, FRAME_SASL, 0, D_SASL_OUTCOME, {"code": UByte(2)})
            self.closing = True
            self.touch()
            return 0
        mech = str(fields.get("mechanism") or "")
        ok = False
        if mech in self.sasl_mechanisms:
            try:
                ok = self.handler.on_sasl(self, mech, fields.get("initial_response"),
                                          fields.get("hostname"))
            except Exception:
                log.exception("[C%d] SASL handler failed", self.conn_id)
                self.sasl_pending = False
                ok = False
            if self.sasl_pending:
                return 0                      # the handler answers later: complete_sasl
        return self.sasl_answer(ok)

    cdef int sasl_answer(self, object ok) except -1:
        """The handler's verdict on a sasl-init or sasl-response: bytes = send them as a
        sasl-challenge (5.3.3.3); (identity, additional-data) = success whose outcome carries
        the data (5.3.3.6; SCRAM's server-final-message); a str = success as that user;
        another true value = success, anonymous; false = failure (code 1, auth); an int = that
        outcome code (e.g. 4, sys-temp: a transient failure, the client may retry)."""
        additional = None
        if isinstance(ok, bytes):
            write_control(self.out, FRAME_SASL, 0, D_SASL_CHALLENGE, {"challenge": ok})
            self.sasl_challenged = True
            self.touch()
            return 0
        if isinstance(ok, tuple):
            ok, additional = ok
        if ok and type(ok) is not int:
            self.user = ok if isinstance(ok, str) else None
            self.sasl_done = True
            write_control(self.out, FRAME_SASL, 0, D_SASL_OUTCOME, {
                "code": UByte(0), "additional_data": additional})
            self.state = CS_SASL_DONE
        else:
            code = ok if type(ok) is int and 1 <= ok <= 4 else 1
            write_control(self.out, FRAME_SASL, 0, D_SASL_OUTCOME, {"code": UByte(code)})
            self.closing = True
            self.state = CS_CLOSED
        self.touch()
        return 0

    cdef int on_sasl_client(self, uint64_t code, dict fields) except -1:
        mech, response, hostname, step = self.sasl_client
        if code == D_SASL_MECHANISMS:
            offered = fields.get("sasl_server_mechanisms")
            offered = [offered] if isinstance(offered, str) else list(offered or ())
            if mech not in offered:
                raise ProtocolError("amqp:unauthorized-access",
                                    f"the server does not offer SASL {mech} (offers {offered})")
            write_control(self.out, FRAME_SASL, 0, D_SASL_INIT, {
                "mechanism": Symbol(mech), "initial_response": response,
                "hostname": hostname})
            self.touch()
        elif code == D_SASL_OUTCOME:
            outcome = fields.get("code")
            if outcome != 0:
                self.error = ("amqp:unauthorized-access",
                              f"SASL {mech} failed (outcome code {int(outcome or 0)})")
                self.closing = True
                self.state = CS_CLOSED
                self.teardown()
                return 0
            if step is not None and not self.sasl_step("outcome", fields.get("additional_data")):
                return 0
            self.sasl_done = True
            self.state = CS_SASL_DONE
            self.out.put_raw(<const uint8_t*>b"AMQP\x00\x01\x00\x00", 8)
            self.touch()
        elif code == D_SASL_CHALLENGE and step is not None:
            # 5.3.3.3 / 5.3.3.4: the mechanism computes the answer
            answer = self.sasl_step("challenge", fields.get("challenge"))
            if answer is None:
                return 0
            write_control(self.out, FRAME_SASL, 0, D_SASL_RESPONSE, {"response": bytes(answer)})
            self.touch()
        else:
            raise ProtocolError("amqp:not-implemented", "SASL challenges are not supported")
        return 0

    cdef object sasl_step(self, str kind, object data):
        """The client mechanism's answer; None (the connection closed) when it refuses."""
        mech = self.sasl_client[0]
        try:
            answer = self.sasl_client[3](kind, data)
        except Exception as e:
            answer = None
            reason = str(e)
        else:
            reason = "the server did not prove it knows the credentials"
        if answer is None or answer is False:
            self.error = ("amqp:unauthorized-access", f"SASL {mech}: {reason}")
            self.closing = True
            self.state = CS_CLOSED
            self.teardown()
            self.touch()
            return None
        return answer

    cdef int on_open(self, dict f) except -1:
        if self.state != CS_OPEN_WAIT:
            raise ProtocolError("amqp:connection:framing-error", "unexpected OPEN")
        self.remote_open = f
        self.remote_container_id = str(f["container_id"])
        mfs = f.get("max_frame_size")
        if mfs is not None and mfs < MIN_MAX_FRAME_SIZE:
            # (refused before it is taken: the CLOSE still goes out in a 512-byte frame)
            raise ProtocolError("amqp:invalid-field",
                                f"max-frame-size {mfs} is below {MIN_MAX_FRAME_SIZE}")
        self.remote_max_frame_size = 0xffffffff if mfs is None else mfs
        if self.remote_max_frame_size > self.max_frame_size:
            # we never send larger frames than we accept ourselves either
            self.remote_max_frame_size = self.max_frame_size
        cm = f.get("channel_max")
        self.remote_channel_max = 65535 if cm is None else cm
        it = f.get("idle_time_out")
        self.remote_idle_timeout_ms = 0 if it is None else it
        self.state = CS_OPENED
        self.handler.on_open(self, f)
        if self.state == CS_OPENED and not self.open_sent:
            self.send_open()
        return 0

    cdef int send_open(self) except -1:
        self.open_sent = True
        cm = self.channel_max if self.channel_max < self.remote_channel_max or \
            self.state != CS_OPENED else self.remote_channel_max
        self.write_frame(FRAME_AMQP, 0, D_OPEN, {
            "container_id": self.router.container_id,
            "max_frame_size": UInt(self.max_frame_size),
            "channel_max": UShort(cm),
            # 2.4.5: advertise half the real threshold, so a peer that sends just in time
            # is never cut off by timer slack
            "idle_time_out": UInt(self.idle_timeout_ms // 2) if self.idle_timeout_ms else None,
            "offered_capabilities": symbol_array(["ANONYMOUS-RELAY"]),
            "properties": self.open_properties if self.open_properties is not None
            else self.router.open_properties,
        })
        return 0

    cdef int on_begin(self, uint16_t channel, dict f) except -1:
        cdef Session s
        cdef Py_ssize_t i
        if channel in self.sessions:
            raise ProtocolError("amqp:connection:framing-error",
                                f"BEGIN on channel {channel}, which is in use")
        refused = session_refused(self, channel)   # limits.pxi; else framing-error as below
        if channel > self.channel_max and not refused:
            # the policy's max_sessions may have set channel-max: it counts its refusal
            hook = getattr(self.handler, "on_channel_refused", None)
            why = hook(self, channel) if hook is not None else None
            raise ProtocolError("amqp:connection:framing-error",
                                f"channel {channel} exceeds channel-max {self.channel_max}"
                                + (f": {why}" if why else ""))
        rc = f.get("remote_channel")
        if rc is not None:
            # 2.5.2: the answer to a BEGIN we sent
            s = self.local_sessions[rc] if rc < len(self.local_sessions) else None
            if s is None or s.mapped:
                raise ProtocolError("amqp:connection:framing-error",
                                    f"BEGIN answers channel {rc}, which we did not begin")
            s.remote_channel = channel
            s.mapped = True
            s.next_incoming_id = f["next_outgoing_id"]
            s.window_base = s.next_incoming_id
            s.remote_incoming_window = f["incoming_window"]
            self.sessions[channel] = s
            return 0
        s = Session()
        s.mapped = True
        s.conn = self
        s.remote_channel = channel
        s.next_incoming_id = f["next_outgoing_id"]
        s.window_base = s.next_incoming_id
        s.remote_incoming_window = f["incoming_window"]
        hm = f.get("handle_max")
        s.handle_max = limit_handle_max(self, 0xffffffff if hm is None else hm)
        for i in range(len(self.local_sessions)):
            if self.local_sessions[i] is None:
                break
        else:
            i = len(self.local_sessions)
            self.local_sessions.append(None)
        self.local_sessions[i] = s
        s.channel = <uint16_t>i
        self.sessions[channel] = s
        self.write_frame(FRAME_AMQP, s.channel, D_BEGIN, {
            "remote_channel": UShort(channel),
            "next_outgoing_id": UInt(0),
            "incoming_window": UInt(WINDOW_MAX),
            "outgoing_window": UInt(WINDOW_MAX),
            "handle_max": UInt(s.handle_max),
        })
        if refused:
            refuse_session(self, s)
        return 0

    cdef int on_attach(self, Session s, dict f) except -1:
        cdef Link link
        cdef uint32_t handle = f["handle"]
        if handle > s.handle_max and not handle_max_is_limit(self, s):
            raise ProtocolError("amqp:connection:framing-error",
                                f"handle {handle} exceeds handle-max {s.handle_max}")
        if handle in s.links:
            raise ProtocolError("amqp:session:handle-in-use", f"handle {handle} is in use")
        name = f["name"]
        if not isinstance(name, str):
            raise ProtocolError("amqp:invalid-field", "link name is not a string")
        name = str(name)  # a symbol (a str subclass) names the link by its text
        link = s.attaching.pop((name, bool(f["role"])), None)
        if link is not None:
            # 2.6.3: the answer to an ATTACH we sent (the peer's role is the opposite of ours:
            # role true, the peer receives, answers a link where we are the sender)
            link.remote_handle = handle
            s.links[handle] = link
            if link.role == ROLE_RECEIVER:
                idc = f.get("initial_delivery_count")
                link.delivery_count = 0 if idc is None else idc
            else:
                mms = f.get("max_message_size")
                link.max_message_size = 0 if mms is None else mms
            if link.state == LINK_ATTACHING:
                link.state = LINK_ATTACHED
            self.handler.on_attach(self, link, f)
            return 0
        link = Link()
        link.name = name
        link.session = s
        link.conn = self
        link.remote_handle = handle
        # the peer's role is the opposite of ours: role false = the peer sends
        link.role = ROLE_SENDER if f["role"] else ROLE_RECEIVER
        ssm = f.get("snd_settle_mode")
        link.snd_settle_mode = SND_MIXED if ssm is None else ssm
        rsm = f.get("rcv_settle_mode")
        link.rcv_settle_mode = RCV_FIRST if rsm is None else rsm
        if link.role == ROLE_RECEIVER:
            idc = f.get("initial_delivery_count")
            link.delivery_count = 0 if idc is None else idc
        else:
            mms = f.get("max_message_size")
            link.max_message_size = 0 if mms is None else mms
        link.state = LINK_ATTACHING
        link.handle = s.alloc_handle(link)
        s.links[handle] = link
        if link_refused(self, s, link, handle):
            return 0
        self.handler.on_attach(self, link, f)
        return 0

    cdef int on_detach(self, Session s, dict f) except -1:
        cdef Link link = s.links.get(f["handle"])
        if link is None:
            raise ProtocolError("amqp:session:unattached-handle",
                                f"DETACH of handle {f['handle']}, which is not attached")
        if link.state == LINK_DETACHED:
            s.free_handle(link)               # the peer's answer to our DETACH
            return 0
        closed = bool(f.get("closed"))
        self.write_frame(FRAME_AMQP, s.channel, D_DETACH,
                         {"handle": UInt(link.handle), "closed": closed})
        link.state = LINK_DETACHED
        link.lost()
        s.free_handle(link)
        self.handler.on_detach(self, link, closed, f.get("error"))
        return 0

    cdef int on_end(self, Session s, dict f) except -1:
        cdef bint refused = s.ended           # we sent our END already (limits.pxi)
        s.end_error = f.get("error")
        self.end_session(s)
        if not refused:
            self.write_frame(FRAME_AMQP, s.channel, D_END, {})
        return 0

    cdef int end_session(self, Session s) except -1:
        cdef Link link
        s.ended = True                        # the handler sees why its links went away
        for link in list(s.links.values()) + list(s.attaching.values()):
            # (attaching: ours, unanswered, e.g. a broker refusing one with END)
            if link.state != LINK_DETACHED:
                link.state = LINK_DETACHED
                link.lost()
                self.handler.on_detach(self, link, False, None)
        s.links.clear()
        s.attaching.clear()
        # our handles hold the links and each link its session: a cycle that kept a closed
        # connection (and its output buffer) until a full collection, which gc_tuning makes rare
        del s.local_handles[:]
        del s.blocked[:]
        self.sessions.pop(s.remote_channel, None)
        if s.channel < len(self.local_sessions):
            self.local_sessions[s.channel] = None
        return 0

    cdef int on_close(self, dict f) except -1:
        self.remote_error = f.get("error")
        if self.state != CS_CLOSE_SENT:
            self.write_frame(FRAME_AMQP, 0, D_CLOSE, {})
        self.closing = True
        self.state = CS_CLOSED
        self.teardown()
        return 0

    cdef int teardown(self) except -1:
        cdef Session s
        for s in list(self.sessions.values()):
            self.end_session(s)
        self.d_pending = False
        try:
            self.handler.on_closed(self)
        except Exception:
            log.exception("[C%d] close handler failed", self.conn_id)
        return 0

    cdef int fail(self, condition, description) except -1:
        """Close the connection with an error (2.8.15 / 2.8.16 conditions); the rest of the
        router keeps running."""
        if self.state == CS_CLOSED or self.closing:
            return 0
        self.error = (condition, description)
        log.warning("[C%d] closing connection: %s: %s", self.conn_id, condition, description)
        self.inbuf = None
        if self.state == CS_OPEN_WAIT or self.state == CS_OPENED or \
                self.state == CS_CLOSE_SENT:
            if not self.open_sent:
                self.send_open()              # 2.4.1: OPEN always precedes CLOSE
            self.d_pending = False
            self.write_frame(FRAME_AMQP, 0, D_CLOSE,
                             {"error": error_value(condition, description)})
        self.closing = True
        self.state = CS_CLOSED
        self.teardown()
        self.touch()
        return 0

    # --- per-message performatives (C only) ---------------------------------------------------

    cdef int on_transfer(self, Session s, Reader* r) except -1:
        # 2.7.5 transfer
        cdef uint32_t count, i, handle = 0, delivery_id = 0, fmt = 0, rsm = 0
        cdef Py_ssize_t end, plen
        cdef const uint8_t* tag = NULL
        cdef Py_ssize_t tag_n = 0
        cdef bint has_id = False, has_tag = False, settled = False, more = False
        cdef bint aborted = False, resume = False
        cdef uint64_t mms
        cdef Py_ssize_t st
        cdef bytes state_raw = None
        cdef Link link
        cdef Delivery d
        cdef const uint8_t* payload
        cdef int64_t want
        r_list(r, &count, &end)
        if count < 1 or not r_uint(r, &handle):
            raise DecodeError("transfer without a handle")
        for i in range(1, count):
            if i == 1:
                has_id = r_uint(r, &delivery_id)
            elif i == 2:
                has_tag = r_binary(r, &tag, &tag_n)
            elif i == 3:
                r_uint(r, &fmt)
            elif i == 4:
                r_bool(r, &settled)
            elif i == 5:
                r_bool(r, &more)
            elif i == 6:
                r_uint(r, &rsm)
            elif i == 7:
                if not r_is_null(r):
                    st = r.pos
                    r_skip(r)
                    check_value(r.p + st, r.pos - st)       # kept, and relayed on resume
                    state_raw = PyBytes_FromStringAndSize(<char*>(r.p + st), r.pos - st)
            elif i == 8:
                r_bool(r, &resume)
            elif i == 9:
                r_bool(r, &aborted)
            else:
                r_skip(r)
        if r.pos != end:
            raise DecodeError("transfer list size does not match its fields")
        payload = r.p + end
        plen = r.n - end
        s.next_incoming_id += 1
        if s.next_incoming_id - s.window_base > WINDOW_MAX // 2:
            self.write_flow(s, None, False)
        link = s.links.get(handle)
        if link is None or link.state == LINK_DETACHED:
            if link is not None:
                return 0                      # in flight when we detached: drop (2.6.4)
            raise ProtocolError("amqp:session:unattached-handle",
                                f"transfer on handle {handle}, which is not attached")
        if link.role != ROLE_RECEIVER:
            raise ProtocolError("amqp:connection:framing-error",
                                "transfer on a link where the router is the sender")
        d = link.current
        if d is None:
            if aborted:
                return 0
            if not has_id or not has_tag:
                raise ProtocolError("amqp:invalid-field",
                                    "first transfer of a delivery lacks delivery-id or tag")
            if tag_n > MAX_TAG:
                raise ProtocolError("amqp:invalid-field", "delivery-tag longer than 32 bytes")
            if not settled and unsettled_refused(link):
                return 0
            if link.credit <= 0:
                if link.revoked > 0:
                    # 2.6.7: sent under credit the router took back (revoke) before its FLOW
                    # reached the peer: legitimate; it is routed (or released) like any other
                    link.revoked -= 1
                elif link.overshot < link.overshoot:
                    link.overshot += 1        # a broker's bounded overshoot (link.pxi)
                else:
                    return link_error(link, "amqp:link:transfer-limit-exceeded",
                                      "transfer without credit")
                link.credit += 1
            link.credit -= 1
            link.delivery_count += 1
            if link.credit <= 0:
                link.credit_changed()
            d = Delivery.new(link, delivery_id, PyBytes_FromStringAndSize(<char*>tag, tag_n))
            d.presettled = settled
            d.message_format = fmt
            d.resume = resume
            d.remote_state_raw = state_raw
            d.durable_key = link.durable_key
            d.transit = link.inter_router     # mesh: the gradient rule (address.pxi pick)
            if not settled:
                s.unsettled_in.put(delivery_id, d)
                link.unsettled_count += 1
        elif settled and not d.presettled:
            d.presettled = True               # 2.7.5: settled may be set on a later frame
            s.unsettled_in.pop(d.delivery_id)
            link.unsettled_count -= 1
        # 2.7.3: the max-message-size our ATTACH stated for this link (a policy's, below the
        # router's), else the router's
        mms = self.max_message_size
        if link.max_message_size and (not mms or link.max_message_size < mms):
            mms = link.max_message_size
        if aborted:
            # 2.6.14: an aborted delivery is discarded (and settled)
            link.current = None
            if not d.presettled:
                s.unsettled_in.pop(d.delivery_id)
                link.unsettled_count -= 1
            return 0
        if more or d.partial is not None:
            if d.partial is None:
                d.partial = bytearray()
                link.current = d
            d.partial += PyBytes_FromStringAndSize(<char*>payload, plen)
            if mms and <uint64_t>len(d.partial) > mms:
                link.current = None
                return oversize(self, link, mms)          # limits.pxi
            if more:
                return 0
            link.current = None
            d.payload = bytes(d.partial)
            d.partial = None
            payload = <const uint8_t*>PyBytes_AS_STRING(d.payload)
            plen = PyBytes_GET_SIZE(d.payload)
        elif mms and <uint64_t>plen > mms:
            return oversize(self, link, mms)
        if self.router.jbuf is not None:
            journal_received(link, d, payload, plen)
        if link.durable_key is not None and link.resumable and not link.endpoint:
            # durability 2: a delivery the router already holds re-binds (2.6.13), also when
            # the producer resends it settled (its outcome was known to both)
            old = link.resumable.pop(d.tag, None)
            if old is not None:
                return resume_inbound(link, d, <Delivery>old, d.presettled)
        if link.durable_key is not None and not d.presettled and not link.endpoint:
            # a new one is recorded before anything of it is forwarded (the flush commits
            # before it writes)
            if d.payload is None:
                d.payload = PyBytes_FromStringAndSize(<char*>payload, plen)
            # stored under the router's next id on this link, the tag inside the record: the
            # batch appends to the terminus's key range (durable.pxi, record layout)
            d.skey = record_key(link.durable_key, durable_tag(link))
            d.tag_in_value = True
            j_put(self.router, d, link.durable_key, None, None, d.payload, True)
        if link.endpoint:
            if d.payload is None:
                d.payload = PyBytes_FromStringAndSize(<char*>payload, plen)
            if link.eo is not None:
                link.eo.on_transfer(d)        # eo_links.pxi: a guaranteed topic's publisher
            else:
                self.handler.on_message(self, link, d, d.payload)
        elif link.address is not None:
            link.address.forward(d, payload, plen)
            if link.credit <= self.router.link_capacity // 2:
                link.address.grant()
        elif link.route_peer is not None:
            route_transfer(link, d, payload, plen)     # linkroute.pxi
        elif link.state == LINK_ATTACHED:
            self.router.route_anonymous(d, payload, plen)
            if link.credit <= self.router.link_capacity // 2 and link.state == LINK_ATTACHED:
                anonymous_topup(link)         # backpressure.pxi
        return 0

    cdef int on_flow(self, Session s, Reader* r) except -1:
        # 2.7.4 flow; 2.5.6 session window; 2.6.7 link credit
        cdef uint32_t count, i, nid = 0, iw = 0, handle = 0, dc = 0, lc = 0, tmp
        cdef bint has_nid = False, has_handle = False, has_dc = False, has_lc = False
        cdef bint drain = False, echo = False
        cdef Py_ssize_t end
        cdef Link link
        r_list(r, &count, &end)
        for i in range(count):
            if i == 0:
                has_nid = r_uint(r, &nid)
            elif i == 1:
                if not r_uint(r, &iw):
                    raise DecodeError("flow without incoming-window")
            elif i == 4:
                has_handle = r_uint(r, &handle)
            elif i == 5:
                has_dc = r_uint(r, &dc)
            elif i == 6:
                has_lc = r_uint(r, &lc)
            elif i == 8:
                r_bool(r, &drain)
            elif i == 9:
                r_bool(r, &echo)
            else:
                r_skip(r)
        if count < 4:
            raise DecodeError("flow lacks its mandatory session fields")
        # 2.5.6: remote-incoming-window = next-incoming-id + incoming-window - next-outgoing-id
        s.remote_incoming_window = <int64_t><uint32_t>(
            (nid if has_nid else 0) + iw - s.next_outgoing_id)
        if s.remote_incoming_window > WINDOW_MAX:
            s.remote_incoming_window = 0      # a window that went "negative": nothing fits
        if has_handle:
            link = s.links.get(handle)
            if link is None:
                raise ProtocolError("amqp:session:unattached-handle",
                                    f"flow on handle {handle}, which is not attached")
            if link.state == LINK_DETACHED:
                return 0
            if link.role == ROLE_SENDER:
                # the consumer's credit: delivery-count(rcv) + link-credit(rcv) - ours
                link.credit = <int64_t><int32_t>((dc if has_dc else 0) + lc -
                                                 link.delivery_count)
                link.drain = drain
                link.credit_changed()
                if link.address is not None:
                    link.address.consumer_credit(link)
                else:
                    link.send_pending()
                    if link.endpoint:
                        self.handler.on_flow(self, link)
                if link.drain and link.credit > 0 and len(link.pending) == 0:
                    # 2.6.7 drain: use up the credit by advancing delivery-count
                    link.delivery_count += <uint32_t>link.credit
                    link.credit = 0
                    link.credit_changed()
                    self.write_flow(s, link, False)
                elif echo:
                    self.write_flow(s, link, False)
                if link.route_peer is not None:
                    route_credit(link)        # linkroute.pxi: the producer gets the same
            elif echo:
                self.write_flow(s, link, False)
        elif echo:
            self.write_flow(s, None, False)
        if len(s.blocked) and s.remote_incoming_window > 0:
            self.unblock(s)
        return 0

    cdef int unblock(self, Session s) except -1:
        cdef Link link
        cdef list blocked = s.blocked
        s.blocked = []
        for link in blocked:
            link.in_blocked = False
            if link.state == LINK_ATTACHED:
                link.send_pending()
                if len(link.pending):
                    link.block()
        return 0

    cdef int on_disposition(self, Session s, Reader* r) except -1:
        # 2.7.6 disposition over [first, last]
        cdef uint32_t count, i, first = 0, last = 0, did
        cdef bint role = False, has_last = False, settled = False
        cdef Py_ssize_t end, st
        cdef uint64_t code = 0
        cdef bytes raw = None
        cdef Unsettled table
        cdef Delivery d
        cdef int64_t span
        r_list(r, &count, &end)
        for i in range(count):
            if i == 0:
                if not r_bool(r, &role):
                    raise DecodeError("disposition without role")
            elif i == 1:
                if not r_uint(r, &first):
                    raise DecodeError("disposition without first")
            elif i == 2:
                has_last = r_uint(r, &last)
            elif i == 3:
                r_bool(r, &settled)
            elif i == 4:
                if not r_is_null(r):
                    st = r.pos
                    r_descriptor(r, &code)
                    r_skip(r)
                    raw = state_bytes(<int>code, r.p + st, r.pos - st)
                    if raw is not _STATE_ACCEPTED and raw is not _STATE_RELEASED:
                        # relayed to the producer as it is (3.4): it must decode in full
                        check_value(r.p + st, r.pos - st)
            else:
                r_skip(r)
        if count < 2:
            raise DecodeError("disposition lacks role or first")
        if not has_last:
            last = first
        # role true: the peer is the receiver, so these are deliveries the router sent
        table = s.unsettled_out if role else s.unsettled_in
        span = <int64_t><uint32_t>(last - first) + 1
        if span > table.n:
            # a huge range (a peer may name all 2^32 ids): visit what we hold instead
            # (span is compared as int64: all 2^32 ids make span 2^32, which is 0 as a uint32)
            for d in [x for x in table.values()
                      if <int64_t><uint32_t>((<Delivery>x).delivery_id - first) < span]:
                self.dispose(table, d, role, settled, <int>code, raw)
        else:
            did = first
            while True:
                d = table.get(did)
                if d is not None:
                    self.dispose(table, d, role, settled, <int>code, raw)
                if did == last:
                    break
                did += 1
        return 0

    cdef int dispose(self, Unsettled table, Delivery d, bint role, bint settled, int code,
                     bytes raw) except -1:
        if role and d.inbound is None:
            # a delivery Python sent on an endpoint link
            d.remote_state = code
            d.remote_state_raw = raw
            if settled and not d.remote_settled:
                # the peer settled first, or in return for ours (Delivery.settle(await_peer))
                d.settled = True
                d.remote_settled = True
                if table.pop(d.delivery_id) is not None and d.link is not None:
                    d.link.unsettled_count -= 1
            if d.link is not None and d.link.eo is not None:
                d.link.eo.on_outcome(d, code, settled)    # eo_links.pxi: a subscriber's
            elif d.link is not None and (code or settled):
                self.handler.on_outcome(self, d.link, d, code, settled)
            return 0
        if role:
            # the consumer's state for a copy the router sent it
            if code == D_RECEIVED and not settled and d.inbound is not None and \
                    d.inbound.copies is None and d.inbound.link is not None and \
                    not d.inbound.presettled and not d.inbound.outcome_sent:
                # 3.4.1 received: how far the consumer got travels to the producer too
                d.inbound.link.conn.queue_disposition(d.inbound.link.session, True,
                                                      d.inbound.delivery_id, False, raw)
                return 0
            if settled and not is_terminal(code):
                # settled with no outcome: the consumer took it (3.4: settlement without a
                # terminal state; our sources have no default-outcome)
                code = D_ACCEPTED
                raw = _STATE_ACCEPTED
            if settled and not d.settled:
                # The copy is done before its outcome travels on, so that settling the
                # producer's delivery (settle_copies) does not send the consumer a
                # disposition for what it settled itself. One journal row says both
                # (copy_outcome's), unless an earlier disposition brought the outcome.
                d.settled = True
                table.pop(d.delivery_id)
                if d.link is not None:
                    d.link.unsettled_count -= 1
                    if journaling(d.link) and (d.outcome_sent or d.inbound is None):
                        jr(d.link, d, d.inbound, J_SETTLED, J_NO_OUTCOME, 0, -1)
                    if d.link.durable_key is not None and d.tag is not None:
                        j_del(self.router, d, d.link.durable_key)
                copy_outcome(d, code, raw, J_SETTLED)
            elif is_terminal(code):
                copy_outcome(d, code, raw)
        elif settled and not d.settled:
            # the producer settled: relay the settlement to the copies (exactly-once's final
            # step, 3.8.3)
            d.settled = True
            table.pop(d.delivery_id)
            if d.link is not None:
                d.link.unsettled_count -= 1
                limit_settled(d.link)
            d.outcome_sent = True
            d.remote_settled = True
            if journaling(d.link):
                jr(d.link, d, d, J_SETTLED, J_NO_OUTCOME, 0, -1)
            settle_copies(d)
            if d.durable_key is not None:
                j_del(self.router, d, d.durable_key)
            if d.link is not None and d.link.eo is not None:
                d.link.eo.on_settled(d)       # eo_links.pxi: a guaranteed topic's publisher
            elif d.link is not None and d.link.endpoint:
                self.handler.on_settled(self, d.link, d)
        return 0


cdef inline bytes state_bytes(int code, const uint8_t* p, Py_ssize_t n):
    # the two states without fields map to shared constants so dispositions coalesce
    if code == D_ACCEPTED and n == 4 and memcmp(p, <const uint8_t*>b"\x00\x53\x24\x45", 4) == 0:
        return _STATE_ACCEPTED
    if code == D_RELEASED and n == 4 and memcmp(p, <const uint8_t*>b"\x00\x53\x26\x45", 4) == 0:
        return _STATE_RELEASED
    if code == D_ACCEPTED:
        return _STATE_ACCEPTED
    if code == D_RELEASED:
        return _STATE_RELEASED
    return PyBytes_FromStringAndSize(<char*>p, n)


cdef int link_error(Link link, condition, description) except -1:
    """Detach one link with an error; the connection and its other links go on."""
    log.warning("[C%d][L%d] detaching link %r: %s: %s", link.conn.conn_id, link.handle,
                link.name, condition, description)
    link.current = None
    link.detach(condition, description, True)
    try:
        link.conn.handler.on_detach(link.conn, link, True, None)
    except Exception:
        log.exception("[C%d] detach handler failed", link.conn.conn_id)
    return 0


cdef inline bint is_hot_frame(const uint8_t* body, uint32_t n) noexcept:
    """TRANSFER, FLOW or DISPOSITION with the small-ulong descriptor (1.2, 2.7): the frames of
    the per-message path, which the engine handles in C and which credit already bounds."""
    return n >= 3 and body[0] == 0x00 and body[1] == 0x53 and (
        body[2] == D_TRANSFER or body[2] == D_FLOW or body[2] == D_DISPOSITION)
