"""busy_poll_us (docs/configuration.md, docs/performance.md "Latency across the load range"):
its default, the file key and the command-line flag, and its bounds."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from qrouter.cli import main
from qrouter.config import BUSY_POLL_MAX_US, ConfigError, RouterConfig, load_config


def test_default_is_off() -> None:
    assert RouterConfig().busy_poll_us == 0


def test_file_and_command_line(tmp_path: Path) -> None:
    path = tmp_path / "r.toml"
    path.write_text("busy_poll_us = 50\n")
    assert load_config(str(path)).busy_poll_us == 50
    assert load_config(str(path), busy_poll_us=200).busy_poll_us == 200  # the flag wins


@pytest.mark.parametrize("value", ["-1", str(BUSY_POLL_MAX_US + 1), "true", '"50"'])
def test_bad_values(tmp_path: Path, value: str) -> None:
    path = tmp_path / "r.toml"
    path.write_text(f"busy_poll_us = {value}\n")
    with pytest.raises(ConfigError) as info:
        load_config(str(path))
    assert "busy_poll_us" in str(info.value)


def test_flag_out_of_range() -> None:
    with pytest.raises(ConfigError) as info:
        load_config(None, busy_poll_us=BUSY_POLL_MAX_US + 1)
    assert "--busy-poll-us" in str(info.value)


def test_cli_flag_reaches_the_config(started: list[RouterConfig]) -> None:
    seen = started  # no server: run() records the config (conftest.py)
    result = CliRunner().invoke(main, ["start", "--busy-poll-us", "75"])
    assert result.exit_code == 0, result.output
    assert seen[0].busy_poll_us == 75
