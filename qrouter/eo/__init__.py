"""Exactly-once (and at-least-once) publish/subscribe across the mesh (DESIGN §7,
docs/exactly-once.md): no I/O; the per-message half is compiled (qrouter/_fast/eo_core.pyx).

`TopicRouter` is one router's state machine for one guaranteed topic; it talks to the router
only through a `Port` (outputs) and a `RecordStore` (durable records). tests/eo/sim.py runs
whole meshes of them under a seeded, deterministic simulation.
"""

from qrouter.eo.messages import EO_VERSION, ProtocolError
from qrouter.eo.port import Port
from qrouter.eo.protocol import AT_LEAST_ONCE, EXACTLY_ONCE, MODES, TopicRouter
from qrouter.eo.records import AttId, LocalRecord, LocalState, OriginRecord, Pub, Sub, SubState
from qrouter.eo.store import MemoryRecordStore, RecordStore, TerminusRecordStore
from qrouter.eo.tags import TAG_SIZE, outgoing_tag

__all__ = [
    "AT_LEAST_ONCE",
    "EO_VERSION",
    "EXACTLY_ONCE",
    "MODES",
    "TAG_SIZE",
    "AttId",
    "LocalRecord",
    "LocalState",
    "MemoryRecordStore",
    "OriginRecord",
    "Port",
    "ProtocolError",
    "Pub",
    "RecordStore",
    "Sub",
    "SubState",
    "TerminusRecordStore",
    "TopicRouter",
    "outgoing_tag",
]
