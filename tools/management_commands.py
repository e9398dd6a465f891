"""``qrouter-tool`` commands that talk to a router's ``$management`` node: links, addresses,
connections, nodes, termini, stats, and manage (raw CRUD), with readable tables (rich) or
``--json``. ``links --store NAME --store-path DIR`` reads a terminus store instead, with no
router (docs/operations.md).

The connection options (``--url``, TLS, SASL, ``--timeout``, ``--json``) are accepted both
before the subcommand (on the ``qrouter-tool`` group) and after it; a value given after wins.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

import click
from qrouter_tools.management_client import (
    DEFAULT_URL,
    ConnectOptions,
    ManagementClient,
    ManagementClientError,
    ManagementForbidden,
)

F = TypeVar("F", bound=Callable[..., Any])

OPTION_NAMES = ("url", "ssl_ca", "ssl_cert", "ssl_key", "user", "password", "timeout", "json")


def connection_options(f: F) -> F:
    """The options every management command takes (also on the group, before the command)."""
    options = [
        click.option(
            "--url",
            metavar="URL",
            help=f"The router to ask (default {DEFAULT_URL}; amqps:// for TLS).",
        ),
        click.option("--ssl-ca", metavar="FILE", help="CA certificate(s) to trust (PEM)."),
        click.option("--ssl-cert", metavar="FILE", help="Client certificate (PEM)."),
        click.option("--ssl-key", metavar="FILE", help="Client private key (PEM)."),
        click.option("--user", metavar="USER", help="SASL PLAIN user name."),
        click.option(
            "--password",
            metavar="PASSWORD",
            envvar="QROUTER_PASSWORD",
            help="SASL PLAIN password (or the QROUTER_PASSWORD environment variable).",
        ),
        click.option(
            "--timeout", type=float, metavar="SECONDS", help="Wait at most this long (10)."
        ),
        click.option("--json", "json", is_flag=True, default=None, help="JSON instead of a table."),
    ]
    for option in reversed(options):
        f = option(f)
    return f


def _settings(ctx: click.Context, given: dict[str, Any]) -> dict[str, Any]:
    """Options after the subcommand win over the same options before it."""
    merged = dict(ctx.find_root().obj or {})
    merged.update({k: v for k, v in given.items() if v is not None})
    return merged


def _connect_options(settings: dict[str, Any]) -> ConnectOptions:
    return ConnectOptions(
        url=settings.get("url") or os.environ.get("QROUTER_URL") or DEFAULT_URL,
        ssl_ca=settings.get("ssl_ca"),
        ssl_cert=settings.get("ssl_cert"),
        ssl_key=settings.get("ssl_key"),
        user=settings.get("user"),
        password=settings.get("password"),
        timeout=float(settings.get("timeout") or 10.0),
    )


def _fail(message: str) -> None:
    """One line on stderr, exit status 1 (the router cannot be reached or refused)."""
    click.echo(f"qrouter-tool: error: {message}", err=True)
    sys.exit(1)


def _with_client(settings: dict[str, Any], work: Callable[[ManagementClient], None]) -> None:
    try:
        with ManagementClient(_connect_options(settings)) as client:
            work(client)
    except ManagementForbidden as exc:
        # the router's policy refused it: say so, and why, on one line
        click.echo(f"qrouter-tool: forbidden: {exc}", err=True)
        sys.exit(1)
    except ManagementClientError as exc:
        _fail(str(exc))


# -- output ------------------------------------------------------------------------------------


Column = tuple[str, str, Callable[[Any], str]]  # header, attribute, formatter


def _text(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.1f}" if abs(value) >= 1 or value == 0 else f"{value:.3g}"
    if isinstance(value, list | tuple):
        return ", ".join(_text(v) for v in value) or "-"
    return str(value)


def _seconds(value: Any) -> str:
    if value is None:
        return "-"
    return f"{float(value):.1f}"


def _utc(seconds: float) -> str:
    import datetime

    when = datetime.datetime.fromtimestamp(float(seconds), datetime.UTC)
    return when.strftime("%Y-%m-%d %H:%M:%S UTC")


def _durability(value: Any) -> str:
    # 3.5.5 terminus-durability
    names = {0: "none", 1: "configuration", 2: "unsettled-state"}
    return names.get(value, _text(value)) if isinstance(value, int) else _text(value)


def _print(renderable: Any) -> None:
    from rich.console import Console

    if sys.stdout.isatty():
        Console(highlight=False).print(renderable)
        return
    # piped or captured: never wrap a row (tables are for grep and for docs as much as for
    # eyes), and no padding at the ends of lines
    console = Console(width=1000, highlight=False, color_system=None)
    with console.capture() as captured:
        console.print(renderable)
    click.echo("\n".join(line.rstrip() for line in captured.get().splitlines()))


def _table(
    title: str, columns: Sequence[Column], rows: Iterable[dict[str, Any]], empty: str
) -> None:
    from rich import box
    from rich.table import Table

    rows = list(rows)
    if not rows:
        click.echo(empty)
        return
    table = Table(title=title, box=box.SIMPLE_HEAD, title_justify="left")
    for header, _key, _fmt in columns:
        table.add_column(header, overflow="fold")
    for row in rows:
        table.add_row(*(fmt(row.get(key)) for _header, key, fmt in columns))
    _print(table)


def _key_values(title: str, row: dict[str, Any]) -> None:
    from rich import box
    from rich.table import Table

    table = Table(title=title, box=box.SIMPLE_HEAD, title_justify="left")
    table.add_column("attribute")
    table.add_column("value", overflow="fold")
    for key, value in row.items():
        table.add_row(key, _text(value))
    _print(table)


def _json(value: Any) -> None:
    click.echo(json.dumps(value, indent=2, sort_keys=False, default=str))


def _own(client: ManagementClient, rows: list[dict[str, Any]], show_all: bool) -> list[dict]:
    """Leave out this tool's own connection (its request and reply links)."""
    if show_all:
        return rows
    return [r for r in rows if r.get("container") != client.container_id]


