"""``python -m qrouter``: the same as the ``qrouter`` command."""

from qrouter.cli import main

if __name__ == "__main__":
    main(prog_name="qrouter")
