"""The audit benchmark (not a test): generate N events, audit them, report time and memory.

    python -m qrouter_tools.audit.benchmark --events 10000000 [--master URL] [--dir DIR]

The audit runs as a child process (spark_main.py, so exactly what spark-submit would run)
while this process samples the resident memory of that child and all its descendants (the
Python driver and the JVM) every 0.2 s; the peak of their sum is reported.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path


def _children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="ascii", errors="replace") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        tree.setdefault(int(fields[1]), []).append(int(entry))
    return tree


def tree_rss_bytes(pid: int) -> int:
    """Resident memory of ``pid`` and all its descendants (Linux /proc)."""
    tree = _children()
    total, todo = 0, [pid]
    page = os.sysconf("SC_PAGE_SIZE")
    while todo:
        p = todo.pop()
        todo.extend(tree.get(p, []))
        try:
            with open(f"/proc/{p}/statm", encoding="ascii") as f:
                total += int(f.read().split()[1]) * page
        except OSError:
            pass
    return total


def measure(cmd: list[str], env: dict[str, str] | None = None) -> tuple[int, float, int]:
    """Run ``cmd``; return (exit status, seconds, peak tree RSS in bytes)."""
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env)
    peak = 0
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, tree_rss_bytes(proc.pid))
            done.wait(0.2)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    status = proc.wait()
    done.set()
    sampler.join()
    return status, time.perf_counter() - started, peak


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m qrouter_tools.audit.benchmark")
    parser.add_argument("--events", type=int, default=10_000_000)
    parser.add_argument("--dir", default="/tmp/qrouter-audit-bench", help="journal root")
    parser.add_argument("--out", default=None, help="report dir (default DIR-report)")
    parser.add_argument("--master", default=None, help="Spark master; default local[*]")
    parser.add_argument("--driver-memory", default="2g")
    args = parser.parse_args(argv)
    root = Path(args.dir)
    dirs = sorted(str(p) for p in root.glob("r*") if p.is_dir())
    if not dirs:
        from .generate import main as generate_main

        t = time.perf_counter()
        generate_main([str(root), "--events", str(args.events)])
        print(f"generated in {time.perf_counter() - t:.1f}s")
        dirs = sorted(str(p) for p in root.glob("r*") if p.is_dir())
    out = args.out or f"{root}-report"
    script = str(Path(__file__).with_name("spark_main.py"))
    cmd = [sys.executable, script, *dirs, "--out", out, "--driver-memory", args.driver_memory]
    if args.master:
        cmd += ["--master", args.master]
    env = dict(os.environ)
    status, seconds, peak = measure(cmd, env)
    summary = json.loads((Path(out) / "summary.json").read_text())
    result = {
        "events": summary["rows"],
        "master": summary["spark"]["master"],
        "status": status,
        "wall_s": round(seconds, 1),
        "audit_s": summary["timing"]["audit_s"],
        "peak_rss_mib": round(peak / 2**20),
        "events_per_s": round(summary["rows"] / summary["timing"]["audit_s"]),
    }
    print(json.dumps(result))
    return 0 if status in (0, 1) else status


if __name__ == "__main__":
    raise SystemExit(main())