# -- links ---------------------------------------------------------------------------------

LINK_COLUMNS: list[Column] = [
    ("conn", "connection", _text),
    ("container", "container", _text),
    ("name", "name", _text),
    ("dir", "direction", _text),
    ("address", "address", _text),
    ("durable", "durable", _durability),
    ("expiry", "expiry_policy", _text),
    ("state", "state", _text),
    ("credit", "credit", _text),
    ("delivered", "delivered", _text),
    ("accepted", "accepted", _text),
    ("released", "released", _text),
    ("rejected", "rejected", _text),
    ("modified", "modified", _text),
    ("unsettled", "unsettled", _text),
    ("no credit (s)", "no_credit_seconds", _seconds),
]

OFFLINE_LINK_COLUMNS: list[Column] = [
    ("name", "link_name", _text),
    ("container", "remote_container", _text),
    ("address", "address", _text),
    ("dir", "direction", _text),
    ("durable", "durability", _durability),
    ("expiry", "expiry_policy", _text),
    ("timeout (s)", "timeout", _text),
    ("suspended at", "suspended", _text),
    ("unsettled", "unsettled", _text),
]


@click.command()
@connection_options
@click.option("--all", "show_all", is_flag=True, help="Include this tool's own links.")
@click.option(
    "--store",
    "store_name",
    metavar="NAME",
    help="Read the termini from a store (lmdb, leveldb) instead of asking a router.",
)
@click.option("--store-path", metavar="DIR", help="The store's directory (with --store).")
@click.pass_context
def links(
    ctx: click.Context,
    show_all: bool,
    store_name: str | None,
    store_path: str | None,
    **given: Any,
) -> None:
    """Links: attached ones with credit and counters, and suspended durable ones."""
    settings = _settings(ctx, given)
    if store_name is not None or store_path is not None:
        _offline_links(store_name, store_path, bool(settings.get("json")))
        return

    def work(client: ManagementClient) -> None:
        rows = _own(client, client.query("link"), show_all)
        if settings.get("json"):
            _json(rows)
        else:
            _table("Links", LINK_COLUMNS, rows, "no links")

    _with_client(settings, work)


