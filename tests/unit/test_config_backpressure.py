"""Backpressure settings (docs/configuration.md, "Backpressure"): write_buffer_high and
write_buffer_low in the file and on the command line, their defaults and their checks."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from qrouter.cli import main
from qrouter.config import ConfigError, RouterConfig, load_config


def test_defaults() -> None:
    cfg = RouterConfig()
    assert (cfg.write_buffer_high, cfg.write_buffer_low) == (1024 * 1024, 256 * 1024)


def test_file_and_command_line(tmp_path: Path) -> None:
    path = tmp_path / "r.toml"
    path.write_text("write_buffer_high = 65536\nwrite_buffer_low = 16384\n")
    cfg = load_config(str(path))
    assert (cfg.write_buffer_high, cfg.write_buffer_low) == (65536, 16384)
    cfg = load_config(str(path), write_buffer_high=131072)  # the flag wins
    assert (cfg.write_buffer_high, cfg.write_buffer_low) == (131072, 16384)


@pytest.mark.parametrize(
    "text, key, what",
    [
        ("write_buffer_high = -1", "write_buffer_high", "out of range"),
        ("write_buffer_low = true", "write_buffer_low", "boolean"),
        (
            "write_buffer_high = 1000\nwrite_buffer_low = 2000",
            "write_buffer_low",
            "must not exceed",
        ),
    ],
)
def test_bad_values(tmp_path: Path, text: str, key: str, what: str) -> None:
    path = tmp_path / "r.toml"
    path.write_text(text + "\n")
    with pytest.raises(ConfigError) as info:
        load_config(str(path))
    assert key in str(info.value) and what in str(info.value)


def test_low_above_high_on_the_command_line() -> None:
    with pytest.raises(ConfigError) as info:
        load_config(None, write_buffer_low=2 * 1024 * 1024)
    assert "--write-buffer-low" in str(info.value)


def test_cli_flags_reach_the_config(started: list[RouterConfig]) -> None:
    seen = started  # no server: run() records the config (conftest.py)
    result = CliRunner().invoke(
        main, ["start", "--write-buffer-high", "5000", "--write-buffer-low", "100"]
    )
    assert result.exit_code == 0, result.output
    assert (seen[0].write_buffer_high, seen[0].write_buffer_low) == (5000, 100)
