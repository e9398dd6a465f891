"""The accept-latency fields of the load clients' report lines (tools/bench/run.py reading
amqp_load.c's and client_load.py's SEND lines) and client_load.py's pure parts. The scenarios
themselves are benchmarks, run by hand."""

from __future__ import annotations

from qrouter_tools.bench.client_load import link_options, percentiles
from qrouter_tools.bench.run import _report, run_of

RECV = (
    "RECV count=2000 expected=2000 secs=1.000 rate=2000 lat_us p50=300 p90=500 p99=900"
    " p99.9=1200 max=1500 cpu_s=0.10"
)
OLD_SEND = (
    "SEND count=2000 settled_mode=unsettled accepted=2000 other=0 secs=1.000 rate=2000 cpu_s=0.2"
)


def test_a_send_line_with_accept_latency_fills_the_run() -> None:
    send = OLD_SEND + " acc_n=2000 acc_p50=400 acc_p90=700 acc_p99=4100 acc_p99.9=5000 acc_max=6"
    run = run_of(_report("SEND", send), [_report("RECV", RECV)], presettled=False)
    assert (run.acc_p50, run.acc_p90, run.acc_p99) == (400, 700, 4100)
    assert (run.rate, run.sent, run.p50, run.p99, run.p999) == (2000.0, 2000, 300, 900, 1200)


def test_a_send_line_of_an_older_amqp_load_still_reads() -> None:
    run = run_of(_report("SEND", "noise\n" + OLD_SEND), [_report("RECV", RECV)], False)
    assert (run.acc_p50, run.acc_p90, run.acc_p99) == (0, 0, 0)
    assert run.rate == 2000.0 and run.other == 0


def test_percentiles_index_as_amqp_load_does() -> None:
    values = list(range(1000, 0, -1))  # 1000 .. 1, unsorted
    assert percentiles(values) == [501, 901, 991, 1000, 1000]
    assert percentiles([]) == [0, 0, 0, 0, 0]
    assert percentiles([7]) == [7, 7, 7, 7, 7]


def test_link_options_are_what_each_kind_of_application_uses() -> None:
    assert link_options("plain") == (0, False)
    assert link_options("at-least-once") == (2, False)
    assert link_options("exactly-once") == (2, True)
