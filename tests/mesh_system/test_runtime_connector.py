"""Connectors created and deleted at run time through ``$management`` (issue 16 item 7):
router B, started alone, is told to connect to A; the mesh forms and a message crosses it.
Deleting the connector closes the connection, withdraws A from B's routes and B does not
reconnect."""

from __future__ import annotations

import time
from typing import Any

from tests.harness import HOST, MeshRouter, retry
from tests.management.test_roles import login, users_file
from tests.management.test_runtime_changes import send_through
from tests.management.tooling import ok, run_tool
from tests.mesh_system.mesh import wait_log

BACKOFF_MAX_S = 2.0  # qrouter/reconnect.py MOST_S: the longest wait between attempts


def _nodes(r: Any) -> set[str]:
    return {row["id"] for row in ok("nodes", "--url", r.url, "--json").json()}


def _inter_router(r: Any) -> list[dict[str, Any]]:
    rows = ok("connections", "--url", r.url, "--json").json()
    return [row for row in rows if row["role"] == "inter-router" and not row["closed"]]


def test_create_and_delete_a_connector(router: Any, blocking: Any) -> None:
    a = router("A", cls=MeshRouter)
    b = router("B", cls=MeshRouter)
    assert ok("manage", "query", "--type", "connector", "--url", b.url, "--json").json() == []

    created = ok(
        "manage", "create", "--type", "connector", "--name", "to-a", f"host={HOST}",
        f"port={a.inter_port}", "--url", b.url, "--json",
    ).json()  # fmt: skip
    assert created["name"] == "to-a" and created["port"] == a.inter_port
    retry(lambda: "A" in _nodes(b) and "B" in _nodes(a), timeout=15, message="no mesh formed")

    # traffic: a consumer on A, a producer on B
    consumer = blocking(a.url).create_receiver("rt.q", credit=1)
    retry(
        lambda: any(
            row["name"] == "rt.q" for row in ok("addresses", "--url", b.url, "--json").json()
        ),
        timeout=15,
        message="B never learnt A's consumer",
    )
    send_through(blocking(b.url).create_sender("rt.q"), consumer, "across")
    rows = ok("manage", "query", "--type", "connector", "--url", b.url, "--json").json()
    assert [(row["name"], row["connected"]) for row in rows] == [("to-a", True)]

    # a second one of the same name: 409; a bad port: 400
    again = run_tool(
        "manage", "create", "--type", "connector", "--name", "to-a", f"port={a.inter_port}",
        "--url", b.url,
    )  # fmt: skip
    assert again.returncode == 1 and "409" in again.stderr, str(again)
    bad = run_tool("manage", "create", "--type", "connector", "port=0", "--url", b.url)
    assert bad.returncode == 1 and "400" in bad.stderr, str(bad)

    deleted = ok("manage", "delete", "--type", "connector", "--name", "to-a", "--url", b.url)
    assert deleted.stdout.strip() == "deleted connector to-a"
    retry(lambda: not _inter_router(b), timeout=10, message="the connection stayed open")
    retry(lambda: "A" not in _nodes(b), timeout=15, message="A's routes not withdrawn on B")
    wait_log(b, "connector deleted by management")
    assert ok("manage", "query", "--type", "connector", "--url", b.url, "--json").json() == []
    # longer than the most a connector waits between attempts: it did not come back
    time.sleep(BACKOFF_MAX_S + 0.5)
    assert not _inter_router(b) and not _inter_router(a)


def test_connector_and_trace_changes_need_admin(router: Any, tmp_path: Any) -> None:
    """Only admins change connectors or switch the trace (qrouter/policy.py): a monitor
    (a users file without a policy) gets 403."""
    b = router(
        "B",
        cls=MeshRouter,
        config={"users_file": str(users_file(tmp_path))},
        listeners=[{"sasl_mechanisms": ["PLAIN"], "require_auth": True}],
    )
    for args in (
        ("create", "--type", "connector", f"port={b.inter_port}"),
        ("update", "--type", "router", "--name", "B", "trace=true"),
    ):
        refused = run_tool("manage", *args, "--url", b.url, *login("adm"))
        assert refused.returncode == 1, str(refused)
        assert "forbidden" in refused.stderr and "needs the admin role" in refused.stderr
    rows = ok("manage", "query", "--type", "connector", "--url", b.url, "--json", *login("mon"))
    assert rows.json() == []
