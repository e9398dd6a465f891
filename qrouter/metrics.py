"""The Prometheus endpoint: ``qrouter start --metrics HOST:PORT`` serves ``/metrics``.

The HTTP side is a small asyncio handler on the router's own loop (prometheus_client's
``start_http_server`` would run a thread that reads the engine's tables while the loop changes
them). The exposition is prometheus_client's: a custom collector reads the engine's counters
at scrape time, so the per-message path pays nothing for metrics. Only the store commit
histogram is fed as things happen, once per store commit (the control path).

Names follow the Prometheus conventions (``qrouter_`` prefix, ``_total`` counters, base units);
docs/operations.md lists them. Addresses are a label; dynamic reply addresses
(``_dynamic/...``), of which there is one per requester, are summed under the single label
value ``_dynamic`` to keep the number of series bounded.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Histogram, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import choose_encoder

from qrouter import __version__
from qrouter.config import parse_listen

if TYPE_CHECKING:
    from qrouter.core import Core
    from qrouter.policy import Policy

log = logging.getLogger("qrouter.metrics")

DYNAMIC_PREFIX = "_dynamic/"  # qrouter/core.py DYNAMIC_PREFIX
# store commits take tens of microseconds (no fsync) to tens of milliseconds (fsync)
COMMIT_BUCKETS = (
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0,
)  # fmt: skip
_OUTCOMES = ("accepted", "released", "rejected", "modified")
_LINK_ATTACHED = 1


class RouterCollector:
    """Reads the router's tables at scrape time."""

    def __init__(self, core: Core) -> None:
        self.core = core

    def describe(self) -> list[Metric]:
        return []  # collected on demand only: no describe-time walk over the tables

    def collect(self) -> Iterator[Metric]:
        from qrouter._fast.engine import DISTRIBUTION_NAMES
        from qrouter.management import mesh_of

        core = self.core
        engine = core.engine

        info = GaugeMetricFamily(
            "qrouter_router_info", "This router: id and version.", labels=["id", "version"]
        )
        info.add_metric([core.config.id, __version__], 1)
        yield info

        # -- per address ------------------------------------------------------------------
        d_in = CounterMetricFamily(
            "qrouter_address_deliveries_in",
            "Deliveries received from producers for an address.",
            labels=["address", "distribution"],
        )
        d_out = CounterMetricFamily(
            "qrouter_address_deliveries_out",
            "Deliveries sent to consumers of an address (one per copy for multicast).",
            labels=["address", "distribution"],
        )
        outcomes = CounterMetricFamily(
            "qrouter_address_outcomes",
            "Outcomes returned to producers of an address.",
            labels=["address", "outcome"],
        )
        dropped = CounterMetricFamily(
            "qrouter_address_dropped",
            "Presettled deliveries dropped: their consumers went away in flight.",
            labels=["address"],
        )
        undelivered = GaugeMetricFamily(
            "qrouter_address_undelivered",
            "Deliveries waiting in an address for consumer credit.",
            labels=["address"],
        )
        consumers = GaugeMetricFamily(
            "qrouter_address_consumers", "Consumer links of an address.", labels=["address"]
        )
        producers = GaugeMetricFamily(
            "qrouter_address_producers", "Producer links of an address.", labels=["address"]
        )
        rows: dict[tuple[str, str], list[int]] = {}
        for name in engine.address_names():
            a = engine.address(name)
            if a is None:
                continue
            label = "_dynamic" if name.startswith(DYNAMIC_PREFIX) else name
            dist = DISTRIBUTION_NAMES.get(a.distribution, str(a.distribution))
            values = [
                a.n_in, a.n_out, a.n_accepted, a.n_released, a.n_rejected, a.n_modified,
                a.n_dropped, a.undelivered_count, a.consumer_count, a.producer_count,
            ]  # fmt: skip
            row = rows.setdefault((label, dist), [0] * len(values))
            for i, v in enumerate(values):
                row[i] += int(v)
        for (label, dist), v in sorted(rows.items()):
            d_in.add_metric([label, dist], v[0])
            d_out.add_metric([label, dist], v[1])
            for outcome, n in zip(_OUTCOMES, v[2:6], strict=True):
                outcomes.add_metric([label, outcome], n)
            dropped.add_metric([label], v[6])
            undelivered.add_metric([label], v[7])
            consumers.add_metric([label], v[8])
            producers.add_metric([label], v[9])
        yield from (d_in, d_out, outcomes, dropped, undelivered, consumers, producers)

        # -- connections and links -------------------------------------------------------
        links = GaugeMetricFamily(
            "qrouter_links", "Attached links, by direction (in: from producers).",
            labels=["direction"],
        )  # fmt: skip
        no_credit = GaugeMetricFamily(
            "qrouter_links_without_credit",
            "Attached links whose credit is zero now (a credit stall while it lasts).",
            labels=["direction"],
        )
        unsettled = GaugeMetricFamily(
            "qrouter_deliveries_unsettled", "Unsettled deliveries held on attached links."
        )
        counts = {"in": [0, 0], "out": [0, 0]}
        n_unsettled = 0
        for conn in list(core.connections):
            for link in conn.links():
                if link.state != _LINK_ATTACHED:
                    continue
                c = counts["out" if link.is_sender else "in"]
                c[0] += 1
                if link.credit <= 0:
                    c[1] += 1
                n_unsettled += int(link.unsettled_count)
        for direction, (n, stalled) in counts.items():
            links.add_metric([direction], n)
            no_credit.add_metric([direction], stalled)
        unsettled.add_metric([], n_unsettled)
        yield from (links, no_credit, unsettled)
        termini = core.registry.all()
        yield GaugeMetricFamily(
            "qrouter_termini_suspended",
            "Link termini kept while their link is detached (durable subscriptions).",
            value=sum(1 for t in termini if t.link is None),
        )
        yield GaugeMetricFamily(
            "qrouter_connections", "Open AMQP connections.", value=len(core.connections)
        )
        yield GaugeMetricFamily(
            "qrouter_connections_write_paused",
            "Connections whose write buffer is above its high-water mark now (backpressure: "
            "no new deliveries go out on them, their producers get no credit).",
            value=sum(1 for conn in list(core.connections) if conn.write_paused),
        )
        yield CounterMetricFamily(
            "qrouter_connection_write_pauses",
            "Times a connection's write buffer rose above its high-water mark.",
            value=engine.n_write_pauses,
        )
        monitor = getattr(core, "monitor", None)
        if monitor is not None:
            yield CounterMetricFamily(
                "qrouter_link_credit_stalls",
                f"Links that went without credit for more than {monitor.threshold:g} s.",
                value=monitor.credit_stalls_total,
            )
            yield GaugeMetricFamily(
                "qrouter_deliveries_stuck",
                f"Deliveries unsettled for more than {monitor.threshold:g} s (a lower bound, "
                "from the last once-a-second check).",
                value=monitor.stuck_deliveries,
            )
        yield CounterMetricFamily(
            "qrouter_anonymous_rejected",
            "Messages on anonymous-relay links refused (no route or unavailable address).",
            value=engine.n_anonymous_rejected,
        )
        yield from _limit_metrics(core)
        yield from _login_metrics(core)
        yield CounterMetricFamily(
            "qrouter_decode_errors",
            "Input that did not decode (amqp:decode-error): connections closed for a bad "
            "frame, and messages refused because a section the router reads was malformed.",
            value=engine.n_decode_errors,
        )
        mesh = mesh_of(core)
        yield CounterMetricFamily(
            "qrouter_control_messages_dropped",
            "Inter-router and guaranteed-topic control messages dropped as malformed.",
            value=getattr(getattr(core, "mesh", None), "dropped", 0)
            + getattr(getattr(core, "guarantees", None), "dropped", 0),
        )
        yield GaugeMetricFamily(
            "qrouter_mesh_routers",
            "Other routers of the mesh reachable from this one (0: standalone).",
            value=len(mesh.next_hops()) if mesh is not None else 0,
        )
        data_plane = getattr(core, "mesh", None)
        refused = CounterMetricFamily(
            "qrouter_mesh_refused",
            "Inter-router claims refused: a peer that is not a mesh identity or claims "
            "another router id than its own, a second connection for a connected router id, "
            "a HELLO naming another id, a guaranteed-topic envelope or address update whose "
            "origin is not behind its connection, a neighbour's link state relayed by another "
            "or one forged in this router's name.",
            labels=["reason"],
        )
        for reason, n in getattr(data_plane, "refused", {}).items():
            refused.add_metric([reason], n)
        refused.add_metric(["mau-origin"], getattr(mesh, "refused_origins", 0))
        refused.add_metric(["ls-origin"], getattr(mesh, "refused_link_states", 0))
        yield refused
        management = getattr(core, "management", None)
        if management is not None:
            yield CounterMetricFamily(
                "qrouter_management_requests",
                "Requests to the $management node.",
                value=management.requests,
            )
            yield CounterMetricFamily(
                "qrouter_management_bad_requests",
                "Requests to the $management node that did not decode (status 400 or REJECTED).",
                value=management.bad_requests,
            )
            yield CounterMetricFamily(
                "qrouter_management_replies_refused",
                "Requests to the $management node REJECTED because 100 replies were already "
                "waiting in the router for the requesting connection.",
                value=management.replies.refused,
            )

        policy = getattr(core, "policy", None)
        if policy is not None:
            yield from _policy_metrics(policy)

        # -- store -----------------------------------------------------------------------
        store = getattr(core.registry.persistence, "store", None)
        if store is not None:
            yield CounterMetricFamily(
                "qrouter_store_commits",
                "Transactions committed to the terminus store since it was opened.",
                value=store.commit_count,
                labels=None,
            )
        health = getattr(core.registry.persistence, "health", None)
        if health is not None:  # store failure (qrouter/store_health.py)
            yield GaugeMetricFamily(
                "qrouter_store_available",
                "1 while store commits succeed; 0 while they fail (durable output held).",
                value=int(health.available),
            )
            yield CounterMetricFamily(
                "qrouter_store_commit_failures",
                "Store commits that failed (each retried until one succeeds).",
                value=health.failures,
            )


