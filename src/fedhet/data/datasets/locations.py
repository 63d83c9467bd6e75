"""Where each data set may lie: --data-root, $FEDHET_DATA and the known locations (see the package
docstring for the order), and the error that names every place looked in.
"""

from __future__ import annotations

import os
from pathlib import Path

from fedhet.data.datasets.catalog import _Layout, _Spec
from fedhet.errors import DataError

# Known locations; module-level so that tests (and packagers) can point them elsewhere.
SYSTEM_FASHION_MNIST_DIR = Path("/usr/share/datasets/fashion-mnist")
REPOSITORY_ROOT = Path(__file__).resolve().parents[4]
SHARED_DATA_DIRS: tuple[Path, ...] = (REPOSITORY_ROOT.parent / "shared" / "data", Path("/work/shared/data"))


def shared_data_file(name: str) -> Path | None:
    """The first ``SHARED_DATA_DIRS / name`` that exists (e.g. ``cifar10-jpg.tar.gz``), or None."""
    return next((d / name for d in SHARED_DATA_DIRS if (d / name).is_file()), None)


def _known_dirs(name: str) -> list[Path]:
    dirs = [SYSTEM_FASHION_MNIST_DIR] if name == "fashion-mnist" else []
    return dirs + list(SHARED_DATA_DIRS)


def _search_dirs(spec: _Spec, root: str | os.PathLike | None) -> list[tuple[Path, str]]:
    """(directory, why it is searched) in lookup order (see the package docstring), without duplicates."""
    tops: list[tuple[Path, str]] = []
    if root is not None:
        tops.append((Path(root).expanduser(), "--data-root"))
    env = os.environ.get("FEDHET_DATA", "")
    tops.extend((Path(p).expanduser(), "$FEDHET_DATA") for p in env.split(os.pathsep) if p)
    bases: list[tuple[Path, str]] = []
    for top, why in tops:
        bases.extend((top / sub, why) for sub in spec.subdirs)
        bases.append((top, why))
    bases.extend((known, "known location") for known in _known_dirs(spec.name))
    seen: set[str] = set()
    unique = []
    for base, why in bases:
        key = os.path.abspath(base)
        if key not in seen:
            seen.add(key)
            unique.append((Path(key), why))
    return unique


def _locate(
    spec: _Spec, root: str | os.PathLike | None
) -> tuple[Path | None, _Layout | None, list[tuple[Path, str]]]:
    looked = _search_dirs(spec, root)
    for base, _why in looked:
        if not base.is_dir():
            continue
        for layout in spec.layouts:
            found = layout.locate(base)
            if found is not None:
                return found, layout, looked
    return None, None, looked


def _is_under(path: Path, top: Path) -> bool:
    try:
        Path(os.path.abspath(path)).relative_to(os.path.abspath(top))
    except ValueError:
        return False
    return True


def _fix_hint(spec: _Spec) -> str:
    hint = []
    if spec.apt_package:
        hint.append(
            f"apt-get install {spec.apt_package} (Debian/Ubuntu; installs {SYSTEM_FASHION_MNIST_DIR})"
        )
    hint.append(
        f"download from {spec.url} into a directory DIR and pass --data-root DIR (or set FEDHET_DATA=DIR)"
    )
    return "; or ".join(hint)


def _missing_error(spec: _Spec, looked: list[tuple[Path, str]]) -> DataError:
    lines = [f"  - {base} ({why}{'' if base.is_dir() else '; does not exist'})" for base, why in looked]
    if not os.environ.get("FEDHET_DATA"):
        at = next((i for i, (_b, why) in enumerate(looked) if why == "known location"), len(looked))
        lines.insert(at, "  - $FEDHET_DATA (not set)")
    if not any(why == "--data-root" for _b, why in looked):
        lines.insert(0, "  - --data-root (not given)")
    accepted = "; ".join(layout.description for layout in spec.layouts)
    return DataError(
        f"dataset {spec.name!r} not found. Looked in:\n" + "\n".join(lines) + f"\nfor any of: {accepted}.\n"
        f"Fix: {_fix_hint(spec)}."
    )
