"""Mesh settings: [[connector]], --inter-router-listen, --inter-router-connect."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from qrouter.config import ConfigError, ConnectorConfig, load_config


def test_connectors_from_toml(tmp_path: Path) -> None:
    f = tmp_path / "r.toml"
    f.write_text(
        'id = "A"\n[[listener]]\nport = 5672\n[[listener]]\nport = 55672\nrole = "inter-router"\n'
        '[[connector]]\nhost = "10.0.0.2"\nport = 55672\ncost = 5\n[[connector]]\nport = 55673\n'
    )
    cfg = load_config(str(f))
    assert cfg.connectors == [
        ConnectorConfig("10.0.0.2", 55672, 5),
        ConnectorConfig("127.0.0.1", 55673, 1),
    ]
    assert [lc.role for lc in cfg.listeners] == ["normal", "inter-router"]


@pytest.mark.parametrize(
    ("table", "key"),
    [("cost = 0", "connector[0].cost"), ('port = "x"', "connector[0].port"), ("nope = 1", "nope")],
)
def test_bad_connector(tmp_path: Path, table: str, key: str) -> None:
    f = tmp_path / "r.toml"
    f.write_text(f"[[connector]]\n{table}\n")
    with pytest.raises(ConfigError) as exc:
        load_config(str(f))
    assert key in str(exc.value)


def test_cli_overrides(tmp_path: Path) -> None:
    f = tmp_path / "r.toml"
    f.write_text('[[listener]]\nport = 1\nrole = "inter-router"\n[[connector]]\nport = 9\n')
    cfg = load_config(
        str(f),
        inter_router_listen="127.0.0.1:7000",
        inter_router_connect="127.0.0.1:7001, 127.0.0.1:7002",
    )
    inter = [lc for lc in cfg.listeners if lc.role == "inter-router"]
    assert [(lc.host, lc.port) for lc in inter] == [("127.0.0.1", 7000)]
    assert [c.port for c in cfg.connectors] == [7001, 7002]
    # an empty value: no peers, even those of the file
    assert load_config(str(f), inter_router_connect="").connectors == []
    assert load_config(str(f)).connectors == [ConnectorConfig(port=9)]
    with pytest.raises(ConfigError, match="--inter-router-connect"):
        load_config(None, inter_router_connect="nohost")


def test_cli_flags_reach_the_config(monkeypatch: pytest.MonkeyPatch) -> None:
    from qrouter import cli

    seen = {}

    def fake_run(cfg: object) -> int:
        seen["cfg"] = cfg
        return 0

    monkeypatch.setattr("qrouter.server.run", fake_run)
    result = CliRunner().invoke(
        cli.main,
        ["start", "--id", "A", "--inter-router-listen", ":7000", "--inter-router-connect", ""],
    )
    assert result.exit_code == 0, result.output
    cfg = seen["cfg"]
    assert [lc.port for lc in cfg.listeners if lc.role == "inter-router"] == [7000]  # type: ignore[attr-defined]
    assert cfg.connectors == []  # type: ignore[attr-defined]


def test_hello_timers_are_configurable(tmp_path: Path) -> None:
    path = tmp_path / "r.toml"
    path.write_text("hello_interval = 0.5\nhello_max_age = 2\n")
    cfg = load_config(str(path))
    assert (cfg.hello_interval, cfg.hello_max_age) == (0.5, 2.0)
    path.write_text("hello_interval = 2\nhello_max_age = 1\n")
    with pytest.raises(ConfigError) as e:
        load_config(str(path))
    assert str(e.value).startswith(f"{path}: hello_max_age: must be longer than hello_interval")
