"""Run directories: refused when a run would lose data, locked while a run writes, written atomically."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time

import pytest

from fedhet.cli import main
from fedhet.engine.rundir import (
    LOCK_FILE,
    RunDirLock,
    check_run_dir,
    claim_run_dir,
    finished_runs,
    read_metrics,
    read_summary,
    run_dir_state,
    run_name,
    write_atomic,
)
from fedhet.errors import CALLER, RunDirectoryError

RUN = ["run", "--method", "fedavg", "--dataset", "digits", "--clients", "2", "--rounds", "1", "--quiet"]
RUN += ["--set", "eval.fairness=false"]


@pytest.fixture(autouse=True)
def _tmp_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDHET_CACHE", str(tmp_path / "cache"))


def test_states_and_what_each_needs(tmp_path):
    d = tmp_path / "r"
    assert run_dir_state(d) == "empty"
    d.mkdir()
    assert run_dir_state(d) == "empty" and check_run_dir(d) == "empty"
    (d / "notes.txt").write_text("mine")
    assert run_dir_state(d) == "foreign"
    with pytest.raises(RunDirectoryError, match="holds no fedhet run; pass overwrite=True"):
        check_run_dir(d, resume=True)  # resuming does not make someone else's files a run
    (d / "metrics.jsonl").write_text("")
    assert run_dir_state(d) == "unfinished"
    with pytest.raises(RunDirectoryError, match=r"holds an unfinished run .*; pass resume=True \(with out="):
        check_run_dir(d)  # from Python, advice in keyword arguments
    token = CALLER.set("cli")
    try:
        with pytest.raises(
            RunDirectoryError, match=f"holds an unfinished run .*; pass --resume {d} .*--overwrite"
        ):
            check_run_dir(d)  # on the command line, in flags
    finally:
        CALLER.reset(token)
    token = CALLER.set("flower")
    try:
        with pytest.raises(
            RunDirectoryError,
            match="pass resume=true in flwr run's --run-config to continue it, overwrite=true in flwr run's",
        ):
            check_run_dir(d)  # under flwr run, in its run config
    finally:
        CALLER.reset(token)
    assert check_run_dir(d, resume=True) == "unfinished"
    (d / "summary.json").write_text("{}")
    assert run_dir_state(d) == "finished"
    with pytest.raises(RunDirectoryError, match="holds a finished run"):
        check_run_dir(d)
    f = tmp_path / "file"
    f.write_text("")
    with pytest.raises(RunDirectoryError, match="is a file"):
        check_run_dir(f, overwrite=True)


def test_overwrite_empties_the_directory_under_the_lock(tmp_path):
    d = tmp_path / "r"
    (d / "checkpoints" / "round_00001").mkdir(parents=True)
    (d / "summary.json").write_text("{}")
    lock = claim_run_dir(d, overwrite=True)
    try:
        assert [p.name for p in d.iterdir()] == [LOCK_FILE]
    finally:
        lock.release()
    claim_run_dir(d).release()  # released: the directory (only the lock file left) counts as empty


@contextlib.contextmanager
def _lock_holder(d, first_file: str | None = None):
    """A process that holds ``d``'s lock (having written ``first_file`` there, as a live run does), killed
    with SIGKILL on the way out — no clean-up, as a crash; the kernel frees the lock."""
    write = f"(pathlib.Path(sys.argv[1]) / {first_file!r}).write_text(''); " if first_file else ""
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, pathlib, time; from fedhet.engine.rundir import RunDirLock; "
            f"held = RunDirLock(sys.argv[1]).acquire(); {write}print('locked', flush=True); time.sleep(60)",
            str(d),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        yield holder
    finally:
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait(timeout=10)


def test_a_locked_directory_is_refused_naming_the_owner_and_freed_when_it_dies(tmp_path):
    d = tmp_path / "r"
    with RunDirLock(d):
        with pytest.raises(
            RunDirectoryError, match=rf"in use by pid {os.getpid()} \(a run is writing there\)"
        ):
            RunDirLock(d).acquire()
    # a process that holds the lock and is killed (no clean-up): the kernel frees the lock
    with _lock_holder(d) as holder:
        with pytest.raises(RunDirectoryError, match=f"pid {holder.pid}"):
            claim_run_dir(d)
    deadline = time.monotonic() + 10
    while True:  # the lock file is left behind, the lock is not
        try:
            claim_run_dir(d).release()
            break
        except RunDirectoryError:
            assert time.monotonic() < deadline
            time.sleep(0.1)


def test_a_directory_a_live_run_writes_to_is_in_use_not_unfinished(tmp_path, capsys):
    d = tmp_path / "r"
    # a process that holds the lock of a directory holding a run's first files, as a live run does
    with _lock_holder(d, first_file="metrics.jsonl") as holder:
        assert run_dir_state(d) == "unfinished"
        in_use = rf"in use by pid {holder.pid} \(a run is writing there\); wait for it, or choose another"
        for kw in ({}, {"resume": True}, {"overwrite": True}):
            with pytest.raises(RunDirectoryError, match=in_use):
                check_run_dir(d, **kw)
        assert main([*RUN, "--out", str(d)]) == 2
        err = capsys.readouterr().err
        assert (
            f"in use by pid {holder.pid} (a run is writing there); wait for it, or choose another --out"
            in err
        )
        assert "unfinished" not in err
    # the holder died: its pid is no owner any more, and the directory is an unfinished run again
    with pytest.raises(RunDirectoryError, match="holds an unfinished run"):
        check_run_dir(d)


def test_a_finished_lock_names_no_owner(tmp_path):
    d = tmp_path / "r"
    d.mkdir()  # (a folder the lock created, left empty, goes with its lock file)
    RunDirLock(d).acquire().release()
    assert (d / LOCK_FILE).read_text() == ""


def test_the_python_api_gives_advice_in_keyword_arguments(tmp_path):
    import fedhet

    overrides = {"data.dataset": "digits", "data.clients": 2, "train.rounds": 1, "model.name": "mlp"}
    fedhet.run(overrides=overrides, out=tmp_path / "r")
    with pytest.raises(
        RunDirectoryError, match="pass overwrite=True to replace it, or choose another out="
    ) as e:
        fedhet.run(overrides=overrides, out=tmp_path / "r")
    assert "--" not in str(e.value)
    (tmp_path / "cmp" / "fedavg-seed0").mkdir(parents=True)
    (tmp_path / "cmp" / "fedavg-seed0" / "mine.txt").write_text("x")
    with pytest.raises(RunDirectoryError, match="Pass rerun=True to replace them") as e:
        fedhet.compare(overrides=overrides, methods=["fedavg"], out=tmp_path / "cmp")
    assert "--" not in str(e.value)


def test_the_readers_of_a_run_and_of_a_compare_folder(tmp_path):
    """Metrics lines are strict JSON unless a torn one may be dropped; a missing file is an error unless it
    may read as none; a compare folder's finished runs are its <method>-seed<k> folders with a summary."""
    run = tmp_path / run_name("fedavg", 0)
    run.mkdir()
    with pytest.raises(FileNotFoundError):
        read_metrics(run)
    assert read_metrics(run, missing_ok=True) == []
    (run / "metrics.jsonl").write_text('{"round": 1}\n\n{"round": 2}\n{"rou')
    with pytest.raises(ValueError):
        read_metrics(run)
    assert read_metrics(run, drop_torn=True) == [{"round": 1}, {"round": 2}]
    (run / "summary.json").write_text('{"seed": 0}')
    assert read_summary(run) == {"seed": 0}
    (tmp_path / "fedavg-seed1").mkdir()  # unfinished: no summary
    (tmp_path / "fedprox-seed0").mkdir()
    (tmp_path / "fedprox-seed0" / "summary.json").write_text("{}")
    assert run.name == "fedavg-seed0" and finished_runs(tmp_path, "fedavg") == [run]
    assert finished_runs(tmp_path / "missing", "fedavg") == []


