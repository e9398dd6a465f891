"""Guaranteed topics' records through the router's record log (qrouter/_fast/eo_log.pxi,
`Guarantees.flush`): each loop iteration's records are log entries, kept net until the
checkpoint, where they reach the store's records in one transaction with the durable links';
a record made and deleted between two checkpoints never reaches them.

The topic cores and the engine are driven without sockets (a committer that records what
it is given); the
crash test runs a router on LMDB with checkpoints held off (QROUTER_TEST_CHECKPOINT_SECONDS),
SIGKILLs it with records only in the log, looks at the store it left, and restarts it."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from qrouter._fast.engine import Router, forget, log_entries

from qrouter import stores
from qrouter._fast.eo_core import OriginRecord
from qrouter.client import Message as ClientMessage
from qrouter.guarantee import Guarantees
from qrouter.stores import open_store
from qrouter.stores.termini import read_log
from tests.client.conftest import run
from tests.guarantee.common import (
    accept_all,
    lmdb_topic_router,
    open_listener,
    publish_and_hold,
    subscriber_then_publisher,
    topic_rows,
    wait_until,
)
from tests.harness import free_port

TOPIC = "events"
PREFIX = b"eo/t/"
MARK = b"eot/t"


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


def _guarantees() -> tuple[Guarantees, Router, _Committer]:
    """A router's guaranteed topics on a store whose commits go through the engine's log."""
    engine = Router("eolog-test")
    committer = _Committer()
    engine.committer = committer
    core = SimpleNamespace(
        config=SimpleNamespace(id="A", guarantee_timeout=30.0),
        persistence=SimpleNamespace(store=SimpleNamespace(scan=lambda p: iter(())), health=None),
        engine=engine,
        mesh=None,
        table=SimpleNamespace(guarantee=lambda topic: None),
    )
    return Guarantees(core), engine, committer  # type: ignore[arg-type]


def _rec(out_tag: bytes, body: bytes | None = b"body") -> OriginRecord:
    return OriginRecord(out_tag, ("pub", "p"), b"tag-" + out_tag, body, {("s", "l"): 0})


def _commit(g: Guarantees, t: Any) -> None:
    t._flush()
    g.flush()


def _numbers_on(g: Guarantees, engine: Router, c: _Committer, t: Any) -> None:
    """A checkpoint first: the log's puts are numbered (LogRefs) from one the router's
    guaranteed topics saw empty it (what a log held before may be counted by no one)."""
    warm = _rec(b"warm-up")
    t._save_origin(warm, True)
    _commit(g, t)
    warm.settled = True
    t._save_origin(warm, False)
    _commit(g, t)
    assert c.appends[-1][:1] == b"U"  # (numbers off: the patch names its key)
    t._delete_origin(warm)
    _commit(g, t)
    engine.checkpoint()
    c.appends.clear()
    c.checkpoints.clear()


def test_records_made_and_deleted_between_checkpoints_never_reach_the_records() -> None:
    g, engine, c = _guarantees()
    t = g.topic("t")
    assert t is not None
    _numbers_on(g, engine, c, t)
    new, old = _rec(b"N"), _rec(b"O", body=None)
    t._save_origin(new, True)
    _commit(g, t)
    t._save_origin(new, False)  # an update: still made in this interval
    t._save_origin(old, False)  # one the store may hold (recovered)
    _commit(g, t)
    t._delete_origin(new)
    t._delete_origin(old)
    _commit(g, t)
    assert len(c.appends) == 3 and not c.checkpoints  # one append per commit, in order
    assert PREFIX + b"m/N" in c.appends[0] and PREFIX + b"o/O" in c.appends[1]
    # the deletes name the records the log put by number (LogRefs), five octets each; the
    # body the log never put (the store may hold it) by its key
    numbers = _numbered(c.appends)
    assert (
        c.appends[2]
        == b"".join(
            b"d" + numbers.index(PREFIX + k).to_bytes(4, "big") for k in (b"o/N", b"m/N", b"o/O")
        )
        + b"D"
        + len(PREFIX + b"m/O").to_bytes(2, "big")
        + PREFIX
        + b"m/O"
    )
    replayed = _replay(c.appends)
    assert replayed[PREFIX + b"o/N"] is None and replayed[PREFIX + b"o/O"] is None
    engine.checkpoint()
    # the new record went in the interval; the other (the store may hold it) is deleted
    assert c.checkpoints == [({MARK: b""}, {PREFIX + b"o/O", PREFIX + b"m/O"})]
    assert not engine.journal and not engine.journal_del and not engine.jborn
    # alive at a checkpoint: it reaches the records, and its delete after it too
    again = _rec(b"A")
    t._save_origin(again, True)
    _commit(g, t)
    engine.checkpoint()
    assert c.checkpoints[-1][0] == {
        PREFIX + b"o/A": again.encode_state(),
        PREFIX + b"m/A": b"body",
        MARK: b"",
    }
    t._delete_origin(again)
    _commit(g, t)
    # deleted and saved again with a body in one commit, with the store holding the first:
    # not made in the interval, so its delete reaches the records
    t._save_origin(_rec(b"A"), True)
    _commit(g, t)
    t._delete_origin(_rec(b"A"))
    _commit(g, t)
    engine.checkpoint()
    assert c.checkpoints[-1] == ({MARK: b""}, {PREFIX + b"o/A", PREFIX + b"m/A"})


def test_a_key_deleted_and_put_again_in_an_interval_is_not_deleted_at_its_checkpoint() -> None:
    """A record the store holds, deleted, then made again (the same out tag, a later
    commit) in one checkpoint interval: the put takes its keys out of the deletes, whether
    the delete was logged in this interval or was there before the log's numbers first saw
    the net changes, and the record made in the interval and deleted in it leaves none."""
    g, engine, c = _guarantees()
    t = g.topic("t")
    assert t is not None
    # a delete of X (the store holds it) in the net changes before the topics' first commit
    engine.journal_del.update({PREFIX + b"o/X", PREFIX + b"m/X"})
    x = _rec(b"X")
    t._save_origin(x, True)
    _commit(g, t)
    engine.checkpoint()
    assert c.checkpoints == [
        ({PREFIX + b"o/X": x.encode_state(), PREFIX + b"m/X": b"body", MARK: b""}, set())
    ]
    # alive at the checkpoint: the store holds it. Deleted, then made again, then a record
    # made and deleted in the interval
    t._delete_origin(x)
    _commit(g, t)
    again, brief = _rec(b"X", body=b"again"), _rec(b"B")
    t._save_origin(again, True)
    t._save_origin(brief, True)
    _commit(g, t)
    t._delete_origin(brief)
    _commit(g, t)
    engine.checkpoint()
    assert c.checkpoints[-1] == (
        {PREFIX + b"o/X": again.encode_state(), PREFIX + b"m/X": b"again", MARK: b""},
        set(),
    )
    assert not engine.jborn


def _subs(*states: int) -> dict[tuple[str, str], int]:
    return {(f"subscriber-{i}", f"link-{i}"): st for i, st in enumerate(states)}


def test_a_state_change_in_the_interval_is_logged_as_a_patch() -> None:
    """An origin record put since the last checkpoint and changed again: the log carries the
    state bytes that changed (a patch), not the whole record; the replay and the net
    changes have the whole new state. After a checkpoint its first change is whole again."""
    g, engine, c = _guarantees()
    t = g.topic("t")
    assert t is not None
    _numbers_on(g, engine, c, t)
    pub, key = ("publisher-container", "publisher-link"), PREFIX + b"o/P"

    def rec(settled: bool, *states: int) -> OriginRecord:
        return OriginRecord(b"P", pub, b"tag-P", b"body", _subs(*states), settled)

    first, accepted, done = rec(False, 0, 0, 0), rec(False, 1, 0, 1), rec(True, 2, 1, 2)
    t._save_origin(first, True)
    _commit(g, t)
    # the record changed as the router changes it (the same object): the patches name it by
    # its put's number (LogRefs)
    for r in (accepted, accepted, done):
        first.subs, first.settled = r.subs, r.settled
        t._save_origin(first, False)
        _commit(g, t)
    assert len(c.appends) == 3  # (the second `accepted` changed nothing: nothing to append)
    whole = len(first.encode_state())
    # (the topic's mark only in the first: a put of the value the log holds logs nothing)
    assert c.appends[0].endswith(b"P\x00\x05" + MARK + b"\x00\x00\x00\x00")
    for blob, changed in ((c.appends[1], 2), (c.appends[2], 4)):
        # (the record named by the number of its put: LogRefs)
        patch = b"u" + _numbered(c.appends).index(key).to_bytes(4, "big") + bytes([changed])
        assert blob.startswith(patch) and len(blob) == len(patch) + 3 * changed, blob
        assert len(patch) + 3 * changed < whole
    assert _replay(c.appends)[key] == done.encode_state() == engine.journal[key]
    # another object for the record (none of its numbers): a patch naming its key
    t._save_origin(rec(True, 2, 2, 1), False)
    _commit(g, t)
    patch = b"U\x00\x08" + key + (2).to_bytes(2, "big")
    assert c.appends[-1].startswith(patch) and len(c.appends[-1]) == len(patch) + 10
    assert _replay(c.appends)[key] == rec(True, 2, 2, 1).encode_state() == engine.journal[key]
    engine.checkpoint()
    since = len(c.appends)  # (the checkpoint emptied the log: it begins again here)
    assert c.checkpoints[-1][0][key] == rec(True, 2, 2, 1).encode_state()
    t._save_origin(rec(True, 2, 2, 2), False)
    _commit(g, t)
    assert c.appends[-1][:1] == b"P"
    assert _replay(c.appends[-1:])[key] == rec(True, 2, 2, 2).encode_state()
    # more bytes changed than a patch is worth: the whole record (20 subscribers accept)
    many = [OriginRecord(b"M", pub, b"tag-M", b"b", _subs(*[s] * 20), False) for s in (0, 1)]
    t._save_origin(many[0], True)
    _commit(g, t)
    t._save_origin(many[1], False)
    _commit(g, t)
    assert c.appends[-1].startswith(b"P\x00\x08" + PREFIX + b"o/M")
    assert _replay(c.appends[since:])[PREFIX + b"o/M"] == many[1].encode_state()


def test_a_patch_changes_no_value_someone_else_holds() -> None:
    """A patch changes the net changes' value of the record where it is when only they and
    the record's logging hold it (no copy a change); a value anyone else holds (a reader of
    `journal`, a checkpoint) keeps its bytes: the net changes get a changed copy."""
    g, engine, c = _guarantees()
    t = g.topic("t")
    assert t is not None
    _numbers_on(g, engine, c, t)
    live = OriginRecord(b"H", ("pub", "link"), b"tag-H", b"body", _subs(0, 0, 0), False)
    key = PREFIX + b"o/H"
    t._save_origin(live, True)
    _commit(g, t)
    ident = id(engine.journal[key])
    for states in ((1, 0, 0), (1, 1, 0)):
        live.subs = _subs(*states)
        t._save_origin(live, False)
        _commit(g, t)
        assert c.appends[-1][:1] == b"u"
        assert id(engine.journal[key]) == ident  # (changed where it is)
        assert engine.journal[key] == live.encode_state() == _replay(c.appends)[key]
    held = engine.journal[key]
    before = bytes(held)  # (a copy: what `held` must stay)
    live.subs, live.settled = _subs(2, 1, 0), True
    t._save_origin(live, False)
    _commit(g, t)
    assert c.appends[-1][:1] == b"u"
    assert held == before and held is not engine.journal[key]
    assert engine.journal[key] == live.encode_state() == _replay(c.appends)[key]
    del held
    # (the copy is the one the net changes and the record hold now: changed where it is)
    ident = id(engine.journal[key])
    live.subs = _subs(2, 2, 0)
    t._save_origin(live, False)
    _commit(g, t)
    assert id(engine.journal[key]) == ident
    assert engine.journal[key] == live.encode_state() == _replay(c.appends)[key]


def _expected_entry(ref: int, old: bytes, new: bytes) -> bytes:
    """What `_log_state` logs for a numbered record whose logged value is `old` and whose
    encoding is `new` now (the reference the logging without an encoding must match): no
    entry if equal, a patch of up to 16 changed bytes naming it by number, else a put."""
    at = [i for i in range(len(new)) if len(old) != len(new) or old[i] != new[i]]
    if not at:
        return b""
    if len(old) == len(new) and len(at) <= 16:
        return (
            b"u"
            + ref.to_bytes(4, "big")
            + bytes([len(at)])
            + b"".join(i.to_bytes(2, "big") + new[i : i + 1] for i in at)
        )
    return b"P"  # (whole: only its kind compared)


@pytest.mark.parametrize("seed", range(6))
def test_patches_of_a_live_record_match_its_whole_encoding(seed: int) -> None:
    """The state changes of one record object, logged without encoding it (`_log_origin`:
    only its settled and state bytes compared with the value the log holds), give the very
    entries a diff of its whole encodings gives, the replay and the net changes its
    encoding; a changed publisher, tag or layout still logs what changed (a diff of the
    whole encoding, a put when it is another length)."""
    rng = random.Random(seed)
    g, engine, c = _guarantees()
    t = g.topic("t")
    assert t is not None
    _numbers_on(g, engine, c, t)
    n = rng.choice([1, 3, 16, 17, 20])
    live = OriginRecord(b"L", ("pub", "link"), b"tag-L", b"body", _subs(*[0] * n), False)
    key = PREFIX + b"o/L"
    t._save_origin(live, True)
    _commit(g, t)
    logged = live.encode_state()
    for step in range(60):
        appended = len(c.appends)
        change = rng.random()
        if change < 0.05:
            live.publisher = ("pub", "lin" + "kx"[step % 2])  # (same length, another value)
        elif change < 0.1:
            live.tag = b"tag-" + bytes([65 + step % 26])
        elif change < 0.15:
            live.subs = _subs(*[rng.randrange(3) for _ in range(rng.choice([n, n + 1]))])
        else:
            states = list(live.subs.values())
            for _ in range(rng.randrange(1, 4)):
                states[rng.randrange(len(states))] = rng.randrange(3)
            live.subs = dict(zip(live.subs, states, strict=True))
            live.settled = rng.random() < 0.3
        t._save_origin(live, False)
        _commit(g, t)
        now = live.encode_state()
        numbers = _numbered(c.appends)  # (its number: that of its last put)
        if step == 31:  # the first change after the checkpoint: whole, a new number
            expected = b"P"
        else:
            expected = _expected_entry(len(numbers) - 1 - numbers[::-1].index(key), logged, now)
        if not expected:
            assert len(c.appends) == appended
        elif expected == b"P":
            assert c.appends[-1].startswith(b"P\x00\x08" + key), step
        else:
            assert c.appends[-1] == expected, step
        assert _replay(c.appends)[key] == now == engine.journal[key]
        logged = now
        if step == 30:
            engine.checkpoint()
            assert c.checkpoints[-1][0][key] == now
            c.appends.clear()


def _begun(out_tag: bytes) -> tuple[Guarantees, Router, _Committer, Any, OriginRecord]:
    """A topic on a log just folded at start-up (numbers on), `out_tag`'s record put."""
    g, engine, c = _guarantees()
    t = g.topic("t")
    assert t is not None
    g.log_refs.begin()
    rec = _rec(out_tag)
    t._save_origin(rec, True)
    _commit(g, t)
    return g, engine, c, t, rec


