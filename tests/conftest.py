"""Suite-wide numeric environment: torch threads and denormal handling.

Every test runs with one torch thread unless ``FEDHET_TEST_THREADS`` says otherwise; ``make test-numerics``
reruns the numeric-equivalence tests (marker ``numerics``) with two threads, with denormals flushed
(``FEDHET_TEST_FLUSH_DENORMAL=1``) and under other CPU kernels, so a test that holds only on one machine's
kernels fails on the developer's machine rather than on a user's.
"""

from __future__ import annotations

import os

import torch

torch.set_num_threads(int(os.environ.get("FEDHET_TEST_THREADS", "1")))
if os.environ.get("FEDHET_TEST_FLUSH_DENORMAL") == "1":
    torch.set_flush_denormal(True)
