"""Cython wire engine: codec, framing, links, credit, deliveries, forwarding."""
