"""Multicast across the mesh: one copy per next hop, valid origins, no loop duplicates."""

from __future__ import annotations

from typing import Any

from tests.clients import run_container
from tests.mesh_system.mesh import Traffic, mesh

MULTICAST = {"mc": "multicast"}


def _exactly_once(t: Traffic, n: int) -> None:
    for i, got in enumerate(t.received):
        assert sorted(got) == list(range(n)), f"receiver {i}: each message exactly once"
    assert len(t.accepted) == n


def test_triangle_multicast_exactly_once_everywhere(router: Any) -> None:
    r = mesh(router, [("A", "B"), ("A", "C"), ("B", "C")], ["A", "B", "C"], addresses=MULTICAST)
    n = 500
    urls = [r[x].url for x in "ABC"]
    t = run_container(Traffic(r["A"].url, urls, "mc.t", n, expect=3 * n), timeout=60)
    _exactly_once(t, n)


def test_square_multicast_from_each_router(router: Any) -> None:
    r = mesh(
        router,
        [("A", "B"), ("A", "C"), ("B", "D"), ("C", "D")],
        ["A", "B", "C", "D"],
        addresses=MULTICAST,
    )
    n = 200
    urls = [r[x].url for x in "ABCD"]
    for origin in "AD":
        t = run_container(
            Traffic(r[origin].url, urls, f"mc.sq.{origin}", n, expect=4 * n), timeout=60
        )
        _exactly_once(t, n)
