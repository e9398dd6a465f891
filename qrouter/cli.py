"""The ``qrouter`` command: ``qrouter start [options]`` (docs/configuration.md)."""

from __future__ import annotations

import sys

import click

from qrouter import __version__
from qrouter.config import LOG_FORMATS, LOG_LEVELS, STORES, ConfigError, RouterConfig, load_config


def _fail(message: str) -> None:
    click.echo(f"qrouter: error: {message}", err=True)
    sys.exit(2)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "--version", prog_name="qrouter")
def main() -> None:
    """qrouter: an AMQP 1.0 message router."""


@main.command()
@click.option("--config", "config_file", metavar="FILE", help="TOML configuration file.")
@click.option(
    "--listen",
    multiple=True,
    metavar="HOST:PORT",
    help="Listen here (repeatable); replaces the configured normal listeners. [::1]:5672 for IPv6.",
)
@click.option(
    "--address",
    multiple=True,
    metavar="PREFIX=DISTRIBUTION[,GUARANTEE]",
    help="Add an address entry (repeatable); with '*' or '#' it is a pattern. GUARANTEE: "
    "exactly-once or at-least-once (multicast only), e.g. events=multicast,exactly-once.",
)
@click.option(
    "--inter-router-listen",
    metavar="HOST:PORT",
    help="Accept connections from other routers of the mesh here.",
)
@click.option(
    "--inter-router-connect",
    metavar="HOST:PORT[,HOST:PORT...]",
    help="Connect to these routers (reconnecting with backoff); an empty value: none.",
)
@click.option("--id", "router_id", metavar="ID", help="Router id (default qrouter-<hostname>).")
@click.option("--store", type=click.Choice(STORES), help="Terminus store (default memory).")
@click.option("--store-path", metavar="DIR", help="Directory of an lmdb or leveldb store.")
@click.option("--journal", metavar="DIR", help="Write the delivery journal (Parquet) to DIR.")
@click.option(
    "--journal-sample",
    metavar="RATE",
    type=float,
    help="Journal this share of deliveries (0..1, default 1), chosen by origin.",
)
@click.option(
    "--store-sync",
    type=click.Choice(["batched", "always"]),
    help="fsync each group commit (always) or about once a second (batched, default).",
)
@click.option(
    "--log-level", type=click.Choice(LOG_LEVELS, case_sensitive=False), help="Default info."
)
@click.option(
    "--log-format", type=click.Choice(LOG_FORMATS), help="text, or json: one object a line."
)
@click.option("--users-file", metavar="FILE", help="Users for SASL PLAIN (qrouter-tool passwd).")
@click.option("--policy-file", metavar="FILE", help="Who may do what: a [policy] TOML file (docs).")
@click.option(
    "--metrics", metavar="HOST:PORT", help="Serve Prometheus metrics at http://HOST:PORT/metrics."
)
@click.option(
    "--limit",
    "limit",
    multiple=True,
    metavar="NAME=VALUE",
    help="A [limits] setting, e.g. max_connections=20000 (repeatable; 0 turns one off).",
)
@click.option(
    "--write-buffer-high",
    metavar="BYTES",
    type=int,
    help="Backpressure: a connection with more than this waiting to be written takes no new "
    "deliveries and its producers get no credit (default 1048576).",
)
@click.option(
    "--write-buffer-low",
    metavar="BYTES",
    type=int,
    help="Backpressure: deliveries resume once it is down to this (default 262144).",
)
@click.option(
    "--busy-poll-us",
    metavar="US",
    type=int,
    help="Latency: after an iteration that read something, poll the sockets for up to this "
    "many µs before sleeping (costs CPU; default 0: off).",
)
@click.option(
    "--allow-insecure-mesh",
    is_flag=True,
    help="Let an inter-router listener off loopback run without mutual TLS (any host may join).",
)
@click.option(
    "--allow-anonymous",
    is_flag=True,
    help="Offer SASL ANONYMOUS on client listeners that are not on loopback.",
)
@click.option(
    "--trace",
    is_flag=True,
    help="Log every frame of every connection (module qrouter.trace, level trace).",
)
def start(
    config_file: str | None,
    listen: tuple[str, ...],
    address: tuple[str, ...],
    inter_router_listen: str | None,
    inter_router_connect: str | None,
    router_id: str | None,
    store: str | None,
    store_path: str | None,
    journal: str | None,
    journal_sample: float | None,
    store_sync: str | None,
    log_level: str | None,
    log_format: str | None,
    users_file: str | None,
    policy_file: str | None,
    metrics: str | None,
    limit: tuple[str, ...],
    write_buffer_high: int | None,
    write_buffer_low: int | None,
    busy_poll_us: int | None,
    allow_insecure_mesh: bool,
    allow_anonymous: bool,
    trace: bool,
) -> None:
    """Run the router until SIGINT or SIGTERM."""
    try:
        cfg = load_config(
            config_file,
            listen=listen,
            address=address,
            inter_router_listen=inter_router_listen,
            inter_router_connect=inter_router_connect,
            id=router_id,
            store=store,
            store_path=store_path,
            store_sync=store_sync,
            journal=journal,
            journal_sample=journal_sample,
            log_level=log_level,
            log_format=log_format,
            users_file=users_file,
            policy_file=policy_file,
            metrics=metrics,
            limit=limit,
            write_buffer_high=write_buffer_high,
            write_buffer_low=write_buffer_low,
            busy_poll_us=busy_poll_us,
            allow_insecure_mesh=allow_insecure_mesh,
            allow_anonymous=allow_anonymous,
            trace=trace,
        )
    except ConfigError as exc:
        _fail(str(exc))
        return
    _check_store(cfg, from_cli=store is not None)
    from qrouter.log import setup_logging

    setup_logging(cfg.log_level, cfg.log_format, cfg.log_modules)
    if cfg.trace:
        from qrouter.log import enable_trace

        enable_trace()
    from qrouter.server import run  # the server pulls in the Cython engine: import it last

    sys.exit(run(cfg))


def _check_store(cfg: RouterConfig, *, from_cli: bool) -> None:
    """A store whose driver is missing is refused before anything starts."""
    from qrouter.stores import StoreError, backend_class

    try:
        backend_class(cfg.store)
    except StoreError as exc:
        where = "--store" if from_cli or cfg.source is None else f"{cfg.source}: store"
        _fail(f"{where}: {exc}")
