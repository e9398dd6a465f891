"""The audit job: PySpark over the delivery journals of one or many routers.

`run_audit` reads every Parquet segment of every journal directory as one data set (a mesh
run is audited as one), computes the numbers described in docs/journal.md ("What the audit
computes") and writes the report (summary.json, PNG plots, report.html) to ``out_dir``.

Only DataFrame operations are used (no Python UDFs), so executors need no Python code of
ours: the job runs on ``local[*]`` (the default), on a standalone master (``--master
spark://host:7077``) or on any cluster ``spark-submit`` reaches (see spark_main.py). The
journal directories must then be readable by the executors under the same URL (shared
storage: hdfs://, s3a://, NFS).

This module imports nothing else from qrouter, so spark_main.py can load it from a bare
checkout.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

# The journal's columns (docs/journal.md). A delivery's origin is stored in two parts,
# origin_prefix + origin_tag (hex); journals written before that hold it whole in `origin`.
# Spark reads a column a file lacks as null, so both kinds read with one schema.
SCHEMA_DDL = (
    "time_ns BIGINT, router STRING, connection BIGINT, link STRING, address STRING, "
    "tag BINARY, origin_prefix STRING, origin_tag BINARY, origin STRING, event STRING, "
    "outcome STRING, size INT, credit_stall_ns BIGINT"
)
GUARANTEES = ("exactly-once", "at-least-once")
GUARANTEES_FILE = "guarantees.json"
PERCENTILES = (0.5, 0.9, 0.99)
# Latency histogram: bins of 1/HIST_PER_DECADE decade of nanoseconds (log scale).
HIST_PER_DECADE = 20
STAGES = 11

Progress = Callable[[int, int, str], None]


class AuditError(Exception):
    """The audit cannot run (no journal found, a bad guarantee, ...)."""


def print_progress(stream: Any = None) -> Progress:
    """A progress callback printing ``audit [k/N] what (elapsed)`` lines to stderr."""
    started = time.perf_counter()

    def progress(step: int, total: int, what: str) -> None:
        out = stream or sys.stderr
        print(f"audit [{step}/{total}] {what} ({time.perf_counter() - started:.1f}s)", file=out)
        out.flush()

    return progress


def _is_url(path: str) -> bool:
    return "://" in path


def parse_guarantee(spec: str) -> tuple[str, str]:
    """``ADDRESS=exactly-once|at-least-once`` -> (address, mode)."""
    address, sep, mode = spec.rpartition("=")
    if not sep or not address or mode not in GUARANTEES:
        raise AuditError(
            f"bad guarantee {spec!r}: expected ADDRESS=exactly-once or ADDRESS=at-least-once"
        )
    return address, mode


def _check_guarantees(values: dict[str, Any], where: str) -> dict[str, str]:
    out: dict[str, str] = {}
    if not isinstance(values, dict):
        raise AuditError(f"{where}: expected an object of address -> guarantee")
    for address, mode in values.items():
        if mode not in GUARANTEES:
            raise AuditError(f"{where}: {address}: guarantee must be one of {GUARANTEES}")
        out[str(address)] = mode
    return out


def load_guarantees(journal_dirs: Iterable[str], spark: Any = None) -> dict[str, str]:
    """Merge the ``guarantees.json`` files found in the journal directories."""
    merged: dict[str, str] = {}
    for d in journal_dirs:
        where = f"{d.rstrip('/')}/{GUARANTEES_FILE}"
        if _is_url(d):
            if spark is None:
                continue
            try:
                rows = spark.read.text(where, wholetext=True).collect()
            except Exception:  # noqa: BLE001 - no such file on that storage
                continue
            text = "".join(r[0] for r in rows)
        else:
            path = Path(d) / GUARANTEES_FILE
            if not path.is_file():
                continue
            text = path.read_text(encoding="utf-8")
        try:
            values = json.loads(text)
        except ValueError as exc:
            raise AuditError(f"{where}: not JSON: {exc}") from exc
        for address, mode in _check_guarantees(values, where).items():
            if merged.get(address, mode) != mode:
                raise AuditError(f"{address}: guarantees differ between journals")
            merged[address] = mode
    return merged


def spark_session(
    master: str | None = None,
    *,
    driver_memory: str = "2g",
    shuffle_partitions: int | None = None,
    app_name: str = "qrouter-audit",
    conf: dict[str, str] | None = None,
) -> Any:
    """A SparkSession: ``local[*]`` unless ``master`` is given or spark-submit chose one."""
    from pyspark.sql import SparkSession

    submitted = "PYSPARK_GATEWAY_PORT" in os.environ  # started by spark-submit
    builder = SparkSession.builder.appName(app_name)
    if master is None and not submitted:
        master = "local[*]"
    if master is not None:
        builder = builder.master(master)
    local = master is not None and master.startswith("local")
    settings = {
        "spark.sql.session.timeZone": "UTC",
        "spark.ui.showConsoleProgress": "true",
        "spark.sql.shuffle.partitions": str(shuffle_partitions or (8 if local else 64)),
    }
    if local:
        settings["spark.ui.enabled"] = "false"
    if local or (master is not None and ("://127." in master or "://localhost" in master)):
        # Everything on this machine: keep the driver's ports on the loopback interface.
        settings["spark.driver.host"] = "127.0.0.1"
        settings["spark.driver.bindAddress"] = "127.0.0.1"
    if not submitted:
        settings["spark.driver.memory"] = driver_memory
    settings.update(conf or {})
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def _rows(df: Any) -> list[dict[str, Any]]:
    return [row.asDict(recursive=True) for row in df.collect()]


def _latency_aggs(F: Any, column: str) -> list[Any]:
    return [
        F.count(column).alias("count"),
        F.percentile_approx(column, list(PERCENTILES), 10_000).alias("pct"),
        F.min(column).alias("min_ns"),
        F.avg(column).alias("mean_ns"),
        F.max(column).alias("max_ns"),
    ]


def _unpack_latency(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    for row in rows:
        pct = row.pop("pct") or [None] * len(PERCENTILES)
        for p, value in zip(PERCENTILES, pct, strict=True):
            row[f"p{round(p * 100)}_ns"] = value
        if row.get("mean_ns") is not None:
            row["mean_ns"] = round(row["mean_ns"])
    return rows


def _local_segments(d: str) -> list[Path]:
    path = Path(d)
    if not path.is_dir():
        raise AuditError(f"{d}: not a directory")
    return sorted(p for p in path.glob("*.parquet") if not p.name.startswith((".", "_")))


def compute(
    spark: Any,
    journal_dirs: list[str],
    guarantees: dict[str, str] | None = None,
    *,
    progress: Progress | None = None,
    max_listed: int = 1000,
) -> dict[str, Any]:
    """Run the audit's Spark jobs; return the summary (the content of summary.json)."""
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    step = 0

    def stage(what: str) -> None:
        nonlocal step
        step += 1
        if progress is not None:
            progress(step, STAGES, what)

    started = time.perf_counter()
    if not journal_dirs:
        raise AuditError("no journal directory given")
    segments = 0
    for d in journal_dirs:
        if not _is_url(d):
            segments += len(_local_segments(d))
    if segments == 0 and not any(_is_url(d) for d in journal_dirs):
        raise AuditError(f"no journal segments (*.parquet) in {', '.join(journal_dirs)}")
    guarantees = dict(guarantees or {})

    stage(f"reading {segments or 'the'} journal segments from {len(journal_dirs)} dir(s)")
    raw = (
        spark.read.schema(SCHEMA_DDL)
        .option("pathGlobFilter", "*.parquet")
        .parquet(*journal_dirs)
        .withColumn(
            "origin",
            F.coalesce(F.col("origin"), F.concat("origin_prefix", F.lower(F.hex("origin_tag")))),
        )
        .drop("origin_prefix", "origin_tag")
    )
    overview = raw.agg(
        F.count(F.lit(1)).alias("rows"),
        F.min("time_ns").alias("t_min"),
        F.max("time_ns").alias("t_max"),
        F.collect_set("router").alias("routers"),
    ).collect()[0]
    if not overview["rows"]:
        raise AuditError("the journals hold no events")

    stage("finding inter-router links")
    fwd_links = raw.filter(F.col("event") == "forwarded").select(
        F.col("router").alias("from_router"), "link"
    )
    rcv_links = raw.filter(F.col("event") == "received").select(
        F.col("router").alias("to_router"), "link"
    )
    ir_rows = _rows(
        fwd_links.distinct()
        .join(rcv_links.distinct(), "link")
        .filter(F.col("from_router") != F.col("to_router"))
    )
    ir_links = sorted({r["link"] for r in ir_rows})
    is_ir = F.col("link").isin(ir_links) if ir_links else F.lit(False)
    ev = raw.withColumn("ir", is_ir).persist(StorageLevel.MEMORY_AND_DISK)
    t0_s = overview["t_min"] // 1_000_000_000

    stage("event counts, credit stalls and throughput (1 s buckets)")
    stall = F.col("credit_stall_ns")
    events = _rows(
        ev.groupBy("router", "address", "event").agg(
            F.count(F.lit(1)).alias("count"),
            # a `settled` row with an outcome says both (one disposition brought them)
            F.count("outcome").alias("with_outcome"),
            F.sum(stall).alias("stall_total_ns"),
            F.max(stall).alias("stall_max_ns"),
        )
    )
    stall_rows = [
        {
            "router": r["router"],
            "address": r["address"],
            "count": r["count"],
            "total_ns": r["stall_total_ns"] or 0,
            "max_ns": r["stall_max_ns"] or 0,
        }
        for r in events
        if r["event"] == "credit-stall"
    ]
    for r in events:
        del r["stall_total_ns"], r["stall_max_ns"]
    sec = (F.col("time_ns") / 1_000_000_000).cast("long") - F.lit(t0_s)
    received = F.col("event") == "received"
    forwarded = F.col("event") == "forwarded"
    thr = _rows(
        ev.filter(received | forwarded)
        .groupBy("router", "address", "ir", sec.alias("second"))
        .agg(
            F.sum(F.when(received, 1).otherwise(0)).alias("received"),
            F.sum(F.when(forwarded, 1).otherwise(0)).alias("forwarded"),
            F.sum(F.when(received, F.col("size")).otherwise(0)).alias("bytes"),
        )
    )
    thr_addr_map: dict[tuple[str, int], dict[str, Any]] = {}
    thr_router_map: dict[tuple[str, int], dict[str, Any]] = {}
    for r in thr:
        key = (r["router"], r["second"])
        tr = thr_router_map.setdefault(
            key, {"router": r["router"], "second": r["second"], "received": 0, "forwarded": 0}
        )
        tr["received"] += r["received"]
        tr["forwarded"] += r["forwarded"]
        if r["ir"]:
            continue
        key = (r["address"], r["second"])
        ta = thr_addr_map.setdefault(
            key,
            {
                "address": r["address"],
                "second": r["second"],
                "published": 0,
                "delivered": 0,
                "bytes": 0,
            },
        )
        ta["published"] += r["received"]
        ta["delivered"] += r["forwarded"]
        ta["bytes"] += r["bytes"]
    thr_addr = list(thr_addr_map.values())
    thr_router = list(thr_router_map.values())

    stage("in-router latency (publisher's router received -> subscriber's link forwarded)")
    ingress = (
        ev.filter(received & ~F.col("ir"))
        .groupBy("origin")
        .agg(
            F.min("time_ns").alias("t0"),
            F.min_by("router", "time_ns").alias("origin_router"),
            F.min_by("address", "time_ns").alias("address"),
            F.min_by("tag", "time_ns").alias("tag"),
            F.min_by("link", "time_ns").alias("origin_link"),
            F.min_by("connection", "time_ns").alias("origin_connection"),
            F.count(F.lit(1)).alias("publishes"),
        )
        .persist(StorageLevel.MEMORY_AND_DISK)
    )
    consumer = (
        ev.filter(forwarded & ~F.col("ir"))
        .groupBy("origin", "router", "link")
        .agg(
            F.min("time_ns").alias("t_first"),
            F.count(F.lit(1)).alias("forwards"),
            F.first("address").alias("address"),
        )
    )
    releases = (
        ev.filter((F.col("event") == "released-back") & ~F.col("ir"))
        .groupBy("origin", "router", "link")
        .agg(F.count(F.lit(1)).alias("releases"))
    )
    reach = (
        consumer.join(releases, ["origin", "router", "link"], "left")
        .withColumn("net", F.col("forwards") - F.coalesce(F.col("releases"), F.lit(0)))
        .persist(StorageLevel.MEMORY_AND_DISK)
    )
    # Named in_router: the time the routers hold a delivery (one router: its transit; a mesh:
    # the routers and the wire between them), not the clients' end to end (edge round trip).
    inr = (
        reach.join(ingress.select("origin", "t0"), "origin")
        .withColumn("latency", F.col("t_first") - F.col("t0"))
        .persist(StorageLevel.MEMORY_AND_DISK)
    )
    inr_all = _unpack_latency(
        _rows(
            inr.rollup("address", "router")
            .agg(*_latency_aggs(F, "latency"))
            .filter(F.col("address").isNotNull())
        )
    )
    inr_router = [r for r in inr_all if r["router"] is not None]
    inr_addr = [
        {k: v for k, v in r.items() if k != "router"} for r in inr_all if r["router"] is None
    ]
    hist_bin = F.floor(F.log10(F.greatest(F.col("latency"), F.lit(1))) * HIST_PER_DECADE)
    inr_hist = _rows(inr.groupBy("address", hist_bin.alias("bin")).count())
    inr.unpersist()

    stage("edge round trip (publisher's router received -> outcome to the publisher)")
    edge_rows, edge_router_rows, edge_hist = _edge_round_trip(F, ev, ingress)

    stage("per-hop and in-router latency")
    first_recv = (
        ev.filter(received)
        .groupBy("origin", "router")
        .agg(F.min("time_ns").alias("t_recv"))
        .persist(StorageLevel.MEMORY_AND_DISK)
    )
    hop_rows: list[dict[str, Any]] = []
    if ir_rows:
        ir_map = spark.createDataFrame(
            [(r["link"], r["from_router"], r["to_router"]) for r in ir_rows],
            "link STRING, from_router STRING, to_router STRING",
        )
        hop_recv = ev.filter(received & F.col("ir")).select(
            "origin", F.col("router").alias("to_router"), "link", F.col("time_ns").alias("t_b")
        )
        hops = (
            hop_recv.join(F.broadcast(ir_map), ["link", "to_router"])
            .join(
                first_recv.select(
                    "origin", F.col("router").alias("from_router"), F.col("t_recv").alias("t_a")
                ),
                ["origin", "from_router"],
            )
            .withColumn("latency", F.col("t_b") - F.col("t_a"))
        )
        hop_rows = _unpack_latency(
            _rows(hops.groupBy("from_router", "to_router").agg(*_latency_aggs(F, "latency")))
        )
    transit = (
        ev.filter(forwarded)
        .groupBy("origin", "router", "link")
        .agg(F.min("time_ns").alias("t_fwd"))
        .join(first_recv, ["origin", "router"])
        .withColumn("latency", F.col("t_fwd") - F.col("t_recv"))
    )
    transit_rows = _unpack_latency(
        _rows(transit.groupBy("router").agg(*_latency_aggs(F, "latency")))
    )
    first_recv.unpersist()

    stage("outcomes")
    publisher_links = (
        ev.filter(received & ~F.col("ir")).select("router", "link").distinct()
    ).withColumn("publisher_link", F.lit(True))
    side = (
        F.when(F.col("ir"), "inter-router")
        .when(F.col("publisher_link").isNotNull(), "publisher")
        .otherwise("consumer")
    )
    has_outcome = (F.col("event") == "outcome") | (
        (F.col("event") == "settled") & F.col("outcome").isNotNull()
    )
    outcome_rows = _rows(
        ev.filter(has_outcome)
        .join(publisher_links, ["router", "link"], "left")
        .withColumn("side", side)
        .groupBy("router", "address", "side", "outcome")
        .count()
    )

    stage("unsettled deliveries")
    settled_keys = ev.filter(F.col("event") == "settled").select("origin", "router", "link")
    unsettled = (
        ev.filter(received)
        .select("origin", "router", "link", "address", "tag", "time_ns", "ir")
        .join(settled_keys, ["origin", "router", "link"], "left_anti")
        .persist(StorageLevel.MEMORY_AND_DISK)
    )
    unsettled_counts = _rows(unsettled.groupBy("router", "address").count())
    unsettled_sample = _rows(
        unsettled.orderBy("time_ns")
        .limit(max_listed)
        .select(
            "router",
            "address",
            "link",
            "origin",
            F.lower(F.hex("tag")).alias("tag"),
            "time_ns",
        )
    )
    unsettled.unpersist()

    stage("published and delivered per address")
    published = {
        r["address"]: r
        for r in _rows(
            ingress.groupBy("address").agg(
                F.count(F.lit(1)).alias("published"),
                F.sum("publishes").alias("publishes"),
            )
        )
    }
    delivered = {
        r["address"]: r
        for r in _rows(
            reach.groupBy("address").agg(
                F.sum("net").alias("delivered"),
                F.sum("forwards").alias("forwards"),
                F.countDistinct("router", "link").alias("subscribers"),
            )
        )
    }

    stage(f"guarantee verdicts for {len(guarantees)} address(es)")
    pub_counts = {a: r["published"] for a, r in published.items()}
    verdicts = _verdicts(spark, F, ingress, reach, guarantees, pub_counts, max_listed)

    stage("assembling the summary")
    ingress.unpersist()
    reach.unpersist()
    ev.unpersist()
    summary = _assemble(
        journal_dirs=journal_dirs,
        segments=segments,
        overview=overview.asDict(),
        t0_s=t0_s,
        ir_rows=ir_rows,
        events=events,
        thr_addr=thr_addr,
        thr_router=thr_router,
        inr_addr=inr_addr,
        inr_router=inr_router,
        inr_hist=inr_hist,
        edge_rows=edge_rows,
        edge_router_rows=edge_router_rows,
        edge_hist=edge_hist,
        hop_rows=hop_rows,
        transit_rows=transit_rows,
        outcome_rows=outcome_rows,
        stall_rows=stall_rows,
        unsettled_counts=unsettled_counts,
        unsettled_sample=unsettled_sample,
        published=published,
        delivered=delivered,
        verdicts=verdicts,
    )
    summary["timing"] = {"audit_s": round(time.perf_counter() - started, 3)}
    summary["spark"] = {
        "version": spark.version,
        "master": spark.sparkContext.master,
        "default_parallelism": spark.sparkContext.defaultParallelism,
    }
    return summary


