"""An idle mesh router sleeps (issue 18): its routing engine ticks when something is due (a
HELLO, an age, the RA, what a control message changed), not every 0.1 s
(qrouter/inter_router.py, Mesh._ticker)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from tests.clients import run_container
from tests.mesh_system.mesh import Traffic, mesh

# per router of an idle pair, measured 3.8-4.8 a second (the 1 s housekeeping and heap trim,
# the inter-router connection's heartbeat tick, the HELLO sent and the one received); a tick
# every 0.1 s made it 13.2-14
IDLE_WAKEUPS_PER_S = 8.0


def _wakeups(pid: int) -> int:
    """Voluntary context switches of the event loop's thread (proc(5)): one per sleep that a
    later wake-up ended. The store's threads are left out: they wake for their own work."""
    for line in Path(f"/proc/{pid}/task/{pid}/status").read_text().splitlines():
        if line.startswith("voluntary_ctxt_switches:"):
            return int(line.split()[1])
    raise AssertionError("no voluntary_ctxt_switches in /proc/PID/status")


def test_an_idle_mesh_router_wakes_a_few_times_a_second(router: Any) -> None:
    r = mesh(router, [("A", "B")], ["A", "B"], config={"store": "memory"})
    # the mesh is up and carries messages both ways, then goes idle
    run_container(Traffic(r["A"].url, [r["B"].url], "idle.q", 20), timeout=30)
    run_container(Traffic(r["B"].url, [r["A"].url], "idle.r", 20), timeout=30)
    time.sleep(1.5)  # the clients' detaches and the address withdrawals done
    before = {name: _wakeups(r[name].pid) for name in "AB"}
    t0 = time.monotonic()
    time.sleep(4.0)
    took = time.monotonic() - t0
    rates = {name: (_wakeups(r[name].pid) - before[name]) / took for name in "AB"}
    assert all(rate < IDLE_WAKEUPS_PER_S for rate in rates.values()), rates
    assert all(rate > 0.5 for rate in rates.values()), rates  # (measured, and still ticking)
    # still a mesh: routes kept by the HELLOs, a message still goes through
    t = run_container(Traffic(r["A"].url, [r["B"].url], "idle.q", 20), timeout=30)
    assert t.received[0] == list(range(20))
