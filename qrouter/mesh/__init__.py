"""Inter-router routing protocol (DESIGN §6, docs/mesh.md): pure Python, no I/O.

`RoutingEngine` runs hello, link state, shortest paths and mobile addresses; it talks to the
data plane only through `DataPlane`.
"""

from qrouter.mesh.data_plane import DataPlane
from qrouter.mesh.engine import RoutingEngine
from qrouter.mesh.messages import PROTOCOL_VERSION, ProtocolError

__all__ = ["PROTOCOL_VERSION", "DataPlane", "ProtocolError", "RoutingEngine"]
