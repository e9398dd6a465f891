"""The engine's copy of what it has told the data plane, so it only ever sends differences.

The data plane starts empty: no route, cost, valid origin or remote address for any router.
Order matters to deliveries in flight: a router gains its route before its addresses (so an
address is never advertised with nowhere to send), and loses its addresses before its route,
then `router_lost` last so deliveries are released only once nothing new is routed to it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from qrouter.mesh.data_plane import DataPlane


@dataclass(frozen=True, slots=True)
class Route:
    link_id: int
    cost: int
    valid_origins: tuple[str, ...]


class ForwardingTables:
    def __init__(self, data_plane: DataPlane) -> None:
        self._dp = data_plane
        self.routes: dict[str, Route] = {}
        self.addresses: dict[str, set[str]] = {}  # router -> addresses pushed for it

    def apply_routes(
        self, routes: Mapping[str, Route], addresses_of: Callable[[str], set[str]]
    ) -> None:
        for router_id in sorted(set(self.routes) - set(routes)):
            self._withdraw(router_id)
        for router_id in sorted(routes):
            new, old = routes[router_id], self.routes.get(router_id)
            if old is None or old.link_id != new.link_id:
                self._dp.set_next_hop(router_id, new.link_id)
            if old is None or old.cost != new.cost:
                self._dp.set_cost(router_id, new.cost)
            if (old.valid_origins if old else ()) != new.valid_origins:
                self._dp.set_valid_origins(router_id, list(new.valid_origins))
            self.routes[router_id] = new
            if old is None:
                self.sync_addresses(router_id, addresses_of(router_id))

    def sync_addresses(self, router_id: str, wanted: set[str]) -> None:
        """Make the pushed addresses of `router_id` equal `wanted` (none if unreachable)."""
        if router_id not in self.routes:
            wanted = set()
        pushed = self.addresses.setdefault(router_id, set())
        for address in sorted(pushed - wanted):
            self._dp.del_remote_address(address, router_id)
        for address in sorted(wanted - pushed):
            self._dp.add_remote_address(address, router_id)
        if wanted:
            self.addresses[router_id] = set(wanted)
        else:
            del self.addresses[router_id]

    def change_addresses(
        self, router_id: str, added: tuple[str, ...], removed: tuple[str, ...]
    ) -> None:
        """Apply one delta (cheaper than `sync_addresses` for routers with many addresses)."""
        if router_id not in self.routes:
            return
        pushed = self.addresses.setdefault(router_id, set())
        for address in removed:
            if address in pushed:
                pushed.discard(address)
                self._dp.del_remote_address(address, router_id)
        for address in added:
            if address not in pushed:
                pushed.add(address)
                self._dp.add_remote_address(address, router_id)
        if not pushed:
            del self.addresses[router_id]

    def _withdraw(self, router_id: str) -> None:
        self.sync_addresses(router_id, set())
        route = self.routes.pop(router_id)
        if route.valid_origins:
            self._dp.set_valid_origins(router_id, [])
        self._dp.set_next_hop(router_id, None)
        self._dp.set_cost(router_id, None)
        self._dp.router_lost(router_id)
