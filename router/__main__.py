"""``python -m router``: the same as the ``qrouter`` command."""

from router.cli import main

if __name__ == "__main__":
    main(prog_name="qrouter")
