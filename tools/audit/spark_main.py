"""The audit as a plain script for spark-submit (the cluster's master and resources apply)::

    spark-submit --master spark://host:7077 \\
        "$(python -c 'import qrouter_tools.audit, os; print(os.path.dirname(qrouter_tools.audit.__file__))')/spark_main.py" \\
        JOURNAL_DIR... --out DIR [--guarantee ADDRESS=exactly-once ...]

It loads job.py and report.py from beside itself, so it also runs from a source checkout
(``spark-submit tools/audit/spark_main.py ...``): the driver needs only PySpark (plus
matplotlib and rich for the plots and tables). Executors need no Python code of ours: the
job uses DataFrame operations only.
"""

from __future__ import annotations

import argparse
import os
import sys


def main(argv: list[str] | None = None) -> int:
    here = os.path.dirname(os.path.abspath(__file__))
    if here not in sys.path:
        sys.path.insert(0, here)
    import job  # type: ignore[import-not-found]
    import report  # type: ignore[import-not-found]

    parser = argparse.ArgumentParser(prog="spark_main.py", description="qrouter delivery audit")
    parser.add_argument("journal_dirs", nargs="+", metavar="JOURNAL_DIR")
    parser.add_argument("--out", default="audit-report", help="report directory")
    parser.add_argument(
        "--guarantee", action="append", default=[], metavar="ADDRESS=MODE", help="repeatable"
    )
    parser.add_argument("--master", default=None, help="only when not set by spark-submit")
    parser.add_argument("--driver-memory", default="2g", help="only when not set by spark-submit")
    parser.add_argument("--max-listed", type=int, default=1000)
    parser.add_argument("--no-plots", action="store_true")
    args = parser.parse_args(argv)
    try:
        wanted = dict(job.parse_guarantee(g) for g in args.guarantee)
        summary = job.run_audit(
            args.journal_dirs,
            args.out,
            args.master,
            guarantees=wanted,
            driver_memory=args.driver_memory,
            max_listed=args.max_listed,
            plots=not args.no_plots,
        )
    except job.AuditError as exc:
        print(f"spark_main.py: error: {exc}", file=sys.stderr)
        return 2
    report.render_terminal(summary)
    return 1 if any(v["verdict"] != "pass" for v in summary["verdicts"].values()) else 0


if __name__ == "__main__":
    sys.exit(main())
