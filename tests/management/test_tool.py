"""Every ``qrouter-tool`` subcommand against a real router with real proton traffic: the table
and the ``--json`` output, ``--url`` before and after the subcommand, TLS and SASL options, and
the one-line failures (unreachable router, refused login, unknown entity)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from proton import Delivery, Message
from proton.reactor import DurableSubscription

from tests.harness import retry
from tests.management.tooling import ok, run_tool, scrape, value

# idle_timeout 0: the proton clients below sit idle while the tool runs
QUIET = {"idle_timeout": 0}


class Traffic:
    """One proton connection that leaves known counters behind:

    * ``orders``: 3 messages sent, 2 accepted by the consumer, 1 still unsettled;
    * ``nobody-home``: a producer with no consumer (so no credit);
    * ``events``: a durable subscription (terminus expiry never).
    """

    def __init__(self, conn: Any) -> None:
        self.conn = conn
        self.container = conn.conn.container
        self.consumer = conn.create_receiver("orders", credit=10, name="orders-consumer")
        self.producer = conn.create_sender("orders", name="orders-producer")
        self.stalled = conn.create_sender("nobody-home", name="stalled-producer")
        self.durable = conn.create_receiver(
            "events", name="durable-sub", options=DurableSubscription()
        )
        sent = [self.producer.link.send(Message(body=f"order {i}")) for i in range(3)]
        for _ in range(3):
            self.consumer.receive(timeout=10)
        self.consumer.accept()
        self.consumer.accept()
        conn.wait(
            lambda: all(d.remote_state == Delivery.ACCEPTED for d in sent[:2]),
            timeout=10,
            msg="the first two orders were not accepted end to end",
        )


@pytest.fixture
def traffic_router(router: Any, blocking: Any) -> tuple[Any, Traffic]:
    r = router(listeners=[QUIET])
    return r, Traffic(blocking(r.url))


def _mine(rows: list[dict[str, Any]], traffic: Traffic) -> dict[str, dict[str, Any]]:
    return {row["name"]: row for row in rows if row["container"] == traffic.container}


def test_links(traffic_router: tuple[Any, Traffic]) -> None:
    r, traffic = traffic_router
    rows = ok("links", "--url", r.url, "--json").json()
    links = _mine(rows, traffic)
    consumer, producer = links["orders-consumer"], links["orders-producer"]
    assert consumer["direction"] == "out" and consumer["address"] == "orders"
    assert consumer["delivered"] == 3 and consumer["unsettled"] == 1
    assert producer["direction"] == "in" and producer["accepted"] == 2
    assert producer["unsettled"] == 1
    assert consumer["state"] == producer["state"] == "attached"
    assert links["stalled-producer"]["credit"] == 0

    def stalled() -> bool:
        rows = ok("links", "--url", r.url, "--json").json()
        return bool(_mine(rows, traffic)["stalled-producer"]["no_credit_seconds"] > 0)

    retry(stalled, timeout=10, message="the stall time of a producer without credit")
    assert links["durable-sub"]["expiry_policy"] == "never"
    # the tool's own request and reply links are left out unless --all
    assert all(row["container"] == traffic.container for row in rows)
    with_self = ok("links", "--url", r.url, "--json", "--all").json()
    assert any(row["address"] == "$management" for row in with_self)

    table = ok("links", "--url", r.url).stdout
    header = table.splitlines()[2].split()
    for column in ("conn", "container", "name", "dir", "address", "durable", "expiry", "state"):
        assert column in header, table
    for column in ("credit", "delivered", "accepted", "released", "rejected", "modified"):
        assert column in header, table
    assert "unsettled" in header and "no credit (s)" in table
    line = next(x for x in table.splitlines() if "orders-consumer" in x).split()
    assert line[3:5] == ["out", "orders"] and "attached" in line
    assert line[-7:-1] == ["3", "0", "0", "0", "0", "1"]  # delivered .. unsettled


def test_addresses(traffic_router: tuple[Any, Traffic]) -> None:
    r, _traffic = traffic_router
    rows = {row["name"]: row for row in ok("addresses", "--url", r.url, "--json").json()}
    orders = rows["orders"]
    assert orders["distribution"] == "balanced"
    assert (orders["consumers"], orders["producers"]) == (1, 1)
    assert (orders["deliveries_in"], orders["deliveries_out"], orders["accepted"]) == (3, 3, 2)
    assert rows["nobody-home"]["consumers"] == 0
    assert not any(name.startswith("_dynamic/") for name in rows)  # the tool's reply address

    table = ok("addresses", "--url", r.url).stdout
    line = next(x for x in table.splitlines() if x.split()[:1] == ["orders"]).split()
    assert line[:8] == ["orders", "balanced", "1", "1", "0", "3", "3", "2"]

    entries = ok("addresses", "--entries", "--url", r.url, "--json").json()
    unicast = next(e for e in entries if e["prefix"] == "unicast")
    assert unicast["distribution"] == "closest" and unicast["origin"] == "preset"
    table = ok("addresses", "--entries", "--url", r.url).stdout
    assert "Address entries" in table and "broadcast" in table and "multicast" in table


def test_connections(traffic_router: tuple[Any, Traffic]) -> None:
    r, traffic = traffic_router
    rows = ok("connections", "--url", r.url, "--json").json()
    assert [row["container"] for row in rows] == [traffic.container]
    row = rows[0]
    assert row["links"] == 4 and row["tls"] is False and row["role"] == "normal"
    assert row["host"].startswith("127.0.0.1:") and row["bytes_in"] > 0
    assert row["listener"] == f"127.0.0.1:{r.port}"
    table = ok("connections", "--url", r.url).stdout
    assert "container" in table and traffic.container in table


def test_termini(traffic_router: tuple[Any, Traffic]) -> None:
    r, traffic = traffic_router
    rows = _mine(ok("termini", "--url", r.url, "--json").json(), traffic)
    assert set(rows) == {"orders-consumer", "orders-producer", "stalled-producer", "durable-sub"}
    durable = rows["durable-sub"]
    assert durable["expiry_policy"] == "never" and durable["state"] == "attached"
    assert durable["direction"] == "out" and durable["address"] == "events"
    table = ok("termini", "--url", r.url).stdout
    assert "durable-sub" in table and "never" in table and "expires in (s)" in table


def test_stats(traffic_router: tuple[Any, Traffic]) -> None:
    r, _traffic = traffic_router
    stats = ok("stats", "--url", r.url, "--json").json()
    assert stats["id"] == r.router_id and stats["mode"] == "standalone"
    assert stats["connection_count"] == 2  # the traffic and the tool
    assert stats["deliveries_in"] >= 3 and stats["accepted"] >= 2
    assert stats["links_without_credit"] >= 1 and stats["mesh_router_count"] == 0
    table = ok("stats", "--url", r.url).stdout
    assert f"Router {r.router_id}" in table
    assert any(line.split()[:2] == ["connection_count", "2"] for line in table.splitlines())


def test_nodes(router: Any) -> None:
    r = router()
    assert ok("nodes", "--url", r.url, "--json").json() == []
    assert ok("nodes", "--url", r.url).stdout.strip() == "no other routers (standalone)"


def test_topics(router: Any, blocking: Any) -> None:
    # issue 5: a guaranteed topic with one proton subscriber and no records
    r = router(addresses={"events": "multicast,exactly-once"})
    assert ok("topics", "--url", r.url).stdout.strip() == "no guaranteed topics"
    conn = blocking(r.url)
    conn.create_receiver("events.audit", credit=5)
    rows = ok("topics", "--url", r.url, "--json").json()
    assert [
        (row["name"], row["guarantee"], row["subscribers"], row["origin_records"]) for row in rows
    ] == [("events.audit", "exactly-once", 1, 0)]
    assert "events.audit" in ok("topics", "--url", r.url).stdout


def test_nodes_of_a_mesh(router: Any) -> None:
    from tests.harness import free_port

    port = free_port()
    hub = router("hub", extra_args=["--inter-router-listen", f"127.0.0.1:{port}"])
    metrics = free_port()
    edge = router(
        "edge",
        extra_args=[
            "--inter-router-connect", f"127.0.0.1:{port}", "--metrics", f"127.0.0.1:{metrics}",
        ],
    )  # fmt: skip
    other = router("other", extra_args=["--inter-router-connect", f"127.0.0.1:{port}"])

    def both() -> list[dict[str, Any]]:
        rows = ok("nodes", "--url", edge.url, "--json").json()
        return rows if len(rows) == 2 else []

    rows = {row["id"]: row for row in retry(both, timeout=20, message="the mesh never formed")}
    assert rows["hub"]["neighbour"] is True and rows["hub"]["next_hop"] == "hub"
    assert rows["other"]["neighbour"] is False and rows["other"]["next_hop"] == "hub"
    assert rows["other"]["cost"] == 2
    table = ok("nodes", "--url", edge.url).stdout
    line = next(x for x in table.splitlines() if x.split()[:1] == ["other"]).split()
    assert line[:4] == ["other", "no", "hub", "2"], table
    assert ok("stats", "--url", edge.url, "--json").json()["mode"] == "interior"
    connector = ok("manage", "query", "--type", "connector", "--url", edge.url, "--json").json()
    assert [(c["port"], c["connected"]) for c in connector] == [(port, True)]
    conns = ok("connections", "--url", hub.url, "--json").json()
    assert sorted(c["container"] for c in conns if c["role"] == "inter-router") == [
        "edge",
        "other",
    ]
    assert value(scrape(metrics), "qrouter_mesh_routers") == 2
    assert other.poll() is None


def test_manage_query_and_read(traffic_router: tuple[Any, Traffic]) -> None:
    r, _traffic = traffic_router
    rows = ok(
        "manage", "query", "--type", "link", "-a", "name", "-a", "credit", "--url", r.url, "--json"
    ).json()
    assert {"name": "stalled-producer", "credit": 0} in rows
    table = ok("manage", "query", "--type", "link", "-a", "name", "-a", "credit", "--url", r.url)
    assert "stalled-producer" in table.stdout and "credit" in table.stdout
    entry = ok(
        "manage", "read", "--type", "org.qrouter.address", "--name", "unicast", "--url", r.url,
        "--json",
    ).json()  # fmt: skip
    assert entry["distribution"] == "closest"
    types = ok("manage", "get-types", "--url", r.url, "--json").json()
    assert "org.qrouter.link" in types and "org.qrouter.node" in types
    ops = ok("manage", "get-operations", "--url", r.url, "--json").json()
    assert "CREATE" in ops["org.qrouter.listener"] and "CREATE" not in ops["org.qrouter.link"]


def test_url_before_or_after_the_command(router: Any) -> None:
    r = router()
    before = ok("--url", r.url, "--json", "stats").json()
    after = ok("stats", "--url", r.url, "--json").json()
    assert before["id"] == after["id"] == r.router_id
    # after the subcommand wins over before it
    assert ok("--url", "amqp://127.0.0.1:1", "stats", "--url", r.url, "--json").json()["id"]


def test_unreachable_router_is_one_line_and_exit_1(tmp_path: Path) -> None:
    from tests.harness import free_port

    url = f"amqp://127.0.0.1:{free_port()}"
    for command in ("links", "addresses", "connections", "nodes", "termini", "stats"):
        result = run_tool(command, "--url", url)
        assert result.returncode == 1, str(result)
        assert result.stdout == ""
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1, str(result)
        assert lines[0].startswith("qrouter-tool: error: cannot connect to " + url), lines[0]
        assert "Traceback" not in result.stderr
    result = run_tool("manage", "query", "--type", "link", "--url", "amqp://no-such-host.invalid")
    assert result.returncode == 1 and len(result.stderr.strip().splitlines()) == 1, str(result)


def test_errors_from_the_node_are_one_line(router: Any) -> None:
    r = router()
    result = run_tool("manage", "read", "--type", "link", "--name", "nope", "--url", r.url)
    assert result.returncode == 1
    assert result.stderr.strip() == (
        "qrouter-tool: error: READ link: 404 no org.qrouter.link with name 'nope'"
    )
    result = run_tool("manage", "query", "--type", "bogus", "--url", r.url)
    assert result.returncode == 1 and "404 unknown entity type" in result.stderr
    result = run_tool("manage", "delete", "--type", "link", "--name", "x", "--url", r.url)
    assert result.returncode == 1 and "405" in result.stderr


def test_sasl_options(router: Any, tmp_path: Path) -> None:
    from qrouter.auth import hash_password

    users = tmp_path / "users"
    users.write_text(f"ops:{hash_password('s3cret')}\n")
    r = router(
        config={"users_file": str(users)},
        listeners=[{"sasl_mechanisms": ["PLAIN"], "require_auth": True}],
    )
    stats = ok("stats", "--url", r.url, "--user", "ops", "--password", "s3cret", "--json").json()
    assert stats["id"] == r.router_id
    via_env = ok("stats", "--url", r.url, "--user", "ops", "--json", env={
        "QROUTER_PASSWORD": "s3cret"})  # fmt: skip
    assert via_env.json()["id"] == r.router_id
    for extra in ([], ["--user", "ops", "--password", "wrong"]):
        result = run_tool("stats", "--url", r.url, *extra)
        assert result.returncode == 1, str(result)
        assert len(result.stderr.strip().splitlines()) == 1, str(result)
        assert "cannot connect" in result.stderr


def test_tls_options(router: Any, certs: Any) -> None:
    r = router(
        listeners=[
            {
                "tls_cert": str(certs.server_cert),
                "tls_key": str(certs.server_key),
                "tls_ca": str(certs.ca),
                "require_client_cert": True,
            }
        ]
    )
    assert r.url.startswith("amqps://")
    tls = ["--ssl-ca", str(certs.ca), "--ssl-cert", str(certs.client_cert)]
    tls += ["--ssl-key", str(certs.client_key)]
    rows = ok("connections", "--url", r.url, *tls, "--all", "--json").json()
    assert [row["tls"] for row in rows] == [True]
    # no client certificate: the router refuses the handshake
    result = run_tool("stats", "--url", r.url, "--ssl-ca", str(certs.ca))
    assert result.returncode == 1 and len(result.stderr.strip().splitlines()) == 1, str(result)
