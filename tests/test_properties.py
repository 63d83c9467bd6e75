"""Property-based tests (hypothesis) of the boundaries: config dicts, ``--set`` overrides, ``fedhet run``.

What arbitrary input may produce: a valid config or a ConfigError; an exit code of 0 or 2 (or argparse's
SystemExit(2)), never a traceback; a run that exits 0 aggregated some update. Inputs that hit a known,
reported bug were once kept out of the strategies; every one is fixed and the strategies cover them.
"""

from __future__ import annotations

import itertools
import json
import math
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from fedhet.cli import build_parser, main
from fedhet.config import (
    CHOICES,
    SECTIONS,
    TOP_LEVEL,
    ExperimentConfig,
    apply_override,
    from_dict,
    load_config_text,
    parse_set_args,
    parse_value,
    to_toml,
)
from fedhet.errors import ConfigError

#: Examples share the function-scoped tmp_path/monkeypatch; each one makes its own folder under it.
FIXTURES_OK = [HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
_example_ids = itertools.count()


@pytest.fixture(autouse=True)
def _isolated(tmp_path, monkeypatch):
    """Caches (the standalone pre-pass, decoded datasets) and default run directories under tmp_path."""
    monkeypatch.setenv("FEDHET_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("FEDHET_DATA", raising=False)
    monkeypatch.chdir(tmp_path)


def _canon(x: Any) -> Any:
    """A comparable form keeping types apart (1 vs 1.0 vs True) in which NaN equals NaN."""
    if isinstance(x, dict):
        return {k: _canon(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_canon(v) for v in x]
    if isinstance(x, float) and math.isnan(x):
        return ("float", "nan")
    return (type(x).__name__, x)


# --------------------------------------------------------------------------------------------------------
# 1. Config dicts: from_dict returns a config or raises ConfigError; what it accepts round-trips via TOML
# --------------------------------------------------------------------------------------------------------
ANY_TEXT = st.text(max_size=8)
#: Any text round-trips (astral characters and non-ASCII keys included).
BMP_TEXT = ANY_TEXT


def _leaves(text, *, writable: bool):
    base = [st.booleans(), st.integers(-(2**70), 2**70), st.floats(), text]
    # None (dropped: the default) always; dates and times (refused) only where no round trip is asked.
    base.append(st.none())
    if not writable:
        base += [st.dates(), st.times(), st.datetimes()]
    return st.one_of(*base)


def _params(*, writable: bool):
    text = BMP_TEXT if writable else ANY_TEXT
    keys = text if writable else st.one_of(text, st.integers())
    # A non-str key (Python API only) is refused; the round trip draws str keys only.
    tree = st.recursive(
        _leaves(text, writable=writable),
        lambda c: st.lists(c, max_size=3) | st.dictionaries(keys, c, max_size=3),
        max_leaves=6,
    )
    return st.dictionaries(keys, tree, max_size=3)


#: Values of any type; a dict of them can land in faults.clients, hence the key filter.
JUNK = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(),
    ANY_TEXT,
    st.lists(st.integers(), max_size=2),
    st.dictionaries(ANY_TEXT, st.integers(), max_size=2),
)
KNOWN_STRINGS = [
    *("digits", "fashion-mnist", "iid", "dirichlet-per-client", "mlp", "resnet8", "fedavg", "celm"),
    *("sgd", "adam", "constant", "cosine", "exponential", "auto", "cpu", "cuda", "runs", ""),
]
FAULT_NAMES = ["noise", "scale", "sign-flip", "stale", "nan", "lie-num-examples", "crash", "drop", "bogus"]


def _sensible(sec: str, f, *, writable: bool):
    """Values of the field's own type (often out of range), by its annotation."""
    text = BMP_TEXT if writable else ANY_TEXT
    ann = str(f.type).replace(" ", "")
    base = ann.replace("|None", "").replace("None|", "")
    if (sec, f.name) == ("faults", "clients"):
        keys = st.sampled_from(["0", "1", "2", "9", "99", "-1", "x"]) | text
        if writable:
            keys = keys
        s = st.dictionaries(keys, st.sampled_from(FAULT_NAMES) | st.floats() | text, max_size=3)
    elif base.startswith("dict"):
        s = _params(writable=writable)
    else:
        s = {
            "int": st.integers(-2, 12) | st.sampled_from([2**63, 10**30]),
            "float": st.floats(-0.5, 2.0) | st.integers(-1, 3) | st.sampled_from([1e-300, 1e300]),
            "float|int": st.floats(-0.5, 2.0) | st.integers(-1, 12),
            "bool": st.booleans(),
            "str": st.sampled_from(KNOWN_STRINGS) | text,
            "str|bool": st.sampled_from(["auto", True, False, "yes"]),
        }.get(base, JUNK)
    return s | st.none() if "None" in ann else s


def _rarely(draw, odds: int) -> bool:
    """True about once in ``odds`` draws (a middle value: hypothesis favours the ends of a range)."""
    return draw(st.integers(0, odds - 1)) == odds // 2


def _typical(sec: str, f):
    """The field's default or, for a field with a fixed set of accepted values, one of them."""
    accepted = CHOICES.get((sec, f.name))
    if accepted:
        return st.sampled_from(list(accepted))
    default = getattr(SECTIONS[sec](), f.name)
    return st.just(default)


@st.composite
def raw_configs(draw, *, writable: bool = False) -> dict[str, Any]:
    """Nested dicts as TOML (or the Python API) gives them: typed values, often out of range, some junk,
    unknown keys. ``writable``: fewer refused values, so that the round trip sees many accepted configs."""
    junk_odds = 40 if writable else 8  # 1 in junk_odds values is junk
    raw: dict[str, Any] = {}
    for sec, cls in SECTIONS.items():
        if draw(st.booleans()):
            continue
        if _rarely(draw, junk_odds * 3):
            raw[sec] = draw(JUNK)
            continue
        chosen = draw(st.lists(st.sampled_from(fields(cls)), max_size=3, unique_by=lambda f: f.name))
        values = {}
        for f in chosen:
            pick = draw(st.integers(1, junk_odds))
            free_form = str(f.type).startswith(("dict", "str")) and (sec, f.name) not in CHOICES
            if pick == junk_odds // 2:
                values[f.name] = draw(JUNK)
            elif writable and not free_form and pick % 3:
                values[f.name] = draw(_typical(sec, f))
            else:
                values[f.name] = draw(_sensible(sec, f, writable=writable))
        if _rarely(draw, junk_odds * 2):
            values[draw(st.sampled_from(["bogus", "Clients", "lr ", ""]))] = draw(JUNK)
        raw[sec] = values
    if draw(st.booleans()):
        junk = _rarely(draw, junk_odds)
        raw["seed"] = draw(JUNK if junk else st.integers(-1, 2**70))
    for key in ("out", "name"):
        if _rarely(draw, 4):
            raw[key] = draw(BMP_TEXT | st.none() if writable else ANY_TEXT | st.none() | JUNK)
    if _rarely(draw, junk_odds * 2):
        raw[draw(st.sampled_from(["rounds", "Seed", "datа"]))] = draw(JUNK)
    return raw


@settings(max_examples=400, deadline=None)
@given(raw_configs())
def test_from_dict_returns_a_config_or_raises_config_error(raw):
    try:
        cfg = from_dict(raw)
    except ConfigError:
        return
    assert isinstance(cfg, ExperimentConfig)


@settings(max_examples=400, deadline=None)
@given(raw_configs(writable=True))
# the guards at their defaults from before the clipping guard (found by this test): written, not left out
@example(raw={"guards": {"update_norm_clip": 0.0}})
def test_every_accepted_config_round_trips_through_toml(raw):
    try:
        cfg = from_dict(raw)
    except ConfigError:
        return
    text = to_toml(cfg)
    back = load_config_text(text)
    assert _canon(back.to_dict()) == _canon(cfg.to_dict())
    assert to_toml(back) == text


# --------------------------------------------------------------------------------------------------------
# 2. Overrides: apply_override / parse_set_args raise only ConfigError, and a refused one changes nothing
# --------------------------------------------------------------------------------------------------------
FIELD_KEYS = sorted(TOP_LEVEL) + [f"{sec}.{f.name}" for sec, cls in SECTIONS.items() for f in fields(cls)]
TABLE_KEYS = [
    f"{sec}.{f.name}" for sec, cls in SECTIONS.items() for f in fields(cls) if str(f.type).startswith("dict")
]
#: The last part of a key into a table (method.params.mu, faults.clients.0).
LEAF_NAMES = ["alpha", "mu", "hidden_sizes", "samples_per_client", "0", "1", "9", "x", ""]
#: Intermediate parts of deeper keys; leaf names too, so that a key descends through a value that is not a
#: table (method.params.a=1, then method.params.a.b=2: a ConfigError).
TABLE_NAMES = ["nested", "deeper", "mu", "0"]

override_keys = st.one_of(
    st.sampled_from(FIELD_KEYS),
    st.builds(
        lambda t, leaf: f"{t}.{leaf}",
        st.sampled_from(TABLE_KEYS),
        st.sampled_from(LEAF_NAMES) | BMP_TEXT,
    ),
    st.builds(
        lambda t, mid, leaf: ".".join([t, *mid, leaf]),
        st.sampled_from(TABLE_KEYS),
        st.lists(st.sampled_from(TABLE_NAMES), min_size=1, max_size=2),
        st.sampled_from(LEAF_NAMES),
    ),
    st.sampled_from(["", ".", "data.", ".clients", "nope.x", "data.clients.x", "train.lr.x", "seed.x"]),
    st.sampled_from(["Data.clients", " data.clients", "data..clients", "train.rounds ", "faults.clients"]),
    ANY_TEXT,
)
TOML_LITERALS = [
    *("0", "1", "-1", "3", "0.5", "1e-9", "1e30", "1e400", "-0.0", "inf", "-inf", "nan", "+nan", "true"),
    *("false", '"adam"', '"digits"', "digits", "iid", "none", "null", "Null", "[]", "[1, 2]", '[0.5, "a"]'),
    *("{}", "{ a = 1 }", "{ alpha = 0.1 }", "1979-05-27", "07:32:00", "1979-05-27T07:32:00Z", "0x1F"),
    *("1_000", '"\\u00e9"', "'lit'", '"""multi"""', "[1,", "{a=", '"unterminated', "= 1", "1 # comment"),
    *("0.5\nx = 1", "noise", '"nan"', "[[1], [2]]", "{ mu = nan }", "\x00", "é", "😀", '"😀"'),
]
NESTED = st.integers(1, 1200).flatmap(
    lambda n: st.sampled_from(["[" * n, "[" * n + "1" + "]" * n, "{a=" * n, "{a=" * n + "1" + "}" * n])
)
text_values = st.one_of(
    st.sampled_from(TOML_LITERALS),
    st.text(max_size=12),
    st.integers(-(2**70), 2**70).map(str),
    st.floats().map(repr),
    NESTED,
)
#: The Python API (ExperimentConfig.copy, the CLI shortcuts) passes values that are not text too.
override_values = text_values | JUNK


@settings(max_examples=400, deadline=None)
@given(st.lists(st.tuples(override_keys, override_values), min_size=1, max_size=4))
def test_overrides_raise_only_config_error_and_a_refused_one_changes_nothing(pairs):
    cfg = ExperimentConfig()
    for key, value in pairs:
        before = _canon(cfg.to_dict())
        try:
            apply_override(cfg, key, value)
        except ConfigError:
            assert _canon(cfg.to_dict()) == before
            continue
        assert isinstance(from_dict(cfg.to_dict()), ExperimentConfig)  # still a valid config


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.builds(lambda k, v: f"{k}={v}", override_keys, text_values) | st.text(max_size=12),
        max_size=4,
    )
)
def test_set_arguments_split_at_the_first_equals_sign_and_raise_only_config_error(items):
    try:
        pairs = parse_set_args(items)
    except ConfigError:
        assert any("=" not in item for item in items)
        return
    assert pairs == [tuple(part.strip() for part in item.split("=", 1)) for item in items]
    cfg = ExperimentConfig()
    for key, value in pairs:
        try:
            apply_override(cfg, key, value)
        except ConfigError:
            pass


