"""Broker tests: one private RabbitMQ per test module (tests/broker/rabbitmq.py), skipped
with the reason when rabbitmq-server is not installed (CI installs it: .ci/run)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.broker.rabbitmq import RabbitMQ, missing


@pytest.fixture(scope="module")
def rabbit(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RabbitMQ]:
    """A RabbitMQ node for the module's tests (its start-up, ~6-18 s, is paid once)."""
    reason = missing()
    if reason is not None:
        pytest.skip(reason)
    broker = RabbitMQ(Path(tmp_path_factory.mktemp("rabbitmq")))
    try:
        broker.start()
        print(f"\nRabbitMQ started in {broker.startup_seconds:.1f} s")
        yield broker
    finally:
        broker.stop()


@pytest.fixture
def broker_up(rabbit: RabbitMQ) -> RabbitMQ:
    """The module's broker, restarted if an earlier test left it down."""
    if rabbit.proc is None or rabbit.proc.poll() is not None:
        rabbit.start()
    return rabbit
