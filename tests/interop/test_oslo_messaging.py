"""OpenStack oslo.messaging's AMQP 1.0 driver (`amqp://`, pyngus over proton)
against the router: RPC call, cast, fanout, call to a named server, a call
nobody answers, and notifications.

The driver builds its addresses from its addressing mode:
* `routable` — `openstack.org/om/rpc/{anycast,unicast,multicast}/...` and
  `openstack.org/om/notify/...`: the router's built-in oslo preset must give
  them balanced / closest / multicast distribution;
* `dynamic` (the driver's default) — routable if the peer's OPEN carries a
  `product` property other than qpid-cpp (oslo_messaging/_drivers/
  amqp1_driver/addressing.py, AddresserFactory), which the router's does;
* `legacy` — `unicast.`/`exclusive.`/`broadcast.` prefixes, also preset.

Pinned: oslo.messaging<15 (the last series with the AMQP 1.0 driver) and pyngus.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

oslo_messaging = pytest.importorskip(
    "oslo_messaging",
    reason="oslo.messaging<15 is a test dependency (pip install 'oslo.messaging<15' pyngus)",
)
pytest.importorskip(
    "pyngus", reason="pyngus is the AMQP 1.0 driver's protocol library (pip install pyngus)"
)

from oslo_config import cfg  # noqa: E402

GROUP = "oslo_messaging_amqp"
TOPIC = "qrouter-test"

pytestmark = [
    pytest.mark.timeout(120),
    # the AMQP 1.0 driver is deprecated upstream (removed in oslo.messaging 15),
    # and oslo.service warns about eventlet: neither is ours to fix
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
]


class Endpoint:
    def __init__(self, name: str) -> None:
        self.name = name
        self.casts: queue.Queue[tuple[str, Any]] = queue.Queue()

    def echo(self, ctxt: dict[str, Any], value: Any) -> dict[str, Any]:
        return {"server": self.name, "value": value}

    def record(self, ctxt: dict[str, Any], value: Any) -> None:
        self.casts.put((self.name, value))


class NotificationEndpoint:
    def __init__(self) -> None:
        self.seen: queue.Queue[tuple[str, str, Any]] = queue.Queue()

    def info(
        self, ctxt: Any, publisher_id: str, event_type: str, payload: Any, metadata: Any
    ) -> None:
        self.seen.put(("info", event_type, payload))

    def error(
        self, ctxt: Any, publisher_id: str, event_type: str, payload: Any, metadata: Any
    ) -> None:
        self.seen.put(("error", event_type, payload))


def _bounded(fn: Callable[[], Any], timeout: float, what: str) -> None:
    """Run a possibly blocking shutdown call in a thread, bounded."""
    errors: list[BaseException] = []

    def run() -> None:
        try:
            fn()
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    t = threading.Thread(target=run, daemon=True, name=f"stop {what}")
    t.start()
    t.join(timeout)
    if t.is_alive():
        raise AssertionError(f"{what} did not stop within {timeout}s")
    if errors:
        raise errors[0]


class Oslo:
    """Transports, servers and listeners of one test, all stopped at teardown."""

    def __init__(self, url: str, mode: str) -> None:
        self.url = url
        self.mode = mode
        self.conf = cfg.ConfigOpts()
        self.conf([], project="qrouter-tests", default_config_files=[], default_config_dirs=[])
        from oslo_messaging._drivers.amqp1_driver import opts
        from oslo_messaging._metrics import client as metrics

        # Register the driver's options now (it registers the same objects
        # again when it loads, which oslo.config allows) so they can be set;
        # and the metrics options the RPC client reads (oslo.messaging's own
        # ConfFixture does the same for a private ConfigOpts).
        self.conf.register_group(cfg.OptGroup(name=GROUP))
        self.conf.register_opts(opts.amqp1_opts, group=GROUP)
        self.conf.register_opts(metrics.oslo_messaging_metrics, group="oslo_messaging_metrics")
        self.conf.set_override("addressing_mode", mode, group=GROUP)
        self.conf.set_override("connection_retry_interval", 1, group=GROUP)
        self.conf.set_override("connection_retry_interval_max", 2, group=GROUP)
        self.conf.set_override("link_retry_delay", 1, group=GROUP)
        self.conf.set_override("default_reply_timeout", 10, group=GROUP)
        self.conf.set_override("default_send_timeout", 10, group=GROUP)
        self.conf.set_override("default_notify_timeout", 10, group=GROUP)
        self.transports: list[Any] = []
        self.servers: list[Any] = []

    def rpc_transport(self) -> Any:
        t = oslo_messaging.get_rpc_transport(self.conf, url=self.url)
        self.transports.append(t)
        return t

    def notification_transport(self) -> Any:
        t = oslo_messaging.get_notification_transport(self.conf, url=self.url)
        self.transports.append(t)
        return t

    def rpc_server(self, name: str, topic: str = TOPIC) -> Endpoint:
        endpoint = Endpoint(name)
        target = oslo_messaging.Target(topic=topic, server=name)
        server = oslo_messaging.get_rpc_server(
            self.rpc_transport(), target, [endpoint], executor="threading"
        )
        server.start()
        self.servers.append(server)
        return endpoint

    def client(self, topic: str = TOPIC, timeout: float = 10) -> Any:
        target = oslo_messaging.Target(topic=topic)
        return oslo_messaging.get_rpc_client(self.rpc_transport(), target, timeout=timeout)

    def notification_listener(self, topic: str) -> NotificationEndpoint:
        endpoint = NotificationEndpoint()
        listener = oslo_messaging.get_notification_listener(
            self.notification_transport(),
            [oslo_messaging.Target(topic=topic)],
            [endpoint],
            executor="threading",
        )
        listener.start()
        self.servers.append(listener)
        return endpoint

    def close(self) -> None:
        for server in self.servers:
            _bounded(server.stop, 15, "oslo server stop")
            _bounded(server.wait, 15, "oslo server wait")
        for t in self.transports:
            _bounded(t.cleanup, 35, "oslo transport cleanup")


@pytest.fixture(params=["routable", "dynamic"])
def oslo(request: pytest.FixtureRequest, router: Any) -> Iterator[Oslo]:
    r = router()
    env = Oslo(f"amqp://127.0.0.1:{r.port}/", request.param)
    try:
        yield env
    finally:
        env.close()


def _addresser_kind(transport: Any) -> str:
    ctrl = transport._driver._ctrl
    return (
        type(ctrl.addresser).__name__ if ctrl is not None and ctrl.addresser is not None else "none"
    )


def test_rpc_call(oslo: Oslo) -> None:
    oslo.rpc_server("server-1")
    client = oslo.client()
    assert client.call({}, "echo", value=42) == {"server": "server-1", "value": 42}
    # 'dynamic' must have picked routable addressing from the router's OPEN
    assert _addresser_kind(oslo.transports[-1]) == "RoutableAddresser"


def test_rpc_cast(oslo: Oslo) -> None:
    endpoint = oslo.rpc_server("server-1")
    client = oslo.client()
    client.cast({}, "record", value="cast-1")
    assert endpoint.casts.get(timeout=10) == ("server-1", "cast-1")
    assert endpoint.casts.empty()


def test_rpc_fanout_to_two_servers(oslo: Oslo) -> None:
    a = oslo.rpc_server("server-a")
    b = oslo.rpc_server("server-b")
    client = oslo.client()
    # Both servers answer by name first: their subscriptions are attached.
    assert client.prepare(server="server-a").call({}, "echo", value=1)["server"] == "server-a"
    assert client.prepare(server="server-b").call({}, "echo", value=2)["server"] == "server-b"
    # The multicast link is attached alongside the others; probe until both
    # see a fanout (bounded), then check one fanout reaches each exactly once.
    fanout = client.prepare(fanout=True)
    deadline = time.monotonic() + 10
    seen: set[str] = set()
    probe = 0
    while seen != {"server-a", "server-b"} and time.monotonic() < deadline:
        fanout.cast({}, "record", value=f"probe-{probe}")
        probe += 1
        time.sleep(0.2)
        for ep in (a, b):
            while not ep.casts.empty():
                seen.add(ep.casts.get_nowait()[0])
    assert seen == {"server-a", "server-b"}, f"fanout probes reached only {seen}"
    time.sleep(0.3)
    for ep in (a, b):
        while not ep.casts.empty():
            ep.casts.get_nowait()
    fanout.cast({}, "record", value="everyone")
    assert a.casts.get(timeout=10) == ("server-a", "everyone")
    assert b.casts.get(timeout=10) == ("server-b", "everyone")
    time.sleep(0.3)
    assert a.casts.empty() and b.casts.empty(), "a fanout cast arrived twice"


def test_rpc_call_to_named_server(oslo: Oslo) -> None:
    oslo.rpc_server("server-a")
    oslo.rpc_server("server-b")
    client = oslo.client()
    for _ in range(5):
        assert client.prepare(server="server-b").call({}, "echo", value="x")["server"] == "server-b"
        assert client.prepare(server="server-a").call({}, "echo", value="y")["server"] == "server-a"


def test_rpc_call_without_server_times_out(oslo: Oslo) -> None:
    client = oslo.client(topic="nobody-listens", timeout=3)
    start = time.monotonic()
    with pytest.raises(oslo_messaging.MessagingTimeout):
        client.call({}, "echo", value=1)
    elapsed = time.monotonic() - start
    assert 2.5 <= elapsed < 15, f"timed out after {elapsed:.1f}s, asked for 3s"


def test_notification_send_and_listen(oslo: Oslo) -> None:
    endpoint = oslo.notification_listener("qrouter-notify")
    notifier = oslo_messaging.Notifier(
        oslo.notification_transport(),
        publisher_id="test.publisher",
        driver="messaging",
        topics=["qrouter-notify"],
    )
    notifier.info({}, "thing.happened", {"n": 1})
    notifier.error({}, "thing.failed", {"n": 2})
    got = sorted(
        [endpoint.seen.get(timeout=15), endpoint.seen.get(timeout=15)], key=lambda seen: seen[0]
    )
    assert got == [("error", "thing.failed", {"n": 2}), ("info", "thing.happened", {"n": 1})]


def test_legacy_addressing_call_and_fanout(router: Any) -> None:
    """addressing_mode legacy: `unicast.`/`exclusive.`/`broadcast.` prefixes."""
    r = router()
    env = Oslo(f"amqp://127.0.0.1:{r.port}/", "legacy")
    try:
        env.rpc_server("legacy-a")
        client = env.client()
        assert client.call({}, "echo", value=7) == {"server": "legacy-a", "value": 7}
        assert client.prepare(server="legacy-a").call({}, "echo", value=8)["value"] == 8
        assert _addresser_kind(env.transports[-1]) == "LegacyAddresser"
    finally:
        env.close()
