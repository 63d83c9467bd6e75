"""``python -m fedhet.cli``: the ``fedhet`` command."""

from fedhet.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
