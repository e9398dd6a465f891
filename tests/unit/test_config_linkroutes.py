"""[[linkroute]] (docs/brokers.md "Link routes"): parsing, checks and address matching."""

from __future__ import annotations

from pathlib import Path

import pytest

from qrouter.config import ConfigError, LinkRouteConfig, load_config
from qrouter.linkroutes import matches

BROKER = """
[[connector]]
name = "rabbit"
role = "route-container"
port = 5672
"""


def _load(tmp_path: Path, text: str) -> object:
    f = tmp_path / "r.toml"
    f.write_text(text)
    return load_config(str(f))


def test_linkroutes_are_read(tmp_path: Path) -> None:
    cfg = _load(
        tmp_path,
        BROKER
        + '[[linkroute]]\nprefix = "/queue/"\ndirection = "out"\nconnection = "rabbit"\n'
        + '[[linkroute]]\npattern = "orders.*.eu"\ndirection = "in"\nconnection = "rabbit"\n',
    )
    assert cfg.linkroutes == [  # type: ignore[attr-defined]
        LinkRouteConfig(prefix="/queue", direction="out", connection="rabbit"),
        LinkRouteConfig(pattern="orders.*.eu", direction="in", connection="rabbit"),
    ]


@pytest.mark.parametrize(
    ("table", "error"),
    [
        ('prefix = "q"\nconnection = "rabbit"\n', "direction"),
        ('prefix = "q"\ndirection = "up"\nconnection = "rabbit"\n', "direction"),
        ('direction = "out"\nconnection = "rabbit"\n', "exactly one of prefix and pattern"),
        ('prefix = "q"\npattern = "q.#"\ndirection = "out"\nconnection = "rabbit"\n', "exactly"),
        ('pattern = "q.a#"\ndirection = "out"\nconnection = "rabbit"\n', "whole tokens"),
        ('prefix = "q"\ndirection = "out"\nconnection = "nobody"\n', "route-container"),
        ('prefix = "q"\ndirection = "out"\nconnection = "rabbit"\nqueue = "x"\n', "queue"),
    ],
)
def test_bad_linkroutes_are_refused(tmp_path: Path, table: str, error: str) -> None:
    with pytest.raises(ConfigError, match=error):
        _load(tmp_path, BROKER + "[[linkroute]]\n" + table)


def test_a_route_without_connection_goes_through_the_mesh(tmp_path: Path) -> None:
    cfg = _load(tmp_path, '[[linkroute]]\nprefix = "q"\ndirection = "in"\n')
    assert cfg.linkroutes == [LinkRouteConfig(prefix="q", direction="in")]  # type: ignore[attr-defined]


def test_a_second_route_for_the_same_prefix_and_direction_is_refused(tmp_path: Path) -> None:
    one = '[[linkroute]]\nprefix = "q"\ndirection = "out"\nconnection = "rabbit"\n'
    with pytest.raises(ConfigError, match="a second out link route"):
        _load(tmp_path, BROKER + one + one)


def test_prefix_and_pattern_matching() -> None:
    prefix = LinkRouteConfig(prefix="/queue")
    assert matches(prefix, "/queue/a") and matches(prefix, "/queue") and matches(prefix, "/queue.b")
    assert not matches(prefix, "/queues/a") and not matches(prefix, "/topic/a")
    star = LinkRouteConfig(pattern="orders.*.eu")
    assert matches(star, "orders.x.eu") and matches(star, "orders/x/eu")
    assert not matches(star, "orders.eu") and not matches(star, "orders.x.y.eu")
    hash_ = LinkRouteConfig(pattern="orders.#")
    assert matches(hash_, "orders") and matches(hash_, "orders.a.b.c")
    assert not matches(hash_, "order.a")
    many = LinkRouteConfig(pattern="#.#.#.#.#.#.x")
    assert not matches(many, ".".join(["a"] * 60))  # bounded: each position tried once
