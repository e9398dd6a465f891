"""Store failure is fail-stop (issue 13, point 5; qrouter/store_health.py).

Real routers on real LMDB / LevelDB directories, durable (durability 2) proton links:

* a store whose commits fail for a while (the test hook QROUTER_TEST_STORE_FAIL: ENOSPC while
  a flag file exists): no outcome reaches the producer for deliveries made while it fails,
  the router lives, says so in one log line, /metrics and $management show it, a new durable
  attach is refused; when the file goes, everything held goes out and nothing is lost;
* a real LMDB map at its size limit (store_map_size) under durable traffic: the same hold,
  and a restart with a larger map recovers every unsettled delivery;
* a torn entry at the record log's tail after SIGKILL is dropped, the entries before it
  are recovered.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from proton import Delivery, Message, Terminus
from proton.reactor import LinkOption

from qrouter import stores
from tests.harness import free_port, retry
from tests.management.tooling import scrape, value

FAIL_LINE = "store: commit failed"
BACK_LINE = "store: commits succeed again"


class DurableTarget(LinkOption):  # type: ignore[misc]
    """A sender whose target keeps unsettled state (3.5.5 durability 2, expiry never)."""

    def apply(self, link: Any) -> None:
        link.target.durability = Terminus.DELIVERIES
        link.target.expiry_policy = Terminus.EXPIRE_NEVER


class DurableSource(LinkOption):  # type: ignore[misc]
    def apply(self, link: Any) -> None:
        link.source.durability = Terminus.DELIVERIES
        link.source.expiry_policy = Terminus.EXPIRE_NEVER


def need(name: str) -> Any:
    return pytest.param(
        name,
        id=name,
        marks=pytest.mark.skipif(
            not stores.available(name),
            reason=f"the {name} store's driver is not installed: pip install {stores.DRIVERS[name]}",
        ),
    )


def pump(conns: list[Any], seconds: float) -> None:
    """Keep the clients' I/O going for `seconds` (what the router sends arrives)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for c in conns:
            _tick(c)


def _tick(conn: Any) -> None:
    from proton import Timeout

    try:
        conn.wait(lambda: False, timeout=0.05)
    except Timeout:
        pass


