"""Print the memory probe's samples (sitecustomize.py) as one table per router process:
python -m tools.bench.memprobe PREFIX. Sizes in KiB; `idle` marks the samples whose pymalloc
blocks are within 10% of the run's fewest (between rounds: what the router keeps)."""

from __future__ import annotations

import glob
import json
import sys


def table(path: str) -> list[str]:
    rows = [json.loads(line) for line in open(path)]
    if not rows:
        return [path, "(no samples)"]
    t0, low = rows[0]["t"], min(r["blocks"] for r in rows)
    out = [
        path,
        "     t    rss   anon   heap  pymal   anon | blocks  gc_obj | py_arenas py_used py_free"
        " | ma_arena ma_used ma_free",
    ]
    for r in rows:
        st, sm, py, mi = r["status"], r["smaps"], r["pymalloc"], r["mallinfo2"]
        out.append(
            f"{r['t'] - t0:6.0f} {st.get('VmRSS', 0):6d} {st.get('RssAnon', 0):6d}"
            f" {sm.get('heap', 0):6d} {sm.get('pymalloc', 0):6d} {sm.get('anon', 0):6d} |"
            f" {r['blocks']:6d} {r['gc_objects']:7d} |"
            f" {py.get('arenas allocated current', 0):9d}"
            f" {py.get('bytes in allocated blocks', 0) // 1024:7d}"
            f" {py.get('bytes in available blocks', 0) // 1024:7d} |"
            f" {mi.get('arena', 0) // 1024:8d} {mi.get('uordblks', 0) // 1024:7d}"
            f" {mi.get('fordblks', 0) // 1024:7d}" + ("  idle" if r["blocks"] < low * 1.10 else "")
        )
    return out


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m tools.bench.memprobe PREFIX", file=sys.stderr)
        return 2
    paths = sorted(glob.glob(argv[0] + "-*.jsonl"))
    for path in paths:
        print("\n".join(table(path)))
    return 0 if paths else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
