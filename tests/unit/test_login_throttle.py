"""qrouter/login_throttle.py: the per-host backoff on a fake clock, bounded memory and
pending checks; the `[login]` table and `handshake_timeout` in the config file. The throttle
against a real router: tests/interop/test_login_throttle.py."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

import pytest

from qrouter.config import ConfigError, LoginConfig, load_config
from qrouter.login_throttle import LoginThrottle


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def throttle(**kw: Any) -> tuple[LoginThrottle, Clock]:
    clock = Clock()
    return LoginThrottle(LoginConfig(**kw), clock=clock), clock


def test_backoff_doubles_up_to_the_cap() -> None:
    t, _ = throttle(backoff_after=3, backoff_max=2.0)
    delays = []
    for _ in range(8):
        delays.append(t.delay("h"))
        t.record("h", False)
    assert delays == [0, 0, 0, 0.25, 0.5, 1.0, 2.0, 2.0]
    assert t.delay("other") == 0


def test_success_and_the_window_forget_failures() -> None:
    t, clock = throttle(backoff_after=1, backoff_window=60.0)
    t.record("h", False)
    t.record("h", False)
    assert t.delay("h") == 0.5
    t.record("h", True)
    assert t.delay("h") == 0 and t.hosts == 0
    t.record("h", False)
    t.record("h", False)
    clock.now += 61
    assert t.delay("h") == 0
    t.record("h", False)  # a new window: one failure
    assert t.delay("h") == 0.25


def test_host_table_is_bounded_least_recent_first() -> None:
    t, _ = throttle(backoff_after=1, max_hosts=100)
    for i in range(1000):
        t.record(f"10.0.{i // 256}.{i % 256}", False)
    assert t.hosts == 100
    t.record("10.0.3.231", False)  # the newest is kept ...
    assert t.delay("10.0.3.231") > 0
    assert t.delay("10.0.0.0") == 0  # ... the oldest forgotten


def test_checks_run_off_the_loop_and_are_bounded() -> None:
    """check() hands the verify to a worker thread and the result back on the loop; beyond
    max_pending it refuses at once."""

    async def main() -> None:
        t = LoginThrottle(LoginConfig(workers=1, max_pending=2))
        gate = threading.Event()
        loop_thread = threading.get_ident()
        ran_on: list[int] = []
        results: list[Any] = []
        done_on: list[int] = []

        def verify() -> bool:
            ran_on.append(threading.get_ident())
            return gate.wait(10)

        def done(ok: Any) -> None:
            done_on.append(threading.get_ident())
            results.append(ok)

        assert t.check("h", verify, done) and t.check("h", verify, done)
        assert not t.check("h", verify, done)  # 2 pending: the third is refused
        assert t.refused == 1 and t.pending == 2
        gate.set()
        for _ in range(200):
            if len(results) == 2:
                break
            await asyncio.sleep(0.01)
        assert results == [True, True]
        assert loop_thread not in ran_on and done_on == [loop_thread] * 2
        assert t.pending == 0
        t.close()

    asyncio.run(main())


def test_a_failing_check_counts_as_a_failed_login() -> None:
    async def main() -> None:
        t = LoginThrottle(LoginConfig(backoff_after=1))
        got: list[Any] = []

        def verify() -> bool:
            raise RuntimeError("boom")

        assert t.check("h", verify, got.append)
        for _ in range(200):
            if got:
                break
            await asyncio.sleep(0.01)
        assert got == [False] and t.failed == 1
        t.close()

    asyncio.run(main())


def test_config(write_config: Callable[..., str]) -> None:
    path = write_config(
        "[login]\nworkers = 4\nmax_pending = 10\nbackoff_after = 3\nbackoff_window = 30.0\n"
        "backoff_max = 5\nmax_hosts = 50\n[[listener]]\nhandshake_timeout = 2.5\n"
    )
    cfg = load_config(path)
    assert cfg.login == LoginConfig(4, 10, 3, 30.0, 5.0, 50)
    assert cfg.listeners[0].handshake_timeout == 2.5
    assert load_config().login == LoginConfig()
    assert load_config().listeners[0].handshake_timeout == 10.0


@pytest.mark.parametrize(
    ("toml", "key", "what"),
    [
        ("login = 3", "login", "expected a table"),
        ("[login]\nthreads = 2", "login.threads", ""),
        ("[login]\nworkers = 0", "login.workers", "out of range"),
        ("[login]\nbackoff_max = -1", "login.backoff_max", "out of range"),
        ("[[listener]]\nhandshake_timeout = -1", "listener[0].handshake_timeout", "out of range"),
    ],
)
def test_config_errors(write_config: Callable[..., str], toml: str, key: str, what: str) -> None:
    path = write_config(toml)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(info.value).startswith(f"{path}: {key}"), str(info.value)
    assert what in str(info.value)


def test_a_throttled_host_holds_no_place_in_the_queue() -> None:
    """Checks waiting out a host's backoff take no thread and no pending place: another
    host still gets its check at once; after the wait a full queue means done(None)."""

    async def main() -> None:
        t = LoginThrottle(LoginConfig(workers=1, max_pending=1, backoff_after=1))
        t.record("bad", False)
        t.record("bad", False)
        assert t.delay("bad") == 0.5
        got: list[Any] = []
        for _ in range(5):
            assert t.check("bad", lambda: False, got.append)
        assert t.pending == 0 and t.delayed == 5
        gate = threading.Event()
        assert t.check("good", lambda: gate.wait(10), got.append)
        assert t.pending == 1
        await asyncio.sleep(0.7)  # the waits are over while "good" still holds the place
        assert got == [None] * 5 and t.refused == 5
        gate.set()
        for _ in range(200):
            if len(got) == 6:
                break
            await asyncio.sleep(0.01)
        assert got[5] is True
        t.close()

    asyncio.run(main())
