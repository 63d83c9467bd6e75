"""Where a number was measured: the machine and the commit, for result pages and the benchmark page.

The commit is read by ``fedhet.code_version`` (below the engine, which records it in every summary); it is
named here too, next to the machine, for the pages that cite both."""

from __future__ import annotations

import os
import platform
from pathlib import Path

from fedhet.code_version import commit

__all__ = ["commit", "machine", "machine_line"]


def machine() -> dict[str, str]:
    """CPU model, cores available to this process, memory, GPU, Python, torch and OS, as short strings."""
    cpu = platform.processor() or "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    memory = "unknown"
    try:
        kib = int(Path("/proc/meminfo").read_text().split()[1])
        memory = f"{kib / 1024**2:.1f} GiB"
    except (OSError, ValueError, IndexError):
        pass
    try:
        import torch

        torch_version = torch.__version__
        gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"
    except ImportError:
        torch_version, gpu = "not installed", "none"
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {
        "CPU": cpu,
        "cores available": str(cores),
        "memory": memory,
        "GPU": gpu,
        "Python": platform.python_version(),
        "torch": torch_version,
        "OS": f"{platform.system()} {platform.release()}",
    }


def machine_line() -> str:
    m = machine()
    return (
        f"{m['CPU']}, {m['cores available']} cores, {m['memory']}, GPU {m['GPU']}, Python {m['Python']}, "
        f"torch {m['torch']}"
    )