def _limit_metrics(core: Core) -> Iterator[Metric]:
    """qrouter/limits.py: each limit's value and how often it was met."""
    rows = core.limits.rows(core.config.max_message_size, len(core.registry.termini))
    value = GaugeMetricFamily(
        "qrouter_limit",
        "Configured limits ([limits]; 0: off; expiry_never: 0 allow, 1 cap, 2 refuse).",
        labels=["limit"],
    )
    exceeded = CounterMetricFamily(
        "qrouter_limit_exceeded",
        "Times a limit was met: refusals with amqp:resource-limit-exceeded (or "
        "message-size-exceeded), or requests capped (terminus_timeout, expiry_never).",
        labels=["limit"],
    )
    policies = ("allow", "cap", "refuse")
    for row in rows:
        v = row["value"]
        value.add_metric([row["name"]], policies.index(v) if isinstance(v, str) else v)
        exceeded.add_metric([row["name"]], row["exceeded"])
    yield value
    yield exceeded


def _login_metrics(core: Core) -> Iterator[Metric]:
    """qrouter/login_throttle.py: password checks failed, delayed by a host's backoff,
    refused with SASL sys-temp, and waiting now."""
    throttle = getattr(core, "login_throttle", None)
    if throttle is None:
        return
    yield CounterMetricFamily(
        "qrouter_logins_failed",
        "Logins refused for a wrong user, password or proof (PLAIN, SCRAM-SHA-256, EXTERNAL).",
        value=throttle.failed,
    )
    yield CounterMetricFamily(
        "qrouter_logins_delayed",
        "Login checks that waited for their host's backoff after repeated failures.",
        value=throttle.delayed,
    )
    yield CounterMetricFamily(
        "qrouter_logins_refused",
        "Logins answered SASL sys-temp because login.max_pending checks were waiting.",
        value=throttle.refused,
    )
    yield GaugeMetricFamily(
        "qrouter_logins_pending",
        "Password checks queued on or running in the login worker threads.",
        value=throttle.pending,
    )
    yield GaugeMetricFamily(
        "qrouter_login_backoff_hosts",
        "Remote hosts remembered for their recent failed logins (at most login.max_hosts).",
        value=throttle.hosts,
    )


