"""[[connector]] role route-container, [[address]] waypoint and [[autolink]] (docs/brokers.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from qrouter.addresses import AddressTable
from qrouter.config import AutoLinkConfig, ConfigError, load_config

BROKER = """
[[connector]]
name = "rabbit"
role = "route-container"
port = 5672

[[address]]
prefix = "orders"
waypoint = true
"""


def _load(tmp_path: Path, text: str, **overrides: object) -> object:
    f = tmp_path / "r.toml"
    f.write_text(text)
    return load_config(str(f), **overrides)


def test_connector_autolinks_and_waypoint(tmp_path: Path) -> None:
    cfg = _load(
        tmp_path,
        BROKER
        + '[[autolink]]\naddress = "orders"\ndirection = "out"\nconnection = "rabbit"\n'
        + 'external_address = "/queue/orders"\n'
        + '[[autolink]]\naddress = "orders"\ndirection = "in"\nconnection = "rabbit"\n',
    )
    (cc,) = cfg.connectors  # type: ignore[attr-defined]
    assert (cc.name, cc.role, cc.port) == ("rabbit", "route-container", 5672)
    assert cfg.autolinks == [  # type: ignore[attr-defined]
        AutoLinkConfig("orders", "out", "rabbit", "/queue/orders"),
        AutoLinkConfig("orders", "in", "rabbit", None),
    ]
    assert [al.queue for al in cfg.autolinks] == ["/queue/orders", "orders"]  # type: ignore[attr-defined]
    table = AddressTable(entries=cfg.addresses)  # type: ignore[attr-defined]
    assert table.waypoint("orders") and table.waypoint("orders/eu")
    assert not table.waypoint("other")


def test_connector_role_defaults_to_inter_router(tmp_path: Path) -> None:
    cfg = _load(tmp_path, "[[connector]]\nport = 55672\n")
    assert cfg.connectors[0].role == "inter-router"  # type: ignore[attr-defined]


def test_cli_connect_keeps_the_broker_connectors(tmp_path: Path) -> None:
    cfg = _load(tmp_path, BROKER, inter_router_connect="127.0.0.1:55673")
    roles = sorted(cc.role for cc in cfg.connectors)  # type: ignore[attr-defined]
    assert roles == ["inter-router", "route-container"]


@pytest.mark.parametrize(
    ("text", "key", "what"),
    [
        ('[[autolink]]\naddress = "a"\ndirection = "out"\nconnection = "nope"\n',
         "autolink[0].connection", "no connector named 'nope'"),
        ('[[autolink]]\naddress = "a"\ndirection = "sideways"\nconnection = "rabbit"\n',
         "autolink[0].direction", "sideways"),
        ('[[autolink]]\naddress = "a"\nconnection = "rabbit"\n',
         "autolink[0].direction", "required"),
        ('[[autolink]]\ndirection = "in"\nconnection = "rabbit"\n',
         "autolink[0].address", "required"),
        ('[[autolink]]\naddress = "a"\ndirection = "in"\nconnection = "rabbit"\nqueue = "x"\n',
         "queue", ""),
        ('[[connector]]\nname = "rabbit"\nport = 1\n', "connector[1].name", "second connector"),
        ('[[autolink]]\naddress = "a"\ndirection = "in"\nconnection = "rabbit"\n' * 2,
         "autolink[1]", "a second in autolink"),
        ('[[connector]]\nrole = "broker"\n', "connector[1].role", "broker"),
        ('[[address]]\nprefix = "m"\ndistribution = "multicast"\nwaypoint = true\n',
         "waypoint", "balanced or closest"),
    ],
)  # fmt: skip
def test_bad_broker_settings(tmp_path: Path, text: str, key: str, what: str) -> None:
    with pytest.raises(ConfigError) as exc:
        _load(tmp_path, BROKER + text)
    assert key in str(exc.value) and what in str(exc.value)


def test_autolink_to_an_inter_router_connector_is_refused(tmp_path: Path) -> None:
    text = '[[connector]]\nname = "peer"\nport = 55672\n'
    text += '[[autolink]]\naddress = "a"\ndirection = "in"\nconnection = "peer"\n'
    with pytest.raises(ConfigError, match="route-container"):
        _load(tmp_path, text)
