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


@pytest.fixture(scope="session")
def cifar10_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A ``$FEDHET_CACHE`` holding CIFAR-10 decoded from the shared JPEG tarball, decoded once per `make test`
    however many workers and tests need it (the decoding takes ~40 s of a 2-core machine's time): the first
    worker to ask decodes under a file lock, the others wait and read. Skips where the tarball is absent."""
    from filelock import FileLock

    from fedhet.data.datasets import load_dataset, locations

    if locations.shared_data_file("cifar10-jpg.tar.gz") is None:
        pytest.skip(f"CIFAR-10 JPEG tarball absent from {[str(d) for d in locations.SHARED_DATA_DIRS]}")
    # every worker's base folder lies in one folder of this `make test`; without workers: the base folder
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base  # (-p no:xdist: no workers)
    cache = shared / "cifar10-cache"
    with FileLock(str(shared / "cifar10-cache.lock")):
        if not (cache / "decoded").exists():
            with pytest.MonkeyPatch.context() as patch:
                patch.setenv("FEDHET_CACHE", str(cache))
                patch.delenv("FEDHET_DATA", raising=False)
                load_dataset("cifar10")
            (cache / "decoded").touch()
    return cache


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


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The slow end-to-end tests (marker ``slow``) first, each group in its file order: `make test` hands
    tests to its two workers in this order, and a minutes-long test handed out last leaves the other worker
    idle until it ends (longest first is the classic rule for sharing jobs between machines)."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)
