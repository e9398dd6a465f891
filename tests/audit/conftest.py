"""Fixtures for the audit tests: one local SparkSession for the whole run."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from typing import Any

import pytest

from tests.tools_alias import alias_tools_package

alias_tools_package()


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """A local[2] SparkSession shared by every audit test (a start costs 5-10 s)."""
    pytest.importorskip("pyspark")
    if not (os.environ.get("JAVA_HOME") or shutil.which("java")):
        pytest.skip("no Java runtime (Spark needs Java 17+)")
    from qrouter_tools.audit.job import spark_session

    session = spark_session(
        "local[2]",
        driver_memory="1g",
        shuffle_partitions=4,
        app_name="qrouter-audit-tests",
        conf={"spark.ui.enabled": "false", "spark.ui.showConsoleProgress": "false"},
    )
    yield session
    session.stop()