def _settle(g: Guarantees, t: Any, rec: OriginRecord) -> None:
    rec.settled = True
    t._save_origin(rec, False)
    _commit(g, t)


def test_numbers_begin_at_once_on_a_log_folded_at_start_up() -> None:
    """`Guarantees.start` folds the previous run's log into the records, so the log holds
    none of the topics' puts: its numbers (LogRefs.begin) name records from the first
    entry, with no checkpoint first; the replay gives what the net changes hold."""
    g, engine, c, t, rec = _begun(b"S")
    _settle(g, t, rec)
    numbers = _numbered(c.appends)
    patch = c.appends[1]  # (the settled byte: one change)
    assert patch == b"u" + numbers.index(PREFIX + b"o/S").to_bytes(4, "big") + b"\x01" + patch[6:]
    assert len(patch) == 9
    assert (
        _replay(c.appends)[PREFIX + b"o/S"] == rec.encode_state() == engine.journal[PREFIX + b"o/S"]
    )
    t._delete_origin(rec)
    _commit(g, t)
    assert c.appends[2] == b"".join(
        b"d" + numbers.index(PREFIX + k).to_bytes(4, "big") for k in (b"o/S", b"m/S")
    )
    assert _replay(c.appends)[PREFIX + b"o/S"] is None and not engine.jborn


