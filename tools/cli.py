"""The ``qrouter-tool`` command (installed as the package ``qrouter_tools``)."""

from __future__ import annotations

import os
import sys

import click

from router import __version__
from router.auth import UserDB
from router.config import ConfigError


def _fail(message: str) -> None:
    click.echo(f"qrouter-tool: error: {message}", err=True)
    sys.exit(2)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "--version", prog_name="qrouter-tool")
def main() -> None:
    """Tools for qrouter operators."""


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
@click.argument("user")
def passwd(users_file: str, password_stdin: bool, user: str) -> None:
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
        db.set(user, password)
    except ValueError as exc:
        _fail(str(exc))
        return
    try:
        db.save(users_file)
    except OSError as exc:
        _fail(f"{users_file}: cannot write: {exc.strerror or exc}")
        return
    click.echo(f"{'updated' if existed else 'added'} user {user} in {users_file}")
