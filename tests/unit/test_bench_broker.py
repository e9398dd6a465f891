"""The broker scenario's pure parts (tools/bench/broker.py): the router configuration it
writes, the rate of a run through a queue and the note comparing the two layouts. The
scenario itself is a benchmark against RabbitMQ, run by hand."""

from __future__ import annotations

from pathlib import Path

from qrouter_tools.bench.broker import compare_note, pipeline_rate, router_toml
from qrouter_tools.bench.run import Row

from qrouter.config import load_config


def test_router_config_is_a_waypoint_with_an_autolink_each_way(tmp_path: Path) -> None:
    f = tmp_path / "r.toml"
    f.write_text(router_toml(5999, ["bench.w.0", "bench.w.1"]))
    cfg = load_config(str(f))
    (cc,) = cfg.connectors
    assert (cc.name, cc.role, cc.host, cc.port) == ("broker", "route-container", "127.0.0.1", 5999)
    links = sorted((a.direction, a.address, a.queue, a.connection) for a in cfg.autolinks)
    assert links == [
        ("in", "bench.w.0", "/queue/bench.w.0", "broker"),
        ("in", "bench.w.1", "/queue/bench.w.1", "broker"),
        ("out", "bench.w.0", "/queue/bench.w.0", "broker"),
        ("out", "bench.w.1", "/queue/bench.w.1", "broker"),
    ]
    assert [a.waypoint for a in cfg.addresses] == [True, True]


def test_a_run_through_a_queue_is_as_fast_as_its_slower_end() -> None:
    assert pipeline_rate(18_000, 11_000) == 11_000
    assert pipeline_rate(9_000, 11_000) == 9_000
    assert pipeline_rate(18_000, 0) == 0  # the receiver got nothing: no rate


def test_note_gives_the_share_of_the_broker_rate_and_the_latency_added() -> None:
    direct = Row("broker direct", 10_000)
    assert compare_note(direct, Row("via router", 9_500)) == (
        "0.95 × broker direct (target ≥ 0.90: met)"
    )
    assert compare_note(direct, Row("via router", 8_000)).startswith(
        "0.80 × broker direct (target ≥ 0.90: missed)"
    )
    ld = Row("broker direct @2000/s", 2_000, p50_us=300, p99_us=900)
    lr = Row("via router @2000/s", 2_000, p50_us=380, p99_us=850)
    assert compare_note(direct, Row("via router", 9_500), (ld, lr)).endswith(
        "; adds +80 µs p50, -50 µs p99 one-way at 2000/s"
    )
    assert compare_note(Row("broker direct", note="failed"), Row("via router")) == ""
