"""The audit report: terminal tables (rich, if installed), summary.json, PNG plots, report.html.

Everything here works from the summary dict the Spark job returns, so a report can be
re-rendered from a summary.json without Spark (``render_terminal(json.load(...))``).
This module imports nothing else from qrouter (spark_main.py loads it from a bare checkout).
"""

from __future__ import annotations

import base64
import html
import json
from pathlib import Path
from typing import Any

SUMMARY_FILE = "summary.json"
HTML_FILE = "report.html"
THROUGHPUT_PNG = "throughput.png"
LATENCY_PNG = "latency.png"
LISTED_IN_TERMINAL = 10


def fmt_ns(ns: float | int | None) -> str:
    """A duration in ns, readably: ``850 ns``, ``12.3 µs``, ``4.56 ms``, ``1.20 s``."""
    if ns is None:
        return "-"
    value = float(ns)
    for unit, scale in (("s", 1e9), ("ms", 1e6), ("µs", 1e3)):
        if abs(value) >= scale:
            v = value / scale
            return f"{v:.3g} {unit}" if v < 100 else f"{v:.0f} {unit}"
    return f"{value:.0f} ns"


def fmt_count(n: int | None) -> str:
    return "-" if n is None else f"{n:,}"


def _outcomes(counts: dict[str, int]) -> str:
    if not counts:
        return "-"
    return " ".join(f"{k}={v:,}" for k, v in sorted(counts.items()))


def _stalls(cs: dict[str, int] | None) -> str:
    if not cs or not cs.get("count"):
        return "0"
    return f"{cs['count']:,} / {fmt_ns(cs['total_ns'])}"


def _rate(summary: dict[str, Any], address: str) -> tuple[float, int]:
    """(average, peak) published deliveries per second for the address."""
    rows = [r for r in summary["throughput"]["by_address"] if r["address"] == address]
    if not rows:
        return 0.0, 0
    seconds = max(r["second"] for r in rows) - min(r["second"] for r in rows) + 1
    total = sum(r["published"] for r in rows)
    return total / seconds, max(r["published"] for r in rows)