def _edge_round_trip(F: Any, ev: Any, ingress: Any) -> tuple[list[Any], list[Any], list[Any]]:
    """The round trip as the publisher's router sees it, per publish: its `received` on the
    publisher's link -> the first row on that link that carries the outcome going back to the
    publisher (`outcome`, or `settled` with an outcome). Both times are that router's clock,
    so no clock synchronisation is involved. Pre-settled publishes have no outcome: none.
    The link is named by its connection too: two clients may give their links one name."""
    back = (
        ev.filter(
            ~F.col("ir") & F.col("outcome").isNotNull() & F.col("event").isin("outcome", "settled")
        )
        .select(
            "origin",
            F.col("router").alias("origin_router"),
            F.col("link").alias("origin_link"),
            F.col("connection").alias("origin_connection"),
            "time_ns",
        )
        .groupBy("origin", "origin_router", "origin_link", "origin_connection")
        .agg(F.min("time_ns").alias("t_back"))
    )
    rtt = (
        ingress.select(
            "origin", "origin_router", "origin_link", "origin_connection", "address", "t0"
        )
        .join(back, ["origin", "origin_router", "origin_link", "origin_connection"])
        .withColumn("latency", F.col("t_back") - F.col("t0"))
        .persist()
    )
    by_address = _unpack_latency(_rows(rtt.groupBy("address").agg(*_latency_aggs(F, "latency"))))
    by_router = _unpack_latency(
        _rows(rtt.groupBy(F.col("origin_router").alias("router")).agg(*_latency_aggs(F, "latency")))
    )
    hist_bin = F.floor(F.log10(F.greatest(F.col("latency"), F.lit(1))) * HIST_PER_DECADE)
    hist = _rows(rtt.groupBy("address", hist_bin.alias("bin")).count())
    rtt.unpersist()
    return by_address, by_router, hist


