"""$management and qrouter-tool show an address entry's fallback and dead-letter addresses and
the addresses' diversion counters; an entry created at run time with a fallback applies to
the addresses in use and to new ones (docs/brokers.md, "Fallback and dead letters")."""

from __future__ import annotations

import concurrent.futures
from typing import Any

from proton import Delivery

from tests.clients import pump_until_done
from tests.interop.test_fallback_dead_letter import ADDRESSES, send, settle
from tests.management.tooling import ok, run_tool


def _entries(r: Any) -> dict[str, dict[str, Any]]:
    rows = ok("addresses", "--entries", "--url", r.url, "--json").json()
    return {row["prefix"] or row["pattern"]: row for row in rows}


def _addresses(r: Any) -> dict[str, dict[str, Any]]:
    return {row["name"]: row for row in ok("addresses", "--url", r.url, "--json").json()}


def test_entries_show_fallback_and_dead_letter(router: Any) -> None:
    r = router(config={"address": ADDRESSES})
    entries = _entries(r)
    assert entries["work"]["fallback"] == "parking"
    assert entries["work"]["dead_letter"] is None
    assert entries["jobs"]["dead_letter"] == "dlq"
    assert entries["jobs"]["origin"] == "config"
    table = ok("addresses", "--entries", "--url", r.url).stdout
    assert "parking" in table and "dlq" in table


def test_counters_and_a_fallback_created_at_run_time(router: Any, blocking: Any) -> None:
    r = router(config={"address": ADDRESSES})
    consumers = blocking(r.url)
    parking = consumers.create_receiver("parking", credit=10)
    jobs = consumers.create_receiver("jobs", credit=10)
    dlq = consumers.create_receiver("dlq", credit=10)
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        # a dead letter is counted on the address that made it
        future = send(pool, blocking(r.url).create_sender("jobs"), "bad")
        jobs.receive(timeout=10)
        settle(jobs, "reject")
        dlq.receive(timeout=10)
        settle(dlq, "accept")
        assert pump_until_done(consumers, future).remote_state == Delivery.ACCEPTED
        row = _addresses(r)["jobs"]
        assert (row["dead_letter"], row["dead_lettered"], row["accepted"]) == ("dlq", 1, 1)

        # CREATE an entry with a fallback: a producer already attached to an address under it
        # (no credit so far: nobody consumes it) gets credit from the fallback's consumer,
        # and its message goes there
        early = blocking(r.url).create_sender("late.orders")
        created = ok(
            "manage", "create", "--type", "address", "prefix=late", "distribution=closest",
            "fallback=parking", "--url", r.url, "--json",
        ).json()  # fmt: skip
        assert created["fallback"] == "parking" and created["origin"] == "management"
        future = send(pool, early, "late-one")
        assert parking.receive(timeout=10).body == "late-one"
        settle(parking, "accept")
        assert pump_until_done(consumers, future).remote_state == Delivery.ACCEPTED
        row = _addresses(r)["late.orders"]
        assert (row["fallback"], row["fallback_deliveries"], row["consumers"]) == (
            "parking",
            1,
            0,
        )


def test_fallback_refused_for_multicast(router: Any) -> None:
    r = router()
    bad = run_tool(
        "manage", "create", "--type", "address", "prefix=news", "distribution=multicast",
        "fallback=parking", "--url", r.url,
    )  # fmt: skip
    assert bad.returncode != 0
    assert "fallback needs distribution closest or balanced" in bad.stdout + bad.stderr
