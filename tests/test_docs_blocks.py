"""The code the user docs show runs: every Python and shell block of README.md and docs/your-own-data.md.

Python blocks run as written, at tiny scale: the few edits that make them tiny are listed in
:data:`TINY` (each must still match the block, so a changed block fails here until its edit is updated),
with the variables a block assumes the reader has (``x_train``, a data frame ``frame``, a ``hospitals/``
folder) made from scikit-learn's breast-cancer table. Shell blocks: every ``fedhet`` command line is parsed
by fedhet's own parser (so no flag or subcommand the docs name can be gone); the cheap ones, and those with a
tiny-scale edit, also run. ``make`` lines name targets the Makefile has.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = (ROOT / "README.md", ROOT / "docs" / "your-own-data.md")
FENCE = re.compile(r"^```(python|bash)\n(.*?)^```", re.M | re.S)

#: block (a line of it) -> the edits that make it tiny
TINY: dict[str, list[tuple[str, str]]] = {
    'table = fedhet.compare("celm/fmnist-maverick"': [
        (
            '"train.rounds": 20}',
            '"train.rounds": 1, "data.max_train_samples": 600, "data.max_test_samples": 300}',
        )
    ],
    "fedhet compare celm/fmnist-maverick --methods fedavg,celm --seeds 2 --rounds 20": [
        (
            "--seeds 2 --rounds 20",
            "--seeds 1 --rounds 1 --set data.max_train_samples=600 --set data.max_test_samples=300",
        )
    ],
    "fedhet run --dataset csv --data-path hospitals/": [
        ("--set data.clients=3", "--set data.clients=3 --rounds 2")
    ],
}
#: after a block: what shows that it did what its text says (e.g. the model it registers trains)
CHECKS: dict[str, str] = {
    'register("small-cnn", SmallCNN)': (
        'fedhet.run({"data": {"dataset": "digits", "clients": 2}, "model": {"name": "small-cnn", '
        '"params": {"width": 8}}, "train": {"rounds": 1}})'
    ),
    "register(FedMedian)": (
        'fedhet.run({"data": {"dataset": "digits", "clients": 3}, "method": {"name": "fedmedian"}, '
        '"train": {"rounds": 1}})'
    ),
}
#: fedhet commands cheap enough to run (the others write pages or train for minutes: parsed only)
RUN_AS_IS = ("datasets", "methods", "experiments")
#: placeholders of a command template -> a value its parser takes
PLACEHOLDERS = {
    "RUN_DIR...": "runs/x",
    "RUN_DIR": "runs/x",
    "CONFIG.toml": "config.toml",
    "DIR": "out",
    "m.png": "m.png",
    "k=v": "alpha=1",
    "quick|cpu|full": "quick",
    "NAME": "robustness",
    "run|table": "table",
}


def doc_blocks() -> list[tuple[str, int, str, str]]:
    found = []
    for doc in DOCS:
        text = doc.read_text(encoding="utf-8")
        for match in FENCE.finditer(text):
            line = text[: match.start()].count("\n") + 1
            found.append((f"{doc.name}:{line}", line, match.group(1), match.group(2)))
    return found


def _tiny(text: str) -> str:
    for key, edits in TINY.items():
        if key in text:
            for old, new in edits:
                assert old in text, f"the docs block changed: {old!r} is gone; update TINY"
                text = text.replace(old, new)
    return text


@pytest.fixture
def reader_setup(tmp_path, monkeypatch, forget_registrations):
    """What the blocks assume a reader has: arrays, a data frame and a folder of hospital files (what a block
    registers, a method or a model, is forgotten after it)."""
    import pandas as pd
    from sklearn.datasets import load_breast_cancer
    from sklearn.model_selection import train_test_split

    monkeypatch.chdir(tmp_path)
    bunch = load_breast_cancer()
    x, y = bunch.data.astype(np.float32), bunch.target
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.25, stratify=y, random_state=0)
    columns = [f"f{i}" for i in range(x.shape[1])]
    frame = pd.DataFrame(x, columns=columns)
    frame["diagnosis"] = np.where(y == 1, "benign", "malignant")
    frame["hospital"] = np.array(["north", "south", "west"])[np.arange(len(y)) % 3]
    (tmp_path / "hospitals" / "train").mkdir(parents=True)
    for site, rows in frame[:450].groupby("hospital"):
        rows.drop(columns="hospital").to_csv(tmp_path / "hospitals" / "train" / f"{site}.csv", index=False)
    frame[450:].drop(columns="hospital").to_csv(tmp_path / "hospitals" / "test.csv", index=False)
    return {"x_train": x_train, "y_train": y_train, "x_test": x_test, "y_test": y_test, "frame": frame}


PYTHON = [b for b in doc_blocks() if b[2] == "python"]
BASH = [b for b in doc_blocks() if b[2] == "bash"]


def test_the_docs_have_blocks_to_run():
    assert len(PYTHON) >= 5 and len(BASH) >= 3


@pytest.mark.parametrize(("where", "line", "lang", "text"), PYTHON, ids=[b[0] for b in PYTHON])
def test_python_block_runs(where, line, lang, text, reader_setup):
    import fedhet

    namespace = {"__name__": "__docs__", **reader_setup}
    exec(compile(_tiny(text), where, "exec"), namespace)  # noqa: S102 - the docs' own code
    for key, check in CHECKS.items():
        if key in text:
            result = eval(check, {"fedhet": fedhet})  # noqa: S307 - a fixed check of this file
            assert 0.0 <= result.final["accuracy"] <= 1.0


def _command_lines(text: str) -> list[str]:
    joined = text.replace("\\\n", " ")
    lines = []
    for raw in joined.splitlines():
        line = raw.split("  #", 1)[0].strip()
        if line and not line.startswith("#"):
            lines.append(line)
    return lines


def _as_argv(line: str) -> list[str] | None:
    """The fedhet arguments of a command line, templates filled in; None for a line that is not fedhet's."""
    words = shlex.split(line)
    if words[:3] == ["python", "-m", "fedhet"]:
        words = ["fedhet", *words[3:]]
    if not words or words[0] != "fedhet" or words[1:] == ["..."]:
        return None
    argv = []
    for word in words[1:]:
        word = word.strip("[]").rstrip("]")
        if word.endswith("...") and word != "...":
            word = word[:-3]
        if word in ("...", ""):
            continue
        argv.append(PLACEHOLDERS.get(word, word))
    if argv and argv[0] == "study" and argv[1:2] == ["robustness"] and argv[2:3] == ["table"]:
        argv = argv[:3]
    return argv


@pytest.mark.parametrize(("where", "line", "lang", "text"), BASH, ids=[b[0] for b in BASH])
def test_shell_block_parses_and_runs(where, line, lang, text, reader_setup):
    from fedhet.cli import build_parser, main

    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    tiny = _tiny(text)
    for command in _command_lines(tiny):
        if command.startswith("make "):
            target = command.split()[1]
            assert re.search(rf"^{re.escape(target)}:", makefile, re.M), f"{where}: no make target {target}"
            continue
        argv = _as_argv(command)
        if argv is None:
            continue
        try:
            build_parser().parse_args(argv)
        except SystemExit as exc:
            pytest.fail(f"{where}: `{command}` does not parse (exit {exc.code})")
        edited = any(new in tiny for edits in TINY.values() for _, new in edits if new in command)
        if edited or (argv[0] in RUN_AS_IS and "[" not in command):
            assert main(argv) == 0, f"{where}: `{command}` failed"
