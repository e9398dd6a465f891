"""Address table: which distribution applies to an address (DESIGN §4).

Control path only. The data plane asks once per target address and caches the answer, so
`match` is allowed to cost a few dict probes, but it must not grow with the number of entries.

Matching rules (docs/configuration.md, "Address matching", says the same for users):

* An address is a sequence of *tokens* separated by ``.`` or ``/``.
* A **prefix** entry matches the address that equals it, or an address that continues it at a
  token boundary: the character right after the prefix is ``.`` or ``/``. So prefix
  ``unicast`` matches ``unicast``, ``unicast.foo`` and ``unicast/foo`` but not ``unicastx``.
  The prefix text is compared literally (``a.b`` does not match ``a/b/c``). Trailing
  separators are dropped (``unicast/`` is the same entry as ``unicast``).
* A **pattern** entry is split into tokens on ``.`` and ``/`` (the two separators are
  interchangeable in patterns); ``*`` matches exactly one token, ``#`` zero or more, any other
  token matches itself. A wildcard must be a whole token (``a*`` is refused).
* When several entries match, the **most specific** wins, as in qdrouterd, which keeps prefixes
  and patterns in one tree: a prefix ``P`` counts as the pattern ``P.#``, and two matching
  entries are compared token by token from the left, where a literal token beats ``*``, ``*``
  beats the end of the entry, and the end beats ``#``. Consequences: among prefixes the
  longest wins; an exact pattern ``a.b`` beats the prefix ``a`` and the prefix ``a.b``; the
  prefix ``a.b`` beats the pattern ``a.*.c`` (second token: literal beats ``*``).
* Exact ties (only possible with ``#``, or between prefix ``P`` and pattern ``P.#``): a prefix
  beats a pattern, then the entry added first wins.
* A user entry with the same key (same prefix, or same pattern text) as a preset entry replaces
  it. The oslo.messaging preset is loaded first (see `OSLO_PRESET`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from qrouter.config import AddressConfig

DISTRIBUTIONS = ("closest", "balanced", "multicast", "unavailable")
# an entry's optional guarantee (docs/exactly-once.md); it needs distribution multicast
GUARANTEES = ("exactly-once", "at-least-once")
# fallback / dead_letter (docs/brokers.md, "Fallback and dead letters") need one of these:
# they are about the one consumer an anycast message goes to
DIVERTING = ("closest", "balanced")

_SEPARATORS = re.compile(r"[./]")

# Token ranks for the specificity comparison (higher is more specific).
_LITERAL, _STAR, _END, _HASH = 3, 2, 1, 0

# oslo.messaging routable addressing (seed oslo-messaging-routed-mesh.txt, DESIGN §4), plus the
# legacy prefixes the AMQP 1.0 driver uses in its non-routable mode.
OSLO_PRESET: tuple[tuple[str, str], ...] = (
    ("openstack.org/om/rpc/multicast", "multicast"),
    ("openstack.org/om/rpc/unicast", "closest"),
    ("openstack.org/om/rpc/anycast", "balanced"),
    ("openstack.org/om/notify/multicast", "multicast"),
    ("openstack.org/om/notify/unicast", "closest"),
    ("openstack.org/om/notify/anycast", "balanced"),
    ("unicast", "closest"),
    ("exclusive", "closest"),
    ("broadcast", "multicast"),
)


class _EntryLike(Protocol):
    @property
    def prefix(self) -> str | None: ...
    @property
    def pattern(self) -> str | None: ...
    @property
    def distribution(self) -> str: ...


@dataclass(frozen=True)
class AddressEntry:
    """One address entry: exactly one of `prefix` and `pattern` is set."""

    prefix: str | None
    pattern: str | None
    distribution: str
    guarantee: str | None = None
    fallback: str | None = None  # where messages go while nobody consumes the address
    dead_letter: str | None = None  # where rejected / undeliverable-here messages go
    waypoint: bool = False  # a broker queue stands in the address's path (docs/brokers.md)

    def __post_init__(self) -> None:
        if (self.prefix is None) == (self.pattern is None):
            raise ValueError("set exactly one of prefix and pattern")
        if self.distribution not in DISTRIBUTIONS:
            raise ValueError(
                f"distribution {self.distribution!r} is not one of {', '.join(DISTRIBUTIONS)}"
            )
        if self.guarantee is not None:
            if self.guarantee not in GUARANTEES:
                raise ValueError(
                    f"guarantee {self.guarantee!r} is not one of {', '.join(GUARANTEES)}"
                )
            if self.distribution != "multicast":
                raise ValueError(
                    f"a guarantee needs distribution multicast, not {self.distribution}"
                )
        check_diversion(self.distribution, self.fallback, self.dead_letter)
        if self.waypoint and self.distribution not in ("balanced", "closest"):
            raise ValueError(
                f"a waypoint needs distribution balanced or closest, not {self.distribution}"
            )
        if self.prefix is not None:
            object.__setattr__(self, "prefix", normalize_prefix(self.prefix))
        if self.pattern is not None:
            check_pattern(self.pattern)

    @property
    def key(self) -> tuple[str, str]:
        """Identity in the table: ("prefix", text) or ("pattern", text)."""
        if self.prefix is not None:
            return ("prefix", self.prefix)
        assert self.pattern is not None
        return ("pattern", self.pattern)


def check_diversion(distribution: str, fallback: str | None, dead_letter: str | None) -> None:
    """Raise ValueError unless `fallback` / `dead_letter` are None or usable addresses for an
    entry with `distribution`."""
    for what, value in (("fallback", fallback), ("dead_letter", dead_letter)):
        if value is None:
            continue
        if not isinstance(value, str) or not value:
            raise ValueError(f"{what} must be a non-empty address")
        if "*" in value or "#" in value:
            raise ValueError(f"{what} {value!r} must be an address, not a pattern")
        if distribution not in DIVERTING:
            raise ValueError(
                f"{what} needs distribution {' or '.join(DIVERTING)}, not {distribution}"
            )


def normalize_prefix(prefix: str) -> str:
    """Drop trailing separators; refuse empty prefixes and wildcards. Raises ValueError."""
    if not isinstance(prefix, str):
        raise ValueError("prefix must be a string")
    stripped = prefix.rstrip("./")
    if not stripped:
        raise ValueError("prefix must not be empty (use default_distribution instead)")
    if "*" in stripped or "#" in stripped:
        raise ValueError(f"prefix {prefix!r} contains '*' or '#'; use pattern for wildcards")
    return stripped


def check_pattern(pattern: str) -> None:
    """Raise ValueError unless every wildcard in `pattern` is a whole token."""
    if not isinstance(pattern, str) or not pattern:
        raise ValueError("pattern must be a non-empty string")
    for token in _SEPARATORS.split(pattern):
        if token not in ("*", "#") and ("*" in token or "#" in token):
            raise ValueError(f"pattern {pattern!r}: '*' and '#' must be whole tokens")


def _tokens(text: str) -> list[str]:
    return _SEPARATORS.split(text)


class _Node:
    __slots__ = ("children", "entry")

    def __init__(self) -> None:
        self.children: dict[str, _Node] = {}
        self.entry: AddressEntry | None = None


class AddressTable:
    """Prefix and pattern entries with their distributions.

    Prefixes live in a dict keyed by prefix text; `match` probes it with the address cut at
    each token boundary, longest first. Patterns live in a token trie whose ``*`` and ``#``
    children are ordinary keys. Both cost O(tokens of the address), independent of the number
    of entries (except for ``#``, which may try each remaining position once per trie node).
    """

    def __init__(
        self,
        default_distribution: str = "balanced",
        entries: Iterable[AddressConfig | AddressEntry] = (),
        oslo_preset: bool = True,
    ) -> None:
        if default_distribution not in DISTRIBUTIONS:
            raise ValueError(
                f"distribution {default_distribution!r} is not one of {', '.join(DISTRIBUTIONS)}"
            )
        self.default_distribution = default_distribution
        self._prefixes: dict[str, AddressEntry] = {}
        self._root = _Node()
        # key -> (insertion sequence, entry): the order of entries() and the tie-breaker.
        self._order: dict[tuple[str, str], tuple[int, AddressEntry]] = {}
        self._rank: dict[tuple[str, str], tuple[int, ...]] = {}
        self._seq = 0
        if oslo_preset:
            for prefix, distribution in OSLO_PRESET:
                self.add(AddressEntry(prefix=prefix, pattern=None, distribution=distribution))
        for entry in entries:
            self.add(entry)

    # -- changes ---------------------------------------------------------------------------

    def add(self, entry: AddressConfig | AddressEntry | _EntryLike) -> None:
        """Add `entry`, replacing any entry with the same key. Raises ValueError if invalid."""
        if not isinstance(entry, AddressEntry):
            entry = AddressEntry(
                prefix=entry.prefix,
                pattern=entry.pattern,
                distribution=entry.distribution,
                guarantee=getattr(entry, "guarantee", None),
                fallback=getattr(entry, "fallback", None),
                dead_letter=getattr(entry, "dead_letter", None),
                waypoint=bool(getattr(entry, "waypoint", False)),
            )
        key = entry.key
        if key in self._order:
            self._remove_key(key)
        self._seq += 1
        self._order[key] = (self._seq, entry)
        if entry.prefix is not None:
            self._prefixes[entry.prefix] = entry
            self._rank[key] = (_LITERAL,) * len(_tokens(entry.prefix)) + (_HASH, _END)
        else:
            assert entry.pattern is not None
            node = self._root
            tokens = _tokens(entry.pattern)
            for token in tokens:
                node = node.children.setdefault(token, _Node())
            node.entry = entry
            self._rank[key] = tuple(_rank_of(t) for t in tokens) + (_END,)

    def remove(self, prefix: str | None = None, pattern: str | None = None) -> bool:
        """Remove the entry with this prefix or pattern (preset or not); False if absent."""
        if (prefix is None) == (pattern is None):
            raise ValueError("give exactly one of prefix and pattern")
        key = ("prefix", normalize_prefix(prefix)) if prefix is not None else ("pattern", pattern)
        assert key[1] is not None
        if key not in self._order:
            return False
        self._remove_key((key[0], key[1]))
        return True

    def _remove_key(self, key: tuple[str, str]) -> None:
        del self._order[key]
        del self._rank[key]
        kind, text = key
        if kind == "prefix":
            del self._prefixes[text]
            return
        path = [self._root]
        for token in _tokens(text):
            path.append(path[-1].children[token])
        path[-1].entry = None
        # Prune nodes left with neither an entry nor children, deepest first.
        for token, depth in zip(reversed(_tokens(text)), range(len(path) - 1, 0, -1), strict=True):
            node = path[depth]
            if node.entry is not None or node.children:
                break
            del path[depth - 1].children[token]

    # -- queries ---------------------------------------------------------------------------

    def entries(self) -> list[AddressEntry]:
        """All entries, preset first, in the order they were (last) added."""
        return [entry for _, entry in sorted(self._order.values(), key=lambda se: se[0])]

    def distribution(self, address: str) -> str:
        """The distribution for `address`: its best entry's, else the default."""
        entry = self.match(address)
        return entry.distribution if entry is not None else self.default_distribution

    def guarantee(self, address: str) -> str | None:
        """The guarantee of `address`'s best entry (exactly-once, at-least-once), or None."""
        entry = self.match(address)
        return entry.guarantee if entry is not None else None

    def diversion(self, address: str) -> tuple[str | None, str | None] | None:
        """(fallback, dead_letter) of `address`'s best entry, or None when it names neither.
        The engine asks once per address it makes (qrouter/_fast/diversion.pxi)."""
        entry = self.match(address)
        if entry is None or (entry.fallback is None and entry.dead_letter is None):
            return None
        return (entry.fallback, entry.dead_letter)

    def waypoint(self, address: str) -> bool:
        """Whether `address`'s best entry is a waypoint (docs/brokers.md)."""
        entry = self.match(address)
        return entry is not None and entry.waypoint

    def match(self, address: str) -> AddressEntry | None:
        """The most specific entry matching `address`, or None when nothing matches."""
        candidates: list[AddressEntry] = []
        prefix_entry = self._longest_prefix(address)
        if prefix_entry is not None:
            candidates.append(prefix_entry)
        if self._root.children:
            candidates.extend(self._match_patterns(_tokens(address)))
        if not candidates:
            return None
        if len(candidates) == 1:
            return candidates[0]
        return max(candidates, key=self._preference)

    def _preference(self, entry: AddressEntry) -> tuple[tuple[int, ...], int, int]:
        key = entry.key
        return (self._rank[key], entry.prefix is not None, -self._order[key][0])

    def _longest_prefix(self, address: str) -> AddressEntry | None:
        prefixes = self._prefixes
        if not prefixes:
            return None
        entry = prefixes.get(address)
        if entry is not None:
            return entry
        end = len(address)
        while True:
            end = max(address.rfind(".", 0, end), address.rfind("/", 0, end))
            if end <= 0:
                return None
            entry = prefixes.get(address[:end])
            if entry is not None:
                return entry

    def _match_patterns(self, tokens: list[str]) -> list[AddressEntry]:
        found: list[AddressEntry] = []
        seen: set[tuple[int, int]] = set()
        count = len(tokens)

        def walk(node: _Node, i: int) -> None:
            # `seen` bounds the work with several '#': each (node, position) is visited once.
            mark = (id(node), i)
            if mark in seen:
                return
            seen.add(mark)
            children = node.children
            if i == count:
                if node.entry is not None:
                    found.append(node.entry)
            else:
                child = children.get(tokens[i])
                if child is not None:
                    walk(child, i + 1)
                child = children.get("*")
                if child is not None:
                    walk(child, i + 1)
            hash_child = children.get("#")
            if hash_child is not None:
                for j in range(i, count + 1):
                    walk(hash_child, j)

        walk(self._root, 0)
        return found


def _rank_of(token: str) -> int:
    if token == "*":
        return _STAR
    if token == "#":
        return _HASH
    return _LITERAL
