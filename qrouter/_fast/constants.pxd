# Protocol and state constants of the engine (AMQP 1.0 part 2 "Transport", part 3
# "Messaging", part 5 "Security"). Compile-time only: cimported by engine.pyx.

# 2.3.1 frame types
cdef enum FrameType:
    FRAME_AMQP = 0
    FRAME_SASL = 1

# 2.7 performative descriptors, 3.4 delivery states, 5.3.3 SASL frames, 2.8.14 error
cdef enum Descriptor:
    D_OPEN = 0x10
    D_BEGIN = 0x11
    D_ATTACH = 0x12
    D_FLOW = 0x13
    D_TRANSFER = 0x14
    D_DISPOSITION = 0x15
    D_DETACH = 0x16
    D_END = 0x17
    D_CLOSE = 0x18
    D_ERROR = 0x1d
    D_RECEIVED = 0x23
    D_ACCEPTED = 0x24
    D_REJECTED = 0x25
    D_RELEASED = 0x26
    D_MODIFIED = 0x27
    D_SOURCE = 0x28
    D_TARGET = 0x29
    D_SASL_MECHANISMS = 0x40
    D_SASL_INIT = 0x41
    D_SASL_CHALLENGE = 0x42
    D_SASL_RESPONSE = 0x43
    D_SASL_OUTCOME = 0x44
    D_HEADER = 0x70
    D_DELIVERY_ANNOTATIONS = 0x71
    D_MESSAGE_ANNOTATIONS = 0x72
    D_PROPERTIES = 0x73

# Where a connection is in the protocol-header / SASL / open sequence (2.4, 5.3).
cdef enum ConnState:
    CS_HEADER = 0          # waiting for a protocol header
    CS_SASL = 1            # SASL layer: mechanisms sent, waiting for init/response
    CS_SASL_DONE = 2       # outcome sent; waiting for the AMQP header
    CS_OPEN_WAIT = 3       # AMQP header exchanged; waiting for OPEN
    CS_OPENED = 4
    CS_CLOSE_SENT = 5      # CLOSE written; ignoring everything but the peer's CLOSE
    CS_CLOSED = 6          # finished: nothing more is read or written

# 2.8.1 role (of the router's end of a link)
cdef enum Role:
    ROLE_SENDER = 0        # the router sends: the peer is a consumer
    ROLE_RECEIVER = 1      # the router receives: the peer is a producer

# 2.8.2 / 2.8.3 settlement modes
cdef enum SndSettleMode:
    SND_UNSETTLED = 0
    SND_SETTLED = 1
    SND_MIXED = 2

cdef enum RcvSettleMode:
    RCV_FIRST = 0
    RCV_SECOND = 1

# Address distributions; the forwarder is chosen by this when the address is created.
cdef enum Distribution:
    DIST_CLOSEST = 0
    DIST_BALANCED = 1
    DIST_MULTICAST = 2
    DIST_UNAVAILABLE = 3

# Link states
cdef enum LinkState:
    LINK_ATTACHING = 0     # peer's ATTACH received, reply not sent yet
    LINK_ATTACHED = 1
    LINK_DETACHED = 2

# The delivery journal's events and outcomes as the engine stores them (journal.pxi); their
# names, in this order, are qrouter/journal.py's EVENTS and OUTCOMES.
cdef enum JournalEvent:
    J_RECEIVED = 0
    J_FORWARDED = 1
    J_OUTCOME = 2
    J_SETTLED = 3
    J_RELEASED_BACK = 4
    J_RESUMED = 5
    J_CREDIT_STALL = 6

cdef enum JournalOutcome:
    J_NO_OUTCOME = -1
    J_ACCEPTED = 0
    J_REJECTED = 1
    J_RELEASED = 2
    J_MODIFIED = 3