# --------------------------------------------------------------------------------------------------------
# 3. `fedhet run` argument lists: exit 0 or 2 (argparse: SystemExit(2)); a run exiting 0 trained something
# --------------------------------------------------------------------------------------------------------
#: Every generated run is tiny: digits, an MLP, 2 clients, 1 round, 300/200 samples, one thread; the
#: generated flags come after these and override them.
TINY = [
    *("--dataset", "digits", "--model", "mlp", "--clients", "2", "--rounds", "1", "--quiet"),
    *("--set", "train.threads=1"),
    *("--set", "data.max_train_samples=300", "--set", "data.max_test_samples=200"),
]
#: Values each option takes: sensible ones first, then garbage; {file}, {dir}, {missing}, {bad_toml},
#: {good_toml} are paths made for each example.
OPTION_VALUES: dict[str, list[str]] = {
    "--method": [
        *("fedavg", "standalone", "fedprox", "fedrs", "celm", "cgsv"),
        *("nope", "", "FedAvg", "fedrac", "proxyfl"),
    ],
    "--dataset": ["digits", "digits", "nope", "", "{missing}", "{dir}", "{file}"],
    "--split": [
        *("iid", "dirichlet-per-client", "dirichlet-per-class", "pow", "step-quantity", "maverick"),
        *("free-rider", "cla", "nope", ""),
    ],
    "--model": ["mlp", "mlp", "resnet8", "cnn", "nope", ""],
    "--clients": ["2", "3", "4", "0", "-1", "1.5", "x", "", "99999999999999999999"],
    "--rounds": ["1", "2", "0", "-1", "x", "1e3"],
    "--seed": ["0", "7", "18446744073709551616", "-1", "x"],
    "--device": ["cpu", "auto", "cuda", "gpu"],
    "--data-root": ["{missing}", "{file}", "{dir}"],
    "--engine": ["embedded", "bogus"],  # not flower-simulation: it starts Ray (minutes)
    "--resume": ["{missing}", "{dir}"],
}
FLAGS = ["--json", "--overwrite", "--quiet"]
#: --set keys with their cheap values (valid first) and refused ones. No value runs long (huge steps,
#: epochs, rounds or layers), and none makes every update unusable: property 4 covers those.
SET_VALUES: dict[str, list[str]] = {
    "train.lr": ["0.05", "0.1", "0", "-1", "inf", "nan", "[0.1]", '"fast"'],
    "train.batch_size": ["16", "32", "0", "1.5", "true"],
    "train.local_steps": ["1", "2", "0", "-1", "none"],
    "train.local_epochs": ["0.5", "1", "0", "1e-9", "-1"],
    "train.clients_per_round": ["1", "2", "0.5", "1.0", "0", "1.5", "-1"],
    "train.momentum": ["0.9", "1", "-0.1"],
    "train.nesterov": ["true", "1"],
    "train.optimizer": ['"adam"', "sgd", "rmsprop"],
    "train.schedule": ["cosine", "exponential", "linear"],
    "train.lr_decay": ["0.5", "0", "2"],
    "train.weight_decay": ["0.0001", "-1"],
    "train.client_dropout": ["0.3", "1", "-0.5"],
    "train.grad_clip": ["1", "0", "none"],
    "train.threads": ["1", "0"],
    "data.split_params.alpha": ["0.5", "0", "-1", "x", "inf"],
    "data.split_params.samples_per_client": ["50", "0", "1000000"],
    "data.split_params.bogus": ["1"],
    "data.validation_fraction": ["0.2", "1", "-0.1"],
    "data.max_train_samples": ["200", "0", "1"],
    "data.max_test_samples": ["100", "0"],
    "model.params.hidden_sizes": ["[16]", "[8, 8]", "[]", "[0]", '"x"', "[1.5]", "[100000000000000000000]"],
    "method.params.mu": ["0.01", "-1", "nan"],
    "eval.every": ["1", "2", "0", "x"],
    "eval.fairness": ["false", "true", '"auto"', "maybe"],
    "eval.rewards": ["false"],
    "eval.checkpoint_every": ["0", "1", "-1"],
    "eval.bcf_alpha": ["0.5", "0", "2"],
    "faults.clients.0": [
        "noise",
        "stale",
        "sign-flip",
        "scale",
        "lie-num-examples",
        "crash",
        "drop",
        "bogus",
    ],
    "faults.clients.1": ["crash", "drop"],
    "faults.clients.7": ["noise"],
    "faults.factor": ["2", "0", "-1", "1e308"],
    "faults.from_round": ["1", "2", "0"],
    "guards.update_norm_factor": ["10", "1", "none"],
    "guards.num_examples_factor": ["10", "0.5"],
    "guards.max_num_examples": ["100000", "0"],
    "guards.max_all_rejected_rounds": ["0", "3", "-1"],
    "seed": ["3", "-1"],
    "name": ['"n"'],
    "nope.x": ["1"],
    "train.nope": ["1"],
    "train": ["1"],
    "": ["1"],
}


