"""A checkpoint whose records were written but whose log was not emptied (qrouter/termini_store.py
`StorePersistence._checkpoint`): the engine keeps its net changes for the retry as though
nothing had been written, so a key made since the last good checkpoint and deleted before the
retry is only dropped from them. The retry must still delete it from the records, or a
restart would bring back a record long settled. Real LMDB and LevelDB files."""

from __future__ import annotations

from pathlib import Path

import pytest

from qrouter.termini_store import StorePersistence

K_GONE = b"eo/t/o/" + b"\x01" * 32  # made, checkpointed halfway, then deleted (only dropped)
K_KEPT = b"eo/t/o/" + b"\x02" * 32  # made, checkpointed halfway, still wanted


@pytest.mark.parametrize("name", ["lmdb", "leveldb"])
def test_a_retried_checkpoint_deletes_what_the_half_one_wrote_and_was_dropped_since(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if name == "leveldb":
        pytest.importorskip("plyvel", reason="the LevelDB store needs plyvel")
    p = StorePersistence.open(name, str(tmp_path / name))
    try:
        p.recover()  # (a previous run's log folded: that empties the log too)
        clear = p.store.log_clear
        calls = {"n": 0}

        def failing_once() -> None:
            calls["n"] += 1
            if calls["n"] == 1:
                raise OSError(5, "injected: the log's ftruncate failed")
            clear()

        monkeypatch.setattr(p.store, "log_clear", failing_once)
        with pytest.raises(OSError):
            p.commit(None, {K_GONE: b"v1", K_KEPT: b"v2"}, set())
        # the records took it; the engine does not know, and drops K_GONE from its net changes
        assert p.store.get(K_GONE) == b"v1"
        p.commit(None, {K_KEPT: b"v2"}, set())
        assert calls["n"] == 2
        assert p.store.get(K_GONE) is None, "the retry left a record the engine deleted"
        assert p.store.get(K_KEPT) == b"v2"
        # and once a checkpoint went through, nothing more is deleted on that account
        p.commit(None, {K_GONE: b"v3"}, set())
        assert p.store.get(K_GONE) == b"v3"
    finally:
        p.close()
