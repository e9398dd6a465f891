"""Idempotent publishing's memory (qrouter/eo/dedup.py), compiled in the engine
(qrouter/_fast/eo_links.pxi): the same answers, sizes and evictions as a plain model of what
dedup.py documents, over random schedules of adds, look-ups and expiries."""

from __future__ import annotations

import random
from collections import OrderedDict
from collections.abc import Callable, Hashable

from qrouter.eo.dedup import AcceptedTags


class Model:
    """(key, tag) -> time accepted; at most `per_link` tags a key (oldest out first) and
    `total` in all (the key accepted to least recently out first), forgotten after `ttl`."""

    def __init__(self, ttl: float, per_link: int, total: int) -> None:
        self.ttl, self.per_link, self.total = ttl, per_link, total
        self.links: OrderedDict[Hashable, OrderedDict[bytes, float]] = OrderedDict()
        self.evicted = 0

    def size(self) -> int:
        return sum(len(tags) for tags in self.links.values())

    def add(self, key: Hashable, tag: bytes, now: float) -> None:
        tags = self.links.setdefault(key, OrderedDict())
        self.links.move_to_end(key)
        tags.pop(tag, None)
        tags[tag] = now
        if len(tags) > self.per_link:
            tags.popitem(last=False)
            self.evicted += 1
        while self.size() > self.total:
            oldest_key, oldest = next(iter(self.links.items()))
            if oldest_key == key and len(self.links) == 1:
                oldest.popitem(last=False)
                self.evicted += 1
                continue
            del self.links[oldest_key]
            self.evicted += len(oldest)

    def accepted(self, key: Hashable, tag: bytes, now: float) -> bool:
        at = self.links.get(key, {}).get(tag)
        return at is not None and now - at <= self.ttl

    def expire(self, now: float) -> None:
        for key in list(self.links):
            tags = self.links[key]
            for tag in [t for t, at in tags.items() if now - at > self.ttl]:
                del tags[tag]
            if not tags:
                del self.links[key]


Key = tuple[str, tuple[str, str]]


def against_the_model(
    seed: int,
    first: Key,
    next_key: Callable[[random.Random, Key], Key],
    p_add: float,
    probe_key: Callable[[random.Random, Key], Key],
) -> None:
    """300 random adds (share `p_add`), look-ups (of `probe_key`'s key) and expiries on the
    compiled AcceptedTags and the model, the link of each step from `next_key`: the answers,
    sizes and evictions the same after every step."""
    rnd = random.Random(seed)
    per_link, total = rnd.randint(1, 8), rnd.randint(1, 20)
    model, real = Model(5.0, per_link, total), AcceptedTags(5.0, per_link, total)
    key = first
    now = 0.0
    for _ in range(300):
        now += rnd.random()
        key = next_key(rnd, key)
        tag = bytes([rnd.randint(0, 9)])
        op = rnd.random()
        if op < p_add:
            model.add(key, tag, now)
            real.add(key, tag, now)
        elif op < 0.9:
            probe = probe_key(rnd, key)
            assert real.accepted(probe, tag, now) == model.accepted(probe, tag, now), seed
        else:
            model.expire(now)
            real.expire(now)
        assert (len(real), real.evicted) == (model.size(), model.evicted), seed


def test_compiled_accepted_tags_matches_the_model() -> None:
    for seed in range(200):
        against_the_model(
            seed,
            ("topic", ("container", "0")),
            lambda rnd, _: ("topic", ("container", str(rnd.randint(0, 4)))),
            0.6,
            lambda _, key: key,
        )


def test_a_link_that_goes_on_publishing_keeps_its_place_as_the_model() -> None:
    """The engine passes each link's own key object (EoPub.key) every time, and the compiled
    one skips moving a key that is already the last added: runs of one link between others,
    expiries that drop the last link, and caps that evict must still match the model."""
    keys = [("topic", ("container", str(i))) for i in range(4)]  # one object per link
    for seed in range(200):
        against_the_model(
            seed,
            keys[0],
            lambda rnd, key: rnd.choice(keys) if rnd.random() < 0.2 else key,  # or the same
            0.7,
            lambda rnd, _: rnd.choice(keys),
        )


def test_long_runs_with_repeated_tags_match_the_model() -> None:
    """Larger caps and many accepts of the same tags: the compiled memory's order (a ring in
    which an accept of a held tag leaves a superseded entry, grown and compacted as it fills)
    keeps the model's answers, sizes and evictions over thousands of steps."""
    for seed in range(6):
        rnd = random.Random(seed)
        per_link, total = rnd.randint(20, 300), rnd.randint(50, 700)
        model, real = Model(30.0, per_link, total), AcceptedTags(30.0, per_link, total)
        keys = [("topic", ("container", str(i))) for i in range(3)]
        now = 0.0
        for _ in range(4000):
            now += rnd.random() * 0.05
            key = keys[0] if rnd.random() < 0.8 else rnd.choice(keys)
            tag = str(rnd.randint(0, rnd.choice((30, 400)))).encode()
            op = rnd.random()
            if op < 0.6:
                model.add(key, tag, now)
                real.add(key, tag, now)
            elif op < 0.995:
                assert real.accepted(key, tag, now) == model.accepted(key, tag, now), seed
            else:
                model.expire(now)
                real.expire(now)
            assert (len(real), real.evicted) == (model.size(), model.evicted), seed
