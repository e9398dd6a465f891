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

import contextlib
import os
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from run import Bench, Row, Run  # type: ignore[import-not-found]

# every run its own queue, so that nothing a run left behind reaches the next one's receiver:
# run k through the router sends to the waypoint address ADDRESS.k (its queue /queue/ADDRESS.k),
# direct to DIRECT_QUEUE.k
ADDRESS = "bench.waypoint"
DIRECT_QUEUE = "/queue/bench.direct"
DIRECT = "broker direct (RabbitMQ)"
ROUTED = "broker via router (waypoint)"
# the routed layouts, each its own router: (row name, address prefix, TOML before the rest);
# the second with a larger link capacity, the most credit an in-autolink gives the broker
LAYOUTS = (
    (ROUTED, ADDRESS, ""),
    (f"{ROUTED}, link_capacity 1000", ADDRESS + "1000", "link_capacity = 1000\n\n"),
)
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
    """Appends the other rows to the table and returns the last one."""
    name = ROUTED
    reason = unavailable(run.CHECKOUT)
    if reason:
        return run.Row(name, note=f"skipped: {reason}")
    from tests.broker.rabbitmq import RabbitMQ

    rabbit = RabbitMQ(Path(tempfile.mkdtemp(prefix="rabbitmq-", dir=b.cfg.logs)))
    runs = 2 * b.cfg.repeat + 1  # a warm-up, then repeat at full speed, repeat at --rate
    try:
        rabbit.start()
        with contextlib.ExitStack() as stack:
            routers = []
            for label, prefix, extra in LAYOUTS:  # each its own queues (two routers on one
                conf = b.cfg.logs / f"broker-{prefix}.toml"  # queue would split its messages)
                conf.write_text(
                    extra + router_toml(rabbit.port, [f"{prefix}.{k}" for k in range(runs)])
                )
                router = stack.enter_context(run.Router(b.cfg.logs, label, "--config", str(conf)))
                routers.append((label, prefix, router))
            return _measure(b, run, rabbit.port, routers)
    except (run.BenchError, AssertionError) as e:
        return run.Row(name, note=f"failed: {e}"[:300])
    finally:
        rabbit.stop()


def _measure(b: Bench, run: ModuleType, broker_port: int, routers: list[Any]) -> Row:
    time.sleep(SETTLE_S)
    env = {**os.environ, **CLIENT_ENV}
    # the layouts: (row name, address prefix, router or None for the broker alone)
    layouts = [(DIRECT, DIRECT_QUEUE, None)] + [(n, p, r) for n, p, r in routers]

    def once(prefix: str, router: Any, k: int, count: int, rate: int = 0) -> Run:
        port = router.port if router else broker_port
        cpu0 = router.cpu_s() if router else 0.0
        r = run.run_load(b.cfg, port, f"{prefix}.{k}", count=count, rate=rate, env=env)
        if router:
            router.check()
            r.router_cpu_s = router.cpu_s() - cpu0
        r.rate = pipeline_rate(r.rate, r.recv_rate)
        return r

    for _, prefix, router in layouts:  # warm-up: the queues declared, the links attached
        once(prefix, router, 0, 1000)
    full: dict[str, list[Run]] = {n: [] for n, _, _ in layouts}
    timed: dict[str, list[Run]] = {n: [] for n, _, _ in layouts}
    rate, count = b.cfg.rate, min(b.cfg.count, MAX_COUNT)
    for k in range(1, b.cfg.repeat + 1):
        for n, prefix, router in layouts:
            full[n].append(once(prefix, router, k, count))
    for k in range(b.cfg.repeat + 1, 2 * b.cfg.repeat + 1):
        for n, prefix, router in layouts:
            timed[n].append(once(prefix, router, k, b.count(rate), rate))
    direct = b.median(DIRECT, full[DIRECT], None)
    ldirect = b.median(f"{DIRECT} @{rate}/s", timed[DIRECT], None, rate=rate)
    direct.note = direct.note or (
        f"producer → queue → consumer, unsettled, {count:,} msgs a run; "
        "the routed rows' × direct is of this row"
    )
    rows = [direct, ldirect]
    for n, _, router in routers:
        row = b.median(n, full[n], direct)
        lrow = b.median(f"{n} @{rate}/s", timed[n], None, rate=rate)
        row.router_rss_mib = router.rss_kib() / 1024
        row.note = row.note or compare_note(direct, row)
        lrow.note = lrow.note or compare_note(direct, row, (ldirect, lrow))
        rows += [row, lrow]
    b.rows += rows[:-1]
    last: Row = rows[-1]
    return last