def _holds_a_number(v: Any) -> bool:
    if isinstance(v, dict):
        return any(_holds_a_number(x) for x in v.values())
    if isinstance(v, list):
        return any(_holds_a_number(x) for x in v)
    return isinstance(v, int | float) and not isinstance(v, bool)


#: Junk text never parses to a number: a number could make a run long (train.local_steps) or divergent.
junk_text = st.text(max_size=6).filter(lambda s: not _holds_a_number(parse_value(s)))


@st.composite
def set_items(draw) -> str:
    """One --set argument: mostly a real key with a listed value, some junk values and junk items."""
    if _rarely(draw, 6):
        return draw(junk_text)  # often without '='
    key = draw(st.sampled_from(sorted(SET_VALUES)))
    return f"{key}={draw(junk_text) if _rarely(draw, 4) else draw(st.sampled_from(SET_VALUES[key]))}"


@st.composite
def run_argvs(draw) -> list[str]:
    argv = ["-v", "run"] if _rarely(draw, 10) else ["run"]
    argv += TINY
    if _rarely(draw, 10):
        argv.insert(argv.index("run") + 1, draw(st.sampled_from(["{missing}", "{dir}", "{bad_toml}"])))
    elif _rarely(draw, 6):
        argv.insert(argv.index("run") + 1, "{good_toml}")
    for option in draw(st.lists(st.sampled_from(sorted(OPTION_VALUES)), max_size=3)):
        value = draw(junk_text) if _rarely(draw, 5) else draw(st.sampled_from(OPTION_VALUES[option]))
        argv += [option, value]
    for item in draw(st.lists(set_items(), max_size=3)):
        argv += ["--set", item]
    argv += draw(st.lists(st.sampled_from(FLAGS), max_size=2))
    out = draw(st.sampled_from(["{out}"] * 6 + ["{file}", "{full_dir}", None]))
    if out is not None:
        argv += ["--out", out]
    if _rarely(draw, 15):  # argparse's own errors
        argv += draw(st.sampled_from([["--nope"], ["--rounds"], ["-x", "1"], ["--clients", "two"]]))
    return argv


