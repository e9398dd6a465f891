"""``qrouter start --config qdrouterd.conf``: a router started from Qpid Dispatch's
configuration file (qrouter/dispatch_config.py) runs as configured, and one with an entity
qrouter lacks does not start, saying which on one line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.harness import ROOT, Process, free_port, port_open, retry
from tests.management.test_dispatch_compat import Mgmt
from tests.management.test_runtime_changes import send_through

CONF = """\
router {
    mode: standalone
    id: Migrated.A
}
listener {
    host: 127.0.0.1
    port: %(port)d
    authenticatePeer: no
    saslMechanisms: ANONYMOUS
}
address {
    prefix: broadcast
    distribution: multicast
}
log {
    module: DEFAULT
    enable: debug+
}
"""


def _env() -> dict[str, str]:
    return {"PYTHONPATH": str(ROOT)}


def test_a_router_runs_from_a_qdrouterd_conf(tmp_path: Path, blocking: Any) -> None:
    port = free_port()
    conf = tmp_path / "qdrouterd.conf"
    conf.write_text(CONF % {"port": port})
    proc = Process(
        [sys.executable, "-m", "qrouter", "start", "--config", str(conf)],
        name="migrated",
        directory=tmp_path,
        env=_env(),
    )
    try:
        retry(lambda: proc.check_running() or port_open(port), timeout=30)
        url = f"amqp://127.0.0.1:{port}"
        (general,) = Mgmt(blocking(url)).qdstat("router", ["id", "mode"])
        assert general == {"id": "Migrated.A", "mode": "standalone"}
        # the address section: both consumers of broadcast.x get the message
        conn = blocking(url)
        a = conn.create_receiver("broadcast.x", credit=5, name="a")
        b = conn.create_receiver("broadcast.x", credit=5, name="b")
        send_through(blocking(url).create_sender("broadcast.x"), a, "to all", also=[b])
        assert "DEBUG" in proc.log_tail()  # log { enable: debug+ }
    finally:
        proc.teardown()


def test_an_unsupported_entity_stops_the_start(tmp_path: Path) -> None:
    conf = tmp_path / "qdrouterd.conf"
    conf.write_text((CONF % {"port": free_port()}) + "exchange {\n    name: e\n}\n")
    done = subprocess.run(
        [sys.executable, "-m", "qrouter", "start", "--config", str(conf)],
        env={**_env(), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode != 0
    errors = [line for line in done.stderr.splitlines() if "exchange" in line]
    assert errors == [
        f"qrouter: error: {conf}:19: exchange: not supported: exchanges are not in qrouter"
    ], done.stderr
