"""The store conformance suite (qrouter/stores/conformance.py) on the memory backend."""

from qrouter.stores.conformance import StoreConformance


class TestMemoryStore(StoreConformance):
    backend = "memory"
