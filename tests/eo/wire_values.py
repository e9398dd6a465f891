"""A hypothesis strategy shared by the tests of what routers write to each other: the values
an envelope or a control message can hold (qrouter/_fast/eo_wire.pxi, Mesh.send_eo)."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st


def wire_values(max_bytes: int) -> st.SearchStrategy[Any]:
    """Nested lists and maps of null, booleans, longs, short strings and binaries of at most
    `max_bytes` octets."""
    return st.recursive(
        st.none()
        | st.booleans()
        | st.integers(-(2**63), 2**63 - 1)
        | st.text(max_size=8)
        | st.binary(max_size=max_bytes),
        lambda inner: (
            st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner, max_size=4)
        ),
        max_leaves=20,
    )
