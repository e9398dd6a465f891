"""The qrouter and qrouter-tool commands, through click's CliRunner (no server is started)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner
from qrouter_tools.cli import main as tool_main

import qrouter as router_package
from qrouter import __version__
from qrouter.auth import UserDB, hash_password
from qrouter.cli import main
from qrouter.config import RouterConfig


def test_version() -> None:
    result = CliRunner().invoke(main, ["--version"])
    assert result.exit_code == 0 and result.output == f"qrouter, version {__version__}\n"


def test_start_defaults(started: list[RouterConfig]) -> None:
    result = CliRunner().invoke(main, ["start"])
    assert result.exit_code == 0, result.output
    assert started == [RouterConfig()]


def test_start_options(
    started: list[RouterConfig], write_config: Callable[..., str], tmp_path: Path
) -> None:
    path = write_config("id = 'file'\n[[listener]]\nport = 1\n[[address]]\nprefix = 'a'")
    users = tmp_path / "users"
    users.write_text("")
    result = CliRunner().invoke(
        main,
        [
            "start",
            "--config", path,
            "--listen", "[::1]:5000",
            "--listen", "0.0.0.0:5001",
            "--address", "b=multicast",
            "--address", "c.*=closest",
            "--id", "cli",
            "--store", "memory",
            "--log-level", "DEBUG",
            "--log-format", "json",
            "--users-file", str(users),
        ],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    (cfg,) = started
    assert cfg.source == path and cfg.id == "cli"
    assert [(lc.host, lc.port) for lc in cfg.listeners] == [("::1", 5000), ("0.0.0.0", 5001)]
    assert [(a.prefix, a.pattern, a.distribution) for a in cfg.addresses] == [
        ("a", None, "balanced"),
        ("b", None, "multicast"),
        (None, "c.*", "closest"),
    ]
    assert (cfg.log_level, cfg.log_format, cfg.users_file) == ("debug", "json", str(users))


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--listen", "nope"], "qrouter: error: --listen: 'nope' is not HOST:PORT"),
        (["--address", "a=fanout"], "qrouter: error: --address: 'a=fanout': 'fanout' is not"),
        (["--config", "/nonexistent/q.toml"], "qrouter: error: /nonexistent/q.toml: cannot read"),
    ],
)
def test_start_errors(started: list[RouterConfig], args: list[str], message: str) -> None:
    result = CliRunner().invoke(main, ["start", *args])
    assert result.exit_code == 2
    assert result.stderr.startswith(message), result.stderr
    assert started == []


@pytest.mark.parametrize("store", ["lmdb", "leveldb"])
def test_disk_store_without_a_path_uses_the_state_folder(
    started: list[RouterConfig], store: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the README's `qrouter start --store lmdb`: no --store-path needed
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    result = CliRunner().invoke(main, ["start", "--store", store, "--id", "r1"])
    assert result.exit_code == 0, result.output
    (cfg,) = started
    assert cfg.store_path == str(tmp_path / "qrouter" / "r1" / store)


@pytest.mark.parametrize("store", ["lmdb", "leveldb"])
def test_store_without_its_driver_is_refused(
    started: list[RouterConfig],
    store: str,
    tmp_path: Path,
    write_config: Callable[..., str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from qrouter import stores

    monkeypatch.setitem(stores.DRIVERS, store, "qrouter_missing_driver")
    result = CliRunner().invoke(main, ["start", "--store", store, "--store-path", str(tmp_path)])
    assert result.exit_code == 2
    assert result.stderr.startswith("qrouter: error: --store: "), result.stderr
    assert "pip install qrouter_missing_driver" in result.stderr
    path = write_config(f"store = '{store}'\nstore_path = 'data'")
    result = CliRunner().invoke(main, ["start", "--config", path])
    assert result.exit_code == 2
    assert result.stderr.startswith(f"qrouter: error: {path}: store: "), result.stderr
    assert started == []


def test_bad_choice_is_a_usage_error(started: list[RouterConfig]) -> None:
    result = CliRunner().invoke(main, ["start", "--store", "redis"])
    assert result.exit_code == 2 and "redis" in result.stderr


def test_python_dash_m_router(tmp_path: Path) -> None:
    # Run from tmp_path with the folder of the `router` under test on the path, so an
    # installed qrouter is not shadowed by the source tree (nor the other way round).
    env = {**os.environ, "PYTHONPATH": str(Path(router_package.__file__).resolve().parents[1])}
    done = subprocess.run(
        [sys.executable, "-m", "qrouter", "--version"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env=env,
    )
    assert done.returncode == 0 and done.stdout == f"qrouter, version {__version__}\n"


def test_passwd_stdin_adds_and_updates(tmp_path: Path) -> None:
    users = tmp_path / "users"
    runner = CliRunner()
    result = runner.invoke(
        tool_main, ["passwd", "--file", str(users), "alice", "--password-stdin"], input="pw1\n"
    )
    assert result.exit_code == 0, result.output
    assert result.output == f"added user alice in {users}\n"
    assert UserDB.load(str(users)).verify("alice", "pw1")
    result = runner.invoke(
        tool_main, ["passwd", "--file", str(users), "--password-stdin", "alice"], input="pw2\r\n"
    )
    assert result.exit_code == 0 and result.output.startswith("updated user alice")
    db = UserDB.load(str(users))
    assert db.verify("alice", "pw2") and not db.verify("alice", "pw1")


def test_passwd_prompts_with_confirmation(tmp_path: Path) -> None:
    users = tmp_path / "users"
    result = CliRunner().invoke(
        tool_main, ["passwd", "--file", str(users), "bob"], input="secret\nsecret\n"
    )
    assert result.exit_code == 0, result.output
    assert "secret" not in result.output  # hidden input
    assert UserDB.load(str(users)).verify("bob", "secret")
    result = CliRunner().invoke(
        tool_main, ["passwd", "--file", str(users), "bob"], input="a\nb\nc\nc\n"
    )
    assert result.exit_code == 0
    assert UserDB.load(str(users)).verify("bob", "c")


@pytest.mark.parametrize(
    ("content", "user", "stdin", "message"),
    [
        ("alice\n", "bob", "pw\n", "qrouter-tool: error: {path}: line 1: expected user:hash"),
        ("", "bob", "\n", "qrouter-tool: error: empty password"),
        ("", "a:b", "pw\n", "qrouter-tool: error: bad user name"),
    ],
)
def test_passwd_errors(tmp_path: Path, content: str, user: str, stdin: str, message: str) -> None:
    users = tmp_path / "users"
    users.write_text(content)
    result = CliRunner().invoke(
        tool_main, ["passwd", "--file", str(users), "--password-stdin", user], input=stdin
    )
    assert result.exit_code == 2
    assert result.stderr.startswith(message.format(path=users)), result.stderr
    assert users.read_text() == content  # untouched


def test_passwd_keeps_other_users(tmp_path: Path) -> None:
    users = tmp_path / "users"
    users.write_text("# team\ncarol:" + hash_password("c", iterations=1000) + "\n")
    result = CliRunner().invoke(
        tool_main, ["passwd", "--file", str(users), "--password-stdin", "dave"], input="d\n"
    )
    assert result.exit_code == 0
    db = UserDB.load(str(users))
    assert db.users() == ["carol", "dave"] and db.verify("carol", "c")
    assert users.read_text().startswith("# team\ncarol:")


def test_tool_has_no_placeholder_commands() -> None:
    ops = {"links", "addresses", "connections", "nodes", "termini", "stats", "manage"}
    commands = tool_main.commands  # type: ignore[attr-defined]
    assert {"passwd"} | ops <= set(commands)
    for name in commands:
        assert commands[name].help, f"{name} has no help text"  # no placeholders


def test_passwd_iterations(tmp_path: Path) -> None:
    """--iterations: a record Cyrus SASL's SCRAM client will compute (at most 65,536); the
    default stays 200,000, and below RFC 7677's 4,096 is refused."""
    users = tmp_path / "users"
    runner = CliRunner()
    args = ["passwd", "--file", str(users), "--password-stdin"]
    result = runner.invoke(tool_main, [*args, "--iterations", "65536", "cyrus"], input="pw\n")
    assert result.exit_code == 0, result.output
    result = runner.invoke(tool_main, [*args, "plain"], input="pw\n")
    assert result.exit_code == 0, result.output
    lines = dict(line.split(":", 1) for line in users.read_text().splitlines()[1:])
    assert lines["cyrus"].startswith("scram-sha-256$65536$")
    assert lines["plain"].startswith("scram-sha-256$200000$")
    assert UserDB.load(str(users)).verify("cyrus", "pw")
    result = runner.invoke(tool_main, [*args, "--iterations", "4095", "weak"], input="pw\n")
    assert result.exit_code == 2 and "4095" in result.output
    assert "weak:" not in users.read_text()
