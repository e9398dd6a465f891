"""qrouter/reconnect.py: the connectors' reconnect loop (inter-router and route-container)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from qrouter import reconnect
from qrouter.reconnect import Backoff, reconnect_forever

LOG = logging.getLogger("qrouter.test_reconnect")


def test_backoff_doubles_to_two_seconds_and_starts_over() -> None:
    b = Backoff()
    assert [b.next() for _ in range(8)] == [0.1, 0.2, 0.4, 0.8, 1.6, 2.0, 2.0, 2.0]
    b.reset()
    assert b.next() == 0.1


class Stop(Exception):
    pass


def run(outcomes: list[Any], quiet: tuple[type[BaseException], ...] = ()) -> list[float]:
    """Run the loop over `outcomes` (an exception to raise, or seconds a connection stays
    up), with the waits recorded instead of slept; returns the waits."""
    waits: list[float] = []
    todo = list(outcomes)

    async def connect() -> Any:
        what = todo.pop(0)
        if isinstance(what, BaseException):
            raise what
        return asyncio.sleep(what)

    async def sleep(delay: float) -> None:
        waits.append(delay)
        if not todo:
            raise Stop

    with pytest.raises(Stop):
        asyncio.run(asyncio.wait_for(reconnect_forever(connect, "c", LOG, quiet, sleep=sleep), 10))
    return waits


def test_waits_double_and_each_error_is_a_warning_once(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger=LOG.name)
    refused, other = OSError("refused"), ValueError("empty password")
    waits = run([refused, refused, refused, other, other, refused, 0.0])
    assert waits == [0.1, 0.2, 0.4, 0.8, 1.6, 2.0, 2.0]  # a short-lived connection: no reset
    levels = [(r.levelno, r.getMessage()) for r in caplog.records]
    assert levels[:6] == [
        (logging.WARNING, "c: refused; retrying in 0.1 s"),
        (logging.DEBUG, "c: refused; retrying in 0.2 s"),
        (logging.DEBUG, "c: refused; retrying in 0.4 s"),
        (logging.WARNING, "c: empty password; retrying in 0.8 s"),
        (logging.DEBUG, "c: empty password; retrying in 1.6 s"),
        (logging.WARNING, "c: refused; retrying in 2.0 s"),  # another error came between
    ]
    assert levels[6:] == [(logging.INFO, "c: connected"), (logging.INFO, "c: connection closed")]


def test_quiet_errors_are_debug_only(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger=LOG.name)
    run([ConnectionRefusedError("refused"), OSError("bad certificate")], (ConnectionError,))
    assert [r.levelno for r in caplog.records] == [logging.DEBUG, logging.WARNING]


def test_a_connection_up_a_while_starts_the_waits_over(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(reconnect, "UP_FOR_S", 0.05)
    refused = OSError("refused")
    assert run([refused, refused, refused, 0.1, refused]) == [0.1, 0.2, 0.4, 0.1, 0.2]
    assert run([refused, refused, refused, 0.0, refused]) == [0.1, 0.2, 0.4, 0.8, 1.6]


def test_stops_when_not_running() -> None:
    calls: list[int] = []

    async def connect() -> Any:
        calls.append(1)
        raise OSError("refused")

    async def sleep(delay: float) -> None:
        pass

    async def main() -> None:
        await reconnect_forever(connect, "c", LOG, running=lambda: len(calls) < 3, sleep=sleep)

    asyncio.run(asyncio.wait_for(main(), 10))
    assert len(calls) == 3
