"""Suite-wide numeric environment: torch threads and denormal handling.

Every test runs with one torch thread unless ``FEDHET_TEST_THREADS`` says otherwise; ``make test-numerics``
reruns the numeric-equivalence tests (marker ``numerics``) with two threads, with denormals flushed
(``FEDHET_TEST_FLUSH_DENORMAL=1``) and under other CPU kernels, so a test that holds only on one machine's
kernels fails on the developer's machine rather than on a user's.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

torch.set_num_threads(int(os.environ.get("FEDHET_TEST_THREADS", "1")))
if os.environ.get("FEDHET_TEST_FLUSH_DENORMAL") == "1":
    torch.set_flush_denormal(True)


@pytest.fixture(scope="session")
def every_method_run(tmp_path_factory: pytest.TempPathFactory) -> subprocess.CompletedProcess:
    """tests/every_method_digits.py run once per session in a subprocess (a native crash fails a test, not the
    run): every method and the FedAvg variants, 2 rounds on digits, ~20 s. Read by the crash test and by the
    golden runs of the results versions."""
    tmp = tmp_path_factory.mktemp("every-method")
    env = {**os.environ, "FEDHET_CACHE": str(tmp / "cache"), "PYTHONFAULTHANDLER": "1"}
    script = Path(__file__).parent / "every_method_digits.py"
    return subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=900, env=env, cwd=tmp
    )


@pytest.fixture
def forget_registrations(monkeypatch: pytest.MonkeyPatch) -> None:
    """Methods, models and attacks a test registers are forgotten after it: other tests in the same worker
    list the registered names (the every-method run, the accepted-names errors)."""
    import fedhet.algorithms as algorithms
    import fedhet.attacks as attacks
    import fedhet.models.registry as models

    monkeypatch.setattr(algorithms, "_REGISTERED", dict(algorithms._REGISTERED))
    monkeypatch.setattr(attacks, "_REGISTERED", dict(attacks._REGISTERED))
    monkeypatch.setattr(models, "MODELS", dict(models.MODELS))
    monkeypatch.setattr(models, "USER_MODELS", set(models.USER_MODELS))
