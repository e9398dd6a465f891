"""Run ``qrouter-tool`` from a source checkout: ``python -m tests.management.run_tool ARGS``.

tox installs the real ``qrouter-tool`` command (the ``qrouter_tools`` package); a bare checkout
has only the ``tools`` folder, which this aliases to ``qrouter_tools`` first, as
tests/unit/conftest.py does.
"""

from __future__ import annotations

from tests.tools_alias import alias_tools_package

if __name__ == "__main__":
    alias_tools_package()
    from qrouter_tools.cli import main

    main(prog_name="qrouter-tool")
