"""Run directories: their file names, what a directory holds, a lock while a run writes into it, atomic
writes, and the reading of a run's summary and metrics lines.

This module owns a run directory's vocabulary: the names of its files (:data:`SUMMARY_FILE`,
:data:`METRICS_FILE`, ...), the ``<method>-seed<k>`` naming of the runs of a compare folder
(:func:`run_name`, :func:`finished_runs`) and the readers of what a run wrote (:func:`read_summary`,
:func:`read_metrics`). Every other module names these files through it.

A run directory is in one of four states (:func:`run_dir_state`):

- ``"empty"``: missing, or an empty directory — a run may start there;
- ``"finished"``: a fedhet run with its ``summary.json`` (the summary is written last);
- ``"unfinished"``: a fedhet run without a summary (``config.toml`` or ``metrics.jsonl``): interrupted, or
  running in another process;
- ``"foreign"``: a non-empty directory that is not a fedhet run.

:func:`claim_run_dir` is what a run calls before it writes anything: only an empty directory is taken
without being asked (``resume`` continues an unfinished run, ``overwrite`` replaces whatever is there), and
a directory another process is running in is refused. :class:`RunDirLock` holds an exclusive ``flock`` on
``.fedhet.lock`` (with the owner's pid inside, for the error message) for as long as the run writes; the
kernel releases it when the process dies, so a crashed run never leaves a stale lock. The (empty) file
itself stays in the directory, except where the lock created the directory and the run wrote nothing
there (it failed first, on a bad config say): then the lock file and the folders the lock created go, so
a failed run leaves no empty run folder behind (:meth:`RunDirLock.release`).
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import shutil
from pathlib import Path
from typing import IO, Any

from fedhet.errors import RunDirectoryError, option

log = logging.getLogger("fedhet")

LOCK_FILE = ".fedhet.lock"
#: The run's summary (final, best and last-rounds metrics, contributions, provenance); written last.
SUMMARY_FILE = "summary.json"
#: One strict-JSON line per round (bit-identical for one config and seed on one machine).
METRICS_FILE = "metrics.jsonl"
#: Seconds per round, one JSON line per round (kept apart from the metrics, which do not vary).
TIMINGS_FILE = "timings.jsonl"
#: The resolved config the run ran with.
CONFIG_FILE = "config.toml"
#: Each client's sample and class counts, the class names and the split's info.
PARTITION_FILE = "partition.json"
#: The method's records (``Strategy.run_records``), read by the report layer.
RECORDS_FILE = "records.json"
#: A Flower run's nodes: each client's Flower node and the nodes refused (written once they described
#: themselves); its presence marks a run folder as a Flower run's, which only Flower can resume.
FLOWER_NODES_FILE = "flower_nodes.json"
#: The files whose presence makes a directory a fedhet run (written at the start of every run).
RUN_MARKERS = (CONFIG_FILE, METRICS_FILE)


def run_name(method: str, seed: object) -> str:
    """The folder of one run in a compare folder: ``<method>-seed<k>`` (``seed`` may be ``"{seed}"``)."""
    return f"{method}-seed{seed}"


def is_finished(run_dir: Path) -> bool:
    """Whether ``run_dir`` holds a finished run (its summary, written last, exists)."""
    return (Path(run_dir) / SUMMARY_FILE).is_file()


def finished_runs(directory: Path, method: str) -> list[Path]:
    """The finished runs ``<method>-seed<k>`` of a compare folder, in seed order (sorted by name)."""
    directory = Path(directory)
    runs = directory.glob(run_name(method, "*")) if directory.is_dir() else []
    return sorted((p for p in runs if is_finished(p)), key=lambda p: p.name)


def read_summary(run_dir: Path) -> dict[str, Any]:
    """A run's summary (raises :class:`FileNotFoundError` when the run has none)."""
    return json.loads((Path(run_dir) / SUMMARY_FILE).read_text())


