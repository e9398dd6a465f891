"""The bench's memory probe (tools/bench/memprobe): a process that imports qrouter.server
with the probe on its path writes samples, and the table prints them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROBE = ROOT / "tools" / "bench" / "memprobe"


def test_a_router_process_writes_samples_and_the_table_reads_them(tmp_path: Path) -> None:
    prefix = str(tmp_path / "probe")
    env = dict(os.environ)
    env.update(
        QROUTER_MEMPROBE=prefix,
        QROUTER_MEMPROBE_PERIOD="0.1",
        PYTHONPATH=os.pathsep.join([str(PROBE), str(ROOT)]),
    )
    code = "import time, qrouter.server; time.sleep(30)"
    proc = subprocess.Popen([sys.executable, "-c", code, "--id", "P"], env=env, cwd=tmp_path)
    try:
        deadline = time.monotonic() + 20
        lines: list[str] = []
        while time.monotonic() < deadline and len(lines) < 2:
            time.sleep(0.1)
            found = list(tmp_path.glob(f"probe-P-{proc.pid}.jsonl"))
            lines = found[0].read_text().splitlines() if found else []
    finally:
        proc.kill()
        proc.wait(10)
    assert len(lines) >= 2, "no samples within 20 s"
    rec = json.loads(lines[0])
    assert rec["status"]["VmRSS"] > 0 and rec["blocks"] > 0 and rec["gc_objects"] > 0
    assert rec["pymalloc"]["arenas allocated current"] > 0
    assert rec["smaps"]["pymalloc"] > 0
    out = subprocess.run(
        [sys.executable, "-m", "tools.bench.memprobe", prefix],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout
    assert out.count("\n") >= 4 and " idle" in out


def test_without_the_variable_the_probe_starts_no_thread() -> None:
    env = {k: v for k, v in os.environ.items() if k != "QROUTER_MEMPROBE"}
    env["PYTHONPATH"] = os.pathsep.join([str(PROBE), str(ROOT)])
    code = "import threading, qrouter.server; print(len(threading.enumerate()))"
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=30
    )
    assert out.returncode == 0 and out.stdout.strip() == "1"