def test_numbers_stay_off_after_a_failed_commit_until_a_checkpoint() -> None:
    """A failed commit's blob may reach the log twice (appended, then the committer raised,
    then the retry): the replay would count its puts twice. So after a failure every entry
    names its key until a checkpoint empties the log; then numbers come back."""
    g, engine, c, t, rec = _begun(b"F")
    c.fail = True
    _settle(g, t, rec)
    assert g.held
    c.fail = False
    assert engine.retry_commit() and g.retry()
    assert c.appends[-1][:1] == b"u"  # (made before the failure: its number is still right)
    t._delete_origin(rec)
    _commit(g, t)
    assert c.appends[-1][:1] == b"D" and PREFIX + b"o/F" in c.appends[-1]  # by key
    engine.checkpoint()
    again = _rec(b"G")
    t._save_origin(again, True)
    _commit(g, t)
    _settle(g, t, again)
    assert c.appends[-1][:1] == b"u"  # numbers again after the checkpoint


def test_a_failed_append_holds_the_outputs_until_the_retry() -> None:
    g, engine, c = _guarantees()
    t = g.topic("t")
    assert t is not None
    applied: list[int] = []
    c.fail = True
    t._save_origin(_rec(b"F"), True)
    t._flush()
    g.stage(applied.append, (1,))
    g.flush()
    assert g.held and engine.store_down and applied == [] and not c.appends
    g.flush()
    assert applied == []  # held: nothing that depends on the records leaves
    c.fail = False
    assert engine.retry_commit()  # the engine's retry runs first (Core: health.retries)
    assert g.retry()
    assert applied == [1] and not g.held
    assert len(c.appends) == 1 and PREFIX + b"o/F" in c.appends[0]