def tables(summary: dict[str, Any]) -> list[tuple[str, list[str], list[list[str]]]]:
    """The report's tables as (title, header, rows) of strings, for any renderer."""
    out: list[tuple[str, list[str], list[list[str]]]] = []
    rows = []
    for a in summary["by_address"]:
        lat = a.get("in_router_latency") or {}
        rtt = a.get("edge_round_trip") or {}
        avg, peak = _rate(summary, a["address"])
        rows.append(
            [
                a["address"],
                fmt_count(a["published"]),
                str(a["subscribers"]),
                fmt_count(a["delivered"]),
                f"{avg:,.0f} / {peak:,}",
                fmt_ns(lat.get("p50_ns")),
                fmt_ns(lat.get("p90_ns")),
                fmt_ns(lat.get("p99_ns")),
                fmt_ns(lat.get("max_ns")),
                fmt_ns(rtt.get("p50_ns")),
                fmt_ns(rtt.get("p99_ns")),
                _outcomes(a["outcomes"]),
                _stalls(a["credit_stalls"]),
                fmt_count(a["unsettled"]),
            ]
        )
    out.append(
        (
            "Per address (in-router: publisher's router received -> forwarded to the"
            " subscriber, hops included; round trip: publisher's router received -> outcome"
            " back to the publisher)",
            [
                "address",
                "published",
                "subs",
                "delivered",
                "avg/peak per s",
                "in-router p50",
                "p90",
                "p99",
                "max",
                "round trip p50",
                "p99",
                "subscriber outcomes",
                "credit stalls",
                "unsettled",
            ],
            rows,
        )
    )
    rows = []
    for r in summary["by_router"]:
        ev = r["events"]
        lat = r.get("transit_latency") or {}
        rtt = r.get("edge_round_trip") or {}
        rows.append(
            [
                r["router"],
                *(
                    fmt_count(ev.get(name, 0))
                    for name in (
                        "received",
                        "forwarded",
                        "outcome",
                        "settled",
                        "released-back",
                        "resumed",
                    )
                ),
                fmt_ns(lat.get("p50_ns")),
                fmt_ns(lat.get("p99_ns")),
                fmt_ns(lat.get("max_ns")),
                fmt_ns(rtt.get("p50_ns")),
                fmt_ns(rtt.get("p99_ns")),
                _stalls(r["credit_stalls"]),
                fmt_count(r["unsettled"]),
            ]
        )
    out.append(
        (
            "Per router (in-router transit: received -> forwarded; round trip of the"
            " publishers attached to it: received -> outcome back to the publisher)",
            [
                "router",
                "received",
                "forwarded",
                "outcome",
                "settled",
                "released-back",
                "resumed",
                "in-router p50",
                "p99",
                "max",
                "round trip p50",
                "p99",
                "credit stalls",
                "unsettled",
            ],
            rows,
        )
    )
    hops = summary["latency"]["hops"]
    if hops:
        out.append(
            (
                "Per hop (received at one router -> received at the next)",
                ["hop", "deliveries", "p50", "p90", "p99", "max"],
                [
                    [
                        f"{h['from_router']} -> {h['to_router']}",
                        fmt_count(h["count"]),
                        fmt_ns(h["p50_ns"]),
                        fmt_ns(h["p90_ns"]),
                        fmt_ns(h["p99_ns"]),
                        fmt_ns(h["max_ns"]),
                    ]
                    for h in hops
                ],
            )
        )
    inr_router = summary["latency"]["in_router_by_address_router"]
    if inr_router:
        out.append(
            (
                "In-router latency (publisher's router -> subscriber's link) by subscriber's"
                " router",
                ["address", "router", "deliveries", "p50", "p90", "p99", "max"],
                [
                    [
                        r["address"],
                        r["router"],
                        fmt_count(r["count"]),
                        fmt_ns(r["p50_ns"]),
                        fmt_ns(r["p90_ns"]),
                        fmt_ns(r["p99_ns"]),
                        fmt_ns(r["max_ns"]),
                    ]
                    for r in inr_router
                ],
            )
        )
    verdicts = summary.get("verdicts") or {}
    if verdicts:
        out.append(
            (
                "Guarantees",
                [
                    "address",
                    "guarantee",
                    "verdict",
                    "published",
                    "subscribers",
                    "lost",
                    "duplicated",
                    "reason",
                ],
                [
                    [
                        a,
                        v["guarantee"],
                        v["verdict"].upper(),
                        fmt_count(v["published"]),
                        str(len(v["subscribers"])),
                        fmt_count(v["lost_count"]),
                        fmt_count(v["duplicated_count"]),
                        v["reason"],
                    ]
                    for a, v in sorted(verdicts.items())
                ],
            )
        )
    return out


def fault_lines(summary: dict[str, Any], limit: int | None = LISTED_IN_TERMINAL) -> list[str]:
    """Lines naming lost and duplicated deliveries (address, tag, origin, subscriber)."""
    lines: list[str] = []
    for address, v in sorted((summary.get("verdicts") or {}).items()):
        for kind, items, total in (
            ("lost", v["lost"], v["lost_count"]),
            ("duplicated", v["duplicated"], v["duplicated_count"]),
        ):
            shown = items if limit is None else items[:limit]
            for item in shown:
                times = f" x{item['times']}" if "times" in item else ""
                lines.append(
                    f"{kind}{times}: {address} tag {item['tag']} (origin {item['origin']}, "
                    f"published at {item['origin_router']}) -> {item['router']}/{item['link']}"
                )
            if total > len(shown):
                lines.append(f"... and {total - len(shown):,} more {kind} on {address}")
    return lines


def headline(summary: dict[str, Any]) -> str:
    t = summary["time"]
    timing = summary.get("timing", {})
    spark = summary.get("spark", {})
    return (
        f"{summary['rows']:,} events from {len(summary['routers'])} router(s) "
        f"({', '.join(summary['routers'])}), {summary['segments']} segment(s), "
        f"{t['duration_s']:.3f} s of traffic; audited in {timing.get('audit_s', 0):.1f} s "
        f"on Spark {spark.get('version', '?')} ({spark.get('master', '?')})"
    )


