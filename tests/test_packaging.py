"""The wheel: built from the repository, installed (not editable) into a fresh environment, it runs the
shipped experiments and tables by name from outside the source tree."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def sh(*argv: str | Path, cwd: Path, env: dict[str, str] | None = None, timeout: int = 300) -> str:
    done = subprocess.run(
        [str(a) for a in argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )
    assert done.returncode == 0, f"{argv}\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    return done.stdout


@pytest.mark.slow
def test_the_wheel_installed_in_a_fresh_environment_runs_named_experiments(tmp_path):
    # 1. Build the wheel with this environment's setuptools (no network: --no-build-isolation).
    dist = tmp_path / "dist"
    sh(sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", dist, ROOT,
       cwd=tmp_path)  # fmt: skip
    [wheel] = dist.glob("fedhet-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "fedhet/configs/celm/fmnist-maverick.toml" in names  # the experiments ship as package data
    assert "fedhet/configs/reproduce/celm-table2-maverick.toml" in names
    assert not [n for n in names if n.startswith(("tests/", "configs/"))]

    # 2. A fresh environment without fedhet: its dependencies come from this one's site-packages through a
    # path entry (a .pth line adds a directory, not the .pth files in it, so the editable fedhet is absent).
    venv = tmp_path / "venv"
    sh(sys.executable, "-m", "venv", "--without-pip", venv, cwd=tmp_path)
    python = venv / "bin" / "python"
    site = Path(
        sh(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])", cwd=tmp_path).strip()
    )
    (site / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["FEDHET_CACHE"] = str(tmp_path / "cache")
    probe = subprocess.run([python, "-c", "import fedhet"], cwd=tmp_path, env=env, capture_output=True)
    assert probe.returncode != 0  # fedhet is not importable before the wheel is installed

    # 3. Install the wheel (not editable) and use it from a directory outside the repository.
    sh(sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "-q", wheel, cwd=tmp_path)
    where = sh(python, "-c", "import fedhet; print(fedhet.__file__)", cwd=tmp_path, env=env)
    assert where.startswith(str(site)), where
    tables = sh(venv / "bin" / "fedhet", "reproduce", "--list", cwd=tmp_path, env=env)
    assert "celm-table2-maverick" in tables
    listed = sh(python, "-m", "fedhet", "experiments", cwd=tmp_path, env=env)
    assert "celm/fmnist-maverick" in listed
    run_dir = tmp_path / "run"
    sh(venv / "bin" / "fedhet", "run", "celm/fmnist-maverick", "--rounds", "2", "--quiet", "--out", run_dir,
       "--set", "data.max_train_samples=3000", "--set", "data.max_test_samples=1000",
       cwd=tmp_path, env=env)  # fmt: skip
    assert (run_dir / "summary.json").is_file()