def _offline_links(store_name: str | None, store_path: str | None, as_json: bool) -> None:
    from qrouter.stores import StoreError, backend_class, open_store
    from qrouter.stores.termini import load_termini, termini_summary

    if not store_name or not store_path:
        _fail("--store and --store-path go together")
        return
    try:
        cls = backend_class(store_name)
    except StoreError as exc:
        _fail(f"--store: {exc}")
        return
    marker = cls.marker_file
    if not os.path.isdir(store_path) or (
        marker is not None and not os.path.exists(os.path.join(store_path, marker))
    ):
        _fail(f"--store-path: {store_path} is not a {store_name} store")
        return
    try:
        store = open_store(store_name, store_path)
        try:
            rows = termini_summary(load_termini(store))
        finally:
            store.close()
    except StoreError as exc:
        _fail(f"{store_path}: {exc}")
        return
    for row in rows:
        row["direction"] = "out" if row["role"] == "sender" else "in"
        at = row.get("suspended_at")
        row["suspended"] = _utc(at) if isinstance(at, int | float) else "attached at crash"
    rows.sort(key=lambda r: (str(r["remote_container"]), str(r["link_name"])))
    if as_json:
        _json(rows)
    else:
        _table(f"Termini in {store_path}", OFFLINE_LINK_COLUMNS, rows, "no termini")


# -- addresses -------------------------------------------------------------------------------

ADDRESS_COLUMNS: list[Column] = [
    ("address", "name", _text),
    ("distribution", "distribution", _text),
    ("consumers", "consumers", _text),
    ("producers", "producers", _text),
    ("undelivered", "undelivered", _text),
    ("in", "deliveries_in", _text),
    ("out", "deliveries_out", _text),
    ("accepted", "accepted", _text),
    ("released", "released", _text),
    ("rejected", "rejected", _text),
    ("modified", "modified", _text),
    ("dropped", "dropped", _text),
    ("fallback", "fallback_deliveries", _text),
    ("dead-lettered", "dead_lettered", _text),
]

ENTRY_COLUMNS: list[Column] = [
    ("prefix", "prefix", _text),
    ("pattern", "pattern", _text),
    ("distribution", "distribution", _text),
    ("fallback", "fallback", _text),
    ("dead letter", "dead_letter", _text),
    ("origin", "origin", _text),
]


@click.command()
@connection_options
@click.option(
    "--entries", is_flag=True, help="The address entries (prefix/pattern -> distribution)."
)
@click.option("--all", "show_all", is_flag=True, help="Include this tool's reply address.")
@click.pass_context
def addresses(ctx: click.Context, entries: bool, show_all: bool, **given: Any) -> None:
    """Addresses in use, with their counters (or, with --entries, the address entries)."""
    settings = _settings(ctx, given)

    def work(client: ManagementClient) -> None:
        if entries:
            rows = client.query("address")
            title, columns, empty = "Address entries", ENTRY_COLUMNS, "no address entries"
        else:
            rows = client.query("router.address")
            if not show_all:
                rows = [r for r in rows if r.get("name") != client.reply_to]
            title, columns, empty = "Addresses", ADDRESS_COLUMNS, "no addresses in use"
        if settings.get("json"):
            _json(rows)
        else:
            _table(title, columns, rows, empty)

    _with_client(settings, work)


def _show(
    ctx: click.Context,
    given: dict[str, Any],
    entity: str,
    title: str,
    columns: list[Column],
    empty: str,
    show_all: bool | None = None,
) -> None:
    """QUERY one entity type and print it: --json, or a table (`show_all` None: nothing of the
    tool's own to hide)."""
    settings = _settings(ctx, given)

    def work(client: ManagementClient) -> None:
        rows = client.query(entity)
        if show_all is not None:
            rows = _own(client, rows, show_all)
        if settings.get("json"):
            _json(rows)
        else:
            _table(title, columns, rows, empty)

    _with_client(settings, work)


# -- connections -----------------------------------------------------------------------------

