"""The client application itself crashes (issue 15, item 4): a publisher and a subscriber
using router.client with a state file (docs/client.md, "Durable client state") are SIGKILLed
mid-stream, several times, and restarted with the same container-id and state file; every
message reaches the subscribing application exactly once and every one is accepted.

The applications are tests/client/crash_app.py, real subprocesses."""

from __future__ import annotations

import random
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from qrouter import stores
from tests.client.conftest import DEFAULT_TEST_TIMEOUT
from tests.harness import Process, retry
from tests.tools_alias import alias_tools_package

alias_tools_package()
from tests.guarantee.common import topic_rows  # noqa: E402 - needs the alias

N = 400
KILLS = 3  # of each application


def app(tmp_path: Path, role: str, n: int, url: str, run: int) -> Process:
    args = [sys.executable, "-m", "tests.client.crash_app", role, url]
    args += [str(tmp_path / f"{role}.state"), str(n)]
    if role == "sub":
        args.append(str(tmp_path / "processed.txt"))
    root = str(Path(__file__).resolve().parents[2])
    return Process(args, f"{role}{run}", tmp_path, expect=0, env={"PYTHONPATH": root})


@pytest.mark.timeout(DEFAULT_TEST_TIMEOUT + 60)
@pytest.mark.skipif(
    not stores.available("lmdb"), reason="the state file needs lmdb: pip install lmdb"
)
def test_publisher_and_subscriber_killed_and_restarted(router: Any, tmp_path: Path) -> None:
    r = router(addresses={"events": "multicast,exactly-once"})
    rng = random.Random()
    seed = rng.randrange(1 << 30)
    rng.seed(seed)
    print(f"kill schedule seed {seed}")
    runs = {"pub": 0, "sub": 0}
    procs = {"sub": app(tmp_path, "sub", N, r.url, 0)}
    retry(
        lambda: [row["subscribers"] for row in topic_rows(r.url)] == [1],
        timeout=20,
        message=lambda: f"topics: {topic_rows(r.url)}",
    )
    procs["pub"] = app(tmp_path, "pub", N, r.url, 0)
    try:
        for k in range(2 * KILLS):
            role = ("pub", "sub")[k % 2]
            time.sleep(rng.uniform(0.5, 1.5))
            if procs[role].poll() is not None:
                break  # (finished already: the run was shorter than the schedule)
            procs[role].kill()
            runs[role] += 1
            procs[role] = app(tmp_path, role, N, r.url, runs[role])
        for role in ("pub", "sub"):
            procs[role].wait(90)
            assert procs[role].returncode == 0, procs[role].log_tail()
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
    processed = Counter((tmp_path / "processed.txt").read_text().split())
    missing = [f"m{i}" for i in range(N) if f"m{i}" not in processed]
    twice = {body: c for body, c in processed.items() if c > 1}
    assert not missing and not twice, f"missing {missing[:10]}, processed twice {twice}"
    assert runs["pub"] >= 1 and runs["sub"] >= 1, runs
    print(f"kills {runs}; last runs: {procs['pub'].log_tail(3)} / {procs['sub'].log_tail(3)}")
