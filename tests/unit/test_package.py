"""The import package is `qrouter` (issue 16, item 8): the client, the stores and the command
line are importable under it, and importing the client does not pull in the server's stack
(an application that only sends and receives does not load management, policy, the mesh or
the event loop the router runs on)."""

from __future__ import annotations

import json
import subprocess
import sys

SERVER_STACK = (
    "qrouter.server",
    "qrouter.core",
    "qrouter.management",
    "qrouter.inter_router",
    "qrouter.guarantee",
    "qrouter.mesh",
    "qrouter.policy",
    "qrouter.link_registry",
    "qrouter.metrics",
    "qrouter.stores",
    "uvloop",
    "prometheus_client",
)


def _modules_after(statement: str) -> set[str]:
    code = f"import json, sys\n{statement}\nprint(json.dumps(sorted(sys.modules)))"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    return set(json.loads(out.stdout))


def test_the_client_does_not_import_the_server() -> None:
    loaded = _modules_after("from qrouter.client import Client, Message")
    assert "qrouter.client" in loaded
    pulled = sorted(m for m in loaded if m.startswith(SERVER_STACK))
    assert pulled == [], f"importing qrouter.client loaded {pulled}"


def test_the_package_names() -> None:
    loaded = _modules_after(
        "import qrouter.cli, qrouter.server\n"
        "from qrouter.stores import open_store\n"
        "from qrouter.stores.memory import MemoryStore"
    )
    assert {"qrouter.cli", "qrouter.server", "qrouter.stores.memory"} <= loaded
    assert not {"router", "stores"} & loaded, "the old top-level names are gone"