CONNECTION_COLUMNS: list[Column] = [
    ("id", "identity", _text),
    ("container", "container", _text),
    ("host", "host", _text),
    ("user", "user", _text),
    ("tls", "tls", _text),
    ("role", "role", _text),
    ("listener", "listener", _text),
    ("links", "links", _text),
    ("bytes in", "bytes_in", _text),
    ("bytes out", "bytes_out", _text),
    ("paused", "write_paused", _text),
    ("pauses", "write_pauses", _text),
]


@click.command()
@connection_options
@click.option("--all", "show_all", is_flag=True, help="Include this tool's own connection.")
@click.pass_context
def connections(ctx: click.Context, show_all: bool, **given: Any) -> None:
    """Open connections."""
    _show(ctx, given, "connection", "Connections", CONNECTION_COLUMNS, "no connections", show_all)


# -- nodes -----------------------------------------------------------------------------------

NODE_COLUMNS: list[Column] = [
    ("router", "id", _text),
    ("neighbour", "neighbour", _text),
    ("next hop", "next_hop", _text),
    ("cost", "cost", _text),
    ("peers", "peers", _text),
]


@click.command()
@connection_options
@click.pass_context
def nodes(ctx: click.Context, **given: Any) -> None:
    """Other routers of the mesh, as this router reaches them."""
    _show(ctx, given, "node", "Mesh routers", NODE_COLUMNS, "no other routers (standalone)")


# -- topics ------------------------------------------------------------------------------------

TOPIC_COLUMNS: list[Column] = [
    ("topic", "name", _text),
    ("guarantee", "guarantee", _text),
    ("publishers", "publishers", _text),
    ("subscribers", "subscribers", _text),
    ("known", "known_subscribers", _text),
    ("origin records", "origin_records", _text),
    ("local records", "local_records", _text),
    ("peers", "peers", _text),
    ("lacking guarantee", "lacking_routers", _text),  # a configuration mismatch (issue 15 b)
]


@click.command()
@connection_options
@click.pass_context
def topics(ctx: click.Context, **given: Any) -> None:
    """Topics with a guarantee: their links here and the records this router holds."""
    _show(ctx, given, "topic", "Guaranteed topics", TOPIC_COLUMNS, "no guaranteed topics")


# -- termini -----------------------------------------------------------------------------------

TERMINUS_COLUMNS: list[Column] = [
    ("container", "container", _text),
    ("name", "name", _text),
    ("dir", "direction", _text),
    ("address", "address", _text),
    ("durable", "durable", _durability),
    ("expiry", "expiry_policy", _text),
    ("timeout (s)", "timeout", _text),
    ("state", "state", _text),
    ("conn", "connection", _text),
    ("expires in (s)", "expires_in", _seconds),
    ("held", "held", _text),
]


@click.command()
@connection_options
@click.option("--all", "show_all", is_flag=True, help="Include this tool's own link termini.")
@click.pass_context
def termini(ctx: click.Context, show_all: bool, **given: Any) -> None:
    """The link registry: every terminus, attached or suspended."""
    _show(ctx, given, "terminus", "Termini", TERMINUS_COLUMNS, "no termini", show_all)


# -- limits ----------------------------------------------------------------------------------

LIMIT_COLUMNS: list[Column] = [
    ("limit", "name", _text),
    ("value", "value", _text),
    ("in use", "in_use", _text),
    ("exceeded", "exceeded", _text),
    ("config key", "config_key", _text),
]


@click.command()
@connection_options
@click.pass_context
def limits(ctx: click.Context, **given: Any) -> None:
    """The router's limits ([limits]): value (0: off), use now, times met (refused or capped)."""
    _show(ctx, given, "limit", "Limits", LIMIT_COLUMNS, "no limits")


# -- stats -----------------------------------------------------------------------------------


