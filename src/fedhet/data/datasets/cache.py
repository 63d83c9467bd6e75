"""The cache of decoded image folders: .npy files under $FEDHET_CACHE/datasets/, keyed by the source's
absolute path, size and mtime, written atomically; safe to delete.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np

from fedhet.data import formats
from fedhet.data.datasets.catalog import _Layout

# The package's logger: a log line names fedhet.data.datasets whichever of its modules writes it.
log = logging.getLogger("fedhet.data.datasets")

CACHE_FORMAT_VERSION = 1
_CACHE_KEYS = ("train_x", "train_y", "test_x", "test_y")


def cache_root() -> Path:
    """$FEDHET_CACHE, or ~/.cache/fedhet; decoded data sets live in its datasets/ folder (safe to delete)."""
    return Path(os.environ.get("FEDHET_CACHE") or Path.home() / ".cache" / "fedhet").expanduser()


def _fingerprint(path: Path) -> dict:
    if path.is_file():
        stat = path.stat()
        return {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns}
    # A directory's own mtime misses edits deeper down: summarise every file below it.
    count = size = newest = 0
    for folder, _subdirs, files in os.walk(path):
        newest = max(newest, os.stat(folder).st_mtime_ns)
        for name in files:
            stat = os.stat(os.path.join(folder, name))
            count, size, newest = count + 1, size + stat.st_size, max(newest, stat.st_mtime_ns)
    return {"files": count, "size": size, "mtime_ns": newest}


def _cache_entry(name: str, source: Path) -> tuple[Path, dict]:
    key = {
        "dataset": name,
        "source": os.path.abspath(source),
        "fingerprint": _fingerprint(source),
        "version": CACHE_FORMAT_VERSION,
    }
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:24]
    return cache_root() / "datasets" / f"{name}-{digest}", key


def _read_cache(entry: Path) -> formats.Arrays | None:
    if not entry.is_dir():
        return None
    try:
        meta = json.loads((entry / "meta.json").read_text())
        parts = {k: np.load(entry / f"{k}.npy", allow_pickle=False) for k in _CACHE_KEYS}
        ok = (
            parts["train_x"].dtype == np.uint8
            and parts["test_x"].dtype == np.uint8
            and parts["train_y"].dtype == np.int64
            and parts["test_y"].dtype == np.int64
            and len(parts["train_x"]) == len(parts["train_y"])
            and len(parts["test_x"]) == len(parts["test_y"])
        )
        if not ok:
            raise ValueError("arrays have unexpected dtypes or lengths")
        classes = tuple(meta["classes"]) if meta.get("classes") is not None else None
    except (OSError, ValueError, EOFError, KeyError, TypeError) as err:
        log.warning("ignoring unreadable cache entry %s (%s); decoding the source again", entry, err)
        shutil.rmtree(entry, ignore_errors=True)
        return None
    return formats.Arrays(**parts, classes=classes)


def _write_cache(entry: Path, arrays: formats.Arrays, key: dict) -> None:
    """Write all arrays into a temporary folder, then rename it into place (atomic on one file system)."""
    tmp: Path | None = None
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{entry.name}.", suffix=".tmp", dir=entry.parent))
        for k in _CACHE_KEYS:
            np.save(tmp / f"{k}.npy", getattr(arrays, k), allow_pickle=False)
        meta = {**key, "classes": list(arrays.classes) if arrays.classes is not None else None}
        (tmp / "meta.json").write_text(json.dumps(meta, indent=1))
        os.rename(tmp, entry)
    except OSError as err:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        if not entry.is_dir():  # else a concurrent load wrote the same entry first
            log.warning("could not write the dataset cache %s (%s); the next load decodes again", entry, err)


def _read_with_cache(name: str, location: Path, layout: _Layout, cache: bool) -> formats.Arrays:
    if not (cache and layout.decodes_images):
        return layout.read(location)
    entry, key = _cache_entry(name, location)
    arrays = _read_cache(entry)
    if arrays is not None:
        log.info("loaded %s from the cache %s", name, entry)
        return arrays
    log.info("decoding %s from %s (cached afterwards under %s)", name, location, entry)
    arrays = layout.read(location)
    _write_cache(entry, arrays, key)
    return arrays