def _example_paths(root: Path) -> dict[str, str]:
    root.mkdir(parents=True)
    (root / "afile").write_text("not a directory\n")
    (root / "full").mkdir()
    (root / "full" / "notes.txt").write_text("someone's files\n")
    (root / "bad.toml").write_text("[train\nrounds = \n")
    (root / "good.toml").write_text('seed = 1\n[train]\nrounds = 1\n[eval]\nfairness = "auto"\n')
    return {
        "{out}": str(root / "run"),
        "{file}": str(root / "afile"),
        "{dir}": str(root),
        "{full_dir}": str(root / "full"),
        "{missing}": str(root / "missing" / "x.toml"),
        "{bad_toml}": str(root / "bad.toml"),
        "{good_toml}": str(root / "good.toml"),
    }


def _metrics_lines(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "metrics.jsonl"
    assert path.is_file(), f"exit 0 without {path}"
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    assert lines and all("round" in line and "clients" in line for line in lines)
    return lines


def _trained_nothing(lines: list[dict[str, Any]], *, because: tuple[str, ...]) -> bool:
    """Every round aggregated no update, and some round's replies were ``because`` (rejected, failed)."""
    return all(not line["clients"] for line in lines) and any(line.get(k) for line in lines for k in because)


def _run_dirs(root: Path) -> set[Path]:
    return {p.parent for p in root.rglob("metrics.jsonl")}


@settings(max_examples=40, deadline=None, suppress_health_check=FIXTURES_OK)
@given(run_argvs())
def test_run_command_exits_0_or_2_and_a_run_exiting_0_trained_something(tmp_path, monkeypatch, argv):
    root = tmp_path / f"ex{next(_example_ids)}"
    paths = _example_paths(root)
    argv = [paths.get(a, a) for a in argv]
    monkeypatch.chdir(root)  # a run without --out writes runs/... here
    before = _run_dirs(root)
    try:
        rc = main(argv)
    except SystemExit as exc:  # argparse
        assert exc.code == 2, f"SystemExit({exc.code!r}) from {argv}"
        return
    assert rc in (0, 2), f"exit {rc!r} from {argv}"
    if rc == 0:
        new = _run_dirs(root) - before
        assert len(new) == 1, f"exit 0 from {argv}, run directories {new}"
        lines = _metrics_lines(new.pop())
        assert not _trained_nothing(lines, because=("rejected", "failed")), (argv, lines)


def test_the_generated_options_are_real_options_of_fedhet_run():
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    run = sub.choices["run"]
    known = {s for a in run._actions for s in a.option_strings}
    assert set(OPTION_VALUES) | set(FLAGS) | {"--set", "--out"} <= known
    assert {a.split("=")[0] for a in TINY if a.startswith("--")} <= known
    choices = {a.option_strings[-1]: a.choices for a in run._actions if a.choices}
    assert {"cpu", "auto", "cuda"} <= set(choices["--device"])
    assert "embedded" in choices["--engine"]


# --------------------------------------------------------------------------------------------------------
# 4. A run whose every update was rejected must not exit 0
# --------------------------------------------------------------------------------------------------------
@settings(max_examples=8, deadline=None, suppress_health_check=FIXTURES_OK)
@example(method="fedavg", lr="1e30", weight_decay="0", optimizer="sgd", rounds=1, clients=2, fairness="false")
@given(
    method=st.sampled_from(["fedavg", "standalone", "fedprox"]),
    lr=st.sampled_from(["1e9", "1e30", "1e300", "0.05"]),
    weight_decay=st.sampled_from(["0", "1e9", "1e30"]),
    optimizer=st.sampled_from(["sgd", "adam"]),
    rounds=st.integers(1, 3),
    clients=st.integers(2, 3),
    fairness=st.sampled_from(["false", '"auto"']),
)
def test_a_run_exiting_0_did_not_have_every_update_rejected(
    tmp_path, method, lr, weight_decay, optimizer, rounds, clients, fairness
):
    out = tmp_path / f"ex{next(_example_ids)}"
    argv = ["run", *TINY, "--method", method, "--rounds", str(rounds), "--clients", str(clients)]
    for item in (f"train.lr={lr}", f"train.weight_decay={weight_decay}", f"train.optimizer={optimizer}"):
        argv += ["--set", item]
    argv += ["--set", f"eval.fairness={fairness}", "--out", str(out)]
    rc = main(argv)
    assert rc in (0, 2)
    if rc == 0:
        lines = _metrics_lines(out)
        assert not _trained_nothing(lines, because=("rejected", "failed")), f"exit 0, nothing trained: {argv}"
