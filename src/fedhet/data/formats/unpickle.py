"""A restricted unpickler for official pickles (CIFAR python batches): numpy arrays and builtins only."""

from __future__ import annotations

import builtins
import codecs
import functools
import importlib
import io
import pickle
import struct
from typing import IO, Any

import numpy as np

from fedhet.errors import DataError

_BUILTIN_NAMES = (
    "dict",
    "list",
    "tuple",
    "set",
    "frozenset",
    "bytes",
    "bytearray",
    "str",
    "int",
    "float",
    "complex",
    "bool",
)


def _numpy_core(module: str, name: str) -> Any:
    """numpy >= 2 keeps its internals in numpy._core; numpy 1.x in numpy.core."""
    try:
        return getattr(importlib.import_module(f"numpy._core.{module}"), name)
    except ImportError:
        return getattr(importlib.import_module(f"numpy.core.{module}"), name)


def _latin1_encode(text: str, encoding: str = "latin1") -> bytes:
    # Python 3 pickles bytes at protocol <= 2 as _codecs.encode(str, 'latin1'); other codecs are refused.
    if encoding not in ("latin1", "latin-1") or not isinstance(text, str):
        raise DataError(
            f"refused _codecs.encode with encoding {encoding!r}: only latin1 appears in array pickles"
        )
    return codecs.encode(text, "latin1")


@functools.cache
def _allowed_globals() -> dict[tuple[str, str], Any]:
    """(module, name) -> object for every global a pickle may reference; py2 pickles say __builtin__."""
    allowed: dict[tuple[str, str], Any] = {
        ("numpy", "ndarray"): np.ndarray,
        ("numpy", "dtype"): np.dtype,
        ("_codecs", "encode"): _latin1_encode,
    }
    for prefix in ("numpy.core", "numpy._core"):
        allowed[(f"{prefix}.multiarray", "_reconstruct")] = _numpy_core("multiarray", "_reconstruct")
        allowed[(f"{prefix}.multiarray", "scalar")] = _numpy_core("multiarray", "scalar")
        allowed[(f"{prefix}.numeric", "_frombuffer")] = _numpy_core("numeric", "_frombuffer")
    for module in ("builtins", "__builtin__"):
        for name in _BUILTIN_NAMES:
            allowed[(module, name)] = getattr(builtins, name)
    return allowed


class _RestrictedUnpickler(pickle.Unpickler):
    """Admits only numpy arrays, dtypes, numpy scalars and builtin containers; any other global is refused."""

    def __init__(self, file: IO[bytes], source: str) -> None:
        super().__init__(file, encoding="bytes")
        self._source = source

    def find_class(self, module: str, name: str) -> Any:
        found = _allowed_globals().get((module, name))
        if found is None:
            raise DataError(
                f"{self._source}: refused to unpickle: the pickle references {module}.{name}, but only numpy "
                "arrays/dtypes and builtin containers (dict, list, bytes, str, int, ...) are admitted; an "
                "official CIFAR batch holds nothing else, so this file is not one; nothing was executed"
            )
        return found

    def persistent_load(self, pid: Any) -> Any:
        raise DataError(f"{self._source}: refused to unpickle: the pickle uses persistent ids")


def restricted_loads(data: bytes, source: str = "<pickle>") -> Any:
    """Unpickle bytes admitting only numpy arrays/dtypes and builtins (DESIGN.md: no arbitrary pickles).

    Anything else (a class instance, os.system, builtins.eval, ...) raises DataError before it is called.
    """
    try:
        return _RestrictedUnpickler(io.BytesIO(data), source).load()
    except DataError:
        raise
    except (
        pickle.UnpicklingError,
        EOFError,
        ValueError,
        TypeError,
        AttributeError,
        IndexError,
        KeyError,
        struct.error,
        MemoryError,
        RecursionError,
    ) as err:
        raise DataError(
            f"{source}: not a readable pickle ({type(err).__name__}: {err}); the file is truncated or "
            "corrupted: download it again"
        ) from err