def _histogram(rows: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    counts: dict[str, dict[int, int]] = {}
    for r in rows:
        counts.setdefault(r["address"], {})[int(r["bin"])] = r["count"]
    hist: dict[str, list[dict[str, Any]]] = {}
    for a, bins in sorted(counts.items()):
        hist[a] = [  # contiguous bins, empty ones included
            {
                "lo_ns": round(10 ** (b / HIST_PER_DECADE)),
                "hi_ns": round(10 ** ((b + 1) / HIST_PER_DECADE)),
                "count": bins.get(b, 0),
            }
            for b in range(min(bins), max(bins) + 1)
        ]
    return hist


def _verdicts(
    spark: Any,
    F: Any,
    ingress: Any,
    reach: Any,
    guarantees: dict[str, str],
    counts: dict[str, int],
    max_listed: int,
) -> dict[str, Any]:
    """Each guaranteed address: did every publish reach every subscriber once (at least once)?

    Publishes are the origins received from a publisher (at the first router); subscribers
    are the (router, link) pairs that any delivery of the address was forwarded to; a
    delivery reached a subscriber ``net`` times = forwarded minus released back.
    """
    from pyspark.sql import Window

    if not guarantees:
        return {}
    addresses = sorted(guarantees)
    pub = ingress.filter(F.col("address").isin(addresses)).select(
        "origin", "address", F.lower(F.hex("tag")).alias("tag"), "origin_router"
    )
    got = reach.filter(F.col("address").isin(addresses))
    subs_rows = _rows(got.select("address", "router", "link").distinct())
    subs: dict[str, list[dict[str, str]]] = {a: [] for a in addresses}
    for r in subs_rows:
        subs[r["address"]].append({"router": r["router"], "link": r["link"]})
    out: dict[str, Any] = {}
    if subs_rows:
        subs_df = spark.createDataFrame(
            [(r["address"], r["router"], r["link"]) for r in subs_rows],
            "address STRING, router STRING, link STRING",
        )
        n_subs = subs_df.groupBy("address").agg(F.count(F.lit(1)).alias("n_subs"))
        reached = got.filter(F.col("net") >= 1)
        per_origin = reached.groupBy("origin").agg(F.count(F.lit(1)).alias("n_reached"))
        short = (
            pub.join(per_origin, "origin", "left")
            .join(F.broadcast(n_subs), "address")
            .filter(F.coalesce(F.col("n_reached"), F.lit(0)) < F.col("n_subs"))
        )
        lost = (
            short.join(F.broadcast(subs_df), "address")
            .join(
                reached.select("origin", "router", "link"),
                ["origin", "router", "link"],
                "left_anti",
            )
            .select(
                F.lit("lost").alias("kind"),
                "address",
                "origin",
                "tag",
                "origin_router",
                "router",
                "link",
                F.lit(0).cast("long").alias("times"),
            )
        )
        dup = (
            got.filter(F.col("net") > 1)
            .join(pub.select("origin", "tag", "origin_router"), "origin", "left")
            .select(
                F.lit("duplicated").alias("kind"),
                "address",
                "origin",
                "tag",
                "origin_router",
                "router",
                "link",
                F.col("net").alias("times"),
            )
        )
        unknown_df = got.join(pub, "origin", "left_anti").select(
            F.lit("unknown").alias("kind"),
            "address",
            "origin",
            F.lit(None).cast("string").alias("tag"),
            F.lit(None).cast("string").alias("origin_router"),
            "router",
            "link",
            F.col("net").alias("times"),
        )
        faults = lost.unionByName(dup).unionByName(unknown_df).persist()
        fault_counts = _rows(faults.groupBy("address", "kind").count())
        lost_counts = {r["address"]: r["count"] for r in fault_counts if r["kind"] == "lost"}
        dup_counts = {r["address"]: r["count"] for r in fault_counts if r["kind"] == "duplicated"}
        unknown = {r["address"]: r["count"] for r in fault_counts if r["kind"] == "unknown"}
        rank = F.row_number().over(
            Window.partitionBy("address", "kind").orderBy("origin", "router", "link")
        )
        listed = _rows(
            faults.withColumn("rank", rank).filter(F.col("rank") <= max_listed).drop("rank")
        )
        faults.unpersist()
        listed.sort(key=lambda r: (r["address"], r["origin"], r["router"], r["link"]))
        lost_list = [r for r in listed if r["kind"] == "lost"]
        dup_list = [r for r in listed if r["kind"] == "duplicated"]
        for r in lost_list:
            del r["kind"], r["times"]
        for r in dup_list:
            del r["kind"]
    else:
        lost_counts, dup_counts, unknown = {}, {}, {}
        lost_list, dup_list = [], []
    for address in addresses:
        mode = guarantees[address]
        n_lost = lost_counts.get(address, 0)
        n_dup = dup_counts.get(address, 0)
        published = counts.get(address, 0)
        n_sub = len(subs[address])
        if published and not n_sub:
            verdict, why = "fail", "published deliveries but no subscriber received any"
        elif n_lost or (mode == "exactly-once" and n_dup):
            verdict = "fail"
            why = f"{n_lost} lost" + (f", {n_dup} duplicated" if mode == "exactly-once" else "")
        else:
            verdict, why = (
                "pass",
                "every delivery reached every subscriber "
                + ("exactly once" if mode == "exactly-once" else "at least once"),
            )
        lost_here = [
            {k: v for k, v in r.items() if k != "address"}
            for r in lost_list
            if r["address"] == address
        ]
        dup_here = [
            {k: v for k, v in r.items() if k != "address"}
            for r in dup_list
            if r["address"] == address
        ]
        out[address] = {
            "guarantee": mode,
            "verdict": verdict,
            "reason": why,
            "published": published,
            "subscribers": sorted(subs[address], key=lambda s: (s["router"], s["link"])),
            "expected": published * n_sub,
            "lost_count": n_lost,
            "duplicated_count": n_dup,
            "unknown_origin_count": unknown.get(address, 0),
            "lost": lost_here,
            "duplicated": dup_here,
            "truncated": len(lost_here) < n_lost or len(dup_here) < n_dup,
        }
    return out


def _assemble(**p: Any) -> dict[str, Any]:
    ov = p["overview"]
    routers = sorted(ov["routers"])
    by_addr: dict[str, dict[str, Any]] = {}
    by_router: dict[str, dict[str, Any]] = {r: {"router": r, "events": {}} for r in routers}

    def addr(a: str) -> dict[str, Any]:
        return by_addr.setdefault(
            a,
            {
                "address": a,
                "published": 0,
                "publishes": 0,
                "delivered": 0,
                "forwards": 0,
                "subscribers": 0,
                "outcomes": {},
                "publisher_outcomes": {},
                "in_router_latency": None,
                "edge_round_trip": None,
                "credit_stalls": {"count": 0, "total_ns": 0, "max_ns": 0},
                "unsettled": 0,
            },
        )

    for r in p["events"]:
        if r["event"] != "credit-stall":
            addr(r["address"])
        ev = by_router[r["router"]]["events"]
        ev[r["event"]] = ev.get(r["event"], 0) + r["count"]
        if r["event"] == "settled" and r["with_outcome"]:
            ev["outcome"] = ev.get("outcome", 0) + r["with_outcome"]
    for a, r in p["published"].items():
        addr(a).update(published=r["published"], publishes=r["publishes"])
    for a, r in p["delivered"].items():
        addr(a).update(
            delivered=r["delivered"], forwards=r["forwards"], subscribers=r["subscribers"]
        )
    for r in p["inr_addr"]:
        addr(r["address"])["in_router_latency"] = {k: v for k, v in r.items() if k != "address"}
    for r in p["edge_rows"]:
        addr(r["address"])["edge_round_trip"] = {k: v for k, v in r.items() if k != "address"}
    for r in p["outcome_rows"]:
        if r["side"] == "inter-router":
            continue
        key = "outcomes" if r["side"] == "consumer" else "publisher_outcomes"
        bucket = addr(r["address"])[key]
        name = r["outcome"] or "none"
        bucket[name] = bucket.get(name, 0) + r["count"]
    for r in p["stall_rows"]:
        for target in (addr(r["address"]), by_router[r["router"]]):
            cs = target.setdefault("credit_stalls", {"count": 0, "total_ns": 0, "max_ns": 0})
            cs["count"] += r["count"]
            cs["total_ns"] += r["total_ns"] or 0
            cs["max_ns"] = max(cs["max_ns"], r["max_ns"] or 0)
    for r in p["unsettled_counts"]:
        addr(r["address"])["unsettled"] += r["count"]
        by_router[r["router"]]["unsettled"] = (
            by_router[r["router"]].get("unsettled", 0) + r["count"]
        )
    for r in p["transit_rows"]:
        by_router[r["router"]]["transit_latency"] = {k: v for k, v in r.items() if k != "router"}
    for r in p["edge_router_rows"]:
        by_router[r["router"]]["edge_round_trip"] = {k: v for k, v in r.items() if k != "router"}
    for r in by_router.values():
        r.setdefault("credit_stalls", {"count": 0, "total_ns": 0, "max_ns": 0})
        r.setdefault("unsettled", 0)
        r.setdefault("transit_latency", None)
        r.setdefault("edge_round_trip", None)
    outcomes = sorted(
        p["outcome_rows"],
        key=lambda r: (r["address"], r["router"], r["side"], r["outcome"] or ""),
    )
    duration_ns = ov["t_max"] - ov["t_min"]
    total_unsettled = sum(r["count"] for r in p["unsettled_counts"])
    return {
        "journal_dirs": list(p["journal_dirs"]),
        "segments": p["segments"],
        "rows": ov["rows"],
        "routers": routers,
        "addresses": sorted(by_addr),
        "time": {
            "first_ns": ov["t_min"],
            "last_ns": ov["t_max"],
            "duration_s": round(duration_ns / 1e9, 6),
            "bucket_t0_s": p["t0_s"],
        },
        "inter_router_links": sorted(
            (
                {"link": r["link"], "from": r["from_router"], "to": r["to_router"]}
                for r in p["ir_rows"]
            ),
            key=lambda r: r["link"],
        ),
        "by_address": [by_addr[a] for a in sorted(by_addr)],
        "by_router": [by_router[r] for r in routers],
        "throughput": {
            "bucket_s": 1,
            "by_address": sorted(p["thr_addr"], key=lambda r: (r["address"], r["second"])),
            "by_router": sorted(p["thr_router"], key=lambda r: (r["router"], r["second"])),
        },
        "latency": {
            # docs/journal.md "What the audit computes": in_router is the routers' time
            # (publisher's router received -> subscriber's router forwarded), edge_round_trip
            # the publisher's router's received -> the outcome back to the publisher
            "in_router_by_address": sorted(p["inr_addr"], key=lambda r: r["address"]),
            "in_router_by_address_router": sorted(
                p["inr_router"], key=lambda r: (r["address"], r["router"])
            ),
            "hops": sorted(p["hop_rows"], key=lambda r: (r["from_router"], r["to_router"])),
            "transit_by_router": sorted(p["transit_rows"], key=lambda r: r["router"]),
            "in_router_histogram_by_address": _histogram(p["inr_hist"]),
            "edge_round_trip_by_address": sorted(p["edge_rows"], key=lambda r: r["address"]),
            "edge_round_trip_by_router": sorted(p["edge_router_rows"], key=lambda r: r["router"]),
            "edge_round_trip_histogram_by_address": _histogram(p["edge_hist"]),
        },
        "outcomes": outcomes,
        "credit_stalls": sorted(p["stall_rows"], key=lambda r: (r["router"], r["address"])),
        "unsettled": {
            "count": total_unsettled,
            "by_router_address": sorted(
                p["unsettled_counts"], key=lambda r: (r["router"], r["address"])
            ),
            "listed": p["unsettled_sample"],
        },
        "verdicts": p["verdicts"],
    }


def run_audit(
    journal_dirs: list[str],
    out_dir: str,
    master: str | None = None,
    *,
    guarantees: dict[str, str] | None = None,
    spark: Any = None,
    progress: Progress | None = None,
    driver_memory: str = "2g",
    max_listed: int = 1000,
    plots: bool = True,
) -> dict[str, Any]:
    """Audit the journals in ``journal_dirs``; write the report to ``out_dir``; return it.

    ``guarantees`` (address -> exactly-once | at-least-once) add to, and override, the
    ``guarantees.json`` files of the journal directories. ``spark``: an existing session to
    use (kept running); otherwise one is made (`spark_session`) and stopped at the end.
    """
    try:
        from . import report as report_module
    except ImportError:  # loaded as a plain module by spark_main.py
        import report as report_module  # type: ignore[no-redef]

    started = time.perf_counter()
    dirs = [str(d) for d in journal_dirs]
    for d in dirs:
        if not _is_url(d):
            _local_segments(d)  # raises AuditError for a missing directory
    if progress is None:
        progress = print_progress()
    if spark is None:
        from pyspark.sql import SparkSession

        spark = SparkSession.getActiveSession()
    own = spark is None
    if own:
        progress(0, STAGES, f"starting Spark ({master or 'local[*]'})")
        spark = spark_session(master, driver_memory=driver_memory)
    try:
        merged = load_guarantees(dirs, spark)
        merged.update(_check_guarantees(guarantees or {}, "--guarantee"))
        summary = compute(spark, dirs, merged, progress=progress, max_listed=max_listed)
    finally:
        if own:
            spark.stop()
    summary["timing"]["total_s"] = round(time.perf_counter() - started, 3)
    summary["report"] = report_module.write_report(summary, out_dir, plots=plots)
    return summary
