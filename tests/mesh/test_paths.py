"""Shortest paths, next hops and valid origins as pure functions of the link states."""

from __future__ import annotations

import itertools
import random

from qrouter.mesh.path import compute_routes, shortest_path_tree, two_way_graph


def sym(*edges: tuple[str, str, int]) -> dict[str, dict[str, int]]:
    states: dict[str, dict[str, int]] = {}
    for u, v, cost in edges:
        states.setdefault(u, {})[v] = cost
        states.setdefault(v, {})[u] = cost
    return states


def test_one_way_edges_ignored() -> None:
    # B still advertises A (stale), A does not advertise B: no edge either way.
    states = {"A": {"C": 1}, "B": {"A": 1, "C": 1}, "C": {"A": 1, "B": 1}}
    graph = two_way_graph(states)
    assert "B" not in graph["A"] and "A" not in graph["B"]
    routes = compute_routes("A", states)
    assert routes.next_hop == {"C": "C", "B": "C"}
    assert routes.cost == {"C": 1, "B": 2}


def test_router_without_link_state_unreachable() -> None:
    routes = compute_routes("A", {"A": {"B": 1}})
    assert routes.next_hop == {} and routes.cost == {}


def test_costs_choose_cheaper_longer_path() -> None:
    routes = compute_routes("A", sym(("A", "B", 1), ("B", "C", 1), ("A", "C", 5)))
    assert routes.next_hop == {"B": "B", "C": "B"}
    assert routes.cost == {"B": 1, "C": 2}


def test_directional_costs() -> None:
    states = sym(("A", "B", 1), ("B", "C", 1), ("A", "C", 1))
    states["A"]["C"] = 5  # A's end of A-C is expensive, C's end is not
    assert compute_routes("A", states).next_hop["C"] == "B"
    assert compute_routes("C", states).next_hop["A"] == "A"


def test_ties_broken_by_id() -> None:
    # Square A-B-D-C-A, all costs 1: both ways round tie; the lower id (B) wins.
    square = sym(("A", "B", 1), ("B", "D", 1), ("D", "C", 1), ("C", "A", 1))
    assert compute_routes("A", square).next_hop["D"] == "B"
    assert compute_routes("D", square).next_hop["A"] == "B"
    # Same answer whatever order the database was built in.
    shuffled = dict(reversed(list(square.items())))
    assert compute_routes("A", shuffled).next_hop["D"] == "B"


def test_triangle_valid_origins() -> None:
    full = compute_routes("B", sym(("A", "B", 1), ("B", "C", 1), ("A", "C", 1)))
    assert full.valid_origins == {"A": (), "C": ()}  # nobody is a transit router
    skewed = compute_routes("B", sym(("A", "B", 1), ("B", "C", 1), ("A", "C", 5)))
    assert skewed.valid_origins == {"A": ("C",), "C": ("A",)}  # B carries A <-> C


def random_mesh(seed: int, size: int = 9) -> dict[str, dict[str, int]]:
    rng = random.Random(seed)
    names = [f"R{i}" for i in range(size)]
    edges = [(names[i], names[i + 1], rng.choice((1, 1, 2))) for i in range(size - 1)]
    for u, v in itertools.combinations(names, 2):
        if rng.random() < 0.3:
            edges.append((u, v, rng.choice((1, 1, 2))))
    return sym(*edges)


def path_to(parent: dict[str, str], root: str, dest: str) -> list[str]:
    path = [dest]
    while path[-1] != root:
        path.append(parent[path[-1]])
    return path[::-1]


def test_paths_are_consistent_across_routers() -> None:
    """Every router on the origin's path to a destination computes, as its own path, exactly
    the rest of the origin's path: so hop-by-hop forwarding follows the origin's tree, which
    valid origins rely on. Random meshes with many equal-cost ties."""
    for seed in range(25):
        states = random_mesh(seed)
        graph = two_way_graph(states)
        trees = {r: shortest_path_tree(graph, r)[0] for r in states}
        for origin, parent in trees.items():
            for dest in parent:
                path = path_to(parent, origin, dest)
                for i, hop in enumerate(path[1:-1], start=1):
                    assert path_to(trees[hop], hop, dest) == path[i:], (seed, origin, dest)
