"""The broker scenario (`run.py --scenarios broker`, issue 17 item 7): what routers cost in
front of a broker. One private RabbitMQ (the tests' fixture, tests/broker/rabbitmq.py), and
the same proton-C clients, unsettled, in two layouts:

* broker direct: producer → RabbitMQ queue → consumer;
* through the router: producer → router (waypoint, out-autolink) → the same kind of queue →
  (in-autolink) the same router → consumer (docs/brokers.md).

The producer's outcome is the broker's in both (it accepts once the queue has the message).
The queue decouples the two ends, so the sender's rate (first send → last outcome) alone
could outrun the consumer: a run's msg/s is the slower of the sender's and the receiver's
(first → last arrival). Runs alternate direct / routed, so load from elsewhere on a shared
machine falls on both alike. Then the same at a fixed --rate, for the one-way latency the
receiver measures (a timestamp in the body): what the router adds to p50 and p99.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from run import Bench, Row, Run  # type: ignore[import-not-found]

# every run its own queue, so that nothing a run left behind reaches the next one's receiver:
# run k through the router sends to the waypoint address ADDRESS.k (its queue /queue/ADDRESS.k),
# direct to DIRECT_QUEUE.k
ADDRESS = "bench.waypoint"
DIRECT_QUEUE = "/queue/bench.direct"
TARGET = 0.90  # issue 17: the routers add at most 10% to the broker-only rate
# terminus-durability 1 on the clients' links too (amqp_load.c), as the router's autolinks
# attach: RabbitMQ then declares both queues alike (durable; the messages are not persistent)
CLIENT_ENV = {"AMQP_LOAD_TERMINUS_DURABLE": "1"}
SETTLE_S = 2.0  # after the router starts: its connector and both autolinks attached
# messages a full-speed run (at most): RabbitMQ takes them faster than it hands them out, so
# the queue grows through a run; at 200,000 (the bench's default) a run took minutes (under
# 1,000 msg/s on our 2-core VM): a figure of the broker's deep queue, not of the router
MAX_COUNT = 50_000


def router_toml(broker_port: int, addresses: list[str]) -> str:
    """The router's configuration: a route-container connector to the broker, each address a
    waypoint with one autolink each way on /queue/ADDRESS."""
    text = (
        '[[connector]]\nname = "broker"\nrole = "route-container"\n'
        f'host = "127.0.0.1"\nport = {broker_port}\n\n'
    )
    for address in addresses:
        text += f'[[address]]\nprefix = "{address}"\nwaypoint = true\n\n'
        text += "".join(
            f'[[autolink]]\naddress = "{address}"\ndirection = "{d}"\nconnection = "broker"\n'
            f'external_address = "/queue/{address}"\n\n'
            for d in ("out", "in")
        )
    return text


def pipeline_rate(sender_rate: float, receiver_rate: float) -> float:
    """msg/s of a run through a queue: the slower end (0 when either end measured nothing)."""
    return min(sender_rate, receiver_rate) if sender_rate > 0 and receiver_rate > 0 else 0.0


def compare_note(direct: Row, routed: Row, latency: tuple[Row, Row] | None = None) -> str:
    """The routed row's note: its share of the broker-only rate against the target, and the
    one-way latency the router adds at the fixed rate."""
    parts = []
    if direct.msgs_per_s and routed.msgs_per_s:
        share = routed.msgs_per_s / direct.msgs_per_s
        verdict = "met" if share >= TARGET else "missed"
        parts.append(f"{share:.2f} × broker direct (target ≥ {TARGET:.2f}: {verdict})")
    if latency is not None:
        ld, lr = latency
        if None not in (ld.p50_us, lr.p50_us, ld.p99_us, lr.p99_us):
            parts.append(
                f"adds {lr.p50_us - ld.p50_us:+d} µs p50, {lr.p99_us - ld.p99_us:+d} µs p99 "
                f"one-way at {lr.scenario.rsplit('@', 1)[-1]}"
            )
    return "; ".join(parts)


def unavailable(checkout: Path | None) -> str | None:
    """Why the scenario cannot run here (None: it can)."""
    if checkout is None:
        return "needs a checkout: the broker fixture is tests/broker/rabbitmq.py"
    if str(checkout) not in sys.path:
        sys.path.insert(0, str(checkout))
    from tests.broker.rabbitmq import missing

    return missing()


def broker(b: Bench, run: ModuleType) -> Row | None:
    """Appends the direct rows to the table and returns the last routed one."""
    name = "broker via router (waypoint)"
    reason = unavailable(run.CHECKOUT)
    if reason:
        return run.Row(name, note=f"skipped: {reason}")
    from tests.broker.rabbitmq import RabbitMQ

    rabbit = RabbitMQ(Path(tempfile.mkdtemp(prefix="rabbitmq-", dir=b.cfg.logs)))
    conf = b.cfg.logs / "broker.toml"
    try:
        rabbit.start()
        runs = 2 * b.cfg.repeat + 1  # a warm-up, then repeat at full speed, repeat at --rate
        conf.write_text(router_toml(rabbit.port, [f"{ADDRESS}.{k}" for k in range(runs)]))
        with run.Router(b.cfg.logs, name, "--config", str(conf)) as router:
            return _measure(b, run, rabbit.port, router, name)
    except (run.BenchError, AssertionError) as e:
        return run.Row(name, note=f"failed: {e}"[:300])
    finally:
        rabbit.stop()


def _measure(b: Bench, run: ModuleType, broker_port: int, router: object, name: str) -> Row:
    import time

    time.sleep(SETTLE_S)
    env = {**os.environ, **CLIENT_ENV}

    def once(routed: bool, k: int, count: int, rate: int = 0) -> Run:
        port = router.port if routed else broker_port  # type: ignore[attr-defined]
        addr = f"{ADDRESS if routed else DIRECT_QUEUE}.{k}"
        cpu0 = router.cpu_s() if routed else 0.0  # type: ignore[attr-defined]
        r = run.run_load(b.cfg, port, addr, count=count, rate=rate, env=env)
        if routed:
            router.check()  # type: ignore[attr-defined]
            r.router_cpu_s = router.cpu_s() - cpu0  # type: ignore[attr-defined]
        r.rate = pipeline_rate(r.rate, r.recv_rate)
        return r

    for routed in (False, True):  # warm-up: both queues declared, the links attached
        once(routed, 0, 1000)
    full: dict[bool, list[Run]] = {False: [], True: []}
    timed: dict[bool, list[Run]] = {False: [], True: []}
    rate = b.cfg.rate
    for k in range(1, b.cfg.repeat + 1):
        for routed in (False, True):
            full[routed].append(once(routed, k, min(b.cfg.count, MAX_COUNT)))
    for k in range(b.cfg.repeat + 1, 2 * b.cfg.repeat + 1):
        for routed in (False, True):
            timed[routed].append(once(routed, k, b.count(rate), rate))
    direct = b.median("broker direct (RabbitMQ)", full[False], None)
    routed_row = b.median(name, full[True], direct)
    ldirect = b.median(f"broker direct @{rate}/s", timed[False], None, rate=rate)
    lrouted = b.median(f"{name} @{rate}/s", timed[True], None, rate=rate)
    routed_row.router_rss_mib = router.rss_kib() / 1024  # type: ignore[attr-defined]
    direct.note = direct.note or (
        f"producer → queue → consumer, unsettled, {min(b.cfg.count, MAX_COUNT):,} msgs a run; "
        "the next row's × direct is of this row"
    )
    routed_row.note = routed_row.note or compare_note(direct, routed_row)
    lrouted.note = lrouted.note or compare_note(direct, routed_row, (ldirect, lrouted))
    b.rows += [direct, routed_row, ldirect]
    return lrouted
