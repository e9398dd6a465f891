# cython: freethreading_compatible = False
"""The wire engine: AMQP 1.0 framing, connections, sessions, links, credit, deliveries and
forwarding, in one Cython module (its parts are the included .pxi files, as asyncpg's
protocol module includes its parts).

Python (qrouter/core.py) talks to it through a small API: ``Connection.feed(bytes)``, output
flushed to the connection's transport once per loop iteration by ``Router.flush()``, and
callbacks on a handler object for the control performatives (SASL, OPEN, ATTACH, DETACH,
END, CLOSE). TRANSFER, FLOW and DISPOSITION never leave C-level code.
"""

import logging

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from libc.stdint cimport int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t
from libc.string cimport memcmp, memcpy

cimport cython

from qrouter._fast.codec cimport (
    Reader, Writer, check_value, r_binary, r_bool, r_descriptor, r_is_null, r_list, r_skip,
    r_uint, r_value,
)
from qrouter._fast.codec import (
    Array, DecodeError, Described, Symbol, UByte, UInt, ULong, UShort, decode, encode, symbol_array,
)
from qrouter._fast.constants cimport *

log = logging.getLogger("qrouter.engine")

# 2.2 protocol headers
AMQP_HEADER = b"AMQP\x00\x01\x00\x00"
SASL_HEADER = b"AMQP\x03\x01\x00\x00"
cdef enum:
    MIN_MAX_FRAME_SIZE = 512          # 2.7.1: the smallest max-frame-size a peer may set
    WINDOW_MAX = 0x7fffffff           # the session window the router advertises (2.5.6)
    MAX_TAG = 32                      # 2.8.7: a delivery-tag is at most 32 octets

include "performatives.pxi"
include "delivery.pxi"
include "unsettled.pxi"
include "link.pxi"
include "limits.pxi"
include "annotations.pxi"
include "address.pxi"
include "connection.pxi"
include "deadlines.pxi"
include "frame_size.pxi"
include "router.pxi"
include "read_path.pxi"
include "durable.pxi"
include "eo_log.pxi"
include "journal.pxi"
include "backpressure.pxi"
include "trace.pxi"
include "diversion.pxi"
include "eo_wire.pxi"
include "linkroute.pxi"
include "eo_links.pxi"
include "eo_control.pxi"
