"""Fixtures for the audit tests: one local SparkSession for the whole run."""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]


def _alias_tools_package() -> None:
    """Make `qrouter_tools` importable from a source checkout (tox installs the real one)."""
    if importlib.util.find_spec("qrouter_tools") is not None:
        return
    spec = importlib.util.spec_from_file_location(
        "qrouter_tools",
        REPO / "tools" / "__init__.py",
        submodule_search_locations=[str(REPO / "tools")],
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["qrouter_tools"] = module
    spec.loader.exec_module(module)


_alias_tools_package()


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
