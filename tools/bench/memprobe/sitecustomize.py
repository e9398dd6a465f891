"""A memory probe for routers under the bench: put this folder on PYTHONPATH and set
QROUTER_MEMPROBE to a path prefix, and each router process (once `qrouter.server` is
imported) appends one JSON line every QROUTER_MEMPROBE_PERIOD seconds (default 2) to
PREFIX-<router id>-<pid>.jsonl. `python -m tools.bench.memprobe PREFIX` prints the table.

    QROUTER_MEMPROBE=/tmp/probe PYTHONPATH=tools/bench/memprobe \\
        python -m tools.bench.run --scenarios mesh-exactly-once-rss

What it reads tells a leak from the allocator keeping memory: Python objects that grow
(the collector's objects by type, not counting those `gc.freeze()` moved at start-up;
`sys.getallocatedblocks()`) against memory held free (pymalloc's arenas and their free
blocks, from `sys._debugmallocstats()`; glibc's main arena in use and free, `mallinfo2`),
beside the RSS split by mapping (`[heap]`: glibc's main arena; anonymous maps of whole MiB:
pymalloc's 1 MiB arenas; other anonymous: thread stacks and arenas, large blocks). A sample
takes a few ms on a router of ~100k objects, on a thread of its own (it takes the GIL).
Without QROUTER_MEMPROBE importing this does nothing. It shadows any other sitecustomize.
"""

from __future__ import annotations

import collections
import ctypes
import gc
import json
import os
import re
import sys
import tempfile
import threading
import time
from typing import Any

STATUS_FIELDS = ("VmRSS:", "VmHWM:", "RssAnon:", "RssFile:")
PYMALLOC = re.compile(
    r"^# (arenas allocated current|arenas highwater mark|bytes in allocated blocks"
    r"|bytes in available blocks)\s*=\s*([\d,]+)"
)


# struct mallinfo2's fields, in order (all size_t)
MALLINFO2 = "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in MALLINFO2]


def _mallinfo2_fn() -> Any:
    try:
        fn = ctypes.CDLL(None).mallinfo2  # glibc 2.33 on; once: each CDLL makes classes
    except (OSError, AttributeError):
        return None
    fn.restype = _MallInfo2
    return fn


def mallinfo(fn: Any) -> dict[str, int]:
    """glibc's main arena (other threads' arenas are not in it), bytes."""
    if fn is None:
        return {}
    m = fn()
    return {name: int(getattr(m, name)) for name in MALLINFO2}


def status() -> dict[str, int]:
    """/proc/self/status's RSS fields, KiB."""
    with open("/proc/self/status") as f:
        return {
            k.rstrip(":"): int(v.split()[0])
            for k, v in (line.split(None, 1) for line in f if line.startswith(STATUS_FIELDS))
        }


def smaps_rss() -> dict[str, int]:
    """Resident KiB by kind of mapping: heap, pymalloc (anonymous, whole MiB), anon."""
    out: collections.Counter[str] = collections.Counter()
    kind: str | None = None
    with open("/proc/self/smaps") as f:
        for line in f:
            parts = line.split()
            if re.match(r"^[0-9a-f]+-[0-9a-f]+ ", line):
                lo, hi = (int(x, 16) for x in parts[0].split("-", 1))
                kib, name = (hi - lo) // 1024, parts[5] if len(parts) > 5 else ""
                if name == "[heap]":
                    kind = "heap"
                elif name:
                    kind = None  # files, stack, vdso
                else:
                    kind = "pymalloc" if kib >= 1024 and kib % 1024 == 0 else "anon"
            elif kind and parts[0] == "Rss:":
                out[kind] += int(parts[1])
    return dict(out)


def pymalloc_stats() -> dict[str, int]:
    """The arena and block figures of sys._debugmallocstats(), which writes to fd 2."""
    saved = os.dup(2)
    with tempfile.TemporaryFile() as tf:
        sys.stderr.flush()
        os.dup2(tf.fileno(), 2)
        try:
            sys._debugmallocstats()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        tf.seek(0)
        text = tf.read().decode(errors="replace")
    found = (PYMALLOC.match(line) for line in text.splitlines())
    return {m.group(1): int(m.group(2).replace(",", "")) for m in found if m}


def sample(mi_fn: Any) -> dict[str, Any]:
    objs = gc.get_objects()
    types = collections.Counter(type(o).__name__ for o in objs)
    n = len(objs)
    del objs
    return {
        "t": time.time(),
        "status": status(),
        "smaps": smaps_rss(),
        "blocks": sys.getallocatedblocks(),
        "gc_objects": n,
        "gc_types": {k: v for k, v in types.items() if v >= 50},
        "pymalloc": pymalloc_stats(),
        "mallinfo2": mallinfo(mi_fn),
        "threads": len(os.listdir("/proc/self/task")),
    }


def _run(prefix: str, period: float) -> None:
    while "qrouter.server" not in sys.modules:  # a router, not the bench or a client
        time.sleep(0.5)
    argv = sys.argv
    rid = argv[argv.index("--id") + 1] if "--id" in argv[:-1] else "router"
    path = f"{prefix}-{rid}-{os.getpid()}.jsonl"
    mi_fn = _mallinfo2_fn()
    while True:
        t0 = time.perf_counter()
        rec = sample(mi_fn)
        rec["cost_s"] = time.perf_counter() - t0
        with open(path, "a") as f:
            f.write(json.dumps(rec) + "\n")
        time.sleep(period)


if os.environ.get("QROUTER_MEMPROBE"):
    threading.Thread(
        target=_run,
        args=(os.environ["QROUTER_MEMPROBE"], float(os.environ.get("QROUTER_MEMPROBE_PERIOD", 2))),
        daemon=True,
        name="memprobe",
    ).start()
