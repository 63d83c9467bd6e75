"""``python -m fedhet``: the ``fedhet`` command."""

from fedhet.cli import main

raise SystemExit(main())