def pump_until(conns: list[Any], cond: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up after {timeout}s: {what}")
        for c in conns:
            _tick(c)


def log_count(r: Any, text: str) -> int:
    return r.log_tail(100000).count(text)


def settled(ds: list[Any]) -> int:
    return sum(1 for d in ds if d.remote_state != 0 or d.settled)


@pytest.mark.parametrize("store", [need("lmdb"), need("leveldb")])
def test_failing_commits_hold_durable_output_until_the_store_works(
    router: Any, blocking: Any, tmp_path: Path, store: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    flag = tmp_path / "store-full"
    monkeypatch.setenv("QROUTER_TEST_STORE_FAIL", str(flag))
    mport = free_port()
    r = router(
        extra_args=[
            "--store", store, "--store-path", str(tmp_path / "store"),
            "--metrics", f"127.0.0.1:{mport}",
        ]
    )  # fmt: skip
    retry(lambda: scrape(mport), timeout=10, message="/metrics never answered")
    cconn = blocking(r.url, container_id="consumer")
    receiver = cconn.create_receiver("durable-q", name="c", credit=100, options=DurableSource())
    pconn = blocking(r.url, container_id="producer")
    sender = pconn.create_sender("durable-q", name="p", options=DurableTarget())
    conns = [pconn, cconn]

    before = [sender.link.send(Message(body=i)) for i in range(10)]
    got: list[int] = []

    def drain() -> None:
        while True:
            try:
                m = receiver.receive(timeout=0.05)
            except Exception:  # noqa: BLE001 - proton.Timeout: nothing more for now
                return
            got.append(m.body)
            receiver.accept()

    pump_until(conns, lambda: (drain(), settled(before) == 10)[1], 20, "outcomes before")
    assert all(d.remote_state == Delivery.ACCEPTED for d in before)
    assert value(scrape(mport), "qrouter_store_available") == 1

    flag.touch()  # from now on every commit fails with ENOSPC
    during = [sender.link.send(Message(body=i)) for i in range(10, 30)]
    pump_until(conns, lambda: log_count(r, FAIL_LINE) >= 1, 20, "the failure logged")
    for _ in range(20):  # 2 s: whatever the router would send, it has sent
        drain()
        pump(conns, 0.1)
    assert settled(during) == 0, "an outcome left for a delivery whose record is not stored"
    assert got == list(range(10)), "a transfer to a durable consumer left unstored"
    r.check_running()
    metrics = scrape(mport)
    assert value(metrics, "qrouter_store_available") == 0
    assert value(metrics, "qrouter_store_commit_failures_total") >= 1
    # new durable work is refused; a link without durability still attaches
    other = blocking(r.url, container_id="late")
    with pytest.raises(Exception, match="store unavailable"):
        other.create_sender("durable-q", name="late", options=DurableTarget())
    other.create_sender("plain-q", name="plain")

    flag.unlink()  # the store works again: the retry commits, the held output goes out
    pump_until(conns, lambda: (drain(), settled(during) == 20)[1], 30, "outcomes after")
    assert all(d.remote_state == Delivery.ACCEPTED for d in during)
    assert sorted(got) == list(range(30))
    retry(
        lambda: value(scrape(mport), "qrouter_store_available") == 1 or None,
        timeout=10,
        message="store_available never came back",
    )
    assert log_count(r, FAIL_LINE) == 1
    assert log_count(r, BACK_LINE) == 1
    r.check_running()


@pytest.mark.skipif(not stores.available("lmdb"), reason="needs the lmdb store: pip install lmdb")
def test_a_full_lmdb_map_holds_outcomes_until_settlements_make_room(
    router: Any, blocking: Any, tmp_path: Path
) -> None:
    mport = free_port()
    config = {
        "store": "lmdb",
        "store_path": str(tmp_path / "store"),
        "store_map_size": 1 << 20,  # 1 MiB: the records below do not fit
        "metrics": f"127.0.0.1:{mport}",
    }
    r = router(config=config)
    retry(lambda: scrape(mport), timeout=10, message="/metrics never answered")
    cconn = blocking(r.url, container_id="consumer")
    receiver = cconn.create_receiver("big-q", name="c", credit=400, options=DurableSource())
    pconn = blocking(r.url, container_id="producer")
    sender = pconn.create_sender("big-q", name="p", options=DurableTarget())
    conns = [pconn, cconn]
    body = "x" * 8192
    sent = [sender.link.send(Message(body=body, id=i)) for i in range(200)]  # ~1.6 MiB
    got: list[Any] = []

    def take() -> None:
        while True:
            try:
                got.append(receiver.receive(timeout=0.05))
            except Exception:  # noqa: BLE001 - proton.Timeout: nothing more for now
                return

    # unsettled at the consumer, the records stay: the next checkpoint fills the map
    pump_until(conns, lambda: (take(), log_count(r, FAIL_LINE) >= 1)[1], 30, "the map fills")
    assert "map is full" in r.log_tail(100000)
    take()
    assert len(got) >= 20
    for _ in range(20):
        receiver.accept()  # 20 outcomes reach the router; their records still do not fit
    for _ in range(20):
        pump(conns, 0.1)
    assert settled(sent) == 0, "an outcome left while its records could not be stored"
    r.check_running()
    metrics = scrape(mport)
    assert value(metrics, "qrouter_store_available") == 0
    assert value(metrics, "qrouter_store_commit_failures_total") >= 2  # retried
    assert log_count(r, FAIL_LINE) == 1

    # the consumer settles the rest: what is left to store fits, the retry succeeds by
    # itself and every outcome reaches the producer
    accepted = 20

    def settle_more() -> bool:
        nonlocal accepted
        take()
        for _ in range(len(got) - accepted):
            receiver.accept()
        accepted = len(got)
        return settled(sent) == 200

    pump_until(conns, settle_more, 30, "every outcome once the map had room")
    assert all(d.remote_state == Delivery.ACCEPTED for d in sent)
    assert len(got) == 200
    assert log_count(r, FAIL_LINE) == 1
    assert log_count(r, BACK_LINE) == 1
    assert value(scrape(mport), "qrouter_store_available") == 1


@pytest.mark.parametrize("store", [need("lmdb"), need("leveldb")])
def test_a_torn_record_log_tail_counts_as_never_written(
    router: Any, blocking: Any, tmp_path: Path, store: str
) -> None:
    port = free_port()
    args = ["--store", store, "--store-path", str(tmp_path / "store")]

    def start(name: str) -> Any:
        return router(name, router_id="r", listeners=[{"port": port}], extra_args=args)

    r = start("first")
    cconn = blocking(r.url, container_id="consumer")
    receiver = cconn.create_receiver("torn-q", name="c", credit=500, options=DurableSource())
    pconn = blocking(r.url, container_id="producer")
    sender = pconn.create_sender("torn-q", name="p", options=DurableTarget())
    log = tmp_path / "store" / "qrouter-records.log"
    got: list[Any] = []

    def take() -> bool:
        while True:
            try:
                got.append(receiver.receive(timeout=0.05))
            except Exception:  # noqa: BLE001 - proton.Timeout: nothing more for now
                return len(got) == sent

    sent = 0
    # rounds of 3 until the last changes are in the log, not yet checkpointed; the tear
    # takes the last round's entries at most, the earlier rounds' records must come back
    for rounds in range(50):
        for _ in range(3):
            sender.link.send(Message(body=sent))
            sent += 1
        pump_until([pconn, cconn], take, 20, "the messages to arrive")
        if rounds and log.exists() and log.stat().st_size > 0:
            break
    r.send_signal(signal.SIGKILL)
    r.wait(timeout=10)
    r.expect = None
    size = log.stat().st_size
    assert size > 0, "the router checkpointed every time: no log to tear"
    whole = unsettled_in(store, tmp_path / "store")
    # the last entry torn a few bytes short, then half a frame of garbage after it
    with open(log, "r+b") as f:
        f.truncate(size - 3)
        f.seek(0, os.SEEK_END)
        f.write(b"\x00\x00\x10\x00\xde\xad")
    torn = unsettled_in(store, tmp_path / "store")  # read as never written, not corrupt
    assert 3 <= torn <= whole
    r2 = start("second")
    retry(
        lambda: "unsettled deliveries recovered" in r2.log_tail(100000) or None,
        timeout=10,
        message="no recovery line",
    )
    r2.check_running()
    text = r2.log_tail(100000)
    assert "corrupt" not in text
    line = [x for x in text.splitlines() if "deliveries recovered" in x][-1]
    assert int(line.split(" unsettled deliveries")[0].rsplit(" ", 1)[-1]) == torn, line


def unsettled_in(store: str, path: Path) -> int:
    """The unsettled records a store directory holds, its record log replayed."""
    from qrouter.stores import open_store
    from qrouter.stores.termini import load_termini

    s = open_store(store, str(path))
    try:
        return sum(len(t.unsettled) for t in load_termini(s))
    finally:
        s.close()
