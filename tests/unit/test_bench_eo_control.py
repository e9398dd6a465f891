"""The control-link receive bench (tools/bench/eo_control.py) runs: its neighbour's frames bring
the router's channel up and every batch is received, by the engine and through
Mesh.on_message (the bench asserts the channel's sequence). Its figures are run by hand."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_eo_control_bench_receives_every_batch_both_ways() -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "bench" / "eo_control.py"), "300", "2", "1"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    assert "in the engine (EoControl)" in out and "through Mesh.on_message" in out
