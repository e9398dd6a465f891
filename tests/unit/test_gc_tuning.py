from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from qrouter import gc_tuning


@pytest.fixture
def restore_gc() -> Iterator[None]:
    before = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*before)


@pytest.mark.usefixtures("restore_gc")
def test_tune_freezes_what_is_alive_and_widens_the_young_generation() -> None:
    gc.unfreeze()
    gc_tuning.tune()
    assert gc.get_freeze_count() > 1000  # this process's modules and their objects
    assert gc.get_threshold() == (gc_tuning.YOUNG, 20, 10)
    # still collects cycles made after start-up
    a: list[object] = []
    a.append(a)
    del a
    assert gc.collect() >= 1
