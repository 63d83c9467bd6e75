"""Containers: the files of a directory, a zip or a tar(.gz) archive, by posix relative name."""

from __future__ import annotations

import os
import tarfile
import zipfile
import zlib
from collections.abc import Callable, Iterable
from pathlib import Path

from fedhet.errors import DataError


def _is_junk(name: str) -> bool:
    # macOS archive leftovers (__MACOSX/, ._name) and hidden files are never data.
    return any(part.startswith(".") or part == "__MACOSX" for part in name.split("/") if part)


class _Container:
    """The files of a directory, a zip or a tar archive, by posix relative name (only those `want` accepts).

    A tar archive is streamed once and the accepted members are kept in memory (gzip cannot seek cheaply).
    """

    def __init__(self, source: Path, want: Callable[[str], bool], max_depth: int | None = None) -> None:
        self.source = source
        self._zip: zipfile.ZipFile | None = None
        self._data: dict[str, bytes] | None = None

        def accept(name: str) -> bool:
            if _is_junk(name):
                return False
            if max_depth is not None and name.count("/") > max_depth:
                return False
            return want(name)

        if source.is_dir():
            names = []
            for folder, subdirs, files in os.walk(source):
                rel = Path(folder).relative_to(source).as_posix()
                rel = "" if rel == "." else rel + "/"
                if max_depth is not None and rel.count("/") >= max_depth:
                    subdirs[:] = []
                subdirs[:] = [d for d in subdirs if not d.startswith(".")]
                names.extend(rel + f for f in files if accept(rel + f))
            self.names = sorted(names)
        elif not source.exists():
            raise DataError(f"{source}: no such file or directory")
        elif zipfile.is_zipfile(source):
            try:
                self._zip = zipfile.ZipFile(source)
                self.names = sorted(
                    i.filename for i in self._zip.infolist() if not i.is_dir() and accept(i.filename)
                )
            except (zipfile.BadZipFile, OSError) as err:
                raise DataError(f"{source}: corrupted zip archive ({err})") from err
        elif tarfile.is_tarfile(source):
            self._data = {}
            try:
                with tarfile.open(source, mode="r|*") as archive:
                    for member in archive:
                        name = member.name.removeprefix("./")
                        if member.isfile() and accept(name):
                            handle = archive.extractfile(member)
                            assert handle is not None  # a regular file member always has data
                            self._data[name] = handle.read()
            except (tarfile.TarError, EOFError, zlib.error, OSError) as err:
                raise DataError(
                    f"{source}: truncated or corrupted tar archive ({err}); download it again"
                ) from err
            self.names = sorted(self._data)
        else:
            raise DataError(f"{source}: neither a directory, a zip archive nor a tar(.gz) archive")

    def read(self, name: str) -> bytes:
        """The bytes of one member."""
        if self._data is not None:
            return self._data[name]
        if self._zip is not None:
            try:
                return self._zip.read(name)
            except (zipfile.BadZipFile, zlib.error, OSError, EOFError) as err:
                raise DataError(f"{self.source}: cannot read member {name} ({err})") from err
        try:
            return (self.source / name).read_bytes()
        except OSError as err:
            raise DataError(f"{self.source / name}: cannot read ({err})") from err

    def describe(self, name: str) -> str:
        """How to name a member in an error message."""
        return (
            str(self.source / name) if self._data is None and self._zip is None else f"{self.source}!{name}"
        )

    def close(self) -> None:
        """Release the archive and the members kept in memory."""
        if self._zip is not None:
            self._zip.close()
        self._data = None

    def __enter__(self) -> _Container:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _find_prefix(names: Iterable[str], marker: str, source: Path) -> str:
    """The folder ('' or 'top/') holding `marker`: archives often wrap everything in one top folder."""
    prefixes = set()
    for name in names:
        parts = name.split("/")
        if parts[0] == marker and len(parts) > 1:
            prefixes.add("")
        elif len(parts) > 2 and parts[1] == marker:
            prefixes.add(parts[0] + "/")
    if not prefixes:
        raise DataError(
            f"{source}: no {marker}/ folder with images found (expected {marker}/<class>/<image>)"
        )
    if len(prefixes) > 1:
        raise DataError(
            f"{source}: {marker}/ appears under several folders ({sorted(prefixes)}); point at one of them"
        )
    return prefixes.pop()
