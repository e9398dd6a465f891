"""The [policy] (qrouter/policy.py, docs/configuration.md "Policy"): every rule allowed and
refused, with real routers, SASL PLAIN users from a users file and python-qpid-proton clients.

A refused attach is answered ATTACH + DETACH with amqp:unauthorized-access (or
amqp:resource-limit-exceeded for a maximum) and a description naming the group and the rule;
proton's BlockingConnection raises LinkDetached with that condition. A refused connection gets
CLOSE with the condition (ConnectionException). Refusals are counted (management entity
``policy.group``, /metrics ``qrouter_policy_refusals_total``) and logged at most once per
(connection, rule) per ``log_interval``.
"""

from __future__ import annotations

import concurrent.futures
import socket
import time
from pathlib import Path
from typing import Any

import pytest
from proton import ConnectionException, Delivery, Message
from proton.utils import LinkDetached, SendException

from tests.clients import pump_until_done
from tests.harness import HOST

PASSWORDS = {"alice": "alice-pw", "bob": "bob-pw", "carol": "carol-pw", "dave": "dave-pw"}

POLICY = """
log_interval = 60

[[group]]
name = "ops"
users = ["dave"]
management = "admin"

[[group]]
name = "apps"
users = ["alice"]
sources = ["orders.${user}", "public.#"]
targets = ["orders.#"]
allow_dynamic_source = false
max_senders = 2
max_receivers = 3
max_message_size = 1000
management = "monitor"

[[group]]
name = "relay"
users = ["bob"]
sources = ["#"]
targets = ["#"]
allow_anonymous_sender = true
max_connections_per_user = 1
max_sessions = 2

[[group]]
name = "guests"
users = ["$anonymous"]
sources = ["public.#"]
max_connections_per_host = 2
"""


def users_file(folder: Path) -> Path:
    from qrouter.auth import hash_password

    path = folder / "users"
    path.write_text(
        "".join(f"{u}:{hash_password(p, iterations=1)}\n" for u, p in PASSWORDS.items())
    )
    return path


def policy_router(router: Any, tmp_path: Path, policy: str = POLICY, **listener: Any) -> Any:
    path = tmp_path / "policy.toml"
    path.write_text(policy)
    return router(
        config={"users_file": str(users_file(tmp_path)), "policy_file": str(path)},
        listeners=[{"sasl_mechanisms": ["PLAIN", "ANONYMOUS"], **listener}],
    )


def as_user(user: str | None) -> dict[str, Any]:
    if user is None:
        return {"allowed_mechs": "ANONYMOUS"}
    return {
        "allowed_mechs": "PLAIN",
        "user": user,
        "password": PASSWORDS[user],
        "allow_insecure_mechs": True,  # PLAIN without TLS, on loopback
    }


def refused(make: Any, condition: str = "amqp:unauthorized-access") -> str:
    """Call `make` (a create_sender/create_receiver); it must be refused: the description."""
    with pytest.raises(LinkDetached) as info:
        make()
    link = info.value.link
    assert link.remote_condition is not None, "detached without an error"
    assert link.remote_condition.name == condition, link.remote_condition
    return str(link.remote_condition.description)


