"""The test harness itself: exit statuses are checked, waits are bounded,
failures carry the process's log."""

from __future__ import annotations

import socket
import sys
import time
from pathlib import Path

import pytest

from tests.harness import HarnessError, Process, Router, free_port, retry

SIGTERM_OK = "import signal, sys, time\nsignal.signal(signal.SIGTERM, lambda *a: sys.exit(0))\nprint('up', flush=True)\ntime.sleep(30)\n"
IGNORES_NOTHING = "import time\nprint('up', flush=True)\ntime.sleep(30)\n"


def test_free_port_is_bindable() -> None:
    port = free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))


def test_retry_returns_first_truthy_value() -> None:
    calls = []

    def fn() -> int:
        calls.append(1)
        return len(calls) if len(calls) >= 3 else 0

    assert retry(fn, timeout=5, delay=0.01) == 3


def test_retry_gives_up_within_its_timeout() -> None:
    start = time.monotonic()
    with pytest.raises(HarnessError, match="gave up"):
        retry(lambda: False, timeout=0.3, delay=0.01, message="never true")
    assert time.monotonic() - start < 2


def test_stop_checks_exit_status(tmp_path: Path) -> None:
    good = Process([sys.executable, "-c", SIGTERM_OK], "good", tmp_path)
    retry(lambda: "up" in good.log_tail(), timeout=10)
    assert good.stop() == 0
    bad = Process([sys.executable, "-c", IGNORES_NOTHING], "bad", tmp_path)
    retry(lambda: "up" in bad.log_tail(), timeout=10)
    with pytest.raises(HarnessError, match=r"exit status -15, expected 0"):
        bad.stop()


def test_kill_is_not_checked(tmp_path: Path) -> None:
    p = Process([sys.executable, "-c", IGNORES_NOTHING], "killed", tmp_path)
    p.kill()
    p.teardown()  # no exit status expected after SIGKILL


def test_router_that_exits_early_fails_fast_with_its_log(tmp_path: Path) -> None:
    """A bad config: the router must exit non-zero naming the key (issue 2,
    CLI), and wait_ports must say so at once, with the log, not time out."""
    start = time.monotonic()
    r = Router(tmp_path, config={"no_such_setting": 1}, wait=False)
    try:
        with pytest.raises(HarnessError, match="exited early") as info:
            r.wait_ports(timeout=20)
        assert "no_such_setting" in str(info.value)
        assert time.monotonic() - start < 15
        assert r.returncode != 0
    finally:
        r.teardown()


def test_exit_during_the_test_is_reported_at_teardown(tmp_path: Path) -> None:
    p = Process([sys.executable, "-c", "print('bye')"], "quitter", tmp_path)
    p.wait(10)
    with pytest.raises(HarnessError, match=r"exited during the test \(status 0\)"):
        p.teardown()