def render_terminal(summary: dict[str, Any], console: Any = None) -> None:
    """Print the summary as rich tables, or as plain text when rich is not installed."""
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        print(plain_text(summary))
        return
    if console is None:
        console = Console()
        if not console.is_terminal:
            console = Console(width=max(console.width, 180))
    console.print(f"[bold]qrouter audit[/bold]: {headline(summary)}")
    for title, header, rows in tables(summary):
        table = Table(title=title, title_justify="left", header_style="bold")
        for i, name in enumerate(header):
            table.add_column(name, justify="left" if i == 0 or name == "reason" else "right")
        for row in rows:
            cells = list(row)
            if title == "Guarantees":
                colour = "green" if cells[2] == "PASS" else "red"
                cells[2] = f"[bold {colour}]{cells[2]}[/]"
            table.add_row(*cells)
        console.print(table)
    for line in fault_lines(summary):
        console.print(line, style="red", highlight=False, markup=False)
    u = summary["unsettled"]
    if u["count"]:
        console.print(f"{u['count']:,} deliveries still unsettled at the end", style="yellow")
    files = summary.get("report") or {}
    if files:
        console.print(f"report: {files.get('html')}  summary: {files.get('summary_json')}")


def plain_text(summary: dict[str, Any]) -> str:
    lines = [f"qrouter audit: {headline(summary)}"]
    for title, header, rows in tables(summary):
        widths = [max(len(str(c)) for c in col) for col in zip(header, *rows, strict=True)]
        lines.append("")
        lines.append(title)
        lines.append("  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)))
        for row in rows:
            lines.append("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)))
    lines.extend(fault_lines(summary))
    if summary["unsettled"]["count"]:
        lines.append(f"{summary['unsettled']['count']:,} deliveries still unsettled at the end")
    return "\n".join(lines)


def plot_throughput(summary: dict[str, Any], path: Path) -> None:
    from matplotlib.figure import Figure

    thr = summary["throughput"]
    fig = Figure(figsize=(10, 6.5), layout="constrained")
    ax1, ax2 = fig.subplots(2, 1, sharex=True)
    for address in summary["addresses"]:
        rows = [r for r in thr["by_address"] if r["address"] == address]
        if rows:
            xs = [r["second"] for r in rows]
            ax1.plot(xs, [r["published"] for r in rows], marker=".", label=address)
    ax1.set_ylabel("published / s")
    ax1.set_title("Throughput per address (deliveries received from publishers, 1 s buckets)")
    for router in summary["routers"]:
        rows = [r for r in thr["by_router"] if r["router"] == router]
        if rows:
            xs = [r["second"] for r in rows]
            ax2.plot(xs, [r["received"] for r in rows], marker=".", label=router)
    ax2.set_ylabel("received / s")
    ax2.set_xlabel("seconds since the first event")
    ax2.set_title("Deliveries received per router (all links)")
    for ax in (ax1, ax2):
        ax.grid(True, alpha=0.3)
        ax.set_ylim(bottom=0)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(loc="best", fontsize="small")
    fig.savefig(path, dpi=100)


def plot_latency(summary: dict[str, Any], path: Path) -> None:
    """Two panels: the in-router latency and the round trip at the publisher's router."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import FuncFormatter, NullFormatter

    lat = summary["latency"]
    panels = (
        (
            lat["in_router_histogram_by_address"],
            lat["in_router_by_address"],
            "in-router latency (log scale)",
            "In-router latency per address: publisher's router received ->\n"
            "forwarded to the subscriber (inter-router hops included)",
            "% of deliveries",
        ),
        (
            lat["edge_round_trip_histogram_by_address"],
            lat["edge_round_trip_by_address"],
            "round trip at the publisher's router (log scale)",
            "End-to-end round trip per address: publisher's router received ->\n"
            "outcome back to the publisher (excludes the publisher's own legs)",
            "% of publishes",
        ),
    )
    fig = Figure(figsize=(10, 9), layout="constrained")
    for ax, (hist, rows, xlabel, title, ylabel) in zip(fig.subplots(2, 1), panels, strict=True):
        stats = {r["address"]: r for r in rows}
        for address, bins in sorted(hist.items()):
            total = sum(b["count"] for b in bins) or 1
            edges = [b["lo_ns"] for b in bins]
            edges.append(bins[-1]["hi_ns"])
            weights = [100.0 * b["count"] / total for b in bins]
            s = stats.get(address, {})
            label = (
                f"{address}  p50 {fmt_ns(s.get('p50_ns'))}, p99 {fmt_ns(s.get('p99_ns'))}, "
                f"max {fmt_ns(s.get('max_ns'))}"
            )
            ax.stairs(weights, edges, label=label, linewidth=1.5)
        ax.set_xscale("log")
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos: fmt_ns(v)))
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(loc="best", fontsize="small")
    fig.savefig(path, dpi=100)


def _html_table(title: str, header: list[str], rows: list[list[str]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = []
    for row in rows:
        cells = []
        for c in row:
            cls = {"PASS": ' class="pass"', "FAIL": ' class="fail"'}.get(c, "")
            cells.append(f"<td{cls}>{html.escape(c)}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return (
        f"<h2>{html.escape(title)}</h2>\n<table><thead><tr>{head}</tr></thead>"
        f"<tbody>{''.join(body)}</tbody></table>"
    )


def render_html(summary: dict[str, Any], images: dict[str, Path]) -> str:
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8"><title>qrouter audit</title>',
        "<style>body{font-family:system-ui,sans-serif;margin:2em;color:#222}"
        "table{border-collapse:collapse;margin-bottom:1em}"
        "th,td{border:1px solid #ccc;padding:3px 8px;text-align:right}"
        "th{background:#f0f0f0}td:first-child{text-align:left}"
        ".pass{color:#080;font-weight:bold}.fail{color:#b00;font-weight:bold}"
        "pre{background:#f7f7f7;padding:1em;overflow-x:auto}img{max-width:100%}</style>",
        "</head><body>",
        "<h1>qrouter delivery audit</h1>",
        f"<p>{html.escape(headline(summary))}</p>",
        "<p>Journals: " + html.escape(", ".join(summary["journal_dirs"])) + "</p>",
    ]
    for title, header, rows in tables(summary):
        parts.append(_html_table(title, header, rows))
    faults = fault_lines(summary, limit=200)
    if faults:
        parts.append("<h2>Lost and duplicated deliveries</h2>")
        parts.append("<pre>" + html.escape("\n".join(faults)) + "</pre>")
    u = summary["unsettled"]
    if u["count"]:
        parts.append(f"<h2>Unsettled at the end: {u['count']:,}</h2><pre>")
        parts.append(
            html.escape(
                "\n".join(
                    f"{r['router']} {r['address']} {r['link']} tag {r['tag']} origin {r['origin']}"
                    for r in u["listed"][:200]
                )
            )
        )
        parts.append("</pre>")
    for title, path in images.items():
        data = base64.b64encode(path.read_bytes()).decode("ascii")
        parts.append(f"<h2>{html.escape(title)}</h2>")
        parts.append(f'<img alt="{html.escape(title)}" src="data:image/png;base64,{data}">')
    parts.append("</body></html>")
    return "\n".join(parts)


def write_report(
    summary: dict[str, Any], out_dir: str | Path, *, plots: bool = True
) -> dict[str, Any]:
    """Write summary.json, the PNG plots and report.html to ``out_dir``; return the paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    files: dict[str, Any] = {
        "summary_json": str(out / SUMMARY_FILE),
        "html": str(out / HTML_FILE),
        "plots": {},
    }
    images: dict[str, Path] = {}
    if plots:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            plots = False
    if plots:
        thr, lat = out / THROUGHPUT_PNG, out / LATENCY_PNG
        plot_throughput(summary, thr)
        plot_latency(summary, lat)
        images = {"Throughput over time": thr, "Latency distribution": lat}
        files["plots"] = {"throughput": str(thr), "latency": str(lat)}
    summary["report"] = files
    (out / SUMMARY_FILE).write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    (out / HTML_FILE).write_text(render_html(summary, images), encoding="utf-8")
    return files
