"""The delivery audit: a PySpark job over qrouter delivery journals (``qrouter-tool audit``).

* `job.run_audit` — the job (local[*] by default, any Spark master), writes the report;
* `report` — terminal tables, summary.json, PNG plots, report.html;
* `generate` — a synthetic journal generator for tests and benchmarks;
* `spark_main.py` — the same job for ``spark-submit``.

See docs/journal.md.
"""
