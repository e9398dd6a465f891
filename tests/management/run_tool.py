"""Run ``qrouter-tool`` from a source checkout: ``python -m tests.management.run_tool ARGS``.

tox installs the real ``qrouter-tool`` command (the ``qrouter_tools`` package); a bare checkout
has only the ``tools`` folder, which this aliases to ``qrouter_tools`` first, as
tests/unit/conftest.py does.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def alias_tools_package() -> None:
    if importlib.util.find_spec("qrouter_tools") is not None:
        return
    spec = importlib.util.spec_from_file_location(
        "qrouter_tools",
        REPO / "tools" / "__init__.py",
        submodule_search_locations=[str(REPO / "tools")],
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["qrouter_tools"] = module
    spec.loader.exec_module(module)


if __name__ == "__main__":
    alias_tools_package()
    from qrouter_tools.cli import main

    main(prog_name="qrouter-tool")
