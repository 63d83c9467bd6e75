"""Checkpoints without pickle: tensors in safetensors, everything else in JSON.

A checkpoint is a directory ``checkpoints/round_NNNNN/`` holding ``tensors.safetensors`` and ``state.json``.
Any nested structure of dicts (string keys), lists, tensors, numpy arrays and JSON scalars round-trips:
tensors are stored under their path in the structure and replaced in the JSON by a reference.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from fedhet.errors import CheckpointError

FORMAT_VERSION = 1
TENSOR_FILE = "tensors.safetensors"
STATE_FILE = "state.json"


def _flatten(obj: Any, path: str, tensors: dict[str, torch.Tensor]) -> Any:
    if isinstance(obj, torch.Tensor):
        tensors[path] = obj.detach().cpu().contiguous().clone()
        return {"__tensor__": path}
    if isinstance(obj, np.ndarray):
        tensors[path] = torch.from_numpy(np.ascontiguousarray(obj).copy())
        return {"__ndarray__": path}
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, dict):
        out = {}
        for k, v in obj.items():
            if not isinstance(k, str):
                raise CheckpointError(f"checkpoint keys must be strings; got {k!r} at {path or '/'}")
            out[k] = _flatten(v, f"{path}/{k}", tensors)
        return out
    if isinstance(obj, list | tuple):
        return [_flatten(v, f"{path}/{i}", tensors) for i, v in enumerate(obj)]
    if obj is None or isinstance(obj, bool | int | float | str):
        return obj
    raise CheckpointError(
        f"cannot checkpoint a {type(obj).__name__} at {path or '/'}; use tensors or JSON values"
    )


def _unflatten(obj: Any, tensors: dict[str, torch.Tensor]) -> Any:
    if isinstance(obj, dict):
        if set(obj) == {"__tensor__"}:
            return tensors[obj["__tensor__"]]
        if set(obj) == {"__ndarray__"}:
            return tensors[obj["__ndarray__"]].numpy()
        return {k: _unflatten(v, tensors) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_unflatten(v, tensors) for v in obj]
    return obj


def save_checkpoint(directory: str | os.PathLike, state: dict[str, Any]) -> Path:
    """Write ``state`` atomically into ``directory`` (a temporary sibling is renamed into place)."""
    target = Path(directory)
    tmp = target.with_name(target.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    tensors: dict[str, torch.Tensor] = {}
    meta = _flatten(state, "", tensors)
    save_file(tensors, str(tmp / TENSOR_FILE))
    # Checksums of both files' contents: a checkpoint that was torn or altered on disk is refused on load.
    record = {
        "format": FORMAT_VERSION,
        "state": meta,
        "state_sha256": _digest(json.dumps(meta, sort_keys=True)),
    }
    record["tensors_sha256"] = _file_digest(tmp / TENSOR_FILE)
    (tmp / STATE_FILE).write_text(json.dumps(record))
    if target.exists():
        shutil.rmtree(target)
    tmp.rename(target)
    return target


def load_checkpoint(directory: str | os.PathLike) -> dict[str, Any]:
    """Read a checkpoint written by :func:`save_checkpoint`."""
    d = Path(directory)
    if not (d / STATE_FILE).is_file() or not (d / TENSOR_FILE).is_file():
        raise CheckpointError(f"{d} is not a fedhet checkpoint (needs {STATE_FILE} and {TENSOR_FILE})")
    try:
        meta = json.loads((d / STATE_FILE).read_text())
        if meta.get("format") != FORMAT_VERSION:
            raise CheckpointError(
                f"{d} has checkpoint format {meta.get('format')}, this fedhet reads {FORMAT_VERSION}"
            )
        # Checkpoints written before checksums existed carry none and are read as they are.
        if "tensors_sha256" in meta and _file_digest(d / TENSOR_FILE) != meta["tensors_sha256"]:
            raise CheckpointError(f"{d / TENSOR_FILE} does not match its checksum (torn or altered)")
        if (
            "state_sha256" in meta
            and _digest(json.dumps(meta["state"], sort_keys=True)) != meta["state_sha256"]
        ):
            raise CheckpointError(f"{d / STATE_FILE} does not match its checksum (altered)")
        tensors = load_file(str(d / TENSOR_FILE))
    except (OSError, ValueError, KeyError, json.JSONDecodeError) as exc:
        raise CheckpointError(
            f"cannot read checkpoint {d}: {exc}; delete it to resume from an earlier one"
        ) from exc
    return _unflatten(meta["state"], tensors)


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _file_digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def checkpoints(run_dir: str | os.PathLike) -> list[Path]:
    """The complete checkpoints of a run directory, newest first."""
    root = Path(run_dir) / "checkpoints"
    if not root.is_dir():
        return []
    done = sorted(
        p
        for p in root.glob("round_*")
        if p.is_dir() and not p.name.endswith(".tmp") and (p / STATE_FILE).is_file()
    )
    return done[::-1]


def latest_checkpoint(run_dir: str | os.PathLike) -> Path | None:
    """The newest complete checkpoint of a run directory, or None."""
    found = checkpoints(run_dir)
    return found[0] if found else None


def checkpoint_dir(run_dir: str | os.PathLike, rnd: int) -> Path:
    return Path(run_dir) / "checkpoints" / f"round_{rnd:05d}"


def prune_checkpoints(run_dir: str | os.PathLike, keep: int = 2) -> None:
    """Keep only the newest ``keep`` checkpoints (disk stays bounded on long runs)."""
    root = Path(run_dir) / "checkpoints"
    if not root.is_dir():
        return
    done = sorted(p for p in root.glob("round_*") if p.is_dir() and not p.name.endswith(".tmp"))
    for p in done[:-keep]:
        shutil.rmtree(p, ignore_errors=True)
