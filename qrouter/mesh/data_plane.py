"""What the routing engine needs from the data plane (qrouter/inter_router.py implements it).

The engine never touches sockets or deliveries: it calls these methods, and only when the
value changes, so an implementation can apply each call directly to its forwarding tables.
"""

from __future__ import annotations

from typing import Any, Protocol


class DataPlane(Protocol):
    def send(self, link_id: int, message: dict[str, Any]) -> None:
        """Send one control message (a map, see messages.py) on one inter-router connection."""

    def set_next_hop(self, router_id: str, link_id: int | None) -> None:
        """Traffic for `router_id` leaves on connection `link_id`; None: it is unreachable."""

    def set_cost(self, router_id: str, cost: int | None) -> None:
        """Path cost to `router_id` (for `closest` / `balanced`); None: unreachable."""

    def set_valid_origins(self, router_id: str, origins: list[str]) -> None:
        """Multicast rule: forward a copy toward `router_id` only if it entered the mesh at this
        router or at one of `origins` (docs/mesh.md, "Valid origins")."""

    def add_remote_address(self, address: str, router_id: str) -> None:
        """`router_id` (reachable) has at least one consumer for `address`."""

    def del_remote_address(self, address: str, router_id: str) -> None:
        """`router_id` no longer has consumers for `address`, or is no longer reachable."""

    def router_lost(self, router_id: str) -> None:
        """Deliveries sent toward `router_id`, or over the connection to neighbour
        `router_id`, will never be settled by it: release them to their producers."""

    def log(self, level: str, msg: str) -> None:
        """level: "debug", "info", "warning" or "error"."""
