"""The frame trace (issue 16 item 6, qrouter/_fast/trace.pxi): ``--trace`` logs every frame of
a proton client's exchange on ``qrouter.trace``; ``$management`` switches it per connection
(UPDATE connection trace=true) and for new connections (UPDATE router trace=true); off, the
log has no trace line."""

from __future__ import annotations

import re
from typing import Any

from tests.harness import retry
from tests.management.test_runtime_changes import send_through
from tests.management.tooling import ok

TRACE_LINE = re.compile(r"TRACE\s+qrouter\.trace: \[C(\d+)\] (->|<-) (.*)")


def log_text(r: Any) -> str:
    if not r._out.closed:
        r._out.flush()
    return str(r.outfile.read_text(errors="replace"))


def trace_lines(r: Any) -> list[tuple[int, str, str]]:
    return [(int(m.group(1)), m.group(2), m.group(3)) for m in TRACE_LINE.finditer(log_text(r))]


def exchange(blocking: Any, url: str, address: str) -> None:
    """One message through the router, accepted: OPEN, ATTACH, TRANSFER, DISPOSITION."""
    consumer = blocking(url).create_receiver(address, credit=1)
    producer = blocking(url)
    send_through(producer.create_sender(address), consumer, "traced")
    producer.close()
    consumer.connection.close()


def test_trace_from_the_command_line(router: Any, blocking: Any) -> None:
    r = router(extra_args=["--trace"], log_level="info")
    exchange(blocking, r.url, "traced.q")

    def seen() -> bool:
        text = " ".join(f"{d} {t}" for _, d, t in trace_lines(r))
        return all(
            want in text
            for want in (
                "<- AMQP header 1.0.0",
                "-> AMQP header 1.0.0",
                "<- @0 open(container_id=",
                "-> @0 open(container_id=",
                "<- @0 attach(",
                "-> @0 attach(",
                "<- @0 transfer(handle=",
                "-> @0 transfer(handle=",
                "disposition(role=true",
                "<- @0 close(",
            )
        )

    retry(seen, timeout=10, message=lambda: f"trace lines missing:\n{log_text(r)[-4000:]}")
    transfers = [t for _, d, t in trace_lines(r) if "transfer(" in t]
    assert transfers and all(re.search(r"payload=\d+$", t) for t in transfers), transfers


def test_trace_switched_per_connection_by_management(router: Any, blocking: Any) -> None:
    r = router(log_level="info")
    first = blocking(r.url)
    first.create_receiver("quiet.q", credit=1)
    rows = ok("connections", "--url", r.url, "--json").json()
    assert rows and all(row.get("trace") is False for row in rows)
    traced = min(int(row["identity"]) for row in rows)
    out = ok(
        "manage", "update", "--type", "connection", "--identity", str(traced), "trace=true",
        "--url", r.url, "--json",
    ).json()  # fmt: skip
    assert out["trace"] is True
    # the switched connection's next frames are traced: a sender attached on it
    first.create_sender("quiet.q")
    retry(
        lambda: any(c == traced and "attach(" in t for c, _, t in trace_lines(r)),
        timeout=10,
        message=lambda: f"no attach traced for C{traced}:\n{log_text(r)[-3000:]}",
    )
    assert {c for c, _, _ in trace_lines(r)} == {traced}  # only that one (not the tool's)

    # for all new connections: the router entity
    ok("manage", "update", "--type", "router", "--name", r.router_id, "trace=true", "--url", r.url)
    exchange(blocking, r.url, "later.q")
    retry(
        lambda: len({c for c, _, t in trace_lines(r) if "open(" in t}) >= 2,
        timeout=10,
        message=lambda: f"new connections not traced:\n{log_text(r)[-3000:]}",
    )
    # and off again for that first connection
    ok(
        "manage", "update", "--type", "connection", "--identity", str(traced), "trace=false",
        "--url", r.url,
    )  # fmt: skip
    row = next(
        x for x in ok("connections", "--url", r.url, "--json").json()
        if int(x["identity"]) == traced
    )  # fmt: skip
    assert row["trace"] is False


def test_no_trace_lines_when_off(router: Any, blocking: Any) -> None:
    r = router(log_level="debug")
    exchange(blocking, r.url, "untraced.q")
    ok("connections", "--url", r.url)  # a last request: the exchange above is over
    assert trace_lines(r) == []
    assert "qrouter.trace" not in log_text(r)


def test_trace_hides_sasl_credentials(router: Any, tmp_path: Any) -> None:
    from tests.management.test_roles import PASSWORDS, login, users_file

    r = router(
        config={"users_file": str(users_file(tmp_path)), "trace": True},
        listeners=[{"sasl_mechanisms": ["PLAIN"], "require_auth": True}],
        log_level="info",
    )
    ok("stats", "--url", r.url, *login("mon"))
    retry(
        lambda: any(
            "sasl-init(mechanism=:PLAIN, initial_response=<" in t for *_, t in trace_lines(r)
        ),
        timeout=10,
        message=lambda: f"no sasl-init traced:\n{log_text(r)[-3000:]}",
    )
    assert PASSWORDS["mon"] not in log_text(r)
    assert any("sasl-outcome(code=0)" in t for *_, t in trace_lines(r))
