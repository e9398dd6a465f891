"""``qrouter-tool audit``: the click command (registered in tools/cli.py)."""

from __future__ import annotations

import sys

import click


@click.command("audit")
@click.argument("journal_dirs", nargs=-1, required=True, metavar="JOURNAL_DIR...")
@click.option(
    "--master",
    metavar="URL",
    help="Spark master (spark://host:7077, yarn, k8s://...); default local[*].",
)
@click.option(
    "--out",
    "out_dir",
    default="audit-report",
    show_default=True,
    metavar="DIR",
    help="Where summary.json, the plots and report.html go.",
)
@click.option(
    "--guarantee",
    "guarantees",
    multiple=True,
    metavar="ADDRESS=MODE",
    help="Check ADDRESS for exactly-once or at-least-once (repeatable; adds to and "
    "overrides the journals' guarantees.json).",
)
@click.option(
    "--driver-memory", default="2g", show_default=True, help="Spark driver memory (local mode)."
)
@click.option(
    "--max-listed",
    default=1000,
    show_default=True,
    help="At most this many lost / duplicated / unsettled deliveries listed per address.",
)
@click.option("--no-plots", is_flag=True, help="Skip the PNG plots (report.html has tables only).")
@click.option(
    "--fail-on-violation/--no-fail-on-violation",
    default=True,
    show_default=True,
    help="Exit with status 1 when a guarantee is violated.",
)
def audit_command(
    journal_dirs: tuple[str, ...],
    master: str | None,
    out_dir: str,
    guarantees: tuple[str, ...],
    driver_memory: str,
    max_listed: int,
    no_plots: bool,
    fail_on_violation: bool,
) -> None:
    """Audit delivery journals (one directory per router) with Spark.

    Reports per address and router: throughput, latency (in-router, per hop, and the round
    trip at the publisher's router), outcomes, credit stalls, unsettled deliveries, and a
    verdict for every address with a guarantee.
    """
    try:
        from .job import AuditError, parse_guarantee, run_audit
        from .report import render_terminal
    except ImportError as exc:  # pyspark or pyarrow missing
        click.echo(f"qrouter-tool audit: {exc} (pip install 'qrouter[audit]')", err=True)
        sys.exit(2)
    try:
        wanted = dict(parse_guarantee(g) for g in guarantees)
        summary = run_audit(
            list(journal_dirs),
            out_dir,
            master,
            guarantees=wanted,
            driver_memory=driver_memory,
            max_listed=max_listed,
            plots=not no_plots,
        )
    except AuditError as exc:
        click.echo(f"qrouter-tool audit: error: {exc}", err=True)
        sys.exit(2)
    except ImportError as exc:  # pyspark, pyarrow or matplotlib: imported when the job runs
        click.echo(f"qrouter-tool audit: {exc} (pip install 'qrouter[audit]')", err=True)
        sys.exit(2)
    render_terminal(summary)
    failed = [a for a, v in summary["verdicts"].items() if v["verdict"] != "pass"]
    if failed and fail_on_violation:
        sys.exit(1)