def read_json_lines(path: Path, *, missing_ok: bool = False, drop_torn: bool = False) -> list[Any]:
    """The values of a JSON-lines file, one per non-empty line.

    ``missing_ok``: a missing file reads as no lines (else :class:`FileNotFoundError`). ``drop_torn``: a line
    that does not parse (a write torn by a kill) is dropped with a warning (else the error is raised)."""
    path = Path(path)
    if missing_ok and not path.is_file():
        return []
    values: list[Any] = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            values.append(json.loads(line))
        except json.JSONDecodeError:
            if not drop_torn:
                raise
            log.warning("%s line %d is torn (not JSON): dropped", path, number)
    return values


def read_metrics(run_dir: Path, *, missing_ok: bool = False, drop_torn: bool = False) -> list[dict[str, Any]]:
    """A run's metrics lines, in round order (the options as in :func:`read_json_lines`)."""
    return read_json_lines(Path(run_dir) / METRICS_FILE, missing_ok=missing_ok, drop_torn=drop_torn)


def run_dir_state(run_dir: Path) -> str:
    """``"empty"``, ``"finished"``, ``"unfinished"`` or ``"foreign"`` (see the module docstring)."""
    if not run_dir.exists():
        return "empty"
    if not run_dir.is_dir():
        return "foreign"
    entries = [p for p in run_dir.iterdir() if p.name != LOCK_FILE]
    if not entries:
        return "empty"
    if is_finished(run_dir):
        return "finished"
    if any((run_dir / m).is_file() for m in RUN_MARKERS):
        return "unfinished"
    return "foreign"


def make_dirs(path: Path) -> list[Path]:
    """Create ``path`` and its missing parents; returns the folders this call created, deepest first (a
    folder another process created meanwhile is not among them)."""
    path = Path(path)
    missing = []
    folder = path
    while not folder.exists() and folder != folder.parent:
        missing.append(folder)
        folder = folder.parent
    created = []
    for folder in reversed(missing):
        try:
            folder.mkdir()
        except FileExistsError:
            continue
        created.append(folder)
    path.mkdir(parents=True, exist_ok=True)  # raises what mkdir raises if path still is no folder
    return created[::-1]


def remove_empty_dirs(folders: list[Path]) -> None:
    """Remove ``folders`` (deepest first) while each is empty; stop at the first that holds anything."""
    for folder in folders:
        try:
            folder.rmdir()
        except OSError:  # not empty (or gone): it and the folders above it stay
            return


