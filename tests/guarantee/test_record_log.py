"""Guaranteed topics' records through the router's record log (qrouter/_fast/eo_log.pxi,
`Guarantees.flush`): each loop iteration's records are log entries, kept net until the
checkpoint, where they reach the store's records in one transaction with the durable links';
a record made and deleted between two checkpoints never reaches them.

The engine's net journal is driven directly (a committer that records what it is given); the
crash test runs a router on LMDB with checkpoints held off (QROUTER_TEST_CHECKPOINT_SECONDS),
SIGKILLs it with records only in the log, looks at the store it left, and restarts it."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from qrouter._fast.engine import Router, commit_logged, log_writes

from qrouter import stores
from qrouter.client import Client
from qrouter.client import Message as ClientMessage
from qrouter.stores import open_store
from qrouter.stores.termini import read_log
from tests.client.conftest import run
from tests.guarantee.common import topic_rows, wait_until
from tests.harness import free_port

TOPIC = "events"


class _Committer:
    """The store side of `Router.commit_log`: what each call carried."""

    def __init__(self) -> None:
        self.appends: list[bytes] = []
        self.checkpoints: list[tuple[dict[bytes, bytes], set[bytes]]] = []
        self.fail = False

    def __call__(
        self, blob: bytes | None, puts: dict[bytes, bytes] | None, deletes: set[bytes] | None
    ) -> None:
        if self.fail:
            raise OSError(28, "no space left")
        if blob is not None:
            self.appends.append(blob)
        else:
            assert puts is not None and deletes is not None
            self.checkpoints.append((dict(puts), set(deletes)))


def _router() -> tuple[Router, _Committer]:
    r = Router("eolog-test")
    c = _Committer()
    r.committer = c
    return r, c


def test_records_made_and_deleted_between_checkpoints_never_reach_the_records() -> None:
    r, c = _router()
    born_o, born_m = b"eo/t/o/new", b"eo/t/m/new"
    old_o, kept = b"eo/t/o/old", b"eo/t/k/sub"
    log_writes(r, {born_o: b"s1", born_m: b"body", kept: b"att"}, set(), {born_o, born_m})
    assert commit_logged(r)
    log_writes(r, {born_o: b"s2", old_o: b"s9"}, set(), set())  # updates: still new
    assert commit_logged(r)
    log_writes(r, {}, {born_o, born_m, old_o}, set())
    assert commit_logged(r)
    assert len(c.appends) == 3 and not c.checkpoints  # one append per commit
    assert all(born_o in blob or old_o in blob for blob in c.appends[1:])
    r.checkpoint()
    # the new record went in the interval; the older one (the store may hold it) is deleted
    assert c.checkpoints == [({kept: b"att"}, {old_o})]
    assert not r.journal and not r.journal_del
    # a key made again after a checkpoint deleted it is new again; one deleted and made
    # again within the interval is not (the records may hold the old one)
    log_writes(r, {}, {kept}, set())
    log_writes(r, {kept: b"att2", old_o: b"again"}, set(), {kept, old_o})
    log_writes(r, {}, {kept}, set())
    r.checkpoint()
    assert c.checkpoints[-1] == ({old_o: b"again"}, {kept})


def test_a_failed_append_keeps_the_entries_for_the_retry() -> None:
    r, c = _router()
    c.fail = True
    log_writes(r, {b"eo/t/o/a": b"s"}, set(), {b"eo/t/o/a"})
    assert not commit_logged(r)
    assert r.store_down and not commit_logged(r)  # held until the retry
    c.fail = False
    assert r.retry_commit()
    assert not r.store_down and commit_logged(r)
    assert len(c.appends) == 1 and b"eo/t/o/a" in c.appends[0]
    r.checkpoint()
    assert c.checkpoints == [({b"eo/t/o/a": b"s"}, set())]


def test_memory_router_has_no_record_log() -> None:
    with pytest.raises(RuntimeError, match="no record log"):
        log_writes(Router("eolog-test"), {b"eo/t/o/a": b"s"}, set(), set())


def _logged(path: Path) -> tuple[list[bytes], dict[bytes, bytes | None]]:
    """What a dead router's LMDB store holds: its origin records, and the log's net changes."""
    store = open_store("lmdb", str(path))
    try:
        stored = [k for k, _ in store.scan(b"eo/" + TOPIC.encode() + b"/o/")]
        changes = {k: v for k, v in read_log(store).changes.items() if k.startswith(b"eo/")}
    finally:
        store.close()
    return stored, changes


@pytest.mark.skipif(not stores.available("lmdb"), reason="needs the lmdb store: pip install lmdb")
def test_records_only_in_the_log_survive_sigkill_and_deliver_exactly_once(
    router: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("QROUTER_TEST_CHECKPOINT_SECONDS", "3600")  # only at a clean stop
    port = free_port()
    path = tmp_path / "store"

    def start(name: str) -> Any:
        return router(
            name,
            router_id="r",
            listeners=[{"port": port}],
            addresses={TOPIC: "multicast,exactly-once"},
            extra_args=["--store", "lmdb", "--store-path", str(path)],
        )

    r = start("r0")
    url = r.url
    n, m = 5, 20

    async def scenario() -> None:
        slow = {"backoff": (1.0, 1.0), "reconnect_timeout": 60.0, "connect_timeout": 3.0}
        subc = await Client.connect(url, "sub", **slow)
        receiver = await subc.receiver(TOPIC, "sub", exactly_once=True, credit=50)
        await wait_until(
            lambda: [row["subscribers"] for row in topic_rows(url)] == [1], 10, lambda: "sub"
        )
        pubc = await Client.connect(url, "pub", **slow)
        sender = await pubc.sender(TOPIC, "pub", exactly_once=True)
        futs = [sender.submit(ClientMessage(body=f"m{i}")) for i in range(n)]
        held = [await receiver.receive(timeout=10) for _ in range(n)]
        assert sorted(h.message.body for h in held) == [f"m{i}" for i in range(n)]
        r.kill()

        # the records were delivered from, so they are durable: in the log, not the records
        stored, changes = await asyncio.to_thread(_logged, path)
        assert stored == [], "a checkpoint ran: the test proves nothing"
        origins = [k for k, v in changes.items() if b"/o/" in k and v is not None]
        bodies = [v for k, v in changes.items() if b"/m/" in k and v is not None]
        assert len(origins) == n and len(bodies) == n, changes

        r1 = await asyncio.to_thread(start, "r1")
        rows = await asyncio.to_thread(topic_rows, r1.url)
        assert [(row["origin_records"], row["publishers"]) for row in rows] == [(n, 0)], rows
        for h in held:  # the clients resume; accepting completes every delivery
            await h.accept()
        outcomes = await asyncio.wait_for(asyncio.gather(*futs), 30)
        assert {o.state for o in outcomes} == {"accepted"}

        # more messages, made and done within the interval: the log has them, the records not
        got: list[str] = []

        async def consume() -> None:
            async for received in receiver:
                got.append(received.message.body)
                await received.accept()

        task = asyncio.get_running_loop().create_task(consume())
        more = [sender.submit(ClientMessage(body=f"x{i}")) for i in range(m)]
        assert all(o.accepted for o in await asyncio.wait_for(asyncio.gather(*more), 30))
        await wait_until(
            lambda: [row["origin_records"] for row in topic_rows(url)] == [0],
            30,
            lambda: f"records: {topic_rows(url)}",
        )
        r1.kill()
        stored, changes = await asyncio.to_thread(_logged, path)
        # the records hold the first n (the fold at start put them) and nothing else; the
        # log deletes them, and the m made since were put and deleted in the log alone
        assert len(stored) == n and all(changes.get(k, b"") is None for k in stored), stored
        origins = [k for k in changes if b"/o/" in k]
        assert len(origins) == n + m and all(changes[k] is None for k in origins), changes

        await asyncio.to_thread(start, "r2")
        await asyncio.sleep(3.0)  # the clients are back (1 s backoff); a duplicate comes now
        rows = await asyncio.to_thread(topic_rows, url)
        assert [row["origin_records"] for row in rows] == [0], rows
        task.cancel()
        await pubc.close()
        await subc.close()
        # each once, and none of the first n again (the consumer takes whatever comes)
        assert sorted(got, key=lambda b: int(b[1:])) == [f"x{i}" for i in range(m)], got

    run(scenario(), timeout=120)
