"""The ``metrics`` setting: TOML key and ``--metrics`` option (docs/configuration.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from qrouter.config import ConfigError, load_config


def test_metrics_from_toml_and_cli(tmp_path: Path) -> None:
    path = tmp_path / "r.toml"
    path.write_text('metrics = "127.0.0.1:9100"\n')
    assert load_config(str(path)).metrics == "127.0.0.1:9100"
    assert load_config(str(path), metrics="0.0.0.0:9200").metrics == "0.0.0.0:9200"
    assert load_config().metrics is None


def test_bad_metrics_settings(tmp_path: Path) -> None:
    path = tmp_path / "r.toml"
    path.write_text("metrics = 9100\n")
    with pytest.raises(ConfigError, match=r"r.toml: metrics: expected a string"):
        load_config(str(path))
    with pytest.raises(ConfigError, match=r"--metrics: 'nowhere' is not HOST:PORT"):
        load_config(metrics="nowhere")
    with pytest.raises(ConfigError, match=r"--metrics: 127.0.0.1:5672 is also used by"):
        load_config(metrics="127.0.0.1:5672")
