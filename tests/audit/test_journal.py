"""The delivery journal writer: segments, rotation, atomic publishing, sampling."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path
from typing import Any

import pytest

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

from qrouter.journal import (  # noqa: E402
    JournalError,
    JournalWriter,
    origin_id,
    sampled,
    schema,
)

SEGMENT_NAME = re.compile(r"^r1-(\d+)-(\d{6})\.parquet$")


def batch(start: int, n: int, *, origins: list[str] | None = None) -> dict[str, list[Any]]:
    return {
        "time_ns": [1_000 + i for i in range(start, start + n)],
        "connection": [7] * n,
        "link": ["pub-0"] * n,
        "address": ["orders"] * n,
        "tag": [i.to_bytes(4, "big") for i in range(start, start + n)],
        "origin": origins or [f"c/pub-0/{i:08x}" for i in range(start, start + n)],
        "event": ["received"] * n,
        "size": [100] * n,
    }


def read(paths: list[Path]) -> Any:
    return pa.concat_tables([pq.read_table(p) for p in paths])


def test_rotates_by_rows_and_names_segments(tmp_path: Path) -> None:
    w = JournalWriter(tmp_path, "r1", segment_rows=100, row_group_rows=30, threaded=False)
    for start in range(0, 250, 40):
        w.append_batch(batch(start, min(40, 250 - start)))
    w.close()
    files = sorted(tmp_path.iterdir())
    assert [p.name for p in files] == [p.name for p in w.segments]
    assert [pq.read_metadata(p).num_rows for p in w.segments] == [100, 100, 50]
    seqs = [SEGMENT_NAME.match(p.name).group(2) for p in w.segments]  # type: ignore[union-attr]
    assert seqs == ["000000", "000001", "000002"]
    table = read(w.segments)
    assert table.schema.equals(schema())
    assert table["time_ns"].to_pylist() == [1_000 + i for i in range(250)]
    assert set(table["router"].to_pylist()) == {"r1"}
    assert table["outcome"].null_count == 250  # optional columns default to null
    assert table["credit_stall_ns"].null_count == 250
    assert w.rows_written == 250


def test_rotates_by_time_on_the_writer_thread(tmp_path: Path) -> None:
    w = JournalWriter(tmp_path, "r1", segment_seconds=0.2)
    w.append_batch(batch(0, 10))
    deadline = time.monotonic() + 5
    while not w.segments and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(w.segments) == 1, "the segment was not closed after segment_seconds"
    w.append_batch(batch(10, 5))
    w.close()
    assert [pq.read_metadata(p).num_rows for p in w.segments] == [10, 5]


def test_segments_appear_atomically(tmp_path: Path) -> None:
    w = JournalWriter(tmp_path, "r1", row_group_rows=10, threaded=False)
    w.append_batch(batch(0, 35))  # three row groups are on disk, under a hidden name
    hidden = [p.name for p in tmp_path.iterdir()]
    assert len(hidden) == 1 and hidden[0].startswith(".") and hidden[0].endswith(".tmp")
    assert list(tmp_path.glob("*.parquet")) == []
    w.flush()
    assert [p.name for p in tmp_path.iterdir()] == [w.segments[0].name]
    assert pq.read_metadata(w.segments[0]).num_rows == 35
    w.append_batch(batch(35, 5))
    w.close()
    assert len(w.segments) == 2 and not list(tmp_path.glob(".*"))
    w.close()  # idempotent


def test_flush_on_threaded_writer_publishes_everything(tmp_path: Path) -> None:
    with JournalWriter(tmp_path, "r1") as w:
        for start in range(0, 1000, 100):
            w.append_batch(batch(start, 100))
        w.flush()
        assert read(w.segments).num_rows == 1000
    with pytest.raises(JournalError, match="closed"):
        w.append_batch(batch(0, 1))


@pytest.mark.skipif(not hasattr(os, "setpriority"), reason="thread priorities are POSIX")
def test_writer_thread_is_nicer_than_the_event_loop(tmp_path: Path) -> None:
    """The Parquet encoding yields the CPU to the forwarding path (docs/journal.md "Cost")."""
    mine = os.getpriority(os.PRIO_PROCESS, 0)
    with JournalWriter(tmp_path, "r1") as w:
        w.append_batch(batch(0, 10))
        w.flush()  # the thread has run its first lines
        assert w._thread is not None and w._thread.native_id is not None
        assert os.getpriority(os.PRIO_PROCESS, w._thread.native_id) == min(19, mine + 10)
    assert os.getpriority(os.PRIO_PROCESS, 0) == mine  # the caller's own is untouched


def test_sampling_keeps_a_delivery_on_every_router(tmp_path: Path) -> None:
    origins = [origin_id("pub", "sender", i.to_bytes(8, "big")) for i in range(4000)]
    kept_by_router = []
    for router in ("a", "b"):
        w = JournalWriter(tmp_path / router, router, sample=0.25, threaded=False)
        for event in ("received", "forwarded", "settled"):
            columns = batch(0, len(origins), origins=origins)
            columns["event"] = [event] * len(origins)
            w.append_batch(columns)
        w.close()
        table = read(w.segments)
        per_origin: dict[str, int] = {}
        for prefix, tag in zip(
            table["origin_prefix"].to_pylist(), table["origin_tag"].to_pylist(), strict=True
        ):
            o = prefix + tag.hex()
            per_origin[o] = per_origin.get(o, 0) + 1
        assert set(per_origin.values()) == {3}  # all events of a kept delivery
        assert w.rows_sampled_out == 3 * (len(origins) - len(per_origin))
        kept_by_router.append(set(per_origin))
    assert kept_by_router[0] == kept_by_router[1]
    assert kept_by_router[0] == {o for o in origins if sampled(o, 0.25)}
    assert 0.2 < len(kept_by_router[0]) / len(origins) < 0.3


def test_rejects_bad_batches_and_reports_writer_errors(tmp_path: Path) -> None:
    w = JournalWriter(tmp_path, "r1")
    bad = batch(0, 3)
    del bad["origin"]
    with pytest.raises(ValueError, match="origin"):
        w.append_batch(bad)
    uneven = batch(0, 3)
    uneven["size"] = [1]
    with pytest.raises(ValueError, match="length"):
        w.append_batch(uneven)
    with pytest.raises(ValueError, match="unknown"):
        w.append_batch({**batch(0, 1), "router": ["x"]})
    broken = batch(0, 3)
    broken["time_ns"] = ["not a number"] * 3
    w.append_batch(broken)  # accepted; the writer thread fails on it
    with pytest.raises(JournalError):
        w.flush()
    with pytest.raises(JournalError):
        w.close()
    assert not list(tmp_path.iterdir())  # nothing half-written is left behind


def test_origin_id_is_unambiguous() -> None:
    assert origin_id("pub-1", "orders", b"\x00\x01") == "pub-1/orders/0001"
    assert origin_id("a/b", "c", b"") != origin_id("a", "b/c", b"")
    assert origin_id("a/b", "c%", b"\xff") == "a%2Fb/c%25/ff"


def test_generator_output_matches_its_expectations(tmp_path: Path) -> None:
    from qrouter_tools.audit.generate import GenConfig, generate

    res = generate(tmp_path, GenConfig(routers=3, messages_per_publisher=50, segment_rows=500))
    assert res.dirs == [str(tmp_path / r) for r in ("r0", "r1", "r2")]
    for d in res.dirs:
        files = sorted(Path(d).glob("*.parquet"))
        rows = sum(pq.read_metadata(p).num_rows for p in files)
        assert rows == res.rows_by_router[Path(d).name]
        assert all(pq.read_metadata(p).num_rows <= 500 for p in files)
        assert (Path(d) / "guarantees.json").is_file()
    assert res.published == {"topic-0": 100, "topic-1": 100}
    assert res.delivered == {"topic-0": 200, "topic-1": 200}
