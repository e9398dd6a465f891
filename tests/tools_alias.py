"""Make ``qrouter_tools`` importable from a source checkout: the package is the ``tools``
folder, installed under that name by ``pip install .`` (tox does), but a bare checkout has only
the folder. Used by the conftests that need qrouter-tool's code and by run_tool.py."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


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