def test_write_atomic_replaces_in_one_step(tmp_path):
    p = tmp_path / "summary.json"
    p.write_text("old")
    write_atomic(p, "new")
    assert p.read_text() == "new" and [q.name for q in tmp_path.iterdir()] == ["summary.json"]


def test_fedhet_run_refuses_a_finished_run_before_any_work_and_overwrites_when_asked(tmp_path, capsys):
    out = tmp_path / "r"
    assert main([*RUN, "--out", str(out)]) == 0
    summary = (out / "summary.json").read_text()
    capsys.readouterr()
    assert main([*RUN, "--out", str(out), "--set", "train.lr=0.05"]) == 2
    err = capsys.readouterr().err
    assert f"run directory {out} holds a finished run (summary.json); pass --overwrite" in err
    assert (out / "summary.json").read_text() == summary  # nothing lost
    assert main([*RUN, "--out", str(out), "--set", "train.lr=0.05", "--overwrite"]) == 0
    assert "lr = 0.05" in (out / "config.toml").read_text()
    claim_run_dir(out, resume=True).release()  # the finished run released its lock


def _children(pid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as fh:
                    fields = fh.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:  # field 4 of /proc/PID/stat: the parent's pid
                out.append(int(entry))
    return out


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_compare_workers_die_with_a_killed_parent(tmp_path):
    """SIGKILL to `fedhet compare --jobs 2`: its worker processes end too (they would otherwise keep
    training and race a rerun in the same cells)."""
    cmd = [
        sys.executable,
        "-m",
        "fedhet.cli",
        "compare",
        "--methods",
        "fedavg,fedprox",
        "--dataset",
        "digits",
    ]
    cmd += ["--clients", "2", "--rounds", "100000", "--jobs", "2", "--quiet", "--out", str(tmp_path / "c")]
    cmd += ["--set", "eval.fairness=false", "--set", "eval.checkpoint_every=0"]
    busy = [tmp_path / "c" / f"{m}-seed0" / "metrics.jsonl" for m in ("fedavg", "fedprox")]
    parent = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    workers: list[int] = []
    try:
        deadline = time.monotonic() + 120
        # until both workers are inside a training run (a worker idle in the pool would exit by itself)
        while time.monotonic() < deadline and parent.poll() is None:
            if all(p.is_file() and p.read_text().count("\n") >= 2 for p in busy):
                break
            time.sleep(0.5)
        workers = [c for c in _children(parent.pid) if "spawn_main" in open(f"/proc/{c}/cmdline").read()]
        assert len(workers) >= 2 and all(p.is_file() for p in busy), "the workers never started training"
        parent.kill()
        parent.wait(timeout=10)
        deadline = time.monotonic() + 30
        while any(_alive(w) for w in workers) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not any(_alive(w) for w in workers)
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait(timeout=10)
        for w in workers:
            if _alive(w):
                os.kill(w, signal.SIGKILL)


BAD_SPLIT = ["--dataset", "digits", "--clients", "3", "--rounds", "1", "--set", "data.split=sites", "--quiet"]


def test_a_run_that_fails_before_writing_leaves_no_folder_it_created(tmp_path, capsys):
    """A bad config (digits name no sites) fails after the run folder is locked: the folders the lock created
    go with its lock file; a folder that was there before stays, lock file and all."""
    out = tmp_path / "new" / "run"
    assert main(["run", *BAD_SPLIT, "--out", str(out)]) == 2
    assert "split 'sites' needs data whose rows name their client" in capsys.readouterr().err
    assert not (tmp_path / "new").exists()  # neither run/ nor new/ is left
    mine = tmp_path / "mine"
    mine.mkdir()
    assert main(["run", *BAD_SPLIT, "--out", str(mine)]) == 2
    assert os.listdir(mine) == [LOCK_FILE]  # not this run's to remove
    cmp = tmp_path / "cmp"
    assert main(["compare", "--methods", "fedavg,fedprox", *BAD_SPLIT, "--out", str(cmp)]) == 2
    assert not cmp.exists()  # the comparison folder and fedavg-seed0/ in it


def test_a_lock_that_created_its_folder_removes_it_only_if_it_holds_nothing_else(tmp_path):
    d = tmp_path / "a" / "r"
    with RunDirLock(d):
        pass
    assert not (tmp_path / "a").exists()
    with RunDirLock(d):
        (d / "config.toml").write_text("")  # the run wrote: its folder is a run's (unfinished)
    assert sorted(os.listdir(d)) == [LOCK_FILE, "config.toml"]
