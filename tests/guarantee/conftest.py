"""Guaranteed topics in real router processes (qrouter/guarantee.py, docs/exactly-once.md)."""

from __future__ import annotations

from tests.tools_alias import alias_tools_package

alias_tools_package()  # the management client of qrouter-tool reads the routers' records
