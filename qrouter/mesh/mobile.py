"""Mobile addresses: which router has consumers for which address.

A router announces its own addresses with MAUs, one per change, sent at once; each carries
``mobile_seq``, bumped on every change. Deltas must be applied in order: a router holding
seq n applies a delta only if it is n + 1. A larger seq is a *gap* (a copy was lost, or the
update overtook its predecessor on a faster path): the delta is dropped and the sender of the
message is asked for the full list (MAR), which replaces the held state if it is newer. Every
update that advanced our state is flooded on, so a full list reaches routers that were behind
too.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from qrouter.mesh.messages import MobileUpdate


class Outcome(enum.Enum):
    APPLIED = "applied"
    STALE = "stale"  # not newer than what we hold
    GAP = "gap"  # a delta that skips sequence numbers: ask for the full list


@dataclass(slots=True)
class _Remote:
    seq: int = 0
    addresses: set[str] = field(default_factory=set)


class MobileAddresses:
    def __init__(self, router_id: str, instance: int) -> None:
        self.router_id = router_id
        self.instance = instance
        self.local: set[str] = set()
        self.local_seq = 0
        self._remote: dict[str, _Remote] = {}

    def add_local(self, address: str) -> MobileUpdate | None:
        if address in self.local:
            return None
        self.local.add(address)
        self.local_seq += 1
        return MobileUpdate(self.router_id, self.instance, self.local_seq, add=(address,))

    def remove_local(self, address: str) -> MobileUpdate | None:
        if address not in self.local:
            return None
        self.local.discard(address)
        self.local_seq += 1
        return MobileUpdate(self.router_id, self.instance, self.local_seq, delete=(address,))

    def apply(self, update: MobileUpdate) -> Outcome:
        """Apply an update for a remote router (its instance already checked)."""
        held = self._remote.setdefault(update.id, _Remote())
        if update.mobile_seq <= held.seq:
            return Outcome.STALE
        if update.exist is not None:
            held.addresses = set(update.exist)
        elif update.mobile_seq == held.seq + 1:
            held.addresses.difference_update(update.delete)
            held.addresses.update(update.add)
        else:
            return Outcome.GAP
        held.seq = update.mobile_seq
        return Outcome.APPLIED

    def seq(self, router_id: str) -> int:
        if router_id == self.router_id:
            return self.local_seq
        held = self._remote.get(router_id)
        return held.seq if held else 0

    def addresses_of(self, router_id: str) -> set[str]:
        if router_id == self.router_id:
            return set(self.local)
        held = self._remote.get(router_id)
        return set(held.addresses) if held else set()

    def full_update(self, router_id: str, instance: int) -> MobileUpdate | None:
        """The full list for `router_id`, or None if we hold nothing for it yet."""
        seq = self.seq(router_id)
        if seq == 0:
            return None
        exist = tuple(sorted(self.addresses_of(router_id)))
        return MobileUpdate(router_id, instance, seq, exist=exist)

    def forget(self, router_id: str) -> None:
        self._remote.pop(router_id, None)

    def known(self) -> list[str]:
        return list(self._remote)
