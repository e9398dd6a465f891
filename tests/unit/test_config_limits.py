"""The [limits] table, --limit and a listener's max_message_size (qrouter/limits.py)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from qrouter.config import ConfigError, load_config
from qrouter.limits import LimitsConfig

WriteConfig = Callable[..., str]


def error_of(path: str | None = None, **overrides: object) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(path, **overrides)
    return str(info.value)


def test_defaults() -> None:
    lim = load_config().limits
    assert lim == LimitsConfig()
    assert (lim.max_connections, lim.max_connections_per_host, lim.max_connections_per_user) == (
        10_000,
        1_000,
        1_000,
    )
    assert (lim.max_sessions_per_connection, lim.max_links_per_connection) == (100, 1_000)
    assert (lim.max_unsettled_per_link, lim.max_termini_per_container, lim.max_termini) == (
        1_000,
        1_000,
        100_000,
    )
    assert (lim.max_terminus_timeout, lim.expiry_never) == (7 * 24 * 3600.0, "allow")
    assert load_config().listeners[0].max_message_size is None  # the router's


def test_table_and_listener(write_config: WriteConfig) -> None:
    path = write_config(
        "[limits]\nmax_connections = 5\nmax_links_per_connection = 0\n"
        'max_terminus_timeout = 30\nexpiry_never = "refuse"\n'
        "[[listener]]\nmax_message_size = 4096\n"
    )
    cfg = load_config(path)
    assert cfg.limits.max_connections == 5
    assert cfg.limits.max_links_per_connection == 0
    assert cfg.limits.max_terminus_timeout == 30
    assert cfg.limits.expiry_never == "refuse"
    assert cfg.limits.max_sessions_per_connection == 100  # the rest keep their defaults
    assert cfg.listeners[0].max_message_size == 4096


def test_limit_option_wins_over_the_file(write_config: WriteConfig) -> None:
    path = write_config("[limits]\nmax_connections = 5\nmax_termini = 7\n")
    cfg = load_config(path, limit=("max_connections=9", "expiry_never=allow"))
    assert (cfg.limits.max_connections, cfg.limits.max_termini) == (9, 7)
    assert cfg.limits.expiry_never == "allow"


@pytest.mark.parametrize(
    ("toml", "key", "what"),
    [
        ("[limits]\nmax_conections = 1\n", "limits", "max_conections"),
        ("[limits]\nmax_connections = -1\n", "limits.max_connections", "out of range"),
        (
            "[limits]\nmax_sessions_per_connection = 70000\n",
            "limits.max_sessions_per_connection",
            "out of range",
        ),
        ('[limits]\nexpiry_never = "sometimes"\n', "limits.expiry_never", "sometimes"),
        ("[[listener]]\nmax_message_size = -5\n", "listener[0].max_message_size", "out of range"),
    ],
)
def test_errors_name_the_key(write_config: WriteConfig, toml: str, key: str, what: str) -> None:
    path = write_config(toml)
    message = error_of(path)
    assert message.startswith(f"{path}: {key}"), message
    assert what in message


def test_limit_option_errors() -> None:
    assert "--limit" in error_of(limit=("max_connections",))
    assert "--limit" in error_of(limit=("nonsense=1",))
    assert "limits.max_links_per_connection" in error_of(limit=("max_links_per_connection=x",))