def test_an_entry_that_cannot_be_made_holds_the_outputs_and_the_next_commit_is_a_checkpoint() -> (
    None
):
    """`log_records` applies each entry to the net changes as it makes it: one that raises
    part-way (here a topic whose keys no log entry holds) leaves the entries made before it
    in `journal` and in no append, so a later diff would find them logged. The outputs wait,
    and the next commit is a checkpoint, which carries the net changes whole."""
    g, engine, c = _guarantees()
    t, bad = g.topic("t"), g.topic("u" * 70_000)
    assert t is not None and bad is not None
    applied: list[int] = []
    t._save_origin(_rec(b"G"), True)
    bad._save_origin(_rec(b"B"), True)
    t._flush()
    bad._flush()
    g.stage(applied.append, (1,))
    g.flush()
    assert g.held and applied == [] and not c.appends
    assert PREFIX + b"o/G" in engine.journal  # made before the entry that raised
    assert engine.retry_commit()  # the checkpoint, pending though nothing was appended
    assert PREFIX + b"o/G" in c.checkpoints[-1][0]
    g.retry()  # the record that cannot be logged is still there: still held
    assert g.held and applied == []


def test_a_topic_made_at_run_time_reads_the_records_with_the_logged_changes() -> None:
    # (a topic dropped idle and named again reads its records: the checkpointed ones, with
    # what was logged since laid over them)
    g, engine, _ = _guarantees()
    stored = [
        (PREFIX + b"m/A", b"a"),
        (PREFIX + b"o/A", _rec(b"A").encode_state()),
        (PREFIX + b"o/B", _rec(b"B").encode_state()),
    ]
    g.store = SimpleNamespace(scan=lambda p: iter([kv for kv in stored if kv[0].startswith(p)]))
    t = g.topic("t")
    assert t is not None
    t._save_origin(_rec(b"C"), True)
    t._save_origin(_rec(b"B", body=None), False)
    _commit(g, t)
    t._delete_origin(_rec(b"A"))
    _commit(g, t)
    assert list(g.backend_scan(PREFIX)) == [
        (PREFIX + b"m/C", b"body"),
        (PREFIX + b"o/B", _rec(b"B", body=None).encode_state()),
        (PREFIX + b"o/C", _rec(b"C").encode_state()),
    ]


