"""The ``qrouter-tool`` command (installed as the package ``qrouter_tools``)."""

from __future__ import annotations

import os
import sys
from typing import Any

import click
from qrouter_tools.management_commands import COMMANDS, OPTION_NAMES, connection_options

from qrouter import __version__, scram
from qrouter.auth import UserDB
from qrouter.config import ConfigError


def _fail(message: str) -> None:
    click.echo(f"qrouter-tool: error: {message}", err=True)
    sys.exit(2)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "--version", prog_name="qrouter-tool")
@connection_options
@click.pass_context
def main(ctx: click.Context, **options: Any) -> None:
    """Tools for qrouter operators.

    The connection options (--url, TLS, SASL, --timeout, --json) may come before the command
    or after it: qrouter-tool --url amqp://h:5672 links, or qrouter-tool links --url ...
    """
    ctx.obj = {k: options.get(k) for k in OPTION_NAMES}


for _command in COMMANDS:
    main.add_command(_command)

# pyspark, pyarrow and matplotlib are imported only when `audit` runs
from qrouter_tools.audit.cli import audit_command  # noqa: E402

main.add_command(audit_command)


@main.command()
@click.option(
    "--file",
    "users_file",
    required=True,
    metavar="USERS",
    help="Users file (created if missing); the router's users_file.",
)
@click.option(
    "--password-stdin",
    is_flag=True,
    help="Read the password from the first line of standard input instead of prompting.",
)
@click.option(
    "--iterations",
    type=click.IntRange(scram.MIN_ITERATIONS, scram.MAX_ITERATIONS),
    default=scram.DEFAULT_ITERATIONS,
    show_default=True,
    help="PBKDF2 iterations of the salted keys. Clients using Cyrus SASL for SCRAM-SHA-256 "
    f"(proton built with it) refuse more than {scram.CYRUS_MAX_ITERATIONS}.",
)
@click.argument("user")
def passwd(users_file: str, password_stdin: bool, iterations: int, user: str) -> None:
    """Add USER to the users file, or change their password."""
    if os.path.exists(users_file):
        try:
            db = UserDB.load(users_file)
        except ConfigError as exc:
            _fail(str(exc))
            return
    else:
        db = UserDB()
    if password_stdin:
        password = sys.stdin.readline().rstrip("\r\n")
    else:
        password = click.prompt(
            f"Password for {user}", hide_input=True, confirmation_prompt=True, err=True
        )
    existed = user in db
    try:
        db.set(user, password, iterations=iterations)
    except ValueError as exc:
        _fail(str(exc))
        return
    try:
        db.save(users_file)
    except OSError as exc:
        _fail(f"{users_file}: cannot write: {exc.strerror or exc}")
        return
    click.echo(f"{'updated' if existed else 'added'} user {user} in {users_file}")
