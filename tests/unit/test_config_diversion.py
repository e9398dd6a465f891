"""`fallback` and `dead_letter` on an address entry (docs/brokers.md, "Fallback and dead
letters"): parsed from the file, refused where they cannot apply, and answered by the address
table for the engine."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from qrouter.addresses import AddressEntry, AddressTable
from qrouter.config import ConfigError, load_config


def test_parsed_from_the_file(write_config: Callable[..., str]) -> None:
    path = write_config(
        "[[address]]\nprefix = 'orders'\nfallback = 'orders-parked'\n"
        "dead_letter = 'orders-dlq'\n"
        "[[address]]\npattern = 'jobs.*'\ndistribution = 'closest'\ndead_letter = 'dlq'\n"
    )
    orders, jobs = load_config(path).addresses
    assert (orders.fallback, orders.dead_letter) == ("orders-parked", "orders-dlq")
    assert (jobs.fallback, jobs.dead_letter) == (None, "dlq")


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ("distribution = 'multicast'\nfallback = 'f'", "address[0].fallback: fallback needs"),
        ("distribution = 'unavailable'\ndead_letter = 'd'", "dead_letter needs distribution"),
        ("fallback = 'a.*'", "must be an address, not a pattern"),
        ("dead_letter = ''", "dead_letter must be a non-empty address"),
        ("fallback = 3", "fallback"),
    ],
)
def test_refused(write_config: Callable[..., str], entry: str, message: str) -> None:
    path = write_config(f"[[address]]\nprefix = 'orders'\n{entry}\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert message in str(info.value)


def test_the_table_answers_per_address() -> None:
    table = AddressTable(
        entries=[
            AddressEntry("orders", None, "balanced", fallback="parked"),
            AddressEntry(None, "jobs.*", "closest", dead_letter="dlq"),
            AddressEntry("plain", None, "balanced"),
        ]
    )
    assert table.diversion("orders.eu") == ("parked", None)
    assert table.diversion("jobs.print") == (None, "dlq")
    assert table.diversion("plain.x") is None
    assert table.diversion("unmatched") is None
    with pytest.raises(ValueError, match="needs distribution closest or balanced"):
        AddressEntry("news", None, "multicast", dead_letter="dlq")
