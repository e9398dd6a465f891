"""A synthetic delivery-journal generator: a line of routers, topics, publishers, subscribers.

Routers ``r0 .. r{n-1}`` form a line (``r0 - r1 - r2 ...``), so a delivery from a publisher
on ``r0`` to a subscriber on ``r2`` takes two inter-router hops. Every message is multicast to
every subscriber of its address along the line. Each router journals what the real one would:

* at the router where a delivery arrives: ``received`` on the incoming link, then (once the
  downstream outcomes are in) ``settled`` with the outcome on that link;
* for each outgoing link (an inter-router link or a subscriber's link): ``forwarded``, then
  ``settled`` with the outcome when the outcome comes back (settled with it in one
  disposition, as the router journals it).

Timing is exact (plus an optional uniform jitter): ``transit_ns`` from ``received`` to
``forwarded`` in a router, ``wire_ns`` between routers, ``consumer_ns`` from ``forwarded`` to
a subscriber until its outcome. Faults are injected on chosen (delivery, subscriber) pairs
and the result says which: ``lose`` (the subscriber never gets it), ``duplicate`` (it gets it
twice), ``release`` (released once, then redelivered: not a duplicate), ``unsettled``
(deliveries never settled with their publisher) and ``credit_stalls`` per subscriber link.

Used by tests/audit and by the 10-million-event benchmark::

    python -m qrouter_tools.audit.generate OUT_DIR --events 10000000

writes ``OUT_DIR/r0``, ``OUT_DIR/r1``, ... (one journal directory per router, as a mesh run
leaves them) with a ``guarantees.json`` in each.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from qrouter.journal import origin_id, schema

START_NS = 1_700_000_000_000_000_000  # a whole second, so 1 s buckets line up with the rate


@dataclass
class GenConfig:
    routers: int = 3
    addresses: int = 2
    publishers_per_address: int = 2
    subscribers_per_address: int = 2
    messages_per_publisher: int = 1000
    rate_per_publisher: int = 1000  # messages per second; publishes are evenly spaced
    size: int = 256
    transit_ns: int = 200_000
    wire_ns: int = 100_000
    consumer_ns: int = 300_000
    jitter_ns: int = 0  # uniform [0, jitter_ns) added to every event time
    reject_every: int = 0  # every k-th message of a publisher is rejected (0: none)
    lose: int = 0
    duplicate: int = 0
    release: int = 0
    unsettled: int = 0
    # Faults at chosen places: (address, publisher, message, subscriber) indexes.
    lose_at: list[tuple[int, int, int, int]] = field(default_factory=list)
    duplicate_at: list[tuple[int, int, int, int]] = field(default_factory=list)
    credit_stalls: int = 0  # per subscriber link
    credit_stall_ns: int = 5_000_000
    guarantee: str | None = "exactly-once"
    segment_rows: int = 1_000_000
    seed: int = 1
    start_ns: int = START_NS


@dataclass
class Fault:
    origin: str
    tag: str  # the publisher's delivery tag, hex
    address: str
    router: str  # the subscriber's router
    link: str  # the subscriber's link


@dataclass
class GenResult:
    config: GenConfig
    dirs: list[str]
    rows: int = 0
    rows_by_router: dict[str, int] = field(default_factory=dict)
    published: dict[str, int] = field(default_factory=dict)  # per address
    subscribers: dict[str, list[tuple[str, str]]] = field(default_factory=dict)
    delivered: dict[str, int] = field(default_factory=dict)  # net per address, all subscribers
    consumer_outcomes: dict[str, dict[str, int]] = field(default_factory=dict)
    # Minimum and maximum in-router latency (ns) per address (publisher's router received ->
    # forwarded to a subscriber), jitter included.
    latency_bounds: dict[str, tuple[int, int]] = field(default_factory=dict)
    # Minimum and maximum edge round trip (ns) per address (publisher's router received ->
    # settled with the outcome toward the publisher), jitter included.
    round_trip_bounds: dict[str, tuple[int, int]] = field(default_factory=dict)
    hops: dict[str, int] = field(default_factory=dict)  # "r0>r1" -> deliveries over it
    lost: list[Fault] = field(default_factory=list)
    duplicated: list[Fault] = field(default_factory=list)
    released: list[Fault] = field(default_factory=list)
    unsettled: list[str] = field(default_factory=list)  # origins
    credit_stalls: int = 0
    credit_stall_total_ns: int = 0
    seconds: float = 0.0


# One journal row of a message's template: where and when (relative to the publish).
@dataclass
class _Row:
    router: int
    link: str
    connection: int
    event: str
    dt: int
    has_outcome: bool
    slot: int  # subscriber slot for rows on a subscriber link, else -1
    ingress: bool  # rows on the publisher's link


def _router(i: int) -> str:
    return f"r{i}"


def _address(a: int) -> str:
    return f"topic-{a}"


def _ir_link(a: int, b: int) -> str:
    return f"qr-ir:{_router(a)}>{_router(b)}"


class _Topology:
    def __init__(self, cfg: GenConfig) -> None:
        self.cfg = cfg
        n = cfg.routers
        self.pub_router = {
            (a, j): (a + j) % n
            for a in range(cfg.addresses)
            for j in range(cfg.publishers_per_address)
        }
        self.sub_router = {
            (a, k): (n - 1 - (a + k) % n)
            for a in range(cfg.addresses)
            for k in range(cfg.subscribers_per_address)
        }
        self._conn: dict[tuple[int, str], int] = {}

    def connection(self, router: int, link: str) -> int:
        key = (router, link)
        if key not in self._conn:
            self._conn[key] = sum(1 for r, _ in self._conn if r == router) + 1
        return self._conn[key]

    def template(self, a: int, j: int) -> list[_Row]:
        """The rows of one message of publisher j of address a."""
        cfg = self.cfg
        subs = [(k, self.sub_router[(a, k)]) for k in range(cfg.subscribers_per_address)]
        rows: list[_Row] = []
        pub = self.pub_router[(a, j)]

        def visit(r: int, t_recv: int, in_link: str, from_r: int | None) -> int:
            ingress = from_r is None
            conn_in = self.connection(r, in_link)
            rows.append(_Row(r, in_link, conn_in, "received", t_recv, False, -1, ingress))
            t_fwd = t_recv + cfg.transit_ns
            done = t_fwd
            for k, sr in subs:
                if sr == r:
                    link = f"sub-{a}-{k}"
                    conn = self.connection(r, link)
                    rows.append(_Row(r, link, conn, "forwarded", t_fwd, False, k, False))
                    t_out = t_fwd + cfg.consumer_ns
                    rows.append(_Row(r, link, conn, "settled", t_out, True, k, False))
                    done = max(done, t_out)
            for step in (-1, 1):
                nxt = r + step
                if from_r is not None and nxt == from_r:
                    continue
                if not any((sr - r) * step > 0 for _, sr in subs):
                    continue
                link = _ir_link(r, nxt)
                conn = self.connection(r, link)
                rows.append(_Row(r, link, conn, "forwarded", t_fwd, False, -1, False))
                child_done = visit(nxt, t_fwd + cfg.wire_ns, link, r)
                t_out = child_done + cfg.wire_ns
                rows.append(_Row(r, link, conn, "settled", t_out, True, -1, False))
                done = max(done, t_out)
            rows.append(_Row(r, in_link, conn_in, "settled", done, True, -1, ingress))
            return done

        visit(pub, 0, f"pub-{a}-{j}", None)
        return rows


def _tags(values: np.ndarray) -> pa.Array:
    data = values.astype(">u8").tobytes()
    fixed = pa.FixedSizeBinaryArray.from_buffers(
        pa.binary(8), len(values), [None, pa.py_buffer(data)]
    )
    return fixed.cast(pa.binary())


class _Sink:
    """Per-router segment files, written the way the JournalWriter publishes them."""

    def __init__(self, out: Path, routers: int, segment_rows: int, split: bool) -> None:
        self.schema = schema()
        self.segment_rows = segment_rows
        self.dirs: list[Path] = []
        for r in range(routers):
            d = out / _router(r) if split else out
            d.mkdir(parents=True, exist_ok=True)
            if d not in self.dirs:
                self.dirs.append(d)
        self.out = out
        self.split = split
        self.pending: dict[int, list[pa.Table]] = {r: [] for r in range(routers)}
        self.pending_rows = dict.fromkeys(range(routers), 0)
        self.seq = dict.fromkeys(range(routers), 0)
        self.rows = dict.fromkeys(range(routers), 0)

    def add(self, router: int, table: pa.Table) -> None:
        self.pending[router].append(table)
        self.pending_rows[router] += table.num_rows
        while self.pending_rows[router] >= self.segment_rows:
            self._write(router, self.segment_rows)

    def close(self) -> None:
        for r in self.pending:
            while self.pending_rows[r]:
                self._write(r, min(self.pending_rows[r], self.segment_rows))

    def _write(self, r: int, n: int) -> None:
        table = pa.concat_tables(self.pending[r]).combine_chunks()
        head, rest = table.slice(0, n), table.slice(n)
        self.pending[r] = [rest] if rest.num_rows else []
        self.pending_rows[r] = rest.num_rows
        d = self.out / _router(r) if self.split else self.out
        start = int(pc.min(head["time_ns"]).as_py())
        name = f"{_router(r)}-{start}-{self.seq[r]:06d}.parquet"
        self.seq[r] += 1
        tmp = d / f".{name}.tmp"
        pq.write_table(head.cast(self.schema), tmp, compression="snappy", row_group_size=131_072)
        tmp.replace(d / name)
        self.rows[r] += n


def generate(
    out_dir: str | Path, config: GenConfig | None = None, *, split_dirs: bool = True
) -> GenResult:
    """Write a synthetic journal under ``out_dir``; return what an audit must find in it."""
    t_start = time.perf_counter()
    cfg = config or GenConfig()
    if cfg.routers < 1 or cfg.addresses < 1 or cfg.publishers_per_address < 1:
        raise ValueError("need at least one router, address and publisher")
    out = Path(out_dir)
    rng = np.random.default_rng(cfg.seed)
    topo = _Topology(cfg)
    sink = _Sink(out, cfg.routers, cfg.segment_rows, split_dirs)
    res = GenResult(config=cfg, dirs=[str(d) for d in sink.dirs])
    n_msgs = cfg.messages_per_publisher
    interval = 1_000_000_000 // cfg.rate_per_publisher
    groups = [(a, j) for a in range(cfg.addresses) for j in range(cfg.publishers_per_address)]
    n_subs = cfg.subscribers_per_address

    # Faults: distinct (group, message, subscriber) picks; unsettled picks (group, message).
    total_pairs = len(groups) * n_msgs * n_subs
    n_faults = cfg.lose + cfg.duplicate + cfg.release
    if n_faults > total_pairs or (n_faults and n_subs == 0):
        raise ValueError("more faults than (delivery, subscriber) pairs")
    picks: list[int] = (
        [int(x) for x in rng.choice(total_pairs, size=n_faults, replace=False)] if n_faults else []
    )
    kinds = ["lose"] * cfg.lose + ["duplicate"] * cfg.duplicate + ["release"] * cfg.release
    faults: dict[tuple[int, int, int], str] = {}
    for kind, p in zip(kinds, picks, strict=True):
        g, rem = divmod(int(p), n_msgs * n_subs)
        m, k = divmod(rem, n_subs)
        faults[(g, m, k)] = kind
    for kind, places in (("lose", cfg.lose_at), ("duplicate", cfg.duplicate_at)):
        for a, j, m, k in places:
            if not (
                0 <= a < cfg.addresses
                and 0 <= j < cfg.publishers_per_address
                and 0 <= m < n_msgs
                and 0 <= k < n_subs
            ):
                raise ValueError(f"{kind} place {(a, j, m, k)} is out of range")
            faults[(a * cfg.publishers_per_address + j, m, k)] = kind
    unsettled_picks: set[tuple[int, int]] = set()
    if cfg.unsettled:
        for p in rng.choice(len(groups) * n_msgs, size=cfg.unsettled, replace=False):
            unsettled_picks.add(divmod(int(p), n_msgs))

    fields = schema()
    for g, (a, j) in enumerate(groups):
        address = _address(a)
        tmpl = topo.template(a, j)
        m = len(tmpl)
        container, pub_link = f"pubc-{a}-{j}", f"pub-{a}-{j}"
        seqs = np.arange(n_msgs, dtype=np.uint64)
        origins_py = [origin_id(container, pub_link, int(s).to_bytes(8, "big")) for s in seqs]
        origin_prefix = origin_id(container, pub_link, b"")
        t0 = cfg.start_ns + np.arange(n_msgs, dtype=np.int64) * interval + j * 1000
        dt = np.array([row.dt for row in tmpl], dtype=np.int64)
        times = (t0[:, None] + dt[None, :]).ravel()
        if cfg.jitter_ns:
            times = times + rng.integers(0, cfg.jitter_ns, size=times.shape[0])
        msg = np.repeat(np.arange(n_msgs), m)
        slot = np.tile(np.arange(m), n_msgs)
        ingress = np.array([row.ingress for row in tmpl])[slot]
        # Publisher's tag on its link; the router's own (hop-unique) tag elsewhere.
        hop_tag = (
            (np.uint64(g) << np.uint64(48))
            + msg.astype(np.uint64) * np.uint64(m)
            + slot.astype(np.uint64)
        )
        tags = _tags(np.where(ingress, msg.astype(np.uint64), hop_tag))
        outcome_of_msg = np.full(n_msgs, "accepted", dtype=object)
        if cfg.reject_every:
            outcome_of_msg[cfg.reject_every - 1 :: cfg.reject_every] = "rejected"
        has_outcome = np.array([row.has_outcome for row in tmpl])[slot]
        outcome_values = outcome_of_msg[msg]
        outcome_values[~has_outcome] = None
        outcomes = pa.array(outcome_values, pa.string(), from_pandas=True)
        idx = pa.array(slot)
        first = pa.array(np.zeros(n_msgs * m, np.int32))
        table = pa.table(
            {
                "time_ns": pa.array(times, pa.int64()),
                "router": pa.array([_router(row.router) for row in tmpl]).take(idx),
                "connection": pa.array([row.connection for row in tmpl], pa.int64()).take(idx),
                "link": pa.array([row.link for row in tmpl]).take(idx),
                "address": pa.array([address]).take(first),
                "tag": tags,
                "origin_prefix": pa.array([origin_prefix]).take(first),
                "origin_tag": _tags(msg.astype(np.uint64)),
                "event": pa.array([row.event for row in tmpl]).take(idx),
                "outcome": outcomes,
                "size": pa.array(np.full(n_msgs * m, cfg.size, dtype=np.int32)),
                "credit_stall_ns": pa.nulls(n_msgs * m, pa.int64()),
            },
            schema=fields,
        )
        row_router = np.array([row.router for row in tmpl])[slot]
        row_sub = np.array([row.slot for row in tmpl])[slot]
        row_event = np.array([row.event for row in tmpl])[slot]

        # Faults: drop or add rows of the chosen (message, subscriber) pairs.
        keep = np.ones(n_msgs * m, dtype=bool)
        extra: list[dict[str, Any]] = []
        for (fg, fm, fk), kind in faults.items():
            if fg != g:
                continue
            sr = topo.sub_router[(a, fk)]
            sub_link = f"sub-{a}-{fk}"
            fault = Fault(
                origins_py[fm], int(fm).to_bytes(8, "big").hex(), address, _router(sr), sub_link
            )
            sel = np.nonzero((msg == fm) & (row_sub == fk))[0]
            if kind == "lose":
                keep[sel] = False
                res.lost.append(fault)
            elif kind == "duplicate":
                res.duplicated.append(fault)
                for i in sel:
                    extra.append(_row_dict(table, int(i), shift=cfg.consumer_ns * 2, tag_add=1))
            else:
                res.released.append(fault)
                fwd = next(int(i) for i in sel if row_event[i] == "forwarded")
                first = _row_dict(table, fwd, shift=0, tag_add=2)
                extra.append(first)
                for event, outcome in (("settled", "released"), ("released-back", None)):
                    row = dict(first, event=event, outcome=outcome)
                    row["time_ns"] = first["time_ns"] + 1000
                    extra.append(row)
        for fg, fm in unsettled_picks:
            if fg != g:
                continue
            res.unsettled.append(origins_py[fm])
            sel = (msg == fm) & ingress & (row_event != "received")
            keep[sel] = False
        if not keep.all():
            table = table.filter(pa.array(keep))
            row_router = row_router[keep]
        if extra:
            extra_table = pa.Table.from_pylist(extra, schema=fields)
            extra_router = np.array([int(str(r)[1:]) for r in extra_table["router"].to_pylist()])
            table = pa.concat_tables([table, extra_table])
            row_router = np.concatenate([row_router, extra_router])
        for r in range(cfg.routers):
            part = table.filter(pa.array(row_router == r))
            if part.num_rows:
                sink.add(r, part)

        # Expectations.
        res.published[address] = res.published.get(address, 0) + n_msgs
        outcome_counts = res.consumer_outcomes.setdefault(address, {})
        n_rej = (n_msgs // cfg.reject_every) if cfg.reject_every else 0
        for name, count in (("accepted", (n_msgs - n_rej) * n_subs), ("rejected", n_rej * n_subs)):
            if count:
                outcome_counts[name] = outcome_counts.get(name, 0) + count
        res.delivered[address] = res.delivered.get(address, 0) + n_msgs * n_subs
        sub_fwd = [row.dt for row in tmpl if row.slot >= 0 and row.event == "forwarded"]
        if sub_fwd:
            lo, hi = min(sub_fwd) - cfg.jitter_ns, max(sub_fwd) + cfg.jitter_ns
            old = res.latency_bounds.get(address)
            res.latency_bounds[address] = (
                (min(lo, old[0]), max(hi, old[1])) if old else (max(lo, 0), hi)
            )
        back = [row.dt for row in tmpl if row.ingress and row.event == "settled"]
        lo, hi = min(back) - cfg.jitter_ns, max(back) + cfg.jitter_ns
        old = res.round_trip_bounds.get(address)
        res.round_trip_bounds[address] = (min(lo, old[0]), max(hi, old[1])) if old else (lo, hi)
        for trow in tmpl:
            if trow.event == "forwarded" and trow.link.startswith("qr-ir:"):
                hop = trow.link.split(":", 1)[1]
                res.hops[hop] = res.hops.get(hop, 0) + n_msgs
    for (_g, _m, _k), kind in faults.items():
        address = _address(groups[_g][0])
        if kind == "lose":
            res.delivered[address] -= 1
            res.consumer_outcomes[address][_outcome(cfg, _m)] -= 1
        elif kind == "duplicate":
            res.delivered[address] += 1
            res.consumer_outcomes[address][_outcome(cfg, _m)] += 1
        else:
            oc = res.consumer_outcomes[address]
            oc["released"] = oc.get("released", 0) + 1

    # Credit stalls on every subscriber link, spread over the run.
    stalls: dict[int, list[dict[str, Any]]] = {}
    duration = n_msgs * interval
    for a in range(cfg.addresses):
        for k in range(n_subs):
            sr = topo.sub_router[(a, k)]
            link = f"sub-{a}-{k}"
            for s in range(cfg.credit_stalls):
                stalls.setdefault(sr, []).append(
                    {
                        "time_ns": cfg.start_ns + duration * (s + 1) // (cfg.credit_stalls + 1),
                        "router": _router(sr),
                        "connection": topo.connection(sr, link),
                        "link": link,
                        "address": _address(a),
                        "tag": b"",
                        "origin_prefix": "",
                        "origin_tag": b"",
                        "event": "credit-stall",
                        "outcome": None,
                        "size": 0,
                        "credit_stall_ns": cfg.credit_stall_ns,
                    }
                )
                res.credit_stalls += 1
                res.credit_stall_total_ns += cfg.credit_stall_ns
    for r, rows in stalls.items():
        sink.add(r, pa.Table.from_pylist(rows, schema=fields))
    sink.close()

    for a in range(cfg.addresses):
        res.subscribers[_address(a)] = [
            (_router(topo.sub_router[(a, k)]), f"sub-{a}-{k}") for k in range(n_subs)
        ]
    res.rows_by_router = {_router(r): n for r, n in sink.rows.items()}
    res.rows = sum(sink.rows.values())
    if cfg.guarantee:
        text = json.dumps({_address(a): cfg.guarantee for a in range(cfg.addresses)}, indent=2)
        for d in sink.dirs:
            (d / "guarantees.json").write_text(text + "\n", encoding="utf-8")
    res.seconds = time.perf_counter() - t_start
    return res


def _outcome(cfg: GenConfig, m: int) -> str:
    return "rejected" if cfg.reject_every and (m + 1) % cfg.reject_every == 0 else "accepted"


def _row_dict(table: pa.Table, i: int, *, shift: int, tag_add: int) -> dict[str, Any]:
    row = {name: table.column(name)[i].as_py() for name in table.column_names}
    row["time_ns"] += shift
    tag = int.from_bytes(row["tag"], "big") + (tag_add << 56)
    row["tag"] = (tag % (1 << 64)).to_bytes(8, "big")
    return row


def events_per_message(cfg: GenConfig) -> float:
    """Average journal rows per published message (for sizing a run by event count)."""
    topo = _Topology(cfg)
    sizes = [
        len(topo.template(a, j))
        for a in range(cfg.addresses)
        for j in range(cfg.publishers_per_address)
    ]
    return sum(sizes) / len(sizes)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m qrouter_tools.audit.generate", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("out_dir")
    parser.add_argument("--events", type=int, help="about this many rows in all (sets messages)")
    parser.add_argument("--routers", type=int, default=3)
    parser.add_argument("--addresses", type=int, default=4)
    parser.add_argument("--publishers", type=int, default=2, help="per address")
    parser.add_argument("--subscribers", type=int, default=3, help="per address")
    parser.add_argument("--messages", type=int, default=1000, help="per publisher")
    parser.add_argument("--rate", type=int, default=10_000, help="messages/s per publisher")
    parser.add_argument("--jitter-ns", type=int, default=50_000)
    parser.add_argument("--lose", type=int, default=0)
    parser.add_argument("--duplicate", type=int, default=0)
    parser.add_argument("--release", type=int, default=0)
    parser.add_argument("--unsettled", type=int, default=0)
    parser.add_argument("--credit-stalls", type=int, default=0)
    parser.add_argument("--reject-every", type=int, default=0)
    parser.add_argument("--guarantee", default="exactly-once")
    parser.add_argument("--single-dir", action="store_true", help="all routers in one dir")
    args = parser.parse_args(argv)
    cfg = GenConfig(
        routers=args.routers,
        addresses=args.addresses,
        publishers_per_address=args.publishers,
        subscribers_per_address=args.subscribers,
        messages_per_publisher=args.messages,
        rate_per_publisher=args.rate,
        jitter_ns=args.jitter_ns,
        lose=args.lose,
        duplicate=args.duplicate,
        release=args.release,
        unsettled=args.unsettled,
        credit_stalls=args.credit_stalls,
        reject_every=args.reject_every,
        guarantee=args.guarantee or None,
    )
    if args.events:
        per_msg = events_per_message(cfg) * cfg.addresses * cfg.publishers_per_address
        cfg.messages_per_publisher = max(1, math.ceil(args.events / per_msg))
    res = generate(args.out_dir, cfg, split_dirs=not args.single_dir)
    print(
        f"wrote {res.rows:,} events ({sum(res.published.values()):,} messages) "
        f"in {res.seconds:.1f}s to {', '.join(res.dirs)}"
    )
    for kind, faults in (("lost", res.lost), ("duplicated", res.duplicated)):
        for f in faults:
            print(f"  {kind}: {f.address} tag {f.tag} -> {f.router}/{f.link}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
