"""Shortest paths, next hops and multicast valid origins over the link-state database.

Pure functions of the link states, so every router that holds the same database computes the
same trees: that agreement is what keeps unicast loop-free and multicast exactly-once.

Edges: ``u -> v`` exists only when u's link state lists v **and** v's lists u (the two-way
check: a router that lost a neighbour, or a stale state of a dead router, cannot attract
traffic on its own word). Its weight is the cost u advertises (costs may differ per direction).

Ties (the rule of qdrouterd's path engine): Dijkstra settles routers in order of (cost, id)
and a router's parent is the first settled neighbour that reaches it at its final cost, so
among equal-cost paths the one through the lower-cost-then-lower-id predecessor wins. This
makes trees agree across roots, the property multicast needs (docs/mesh.md, "Valid origins"):
if X lies on origin O's path to D, X's own path to D is exactly the rest of O's path. (Proof
sketch, per router on that tail: O's chosen predecessor p lies below X in O's tree, so
cost_X(p) = cost_O(p) - cost_O(X); any other predecessor u as seen from X has
cost_O(u) <= cost_O(X) + cost_X(u); so p also minimises (cost, id) seen from X. A random
tie-break fails this; tests/mesh/test_paths.py checks it on random meshes full of ties.)
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping
from dataclasses import dataclass

LinkStates = Mapping[str, Mapping[str, int]]
Graph = dict[str, dict[str, int]]


@dataclass(frozen=True, slots=True)
class Routes:
    next_hop: dict[str, str]  # reachable router -> neighbour to send through
    cost: dict[str, int]  # reachable router -> path cost
    valid_origins: dict[str, tuple[str, ...]]  # reachable router -> sorted origin ids


def two_way_graph(link_states: LinkStates) -> Graph:
    """Keep only the edges both ends advertise."""
    graph: Graph = {router: {} for router in link_states}
    for u, peers in link_states.items():
        for v, cost in peers.items():
            if v != u and u in link_states.get(v, {}):
                graph[u][v] = cost
    return graph


def shortest_path_tree(graph: Graph, root: str) -> tuple[dict[str, str], dict[str, int]]:
    """Dijkstra from `root`: (parent of each reachable router, cost of each reachable router).

    The root has cost 0 and no parent.
    """
    if root not in graph:
        return {}, {}
    best: dict[str, int] = {root: 0}
    parent: dict[str, str] = {}
    done: set[str] = set()
    heap: list[tuple[int, str]] = [(0, root)]
    while heap:
        cost, u = heapq.heappop(heap)  # settled in (cost, id) order: the tie-break
        if u in done:
            continue
        done.add(u)
        for v, weight in graph[u].items():
            # Strictly cheaper only: on a tie the predecessor settled first keeps v.
            if v not in done and (v not in best or cost + weight < best[v]):
                best[v] = cost + weight
                parent[v] = u
                heapq.heappush(heap, (cost + weight, v))
    return parent, best


def compute_routes(me: str, link_states: LinkStates) -> Routes:
    graph = two_way_graph(link_states)
    parent, cost = shortest_path_tree(graph, me)

    next_hop: dict[str, str] = {}
    for dest in parent:
        # Walk up to the child of the root; parents are closer, so memoising them as we go keeps
        # this linear in the tree size.
        chain = [dest]
        hop = parent[dest]
        while hop != me and hop not in next_hop:
            chain.append(hop)
            hop = parent[hop]
        first = chain[-1] if hop == me else next_hop[hop]
        for node in chain:
            next_hop[node] = first

    # Valid origins, the rule of qdrouterd's path engine: a copy that entered the mesh at
    # `origin` is forwarded by us toward `dest` only if we lie strictly inside origin's path to
    # dest, i.e. dest is below us in the tree rooted at origin. Copies then move only along the
    # edges of the origin's tree, one per edge, so none loops and no router gets two. The origin
    # itself is not listed: the data plane always forwards copies that entered here.
    origins: dict[str, list[str]] = {dest: [] for dest in parent}
    for origin in sorted(parent):
        origin_parent, _ = shortest_path_tree(graph, origin)
        for dest in _descendants(origin_parent, me):
            origins[dest].append(origin)

    del cost[me]
    return Routes(next_hop, cost, {dest: tuple(found) for dest, found in origins.items()})


def _descendants(parent: dict[str, str], node: str) -> list[str]:
    """Routers strictly below `node` in the tree given by `parent`."""
    children: dict[str, list[str]] = {}
    for child, up in parent.items():
        children.setdefault(up, []).append(child)
    found: list[str] = []
    stack = list(children.get(node, ()))
    while stack:
        child = stack.pop()
        found.append(child)
        stack.extend(children.get(child, ()))
    return found
