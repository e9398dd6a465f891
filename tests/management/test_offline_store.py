"""``qrouter-tool links --store lmdb --store-path DIR`` reads the termini a router wrote,
after that router was SIGKILLed (no clean shutdown, nothing flushed on the way out)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from proton import Message
from proton.reactor import DurableSubscription
from proton.utils import BlockingConnection

from tests.harness import retry
from tests.management.tooling import ok, run_tool

pytest.importorskip("lmdb")


def test_links_of_a_killed_router(router: Any, tmp_path: Path) -> None:
    store = tmp_path / "store"
    r = router(
        listeners=[{"idle_timeout": 0}],
        extra_args=["--store", "lmdb", "--store-path", str(store), "--store-sync", "always"],
    )
    # not the `blocking` fixture: closing a connection to a killed router waits its timeout
    conn = BlockingConnection(r.url, timeout=10)
    container = conn.conn.container
    auditor_link = conn.create_receiver(
        "audit.events", name="auditor", credit=5, options=DurableSubscription()
    )
    sender = conn.create_sender("audit.events", name="publisher")
    sender.link.send(Message(body="held across the crash"))
    assert auditor_link.receive(timeout=10).body == "held across the crash"  # not settled

    def stored() -> list[dict[str, Any]]:
        rows = ok("termini", "--url", r.url, "--json").json()
        return [row for row in rows if row["name"] == "auditor" and row["durable"] >= 1]

    retry(stored, timeout=10, message="the durable subscription was not stored")
    # the store is locked while the router runs: one line, exit 1
    locked = run_tool("links", "--store", "lmdb", "--store-path", str(store))
    assert locked.returncode == 1 and len(locked.stderr.strip().splitlines()) == 1, str(locked)

    r.kill()  # SIGKILL
    conn.timeout = 0.5
    try:
        conn.close()
    except Exception:  # noqa: BLE001 - the router is gone
        pass

    rows = ok("links", "--store", "lmdb", "--store-path", str(store), "--json").json()
    auditor = next(row for row in rows if row["link_name"] == "auditor")
    assert auditor["remote_container"] == container
    assert auditor["address"] == "audit.events" and auditor["direction"] == "out"
    assert auditor["durability"] >= 1 and auditor["expiry_policy"] == "never"
    assert auditor["suspended"] == "attached at crash"
    # durability 2 (unsettled-state): the delivery the auditor received but never settled is
    # kept with the terminus
    assert auditor["durability"] == 2 and auditor["unsettled"] == 1
    assert all(row["link_name"] != "publisher" for row in rows)  # durability 0: not stored

    table = ok("links", "--store", "lmdb", "--store-path", str(store)).stdout
    header = table.splitlines()[2].split()
    assert header[:4] == ["name", "container", "address", "dir"], table
    line = next(x for x in table.splitlines() if x.split()[:1] == ["auditor"])
    assert container in line and "audit.events" in line and "never" in line
    assert "attached at crash" in line and line.split()[-1] == "1"  # unsettled


def test_not_a_store(tmp_path: Path) -> None:
    result = run_tool("links", "--store", "lmdb", "--store-path", str(tmp_path / "missing"))
    assert result.returncode == 1, str(result)
    assert result.stderr.strip() == (
        f"qrouter-tool: error: --store-path: {tmp_path / 'missing'} is not a lmdb store"
    )
    result = run_tool("links", "--store", "nosuch", "--store-path", str(tmp_path))
    assert result.returncode == 1 and len(result.stderr.strip().splitlines()) == 1, str(result)