def test_memory_router_has_no_record_log() -> None:
    with pytest.raises(RuntimeError, match="no record log"):
        log_entries(Router("eolog-test"), b"D\x00\x01k")


def test_entries_handed_over_whole_join_later_ones_in_one_append() -> None:
    """The topics' entries are kept as they are while they are all the iteration logged
    (log_entries, no copy); an entry made after them (a durable link's, another commit's)
    joins them in order in the iteration's one append, and a failed append keeps them all
    for the retry."""
    engine = Router("eolog-test")
    committer = _Committer()
    engine.committer = committer
    first, last = (b"D" + len(k).to_bytes(2, "big") + k for k in (PREFIX + b"o/A", MARK))
    log_entries(engine, first)
    engine.flush()
    assert committer.appends == [first]
    log_entries(engine, first)
    forget(engine, b"d" * 32, b"tag")  # a durable link's record dropped: its delete entry
    log_entries(engine, last)
    committer.fail = True
    engine.flush()
    assert committer.appends == [first]
    committer.fail = False
    assert engine.retry_commit()
    key = b"u/" + b"d" * 32 + b"/tag"
    assert committer.appends == [first, first + b"D" + len(key).to_bytes(2, "big") + key + last]
    assert _replay(committer.appends[1:]) == {PREFIX + b"o/A": None, key: None, MARK: None}


