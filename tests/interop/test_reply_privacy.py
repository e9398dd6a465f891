"""Reply addresses are private (issue 14, 3): the address of a dynamic source (3.5.3) can be
attached as a receiver only by the connection that made it, with or without a policy; and
management queries from non-admins do not list it (router.address, link, terminus)."""

from __future__ import annotations

import concurrent.futures
from pathlib import Path
from typing import Any

import pytest
from proton import Delivery, Message
from proton.utils import LinkDetached

from tests.clients import pump_until_done
from tests.management.tooling import ok, run_tool


def test_only_the_creating_connection_may_receive(router: Any, blocking: Any) -> None:
    r = router()
    owner = blocking(r.url)
    reply = owner.create_receiver(None, dynamic=True, name="reply", credit=1)
    address = reply.link.remote_source.address
    assert address.startswith("_dynamic/")

    thief = blocking(r.url)
    with pytest.raises(LinkDetached) as info:
        thief.create_receiver(address, name="steal")
    condition = info.value.link.remote_condition
    assert condition.name == "amqp:unauthorized-access"
    assert condition.description == (
        f"{address!r} is the reply address of another connection (dynamic addresses are "
        "private to the connection that made them)"
    )
    # a made-up address under the dynamic prefix is refused too (nobody owns it)
    with pytest.raises(LinkDetached):
        thief.create_receiver("_dynamic/other-router/0123", name="guess")

    # anyone may still *send* to it (that is what a reply address is for); the owner gets it
    sender = thief.create_sender(address, name="answer")
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        future = pool.submit(sender.send, Message(body="the reply"), 15)
        assert reply.receive(timeout=10).body == "the reply"
        reply.accept()
        assert pump_until_done(reply.connection, future).remote_state == Delivery.ACCEPTED
    # and the owner may attach a second receiver to its own reply address
    owner.create_receiver(address, name="again")

    # once the owner is gone, nobody else may take the address over
    owner.close()
    with pytest.raises(LinkDetached):
        blocking(r.url).create_receiver(address, name="late")


def test_monitor_queries_do_not_list_reply_addresses(
    router: Any, blocking: Any, tmp_path: Path
) -> None:
    from qrouter.auth import hash_password

    users = tmp_path / "users"
    users.write_text(f"mon:{hash_password('mon-pw', iterations=1)}\n")
    # two listeners: the first, anonymous on loopback, is admin (no users file would be the
    # embedded default; with one, a policy makes the anonymous group admin on loopback)
    policy = tmp_path / "policy.toml"
    policy.write_text(
        '[[group]]\nname = "ops"\nusers = ["$anonymous"]\nsources = ["#"]\ntargets = ["#"]\n'
        'management = "admin"\n\n[[group]]\nname = "watchers"\nusers = ["mon"]\n'
        'management = "monitor"\n'
    )
    r = router(
        config={"users_file": str(users), "policy_file": str(policy)},
        listeners=[{"sasl_mechanisms": ["PLAIN", "ANONYMOUS"]}],
    )
    client = blocking(r.url)
    reply = client.create_receiver(None, dynamic=True, name="private-reply", credit=1)
    address = reply.link.remote_source.address
    client.create_receiver("visible.queue", name="public-consumer")
    mon = ["--user", "mon", "--password", "mon-pw"]

    def query(entity: str, *auth: str) -> list[dict[str, Any]]:
        return ok("manage", "query", "--type", entity, "--url", r.url, "--json", *auth).json()

    admin_addresses = {row["name"] for row in query("router.address")}
    assert address in admin_addresses and "visible.queue" in admin_addresses
    mon_addresses = {row["name"] for row in query("router.address", *mon)}
    assert "visible.queue" in mon_addresses
    assert not any(a.startswith("_dynamic/") for a in mon_addresses), mon_addresses

    assert any(row["address"] == address for row in query("link"))
    mon_links = query("link", *mon)
    assert any(row["address"] == "visible.queue" for row in mon_links)
    assert not any(str(row["address"]).startswith("_dynamic/") for row in mon_links)
    assert not any(str(row["address"]).startswith("_dynamic/") for row in query("terminus", *mon))

    # READ by name: found for the admin, not for the monitor
    ok("manage", "read", "--type", "router.address", "--name", address, "--url", r.url)
    hidden = run_tool(
        "manage", "read", "--type", "router.address", "--name", address, "--url", r.url, *mon
    )
    assert hidden.returncode == 1 and "404" in hidden.stderr, str(hidden)
