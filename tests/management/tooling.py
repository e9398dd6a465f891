"""Run the real ``qrouter-tool`` command in a subprocess: exit status, stdout and stderr as an
operator sees them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from dataclasses import dataclass
from typing import Any

from tests.harness import ROOT


@dataclass
class ToolResult:
    args: list[str]
    returncode: int
    stdout: str
    stderr: str

    def json(self) -> Any:
        return json.loads(self.stdout)

    def __str__(self) -> str:
        return (
            f"qrouter-tool {' '.join(self.args)} -> {self.returncode}\n"
            f"--- stdout ---\n{self.stdout}\n--- stderr ---\n{self.stderr}"
        )


def run_tool(*args: str, timeout: float = 60.0, env: dict[str, str] | None = None) -> ToolResult:
    full_env = dict(os.environ)
    full_env["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])
    )
    full_env.pop("QROUTER_URL", None)
    full_env.update(env or {})
    proc = subprocess.run(
        [sys.executable, "-m", "tests.management.run_tool", *args],
        cwd=str(ROOT),
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )
    return ToolResult(list(args), proc.returncode, proc.stdout, proc.stderr)


def ok(*args: str, **kwargs: Any) -> ToolResult:
    result = run_tool(*args, **kwargs)
    assert result.returncode == 0, str(result)
    assert "Traceback" not in result.stderr, str(result)
    return result


Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(port: int) -> Samples:
    """GET /metrics, parsed with the Prometheus text parser: (name, labels) -> value."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/plain")
        text = response.read().decode()
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)