def _replay(appends: list[bytes]) -> dict[bytes, bytes | None]:
    """The log entries as `read_log` replays them (the fold at start-up)."""
    store = open_store("memory", None)
    try:
        for blob in appends:
            store.log_append(blob)
        return read_log(store).changes
    finally:
        store.close()


def _entries(appends: list[bytes]) -> list[tuple[bytes, bytes | None]]:
    """The log's entries in order: (kind, key; None for one naming its record by number)."""
    out: list[tuple[bytes, bytes | None]] = []
    for blob in appends:
        pos = 0
        while pos < len(blob):
            op = blob[pos : pos + 1]
            if op in (b"u", b"d"):
                out.append((op, None))
                pos += 5 + (1 + 3 * blob[pos + 5] if op == b"u" else 0)
                continue
            klen = int.from_bytes(blob[pos + 1 : pos + 3], "big")
            key = blob[pos + 3 : pos + 3 + klen]
            out.append((op, key))
            pos += 3 + klen
            if op == b"P":
                pos += 4 + int.from_bytes(blob[pos : pos + 4], "big")
            elif op == b"U":
                pos += 2 + 5 * int.from_bytes(blob[pos : pos + 2], "big")
    return out


def _numbered(appends: list[bytes]) -> list[bytes]:
    """The guaranteed topics' keys the log's puts gave their numbers to (LogRefs), in order."""
    return [k for op, k in _entries(appends) if op == b"P" and k is not None]


def _logged(path: Path) -> tuple[list[bytes], dict[bytes, bytes | None], int]:
    """What a dead router's LMDB store holds: its origin records, the log's net changes, and
    how many of the log's entries name their record by number (LogRefs)."""
    store = open_store("lmdb", str(path))
    try:
        stored = [k for k, _ in store.scan(b"eo/" + TOPIC.encode() + b"/o/")]
        changes = {k: v for k, v in read_log(store).changes.items() if k.startswith(b"eo/")}
        numbered = sum(1 for _, k in _entries(store.log_read()) if k is None)
    finally:
        store.close()
    return stored, changes, numbered