def deliver(sender: Any, receiver: Any, message: Message) -> None:
    """Send from one blocking connection to a receiver on another (or the same), keeping the
    receiver's connection pumping while the sender waits for the outcome."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        future = pool.submit(sender.send, message, 15)
        got = receiver.receive(timeout=10)
        assert got.body == message.body
        receiver.accept()
        assert pump_until_done(receiver.connection, future).remote_state == Delivery.ACCEPTED


def refusals(r: Any) -> dict[tuple[str, str], int]:
    from tests.management.tooling import ok

    rows = ok(
        "manage", "query", "--type", "policy.group", "--url", r.url, "--json",
        "--user", "dave", "--password", PASSWORDS["dave"],
    ).json()  # fmt: skip
    return {
        (row["name"], rule): n for row in rows for rule, n in (row["refused_by_rule"] or {}).items()
    }


def test_sources_and_targets(router: Any, blocking: Any, tmp_path: Path) -> None:
    r = policy_router(router, tmp_path)
    alice = blocking(r.url, **as_user("alice"))
    # ${user} in sources: her own orders.alice, not bob's
    mine = alice.create_receiver("orders.alice", name="mine", credit=1)
    alice.create_receiver("public.news.today", name="public")  # public.# : any depth
    text = refused(lambda: alice.create_receiver("orders.bob", name="theirs"))
    assert text == (
        "policy group 'apps': source 'orders.bob' not in sources ['orders.${user}', 'public.#']"
    )
    # targets: orders.# yes, anything else no
    alice.create_sender("orders.new", name="s1")
    text = refused(lambda: alice.create_sender("billing.x", name="s2"))
    assert text == "policy group 'apps': target 'billing.x' not in targets ['orders.#']"

    # what was allowed works: a message from bob (sources/targets '#') to alice's queue
    bob = blocking(r.url, **as_user("bob"))
    deliver(bob.create_sender("orders.alice", name="to-alice"), mine, Message(body="for alice"))
    counted = refusals(r)
    assert counted[("apps", "sources")] == 1 and counted[("apps", "targets")] == 1


def test_dynamic_source_and_anonymous_relay(router: Any, blocking: Any, tmp_path: Path) -> None:
    policy = POLICY.replace("max_connections_per_user = 1", "max_connections_per_user = 2")
    r = policy_router(router, tmp_path, policy)
    alice = blocking(r.url, **as_user("alice"))
    text = refused(lambda: alice.create_receiver(None, dynamic=True, name="reply"))
    assert "allow_dynamic_source" in text and "'apps'" in text
    text = refused(lambda: alice.create_sender(None, name="relay"))
    assert "anonymous relay" in text and "allow_anonymous_sender" in text

    bob = blocking(r.url, **as_user("bob"))
    reply = bob.create_receiver(None, dynamic=True, name="reply", credit=1)
    assert reply.link.remote_source.address.startswith("_dynamic/")
    relay = blocking(r.url, **as_user("bob")).create_sender(None, name="relay")  # allowed
    deliver(relay, reply, Message(address=reply.link.remote_source.address, body="via relay"))
    counted = refusals(r)
    assert counted[("apps", "allow_dynamic_source")] == 1
    assert counted[("apps", "allow_anonymous_sender")] == 1


def test_max_senders_and_receivers(router: Any, blocking: Any, tmp_path: Path) -> None:
    r = policy_router(router, tmp_path)
    alice = blocking(r.url, **as_user("alice"))
    senders = [alice.create_sender("orders.a", name=f"s{i}") for i in range(2)]
    text = refused(
        lambda: alice.create_sender("orders.a", name="s2"), "amqp:resource-limit-exceeded"
    )
    assert text == "policy group 'apps': 2 senders on this connection (max_senders 2)"
    receivers = [alice.create_receiver("public.a", name=f"r{i}") for i in range(3)]
    text = refused(
        lambda: alice.create_receiver("public.a", name="r3"), "amqp:resource-limit-exceeded"
    )
    assert text == "policy group 'apps': 3 receivers on this connection (max_receivers 3)"
    # a closed link frees its place
    senders[0].close()
    alice.create_sender("orders.a", name="s3")
    # the maxima are per connection: another connection of the same user starts afresh
    other = blocking(r.url, **as_user("alice"))
    other.create_sender("orders.a", name="s0")
    del receivers


def test_max_message_size(router: Any, blocking: Any, tmp_path: Path) -> None:
    # bob needs two connections here: one blocking connection must not be pumped by two
    # threads at once
    policy = POLICY.replace("max_connections_per_user = 1", "max_connections_per_user = 2")
    r = policy_router(router, tmp_path, policy)
    alice = blocking(r.url, **as_user("alice"))
    sender = alice.create_sender("orders.big", name="big")
    # 2.7.3: the router's ATTACH states the group's maximum
    assert sender.link.remote_max_message_size == 1000
    bob = blocking(r.url, **as_user("bob"))
    consumer = bob.create_receiver("orders.big", credit=5)
    deliver(sender, consumer, Message(body="x" * 500))
    with pytest.raises((LinkDetached, SendException)):
        sender.send(Message(body="y" * 2000), timeout=10)
    assert sender.link.remote_condition.name == "amqp:link:message-size-exceeded"
    # bob's group has no maximum of its own: the router's (100 MiB) applies
    big = blocking(r.url, **as_user("bob")).create_sender("orders.big", name="bob-big")
    assert big.link.remote_max_message_size == 100 * 1024 * 1024
    deliver(big, consumer, Message(body="z" * 2000))


def test_unknown_user_refused(router: Any, blocking: Any, tmp_path: Path) -> None:
    r = policy_router(router, tmp_path)
    # carol authenticates (she is in the users file) but is in no group
    with pytest.raises(ConnectionException, match="allow_unknown_user"):
        blocking(r.url, timeout=5, **as_user("carol"))
    assert refusals(r)[("", "allow_unknown_user")] == 1


def test_unknown_user_allowed_gets_the_default_group(
    router: Any, blocking: Any, tmp_path: Path
) -> None:
    policy = POLICY.replace(
        "log_interval = 60",
        'log_interval = 60\nallow_unknown_user = true\ndefault_group = "guests"',
    )
    r = policy_router(router, tmp_path, policy)
    carol = blocking(r.url, **as_user("carol"))
    carol.create_receiver("public.x", name="ok")  # the guests' sources
    text = refused(lambda: carol.create_receiver("orders.carol", name="no"))
    assert text.startswith("policy group 'guests': source 'orders.carol'")


def test_max_connections_per_user(router: Any, blocking: Any, tmp_path: Path) -> None:
    r = policy_router(router, tmp_path)
    first = blocking(r.url, **as_user("bob"))
    with pytest.raises(ConnectionException, match="max_connections_per_user 1"):
        blocking(r.url, timeout=5, **as_user("bob"))
    first.close()

    # once the first is gone, bob may connect again (the count follows closes)
    def again() -> Any:
        try:
            return blocking(r.url, timeout=5, **as_user("bob"))
        except ConnectionException:
            return None

    from tests.harness import retry

    retry(again, timeout=10, message="bob cannot connect after closing his connection")
    assert refusals(r)[("relay", "max_connections_per_user")] == 1


def test_max_connections_per_host(router: Any, blocking: Any, tmp_path: Path) -> None:
    r = policy_router(router, tmp_path)
    guests = [blocking(r.url, **as_user(None)) for _ in range(2)]
    with pytest.raises(ConnectionException, match="resource-limit-exceeded|max_connections"):
        blocking(r.url, timeout=5, **as_user(None))
    assert len(guests) == 2
    counted = refusals(r)
    assert counted[("guests", "max_connections_per_host")] == 1


def test_refused_connection_gets_the_condition(router: Any, tmp_path: Path) -> None:
    """The CLOSE itself, read off a raw socket: condition and description (2.7.9)."""
    from tests.engine.pump import AMQP_HEADER, CLOSE, open_frame, parse_output

    r = policy_router(router, tmp_path, POLICY.replace('"$anonymous"', '"nobody"'))
    with socket.create_connection((HOST, r.port), timeout=10) as sock:
        # no SASL layer: an anonymous connection (the listener does not require auth)
        sock.sendall(AMQP_HEADER + open_frame("raw"))
        data = _read_until_close(sock)
    _headers, frames = parse_output(data)
    close = [f for f in frames if f.code == CLOSE]
    assert close, frames
    condition, description = close[0].error()  # type: ignore[misc]
    assert condition == "amqp:unauthorized-access"
    assert description == (
        "policy: anonymous connections in no group, and allow_unknown_user is false"
    )


def test_max_sessions(router: Any, tmp_path: Path) -> None:
    """max_sessions 2: our OPEN says channel-max 1 (2.7.1); a BEGIN on channel 2 closes the
    connection with a framing error (a peer that ignores channel-max)."""
    from tests.engine.pump import AMQP_HEADER, CLOSE, OPEN, begin_frame, open_frame
    from tests.engine.pump import parse_output as parse

    policy = POLICY.replace("max_connections_per_host = 2", "max_sessions = 2")
    r = policy_router(router, tmp_path, policy)
    with socket.create_connection((HOST, r.port), timeout=10) as sock:
        sock.sendall(AMQP_HEADER + open_frame("raw") + begin_frame(0) + begin_frame(1))
        sock.sendall(begin_frame(2))
        data = _read_until_close(sock)
    _headers, frames = parse(data)
    opens = [f for f in frames if f.code == OPEN]
    assert opens and opens[0].fields["channel_max"] == 1
    assert len([f for f in frames if f.name == "begin"]) == 2
    close = [f for f in frames if f.code == CLOSE]
    assert close and close[0].error()[0] == "amqp:connection:framing-error"  # type: ignore[index]


def test_refusals_in_metrics_and_log_rate_limited(
    router: Any, blocking: Any, tmp_path: Path
) -> None:
    import urllib.request

    from tests.harness import free_port

    path = tmp_path / "policy.toml"
    path.write_text(POLICY)
    metrics_port = free_port()
    r = router(
        config={
            "users_file": str(users_file(tmp_path)),
            "policy_file": str(path),
            "metrics": f"{HOST}:{metrics_port}",
        },
        listeners=[{"sasl_mechanisms": ["PLAIN", "ANONYMOUS"]}],
    )
    alice = blocking(r.url, **as_user("alice"))
    for i in range(5):
        refused(lambda i=i: alice.create_receiver("orders.bob", name=f"x{i}"))
    refused(lambda: alice.create_sender("nope", name="t"))
    with urllib.request.urlopen(f"http://{HOST}:{metrics_port}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    assert 'qrouter_policy_refusals_total{group="apps",rule="sources"} 5.0' in text
    assert 'qrouter_policy_refusals_total{group="apps",rule="targets"} 1.0' in text
    assert 'qrouter_policy_connections{group="apps"} 1.0' in text
    # log_interval 60: one line for the five source refusals of this connection, one for the
    # target refusal (another rule)
    deadline = time.monotonic() + 10
    while True:
        log = r.outfile.read_text(errors="replace")
        lines = [line for line in log.splitlines() if "qrouter.policy" in line]
        if len(lines) >= 2 or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert len([line for line in lines if "not in sources" in line]) == 1, lines
    assert len([line for line in lines if "not in targets" in line]) == 1, lines
    assert "user 'alice'" in lines[0]


def test_no_policy_allows_everything(router: Any, blocking: Any, tmp_path: Path) -> None:
    r = router(
        config={"users_file": str(users_file(tmp_path))},
        listeners=[{"sasl_mechanisms": ["PLAIN", "ANONYMOUS"]}],
    )
    carol = blocking(r.url, **as_user("carol"))
    carol.create_receiver(None, dynamic=True, name="d")
    carol.create_sender(None, name="relay")
    for i in range(5):
        carol.create_sender(f"any.where.{i}", name=f"s{i}")
    anonymous = blocking(r.url, **as_user(None))
    anonymous.create_receiver("orders.bob", name="r")


def _read_until_close(sock: socket.socket, timeout: float = 10.0) -> bytes:
    sock.settimeout(timeout)
    data = b""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            break
        if not chunk:
            break
        data += chunk
    return data


def test_max_sessions_refusal_is_counted(router: Any, tmp_path: Path) -> None:
    """The framing error for a BEGIN above the channel-max that max_sessions set names the
    policy rule, and counts as the group's refusal in /metrics."""
    from tests.engine.pump import AMQP_HEADER, CLOSE, begin_frame, open_frame
    from tests.engine.pump import parse_output as parse
    from tests.harness import free_port, retry
    from tests.management.tooling import scrape, value

    path = tmp_path / "policy.toml"
    path.write_text(POLICY.replace("max_connections_per_host = 2", "max_sessions = 2"))
    metrics_port = free_port()
    r = router(
        config={
            "users_file": str(users_file(tmp_path)),
            "policy_file": str(path),
            "metrics": f"{HOST}:{metrics_port}",
        },
        listeners=[{"sasl_mechanisms": ["PLAIN", "ANONYMOUS"]}],
    )
    with socket.create_connection((HOST, r.port), timeout=10) as sock:
        sock.sendall(AMQP_HEADER + open_frame("raw") + begin_frame(0) + begin_frame(1))
        sock.sendall(begin_frame(2))
        data = _read_until_close(sock)
    close = [f for f in parse(data)[1] if f.code == CLOSE]
    error = close[0].error() if close else None
    assert error is not None and error[0] == "amqp:connection:framing-error", close
    assert "policy group 'guests'" in str(error[1]) and "max_sessions 2" in str(error[1])
    # the harness waits for the AMQP listener; /metrics may start a moment later
    metrics = retry(lambda: scrape(metrics_port), timeout=10, message="/metrics never answered")
    assert value(metrics, "qrouter_policy_refusals_total", group="guests", rule="max_sessions") == 1
