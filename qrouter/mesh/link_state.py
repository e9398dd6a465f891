"""Link-state database: every known router's neighbours and costs, with sequence numbers.

Each router originates its own link state (its adjacencies and their costs) and bumps
``ls_seq`` whenever it changes; copies are flooded and a copy is kept only if it is newer than
the one held, so an old copy arriving late over a slow path changes nothing.

Records are keyed by router id and tagged with the originator's *instance* (its process start
time). A larger instance means the router restarted: its sequence numbers start again, so the
old record (and its mobile addresses, see mobile.py) is dropped rather than compared. A smaller
instance is a leftover of the dead process and is ignored.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from qrouter.mesh.messages import LinkStateUpdate


class Verdict(enum.Enum):
    NEW = "new"  # first word of this router
    SAME = "same"
    RESTARTED = "restarted"  # a newer instance: the old record was reset
    STALE = "stale"  # an older instance than the one recorded


@dataclass(slots=True)
class RouterRecord:
    instance: int
    ls_seq: int = 0  # 0: no link state received yet
    peers: dict[str, int] = field(default_factory=dict)
    ra_seq: int = 0  # highest RA seen (dedup for flooding)
    last_seen: float = 0.0  # last RA / LSU / MAU originated by this router


class LinkStateDB:
    def __init__(self, router_id: str, instance: int) -> None:
        self.router_id = router_id
        self.instance = instance
        # Our own state starts at seq 1 (empty) so a neighbour can tell "no state" from ours.
        self.own = RouterRecord(instance, ls_seq=1)
        self.remote: dict[str, RouterRecord] = {}
        # Last RA seq heard from superseded instances, to tell a duplicate that is still
        # advertising from stale copies of a dead process that are still in flight.
        self.old_instance_ra: dict[tuple[str, int], int] = {}

    def observe(self, router_id: str, instance: int, now: float) -> Verdict:
        record = self.remote.get(router_id)
        if record is None:
            self.remote[router_id] = RouterRecord(instance, last_seen=now)
            return Verdict.NEW
        if instance == record.instance:
            return Verdict.SAME
        if instance < record.instance:
            return Verdict.STALE
        self.old_instance_ra[(router_id, record.instance)] = record.ra_seq
        self.remote[router_id] = RouterRecord(instance, last_seen=now)
        return Verdict.RESTARTED

    def old_instance_advertising(self, router_id: str, instance: int, ra_seq: int) -> bool:
        """Record an RA from an old instance; True if that instance is evidently still alive."""
        key = (router_id, instance)
        last = self.old_instance_ra.get(key)
        self.old_instance_ra[key] = max(ra_seq, last or 0)
        return last is not None and ra_seq > last

    def set_own_peers(self, peers: dict[str, int]) -> bool:
        if peers == self.own.peers:
            return False
        self.own.peers = dict(peers)
        self.own.ls_seq += 1
        return True

    def accept(self, update: LinkStateUpdate, now: float) -> bool:
        """Store `update` if newer than the held copy (instance already checked by observe)."""
        record = self.remote[update.id]
        record.last_seen = now
        if update.ls_seq <= record.ls_seq:
            return False
        record.ls_seq = update.ls_seq
        record.peers = dict(update.ls)
        return True

    def update_for(self, router_id: str) -> LinkStateUpdate | None:
        if router_id == self.router_id:
            return LinkStateUpdate(self.router_id, self.instance, self.own.ls_seq, self.own.peers)
        record = self.remote.get(router_id)
        if record is None or record.ls_seq == 0:
            return None
        return LinkStateUpdate(router_id, record.instance, record.ls_seq, dict(record.peers))

    def next_expiry(self, max_age: float) -> float:
        """When `expire` next may drop a router (inf: none held)."""
        return min((rec.last_seen for rec in self.remote.values()), default=float("inf")) + max_age

    def expire(self, now: float, max_age: float) -> list[str]:
        """Drop routers whose state has not been refreshed within max_age."""
        gone = [rid for rid, rec in self.remote.items() if now - rec.last_seen > max_age]
        for router_id in gone:
            del self.remote[router_id]
        for key in [key for key in self.old_instance_ra if key[0] not in self.remote]:
            del self.old_instance_ra[key]
        return gone

    def link_states(self) -> dict[str, dict[str, int]]:
        states = {rid: rec.peers for rid, rec in self.remote.items() if rec.ls_seq}
        states[self.router_id] = self.own.peers
        return states