def _policy_metrics(policy: Policy) -> Iterator[Metric]:
    """qrouter/policy.py: attaches and connections refused, by group and rule (the group is
    "" for a refusal before any group applied: an unknown user, another's reply address)."""
    refused = CounterMetricFamily(
        "qrouter_policy_refusals",
        "Attaches and connections the policy refused, by group and rule.",
        labels=["group", "rule"],
    )
    for (group, rule), count in sorted(policy.refusals.items()):
        refused.add_metric([group, rule], count)
    yield refused
    connections = GaugeMetricFamily(
        "qrouter_policy_connections",
        "Open client connections by policy group.",
        labels=["group"],
    )
    for group, count in sorted(policy.per_group.items()):
        connections.add_metric([group], count)
    yield connections


class MetricsEndpoint:
    """The registry and the HTTP server of ``/metrics``."""

    def __init__(self, core: Core) -> None:
        self.core = core
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(RouterCollector(core))  # type: ignore[arg-type]
        ProcessCollector(registry=self.registry)
        self.commit_seconds: Histogram | None = None
        persistence = core.registry.persistence
        if hasattr(persistence, "on_commit"):
            self.commit_seconds = Histogram(
                "qrouter_store_commit_seconds",
                "Time of each terminus store commit, fsync included.",
                buckets=COMMIT_BUCKETS,
                registry=self.registry,
            )
            persistence.on_commit = self.commit_seconds.observe
        self.server: asyncio.AbstractServer | None = None

    def render(self, accept: str | None = None) -> tuple[bytes, str]:
        encoder, content_type = choose_encoder(accept or "")
        return encoder(self.registry), content_type

    async def start(self, where: str) -> None:
        lc = parse_listen(where)
        self.server = await asyncio.start_server(
            self._serve, host=lc.host, port=lc.port, reuse_address=True
        )
        for sock in self.server.sockets:
            host, port = sock.getsockname()[:2]
            log.info("metrics on http://%s:%d/metrics", host, port)

    def close(self) -> None:
        if self.server is not None:
            self.server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10.0)
            status, body, content_type = self._answer(head)
            writer.write(_response(status, body, content_type))
            await writer.drain()
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError):
            pass
        except ConnectionError:
            pass
        except Exception:  # the router goes on; the scraper sees the connection drop
            log.exception("metrics request failed")
        finally:
            writer.close()

    def _answer(self, head: bytes) -> tuple[str, bytes, str]:
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/"):
            return "400 Bad Request", b"bad request\n", "text/plain"
        method, target = parts[0], parts[1]
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if sep:
                headers[name.strip().lower()] = value.strip()
        if method not in ("GET", "HEAD"):
            return "405 Method Not Allowed", b"GET only\n", "text/plain"
        path = target.split("?", 1)[0]
        if path == "/metrics":
            body, content_type = self.render(headers.get("accept"))
            return "200 OK", body if method == "GET" else b"", content_type
        if path == "/":
            return "200 OK", b"qrouter: metrics at /metrics\n", "text/plain"
        return "404 Not Found", b"not found: try /metrics\n", "text/plain"


def _response(status: str, body: bytes, content_type: str) -> bytes:
    head = (
        f"HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    return head.encode("latin-1") + body
