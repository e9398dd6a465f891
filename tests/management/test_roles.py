"""Management roles (qrouter/policy.py `management_role`) and the audit trail (logger
``qrouter.audit``), with real routers, SASL PLAIN users and the real ``qrouter-tool``.

* monitor: QUERY, READ, GET-*; admin: also CREATE, UPDATE, DELETE; none: nothing.
* No policy: admin only for connections on a loopback listener of a router without a users
  file (``qrouter start`` as it comes); a user of a users file is monitor.
* A refused request: status 403, ``qrouter-tool: forbidden: <reason>`` on one line, exit 1.
* Every change, and every refused or failed request: one ``qrouter.audit`` line saying who
  (user, role), from where (remote address, connection, listener), when, what, and the result.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from tests.management.tooling import ok, run_tool

PASSWORDS = {"mon": "mon-pw", "adm": "adm-pw", "nobody": "nobody-pw", "eve": "eve-pw"}

POLICY = """
management_users = { eve = "admin" }

[[group]]
name = "operators"
users = ["adm"]
management = "admin"

[[group]]
name = "watchers"
users = ["mon", "eve"]
management = "monitor"

[[group]]
name = "apps"
users = ["nobody", "$anonymous"]
sources = ["#"]
targets = ["#"]
"""


def users_file(folder: Path) -> Path:
    from qrouter.auth import hash_password

    path = folder / "users"
    path.write_text(
        "".join(f"{u}:{hash_password(p, iterations=1)}\n" for u, p in PASSWORDS.items())
    )
    return path


def login(user: str) -> list[str]:
    return ["--user", user, "--password", PASSWORDS[user]]


def audit_lines(r: Any, count: int, timeout: float = 10.0) -> list[str]:
    deadline = time.monotonic() + timeout
    while True:
        lines = [
            line
            for line in r.outfile.read_text(errors="replace").splitlines()
            if "qrouter.audit" in line
        ]
        if len(lines) >= count or time.monotonic() > deadline:
            return lines
        time.sleep(0.1)


def create_address(r: Any, prefix: str, *auth: str) -> Any:
    return run_tool(
        "manage", "create", "--type", "address", f"prefix={prefix}", "distribution=multicast",
        "--url", r.url, *auth,
    )  # fmt: skip


def test_monitor_may_query_but_not_create_admin_may(router: Any, tmp_path: Path) -> None:
    policy = tmp_path / "policy.toml"
    policy.write_text(POLICY)
    r = router(
        config={"users_file": str(users_file(tmp_path)), "policy_file": str(policy)},
        listeners=[{"sasl_mechanisms": ["PLAIN"], "require_auth": True}],
    )
    # monitor: reads work
    rows = ok("manage", "query", "--type", "listener", "--url", r.url, "--json", *login("mon"))
    assert len(rows.json()) == 1
    ok("stats", "--url", r.url, *login("mon"))
    # ... changes do not: one line, "forbidden" and the reason, exit status 1
    denied = create_address(r, "audit.mon", *login("mon"))
    assert denied.returncode == 1, str(denied)
    assert denied.stderr.strip().splitlines() == [
        "qrouter-tool: forbidden: CREATE needs the admin role; user 'mon' has 'monitor' "
        "(given by the [policy] (docs/configuration.md))"
    ], str(denied)
    delete = run_tool(
        "manage", "delete", "--type", "connection", "--identity", "1", "--url", r.url,
        *login("mon"),
    )  # fmt: skip
    assert delete.returncode == 1 and "forbidden: DELETE needs the admin role" in delete.stderr

    # none (a group without a management role): not even reads
    none = run_tool("stats", "--url", r.url, *login("nobody"))
    assert none.returncode == 1 and "forbidden: QUERY needs the monitor or admin role" in (
        none.stderr
    ), str(none)

    # admin: by the group, and by management_users (eve's group says monitor)
    created = create_address(r, "audit.adm", *login("adm"))
    assert created.returncode == 0, str(created)
    created = create_address(r, "audit.eve", *login("eve"))
    assert created.returncode == 0, str(created)
    rows = ok("manage", "query", "--type", "address", "--url", r.url, "--json", *login("mon"))
    prefixes = {row["prefix"] for row in rows.json()}
    assert {"audit.adm", "audit.eve"} <= prefixes and "audit.mon" not in prefixes

    # the audit trail: the two changes and the three refusals, nothing for the reads
    lines = audit_lines(r, 5)
    assert len(lines) == 5, lines
    refused_create, refused_delete, refused_query, by_adm, by_eve = lines
    assert "WARNING" in refused_create and "user=mon role=monitor" in refused_create
    assert "op=CREATE type=org.qrouter.address" in refused_create
    assert "status=403" in refused_create and "from=127.0.0.1:" in refused_create
    assert f"listener=127.0.0.1:{r.port}" in refused_create and " at=20" in refused_create
    assert "op=DELETE" in refused_delete and "identity=1" in refused_delete
    assert "user=nobody role=none" in refused_query and "op=QUERY" in refused_query
    assert "INFO" in by_adm and "user=adm role=admin" in by_adm and "status=201" in by_adm
    assert "'prefix': 'audit.adm'" in by_adm and "'distribution': 'multicast'" in by_adm
    assert "user=eve role=admin" in by_eve


def test_failed_change_is_audited(router: Any) -> None:
    r = router()
    bad = run_tool("manage", "create", "--type", "listener", "port=99999", "--url", r.url)
    assert bad.returncode == 1 and "400" in bad.stderr
    lines = audit_lines(r, 1)
    assert len(lines) == 1 and "op=CREATE type=org.qrouter.listener" in lines[0], lines
    assert "status=400" in lines[0] and "user=- role=admin" in lines[0]


def test_embedded_default_is_admin_on_loopback(router: Any) -> None:
    """`qrouter start` as it comes (loopback listener, no users file): anonymous is admin,
    as before; the change is audited."""
    r = router()
    created = create_address(r, "embedded.default")
    assert created.returncode == 0, str(created)
    ok("manage", "delete", "--type", "address", "--name", "embedded.default", "--url", r.url)
    lines = audit_lines(r, 2)
    assert [("op=CREATE" in lines[0]), ("op=DELETE" in lines[1])] == [True, True], lines
    assert all("user=- role=admin" in line and "status=20" in line for line in lines), lines


def test_users_file_without_policy_is_monitor(router: Any, tmp_path: Path) -> None:
    """Issue 14: a user made with `qrouter-tool passwd`, with no rights given, must not open
    listeners. Without a policy, users of a users file may look, not change."""
    r = router(
        config={"users_file": str(users_file(tmp_path))},
        listeners=[{"sasl_mechanisms": ["PLAIN"], "require_auth": True}],
    )
    ok("stats", "--url", r.url, *login("mon"))
    denied = run_tool(
        "manage", "create", "--type", "listener", "host=127.0.0.1", "port=0",
        "require_auth=false", "--url", r.url, *login("adm"),
    )  # fmt: skip
    assert denied.returncode == 1, str(denied)
    assert len(denied.stderr.strip().splitlines()) == 1
    assert "forbidden: CREATE needs the admin role; user 'adm' has 'monitor'" in denied.stderr
    assert "without one only anonymous connections on a loopback listener" in denied.stderr
    rows = ok("manage", "query", "--type", "listener", "--url", r.url, "--json", *login("mon"))
    assert len(rows.json()) == 1  # no listener was opened


def test_anonymous_is_not_admin_beside_a_require_auth_listener(router: Any, tmp_path: Path) -> None:
    """A policy that makes the anonymous group admin: on a listener that requires
    authentication an anonymous connection is refused before it could ask anything, and an
    authenticated user of that listener gets their own role, not the anonymous one."""
    policy = tmp_path / "policy.toml"
    policy.write_text(POLICY.replace('users = ["nobody", "$anonymous"]', 'users = ["nobody"]')
                      + '\n[[group]]\nname = "anon"\nusers = ["$anonymous"]\n'
                      'management = "admin"\n')  # fmt: skip
    r = router(
        config={"users_file": str(users_file(tmp_path)), "policy_file": str(policy)},
        listeners=[{"sasl_mechanisms": ["PLAIN"], "require_auth": True}],
    )
    anonymous = run_tool("stats", "--url", r.url)
    assert anonymous.returncode == 1 and "cannot connect" in anonymous.stderr, str(anonymous)
    denied = create_address(r, "x", *login("mon"))
    assert denied.returncode == 1 and "forbidden" in denied.stderr
