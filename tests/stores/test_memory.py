"""The store conformance suite (stores/conformance.py) on the memory backend."""

from stores.conformance import StoreConformance


class TestMemoryStore(StoreConformance):
    backend = "memory"
