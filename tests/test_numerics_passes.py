"""The numeric-equivalence tests (marker ``numerics``: two implementations within a justified tolerance,
or one code path run twice bit for bit) once more under other CPU kernels, thread counts and denormal
handling, so a test that holds only on one CPU's default kernels fails on the developer's machine, not on a
user's.

Each pass is a pytest process of its own (kernels are chosen when torch loads) collecting only the files
that hold such tests. They run inside the suite rather than after it so that `make test`'s two workers share
them with the tests that mostly wait (servers, Ray, subprocesses): the same work in less wall time."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
MARKER = "mark." + "numerics"  # spelled in two parts: this file must not select itself
PASSES = {
    "default-kernels": {"ATEN_CPU_CAPABILITY": "default"},
    "two-threads": {"FEDHET_TEST_THREADS": "2", "OMP_NUM_THREADS": "2"},
    "flushed-denormals": {"FEDHET_TEST_FLUSH_DENORMAL": "1"},
    "avx2": {
        "ATEN_CPU_CAPABILITY": "avx2",
        "ONEDNN_MAX_CPU_ISA": "AVX2",
        "MKL_ENABLE_INSTRUCTIONS": "AVX2",
        "MKL_CBWR": "COMPATIBLE",
    },
}


def numerics_files() -> list[str]:
    return sorted(str(p) for p in TESTS.glob("test_*.py") if MARKER in p.read_text())


@pytest.mark.slow
@pytest.mark.parametrize("name", list(PASSES))
def test_the_numeric_equivalence_tests_hold_under(name):
    files = numerics_files()
    assert len(files) >= 5, files  # the suite's numeric tests were found (a dozen files hold them)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "FEDHET_TEST_"))}
    command = [sys.executable, "-m", "pytest", *files, "-m", "numerics", "-p", "no:cacheprovider"]
    done = subprocess.run(
        command, capture_output=True, text=True, env={**env, **PASSES[name]}, timeout=600, cwd=TESTS.parent
    )
    summary = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
    assert done.returncode == 0 and " passed" in summary, done.stdout[-6000:] + done.stderr[-3000:]
