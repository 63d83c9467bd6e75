"""What a Flower deployment's ClientApp process imports: a SuperNode starts one for every message
(docs/flower.md, "Warm nodes"), so a module the node does not need costs every node every round."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("flwr", reason="the Flower tests need fedhet[flower]; make setup installs it")

ROOT = Path(__file__).resolve().parents[1]


def test_the_example_apps_client_side_does_not_import_flowers_superlink():
    # flwr-clientapp imports app.py, which builds the ServerApp too: the server module must not pull in
    # Flower's SuperLink grid (its state database, 1.4 s of a 4.8 s import measured here) at import time
    probe = (
        "import sys; sys.path.insert(0, 'examples/flower-app'); import app; "
        "print(sorted(m for m in sys.modules if m.startswith('flwr.superlink')))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]"