@pytest.mark.skipif(not stores.available("lmdb"), reason="needs the lmdb store: pip install lmdb")
def test_records_only_in_the_log_survive_sigkill_and_deliver_exactly_once(
    router: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("QROUTER_TEST_CHECKPOINT_SECONDS", "3600")  # only at a clean stop
    port = free_port()
    path = tmp_path / "store"

    def start(name: str, at: int = port) -> Any:
        return lmdb_topic_router(router, name, at, path)

    r = start("r0")
    url = r.url
    n, m = 5, 20

    async def scenario() -> None:
        slow = {"backoff": (1.0, 1.0), "reconnect_timeout": 60.0, "connect_timeout": 3.0}
        subc, receiver, pubc, sender = await subscriber_then_publisher(url, 50, **slow)
        futs, held = await publish_and_hold(sender, receiver, n)
        r.kill()

        # the records were delivered from, so they are durable: in the log, not the records
        stored, changes, _ = await asyncio.to_thread(_logged, path)
        assert stored == [], "a checkpoint ran: the test proves nothing"
        origins = [k for k, v in changes.items() if b"/o/" in k and v is not None]
        bodies = [v for k, v in changes.items() if b"/m/" in k and v is not None]
        assert len(origins) == n and len(bodies) == n, changes

        # restarted on a port the clients do not know: the records it holds are the log's,
        # not the publisher's resent deliveries (read on the clients' port, this raced their
        # reconnect, once a second); then their port is opened
        r1 = await asyncio.to_thread(start, "r1", free_port())
        rows = await asyncio.to_thread(topic_rows, r1.url)
        got_rows = [(row["origin_records"], row["publishers"], row["subscribers"]) for row in rows]
        assert got_rows == [(n, 0, 0)], rows
        await asyncio.to_thread(open_listener, r1.url, port)
        for h in held:  # the clients resume; accepting completes every delivery
            await h.accept()
        outcomes = await asyncio.wait_for(asyncio.gather(*futs), 30)
        assert {o.state for o in outcomes} == {"accepted"}

        # more messages, made and done within the interval: the log has them, the records not
        got: list[str] = []

        task = accept_all(receiver, got)
        more = [sender.submit(ClientMessage(body=f"x{i}")) for i in range(m)]
        assert all(o.accepted for o in await asyncio.wait_for(asyncio.gather(*more), 30))
        await wait_until(
            lambda: [row["origin_records"] for row in topic_rows(url)] == [0],
            30,
            lambda: f"records: {topic_rows(url)}",
        )
        r1.kill()
        stored, changes, numbered = await asyncio.to_thread(_logged, path)
        # the records hold the first n (the fold at start put them) and nothing else; the
        # log deletes them, and the m made since were put and deleted in the log alone, by
        # number (the log's numbers begin at the start-up fold: two deletes each at least)
        assert numbered >= 2 * m, numbered
        assert len(stored) == n and all(changes.get(k, b"") is None for k in stored), stored
        origins = [k for k in changes if b"/o/" in k]
        assert len(origins) == n + m and all(changes[k] is None for k in origins), changes

        await asyncio.to_thread(start, "r2")
        await wait_until(
            lambda: (
                [(row["publishers"], row["subscribers"]) for row in topic_rows(url)] == [(1, 1)]
            ),
            30,
            lambda: f"the clients are not back: {topic_rows(url)}",
        )
        await asyncio.sleep(1.0)  # the clients are back: a duplicate would come now
        rows = await asyncio.to_thread(topic_rows, url)
        assert [row["origin_records"] for row in rows] == [0], rows
        task.cancel()
        await pubc.close()
        await subc.close()
        # each once, and none of the first n again (the consumer takes whatever comes)
        assert sorted(got, key=lambda b: int(b[1:])) == [f"x{i}" for i in range(m)], got

    run(scenario(), timeout=120)
