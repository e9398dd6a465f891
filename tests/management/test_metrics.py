"""``qrouter start --metrics HOST:PORT``: ``/metrics`` scraped and parsed with the Prometheus
text parser; the counters move with traffic."""

from __future__ import annotations

import concurrent.futures
import urllib.error
import urllib.request
from typing import Any

import pytest
from proton import Delivery, Message

from tests.clients import pump_until_done
from tests.harness import free_port, retry
from tests.management.tooling import scrape, value


def metrics_router(router: Any, **kwargs: Any) -> tuple[Any, int]:
    port = free_port()
    r = router(extra_args=["--metrics", f"127.0.0.1:{port}"], **kwargs)
    retry(lambda: scrape(port), timeout=10, message="/metrics never answered")
    return r, port


def test_counters_move_with_traffic(router: Any, blocking: Any) -> None:
    r, port = metrics_router(router)
    before = scrape(port)
    assert value(before, "qrouter_router_info", id=r.router_id, version="0.1.0") == 1
    assert value(before, "qrouter_connections") == 0
    assert value(before, "qrouter_mesh_routers") == 0

    consumer_conn = blocking(r.url)
    consumer = consumer_conn.create_receiver("metered", credit=10)
    sender = blocking(r.url).create_sender("metered")
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        future = pool.submit(lambda: [sender.send(Message(body=i), timeout=15) for i in range(5)])
        for i in range(5):
            assert consumer.receive(timeout=10).body == i
            if i == 4:
                consumer.release()  # delivered: MODIFIED (a RELEASED send would raise)
            else:
                consumer.accept()
        outcomes = pump_until_done(consumer_conn, future)
    assert [d.remote_state for d in outcomes] == [Delivery.ACCEPTED] * 4 + [Delivery.MODIFIED]
    blocking(r.url).create_sender("no-consumer")  # a producer without credit

    after = scrape(port)
    labels = {"address": "metered", "distribution": "balanced"}
    assert value(after, "qrouter_address_deliveries_in_total", **labels) == 5
    assert value(after, "qrouter_address_deliveries_out_total", **labels) == 5
    metered = {"address": "metered"}
    assert value(after, "qrouter_address_outcomes_total", outcome="accepted", **metered) == 4
    assert value(after, "qrouter_address_outcomes_total", outcome="modified", **metered) == 1
    assert value(after, "qrouter_address_outcomes_total", outcome="released", **metered) == 0
    assert value(after, "qrouter_address_consumers", **metered) == 1
    assert value(after, "qrouter_connections") == 3
    assert value(after, "qrouter_links", direction="in") == 2
    assert value(after, "qrouter_links", direction="out") == 1
    assert value(after, "qrouter_links_without_credit", direction="in") >= 1
    assert value(after, "process_resident_memory_bytes") > 0

    # more traffic, higher counters
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        future = pool.submit(sender.send, Message(body="again"), 15)
        consumer.receive(timeout=10)
        consumer.accept()
        pump_until_done(consumer_conn, future)
    again = scrape(port)
    assert value(again, "qrouter_address_deliveries_in_total", **labels) == 6
    assert value(again, "qrouter_address_outcomes_total", outcome="accepted", **metered) == 5


def test_dynamic_addresses_share_one_label(router: Any, blocking: Any) -> None:
    r, port = metrics_router(router)
    conn = blocking(r.url)
    for _ in range(3):
        conn.create_receiver(None, dynamic=True)
    samples = scrape(port)
    consumers = {
        labels: v for (name, labels), v in samples.items() if name == "qrouter_address_consumers"
    }
    assert consumers == {(("address", "_dynamic"),): 3.0}


def test_other_paths(router: Any) -> None:
    _r, port = metrics_router(router)
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(f"http://127.0.0.1:{port}/nope", timeout=10)
    assert err.value.code == 404
    request = urllib.request.Request(f"http://127.0.0.1:{port}/metrics", method="POST", data=b"")
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(request, timeout=10)
    assert err.value.code == 405


def test_store_commit_histogram(router: Any, blocking: Any, tmp_path: Any) -> None:
    pytest.importorskip("lmdb")
    store = ["--store", "lmdb", "--store-path", str(tmp_path / "store")]
    port = free_port()
    r = router(extra_args=["--metrics", f"127.0.0.1:{port}", *store])
    retry(lambda: scrape(port), timeout=10)
    from proton.reactor import DurableSubscription

    blocking(r.url).create_receiver("durable", name="sub", options=DurableSubscription())

    def committed() -> bool:
        s = scrape(port)
        count = value(s, "qrouter_store_commit_seconds_count")
        return count >= 2 and value(s, "qrouter_store_commit_seconds_bucket", le="+Inf") == count

    retry(committed, timeout=10, message="no store commits observed")
    samples = scrape(port)
    assert value(samples, "qrouter_store_commits_total") >= 2
    assert value(samples, "qrouter_store_commit_seconds_sum") > 0
