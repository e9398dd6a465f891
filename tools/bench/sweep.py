"""The latency sweep (`run.py --scenarios sweep`, issue 18): one-way latency and router CPU
per message at fixed rates from 1,000 msg/s up to 80% of the measured maximum, for one hop
and two hops, beside direct client-to-client runs and runs through one and two byte relays
(byte_relay.c: the floor of any intermediary) at the same rates; a table, and a PNG plot
when matplotlib is installed.

Runs at one rate alternate (direct, relay, one hop, two relays, two hops, then again
`--repeat` times) so that load from elsewhere on the machine falls on all alike; each figure
is the median run by p99. The routers stay up for the whole sweep; relays are started per run.
Before the ladder it measures what a wake-up across CPUs costs here (wakeup.c, latency.py),
the least any hop through a process that sleeps adds to direct, and prints it over the table.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from run import Bench, Run  # type: ignore[import-not-found]

LADDER = (1_000, 2_000, 5_000, 10_000, 20_000, 50_000, 100_000, 200_000, 500_000)
FRACTION = 0.8  # of the measured maximum: the highest rate swept
SECONDS = 5  # of messages at each rate and run (at least 5,000 messages)
KINDS = ("direct", "relay 1 hop", "one hop", "relay 2 hops", "two hops")
# the relay kinds: the same connection through byte relays (byte_relay.c, latency.py), the
# floor of any intermediary; their CPU column is the relays'
RELAY_HOPS = {"relay 1 hop": 1, "relay 2 hops": 2}


@dataclass
class Point:
    kind: str
    rate: int
    p50: int
    p90: int
    p99: int
    p999: int
    cpu_us: float | None  # router CPU per message (both routers for two hops)


def rates(maximum: float) -> list[int]:
    """The ladder up to FRACTION of `maximum`, and that cap itself."""
    cap = int(maximum * FRACTION) // 1000 * 1000
    out = [r for r in LADDER if r <= cap]
    if cap >= 1000 and (not out or cap > out[-1] * 1.2):
        out.append(cap)
    return out


def sweep(b: Bench, m: ModuleType) -> None:
    """`m` is run.py's module (a script's __main__ or the package's), for its Router,
    run_load and free_port."""
    import importlib

    latency = importlib.import_module(m.__package__ + ".latency" if m.__package__ else "latency")
    cfg = b.cfg
    count_at = lambda rate: max(5_000, min(cfg.count, rate * SECONDS))  # noqa: E731
    ir_port = m.free_port()
    plot_path = cfg.logs / "latency-sweep.png"
    points: list[Point] = []
    maxima: dict[str, float] = {}
    wake = ""
    try:
        with (
            m.Router(cfg.logs, "sweep one hop") as one,
            m.Router(cfg.logs, "sweep A", "--id", "A", "--inter-router-listen",
                     f"{m.HOST}:{ir_port}") as a,
            m.Router(cfg.logs, "sweep B", "--id", "B", "--inter-router-connect",
                     f"{m.HOST}:{ir_port}") as b2,
        ):  # fmt: skip
            time.sleep(m.MESH_FORM_S)
            tag = iter(range(1_000_000))

            def once(kind: str, rate: int) -> Run:
                addr = f"sweep.{next(tag)}"
                count = count_at(rate) if rate else cfg.count
                if kind in RELAY_HOPS:
                    hops = RELAY_HOPS[kind]
                    return latency.relay_run(m, cfg, hops, 0, addr, count, rate)
                routers = {"direct": [], "one hop": [one], "two hops": [a, b2]}[kind]
                ns0 = sum(r.run_ns() for r in routers)
                if kind == "direct":
                    port = m.free_port()
                    run = m.run_load(cfg, port, addr, count=count, rate=rate, listen=True)
                elif kind == "one hop":
                    run = m.run_load(cfg, one.port, addr, count=count, rate=rate)
                else:
                    run = m.run_load(cfg, b2.port, addr, count=count, rate=rate, send_port=a.port)
                for r in routers:
                    r.check()
                if routers:
                    run.router_cpu_s = (sum(r.run_ns() for r in routers) - ns0) / 1e9
                return run

            # the maximum: full speed, unsettled, one run each (the cap of each kind's ladder)
            maxima = {k: once(k, 0).rate for k in KINDS}
            print(
                "sweep maxima (msg/s): " + ", ".join(f"{k} {v:,.0f}" for k, v in maxima.items()),
                flush=True,
            )
            wake = wake_line(m, latency)
            print(wake, flush=True)
            ladder = rates(maxima["one hop"])
            for rate in ladder:
                runs: dict[str, list[Run]] = {k: [] for k in KINDS}
                for _ in range(cfg.repeat):
                    for k in KINDS:
                        if rate <= maxima[k] * FRACTION * 1.05 or k == "direct":
                            runs[k].append(once(k, rate))
                for k, rs in runs.items():
                    if not rs:
                        continue
                    run = sorted(rs, key=lambda r: r.p99)[len(rs) // 2]
                    cpu = run.router_cpu_s * 1e6 / run.sent if run.router_cpu_s else None
                    points.append(Point(k, rate, run.p50, run.p90, run.p99, run.p999, cpu))
                print(f"… sweep {rate:,}/s done", flush=True)
    except m.BenchError as e:
        print(f"sweep failed: {e}")
    print(f"\n{m.describe(cfg)}")
    print_sweep(points, maxima, wake)
    plot(points, plot_path)


def wake_line(m: ModuleType, latency: ModuleType) -> str:
    """One line: a wake-up across CPUs on this machine (latency.measure_wake), or why not."""
    try:
        w = latency.measure_wake(m)
    except m.BenchError as e:
        return f"wake-up across CPUs: not measured ({e})"
    return (
        f"wake-up across CPUs {w.cpus[0]} and {w.cpus[1]} (one way, wakeup.c): p50 {w.p50:.1f}"
        f" / p99 {w.p99:.1f} µs, on one CPU {w.same_p50:.1f}: the least a hop through a"
        " process that sleeps adds to direct"
    )


def print_sweep(points: list[Point], maxima: dict[str, float], wake: str = "") -> None:
    """Markdown: one line per rate; each kind's p50/p90/p99/p99.9 µs, the router and relay
    kinds' p50 and p99 as × direct, and their CPU µs per message (kinds without a point are
    left out)."""
    by = {(p.kind, p.rate): p for p in points}
    head = ["rate msg/s", "direct p50/p90/p99/p99.9"]
    shown = [k for k in KINDS[1:] if any(p.kind == k for p in points)]
    for k in shown:
        head += [f"{k} p50/p90/p99/p99.9", f"{k} × direct p50/p99", f"{k} CPU µs/msg"]
    print("latency sweep (µs, one-way, unsettled; median run by p99)")
    if maxima:
        print("maxima msg/s: " + ", ".join(f"{k} {v:,.0f}" for k, v in maxima.items()))
    if wake:
        print(wake)
    print("| " + " | ".join(head) + " |")
    print("|" + "---:|" * len(head))
    for rate in sorted({p.rate for p in points}):
        d = by.get(("direct", rate))
        line = [f"{rate:,}", pcts(d)]
        for k in shown:
            p = by.get((k, rate))
            ratio = ""
            if p and d and d.p50 and d.p99:
                ratio = f"{p.p50 / d.p50:.2f} / {p.p99 / d.p99:.2f}"
            cpu = f"{p.cpu_us:.1f}" if p and p.cpu_us is not None else ""
            line += [pcts(p), ratio, cpu]
        print("| " + " | ".join(line) + " |")


def pcts(p: Point | None) -> str:
    return f"{p.p50} / {p.p90} / {p.p99} / {p.p999}" if p else ""


def plot(points: list[Point], path: Path) -> None:
    """p50 and p99 against the rate, log-log, one colour per kind."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("no plot: matplotlib is not installed (pip install matplotlib)")
        return
    if not points:
        return
    fig, ax = plt.subplots(figsize=(8, 5))
    colours = ("black", "tab:green", "tab:blue", "tab:olive", "tab:orange")
    for kind, colour in zip(KINDS, colours, strict=True):
        ps = sorted((p for p in points if p.kind == kind), key=lambda p: p.rate)
        xs = [p.rate for p in ps]
        ax.plot(xs, [p.p50 for p in ps], "o-", color=colour, label=f"{kind} p50")
        ax.plot(xs, [p.p99 for p in ps], "s--", color=colour, label=f"{kind} p99")
        ax.plot(xs, [p.p999 for p in ps], ":", color=colour, alpha=0.5, label=f"{kind} p99.9")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("rate, msg/s (unsettled, fixed)")
    ax.set_ylabel("one-way latency, µs")
    ax.set_title("qrouter latency sweep")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, ncol=3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    print(f"plot: {path}")