@click.command()
@connection_options
@click.pass_context
def stats(ctx: click.Context, **given: Any) -> None:
    """The router: identity, counts, delivery totals, store."""
    settings = _settings(ctx, given)

    def work(client: ManagementClient) -> None:
        rows = client.query("router")
        row = rows[0] if rows else {}
        if settings.get("json"):
            _json(row)
            return
        shown = dict(row)
        if isinstance(shown.get("started"), int | float):
            shown["started"] = _utc(shown["started"])
        _key_values(f"Router {row.get('id', '?')}", shown)

    _with_client(settings, work)


# -- manage ----------------------------------------------------------------------------------

OPERATIONS = (
    "query",
    "read",
    "create",
    "update",
    "delete",
    "get-types",
    "get-operations",
    "get-attributes",
    "get-mgmt-nodes",
)


def _value(text: str) -> Any:
    """``port=5673`` -> 5673, ``tls=true`` -> True, ``x=[1,2]`` -> [1, 2], else the text."""
    try:
        return json.loads(text)
    except ValueError:
        return text


@click.command()
@connection_options
@click.argument("operation", type=click.Choice(OPERATIONS, case_sensitive=False))
@click.argument("attributes", nargs=-1, metavar="[NAME=VALUE]...")
@click.option("--type", "entity_type", metavar="TYPE", help="Entity type (link, address ...).")
@click.option("--name", metavar="NAME", help="The entity's name.")
@click.option("--identity", metavar="ID", help="The entity's identity.")
@click.option(
    "--attribute",
    "-a",
    "attribute_names",
    multiple=True,
    metavar="NAME",
    help="query: the attributes to show (repeatable; default all).",
)
@click.pass_context
def manage(
    ctx: click.Context,
    operation: str,
    attributes: tuple[str, ...],
    entity_type: str | None,
    name: str | None,
    identity: str | None,
    attribute_names: tuple[str, ...],
    **given: Any,
) -> None:
    """Raw management requests: OPERATION on --type, with NAME=VALUE attributes.

    \b
    qrouter-tool manage query --type link -a name -a credit
    qrouter-tool manage create --type address prefix=orders distribution=multicast
    qrouter-tool manage create --type listener --name extra host=127.0.0.1 port=5673
    qrouter-tool manage delete --type listener --name extra
    qrouter-tool manage create --type connector --name a host=127.0.0.1 port=55672
    qrouter-tool manage create --type connector --name mq role=route-container port=5672
    qrouter-tool manage create --type autoLink address=q direction=out connection=mq
    qrouter-tool manage update --type connection --identity 3 trace=true
    qrouter-tool manage get-types
    """
    settings = _settings(ctx, given)
    op = operation.upper()
    body: dict[str, Any] = {}
    for item in attributes:
        key, sep, text = item.partition("=")
        if not sep or not key:
            raise click.UsageError(f"{item!r} is not NAME=VALUE")
        body[key] = _value(text)
    if op in ("QUERY", "READ", "CREATE", "UPDATE", "DELETE") and not entity_type:
        raise click.UsageError(f"{operation} needs --type")
    if op in ("READ", "UPDATE", "DELETE") and name is None and identity is None:
        raise click.UsageError(f"{operation} needs --name or --identity")
    as_json = bool(settings.get("json"))

    def work(client: ManagementClient) -> None:
        if op == "QUERY":
            assert entity_type is not None
            rows = client.query(entity_type, list(attribute_names))
            if as_json:
                _json(rows)
                return
            names = list(attribute_names) or (list(rows[0]) if rows else [])
            columns = [(n, n, _text) for n in names]
            _table(f"{entity_type}", columns, rows, f"no {entity_type} entities")
            return
        request_body: Any = body if op in ("CREATE", "UPDATE") else None
        result = client.call(op, entity_type, name=name, identity=identity, body=request_body)
        if as_json:
            _json(result)
        elif op == "DELETE":
            click.echo(f"deleted {entity_type} {name if name is not None else identity}")
        elif isinstance(result, dict) and op in ("READ", "CREATE", "UPDATE"):
            _key_values(f"{entity_type} {result.get('name', '')}", result)
        else:
            _json(result)

    _with_client(settings, work)


COMMANDS = (links, addresses, connections, nodes, topics, termini, limits, stats, manage)