class RunDirLock:
    """An exclusive lock on a run directory for the lifetime of a run (``with RunDirLock(d): ...``)."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / LOCK_FILE
        self._fh: IO[str] | None = None
        self._created: list[Path] = []  # the folders acquire() created, deepest first

    def acquire(self) -> RunDirLock:
        self._created = make_dirs(self.run_dir)
        while True:
            try:
                fh = open(self.path, "a+")  # noqa: SIM115 - held open for the lock's lifetime
            except FileNotFoundError:  # a failed run removed the folder it had created: create it again
                self._created = make_dirs(self.run_dir)
                continue
            try:
                fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                fh.seek(0)
                owner = fh.read().strip() or "unknown"
                fh.close()
                raise RunDirectoryError(in_use_message(self.run_dir, owner)) from None
            if _same_file(fh, self.path):
                break
            # The file was unlinked (by a failed run that removed its folder) between our open and our lock:
            # a lock on it would lock nothing another process could see. Open the name again.
            fh.close()
        fh.seek(0)
        fh.truncate()
        fh.write(f"{os.getpid()}\n")
        fh.flush()
        self._fh = fh
        return self

    def release(self) -> None:
        if self._fh is None:
            return
        if self._created and [p.name for p in self.run_dir.iterdir()] == [LOCK_FILE]:
            # This lock created the folder and the run wrote nothing there (it failed first): the lock file
            # and the folders go, still under the lock (a process that opened the file meanwhile sees it
            # unlinked once it holds the lock, and opens the name again: acquire).
            self.path.unlink()
            remove_empty_dirs(self._created)
        else:
            # The file stays: unlinking it would let a process that opened it before the unlink lock a file
            # that no longer has the name, while a third one locks a new file of that name. Its pid goes: a
            # finished run names no owner.
            self._fh.seek(0)
            self._fh.truncate()
            self._fh.flush()
        fcntl.flock(self._fh.fileno(), fcntl.LOCK_UN)
        self._fh.close()
        self._fh = None

    def __enter__(self) -> RunDirLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def _same_file(fh: IO[str], path: Path) -> bool:
    """Whether the open file ``fh`` is the file named ``path`` now (not unlinked nor replaced)."""
    try:
        named = os.stat(path)
    except FileNotFoundError:
        return False
    held = os.fstat(fh.fileno())
    return (named.st_dev, named.st_ino) == (held.st_dev, held.st_ino)


def in_use_message(run_dir: Path, pid: object) -> str:
    """The error for a directory a live run is writing to."""
    return (
        f"run directory {run_dir} is in use by pid {pid} (a run is writing there); wait for it, or choose "
        f"another {option('out')}"
    )


def live_owner(run_dir: Path) -> int | None:
    """The pid of another live process holding ``run_dir``'s lock (a run writing there), or None.

    The lock file names the pid that took it; the pid is taken as the owner only while that process is alive
    and the lock is held (a probe with a shared lock, released at once), so neither a crashed run's pid nor a
    reused pid reads as a live run."""
    path = Path(run_dir) / LOCK_FILE
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    if not text.isdigit() or int(text) == os.getpid():
        return None
    pid = int(text)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:  # alive, another user's
        pass
    try:
        with open(path) as fh:
            try:
                fcntl.flock(fh.fileno(), fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                return pid
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)
    except OSError:
        return None
    return None


def check_run_dir(run_dir: Path, *, resume: bool = False, overwrite: bool = False) -> str:
    """Refuse a directory whose contents a run would lose (see the module docstring); returns its state.

    Cheap and lock-free, so a command can call it before any work; :func:`claim_run_dir` checks again.
    """
    run_dir = Path(run_dir)
    if run_dir.exists() and not run_dir.is_dir():
        raise RunDirectoryError(f"run directory {run_dir} is a file; pass a directory (created if missing)")
    state = run_dir_state(run_dir)
    owner = live_owner(run_dir) if run_dir.is_dir() else None
    if owner is not None:  # neither --resume nor --overwrite may take a directory a live run writes to
        raise RunDirectoryError(in_use_message(run_dir, owner))
    if overwrite or state == "empty":
        return state
    out = option("out")
    if state == "finished" and not resume:
        raise RunDirectoryError(
            f"run directory {run_dir} holds a finished run ({SUMMARY_FILE}); pass {option('overwrite')} to "
            f"replace it, or choose another {out}"
        )
    if state == "unfinished" and not resume:
        raise RunDirectoryError(
            f"run directory {run_dir} holds an unfinished run (interrupted or crashed: no process writes "
            f"there); pass {option('resume', run_dir)} to continue it, {option('overwrite')} to start it "
            f"again, or choose another {out}"
        )
    if state == "foreign":
        raise RunDirectoryError(
            f"run directory {run_dir} is not empty and holds no fedhet run; pass {option('overwrite')} to "
            f"empty it (its files are deleted), or choose another {out}"
        )
    return state


def claim_run_dir(run_dir: Path, *, resume: bool = False, overwrite: bool = False) -> RunDirLock:
    """Lock ``run_dir`` for a run, refusing what would lose data (:func:`check_run_dir`); returns the lock.

    ``overwrite`` empties the directory first (after the lock is held, so never under a live run).
    """
    run_dir = Path(run_dir)
    check_run_dir(run_dir, resume=resume, overwrite=overwrite)
    lock = RunDirLock(run_dir).acquire()
    try:
        state = check_run_dir(run_dir, resume=resume, overwrite=overwrite)  # again, now under the lock
        if overwrite and state != "empty":
            for entry in run_dir.iterdir():
                if entry.name == LOCK_FILE:
                    continue
                shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink()
    except BaseException:
        lock.release()
        raise
    return lock


def write_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` so that a reader sees the old file or the new one, never a torn one."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
