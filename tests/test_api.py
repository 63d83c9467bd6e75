"""Bring your own data, model and method: the Python API, registration, named experiments, method defaults,
and the examples/ scripts at tiny scale."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from sklearn.datasets import load_digits
from torch import nn

import fedhet
from fedhet.cli import main
from fedhet.config import ExperimentConfig, experiment_names, load_config
from fedhet.data import from_arrays, load_dataset, register_dataset
from fedhet.errors import ConfigError, DataError

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _tmp_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDHET_CACHE", str(tmp_path / "cache"))


@pytest.fixture(autouse=True)
def _restore_registries():
    """What a test registers (methods, models, data sets) is gone after it: other tests list the built-ins."""
    from fedhet import algorithms
    from fedhet.data import datasets
    from fedhet.models import registry

    saved = (
        dict(algorithms._REGISTERED),
        dict(registry.MODELS),
        set(registry.USER_MODELS),
        dict(datasets._REGISTERED),
    )
    yield
    for live, kept in zip(
        (algorithms._REGISTERED, registry.MODELS, registry.USER_MODELS, datasets._REGISTERED),
        saved,
        strict=True,
    ):
        live.clear()
        live.update(kept)


def five_digit_classes():
    """scikit-learn's digits 0-4 only (5 classes), uint8 (N, 8, 8), split by hand."""
    digits = load_digits()
    keep = digits.target < 5
    images = np.rint(digits.images[keep] * (255 / 16)).astype(np.uint8)
    labels = digits.target[keep]
    order = np.random.default_rng(1).permutation(len(labels))
    train, test = order[:700], order[700:]
    return images[train], labels[train], images[test], labels[test]


def tiny_run(**over):
    base = {
        "data": {"clients": 3, "split": "iid"},
        "model": {"name": "mlp"},
        "train": {"rounds": 3, "lr": 0.1},
        "eval": {"fairness": False},
    }
    for dotted, value in over.items():
        section, key = dotted.split("__")
        base.setdefault(section, {})[key] = value
    return base


# --------------------------------------------------------------------------------------------------------
# Your own data
# --------------------------------------------------------------------------------------------------------
def test_from_arrays_trains_on_the_users_classes_through_the_python_api():
    xtr, ytr, xte, yte = five_digit_classes()
    data = from_arrays(xtr, ytr, xte, yte, [f"d{i}" for i in range(5)], name="five-digits")
    assert data.input_shape == (1, 8, 8) and data.num_classes == 5
    # mean/std computed independently here: the train pixels on [0, 1]
    assert data.mean[0] == pytest.approx(xtr.mean() / 255, rel=1e-6)
    assert data.std[0] == pytest.approx((xtr / 255).std(), rel=1e-4)
    seen = []
    result = fedhet.run(tiny_run(), dataset=data, progress=lambda rnd, line: seen.append(rnd))
    assert seen == [1, 2, 3] and len(result.metrics) == 3
    assert len(result.final["per_class_recall"]) == 5  # our 5 classes, not the 10 of the built-in digits
    assert result.accuracy > 0.6  # chance is 0.2
    assert result.run_dir is None and result.method == "fedavg"


@pytest.mark.parametrize("method", ["celm", "cgsv", "cffl", "shapfed", "fedrac", "fedprox", "fedrs", "iafl"])
def test_every_kind_of_method_runs_on_the_users_data(method):
    xtr, ytr, xte, yte = five_digit_classes()
    data = from_arrays(xtr, ytr, xte, yte, name="five-digits")
    cfg = tiny_run(method__name=method, train__rounds=2, data__split="dirichlet-per-class")
    cfg["data"]["split_params"] = {"alpha": 0.5}
    result = fedhet.run(cfg, dataset=data)  # CFFL/FedRAC get their validation split, FedRAC mlp200
    assert len(result.final["per_class_recall"]) == 5 and 0.0 <= result.accuracy <= 1.0
    assert len(result.metrics) == 2


def test_from_arrays_refuses_bad_arrays_naming_the_problem():
    xtr, ytr, xte, yte = five_digit_classes()
    with pytest.raises(DataError, match=r"y_train.*out of range"):
        from_arrays(xtr, ytr, xte, yte, ["a", "b"], name="x")
    with pytest.raises(DataError, match="x_test images are"):
        from_arrays(xtr, ytr, xte[:, :4], yte, name="x")
    with pytest.raises(DataError, match="count mismatch"):
        from_arrays(xtr, ytr[:-1], xte, yte, name="x")
    with pytest.raises(DataError, match=r"float images must lie in \[0, 1\]"):
        from_arrays(xtr.astype(np.float32), ytr, xte, yte, name="x")
    with pytest.raises(DataError, match="built-in"):
        from_arrays(xtr, ytr, xte, yte, name="digits")
    with pytest.raises(ConfigError, match="already registered"):
        register_dataset(from_arrays(xtr, ytr, xte, yte, name="twice"))
        register_dataset(from_arrays(xtr, ytr, xte, yte, name="twice"))


def write_image_folder(root: Path, x: np.ndarray, y: np.ndarray, part: str) -> None:
    for i, (image, label) in enumerate(zip(x, y, strict=True)):
        folder = root / part / f"class-{label}"
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(image).save(folder / f"{i:04d}.png")


def as_pairs(x: np.ndarray, y: np.ndarray) -> list[tuple[bytes, int]]:
    return sorted((img.tobytes(), int(lab)) for img, lab in zip(x, y, strict=True))


def test_npz_and_image_folder_hold_the_same_data_and_run_from_the_cli(tmp_path, capsys):
    xtr, ytr, xte, yte = five_digit_classes()
    np.savez(tmp_path / "site.npz", x_train=xtr, y_train=ytr, x_test=xte, y_test=yte)
    write_image_folder(tmp_path / "images", xtr, ytr, "train")
    write_image_folder(tmp_path / "images", xte, yte, "test")
    npz = load_dataset("npz", path=tmp_path / "site.npz")
    folder = load_dataset("folder", path=tmp_path / "images")
    assert folder.input_shape == (1, 8, 8)  # grayscale PNGs: one channel
    assert folder.classes == tuple(f"class-{i}" for i in range(5))
    # the same (image, label) pairs as the arrays written, in whatever order each format reads them
    for ds in (npz, folder):
        assert as_pairs(ds.train_x[:, 0].numpy(), ds.train_y.numpy()) == as_pairs(xtr, ytr)
        assert as_pairs(ds.test_x[:, 0].numpy(), ds.test_y.numpy()) == as_pairs(xte, yte)
    for kind, path in (("npz", tmp_path / "site.npz"), ("folder", tmp_path / "images")):
        out = tmp_path / f"run-{kind}"
        argv = ["run", "--dataset", kind, "--data-path", str(path), "--clients", "3", "--rounds", "2",
                "--model", "mlp", "--set", "eval.fairness=false", "--out", str(out), "--quiet",
                "--json"]  # fmt: skip
        assert main(argv) == 0
        summary = json.loads(capsys.readouterr().out)
        assert len(summary["final"]["per_class_recall"]) == 5 and summary["final"]["accuracy"] > 0.4
        assert load_config(out / "config.toml").data.path == str(path)


def test_user_data_errors_name_the_key_and_the_fix(tmp_path):
    with pytest.raises(ConfigError, match=r"set data\.path"):
        load_dataset("npz")
    with pytest.raises(ConfigError, match=r"data\.path is read only with data\.dataset = 'npz', 'folder'"):
        load_dataset("digits", path=tmp_path)
    with pytest.raises(DataError, match="has no train/ folder"):
        load_dataset("folder", path=tmp_path)
    with pytest.raises(DataError, match="no .npz file there"):
        load_dataset("npz", path=tmp_path / "missing.npz")
    with pytest.raises(ConfigError, match="register_dataset"):
        load_dataset("no-such-data")


def test_the_new_data_path_key_keeps_every_earlier_fingerprint():
    # Computed by fedhet at commit 0233f80, before data.path existed and before the clipping guard was on by
    # default: runs and caches made then still match, read as they ran (no clipping).
    before = {"guards.update_norm_clip": 0.0}
    assert fedhet.api.as_config(None, before).run_fingerprint() == "2b6c1f238e1b959e"
    maverick = fedhet.api.as_config(ROOT / "configs" / "celm" / "fmnist-maverick.toml", before)
    assert maverick.run_fingerprint() == "f88e71654de8deca"
    from fedhet.experiment import standalone_key

    assert standalone_key(maverick) == "a3f792048370f4ef"
    assert (
        standalone_key(load_config(ROOT / "configs" / "celm" / "fmnist-maverick.toml")) == "a3f792048370f4ef"
    )
    assert (
        fedhet.api.as_config(None, {**before, "data.path": "x.npz"}).run_fingerprint() != "2b6c1f238e1b959e"
    )
    # the clipping guard on (today's default) is another experiment: an earlier run is not taken for it
    assert ExperimentConfig().run_fingerprint() != "2b6c1f238e1b959e"


# --------------------------------------------------------------------------------------------------------
# Your own model
# --------------------------------------------------------------------------------------------------------
def test_a_registered_plain_module_trains_with_fedavg_and_is_refused_by_celm_naming_the_head():
    from fedhet.models import register

    register(
        "flat-linear",
        lambda shape, k, scale=1: nn.Sequential(nn.Flatten(), nn.Linear(shape[0] * shape[1] * shape[2], k)),
        overwrite=True,
    )
    cfg = tiny_run(data__dataset="digits", model__name="flat-linear")
    result = fedhet.run(cfg)
    assert result.accuracy > 0.5  # a linear model on digits; chance is 0.1
    with pytest.raises(ConfigError, match=r"needs a backbone features\(x\) and a Linear classifier 'head'"):
        fedhet.run(cfg, overrides={"method.name": "celm"})
    with pytest.raises(ConfigError, match="does not take parameter"):
        fedhet.run(cfg, overrides={"model.params": {"depth": 3}})
    register(
        "wrong-width", lambda shape, k: nn.Sequential(nn.Flatten(), nn.Linear(64, k + 1)), overwrite=True
    )
    with pytest.raises(ConfigError, match=r"expected logits \(2, 10\)"):
        fedhet.run(cfg, overrides={"model.name": "wrong-width"})
    with pytest.raises(ConfigError, match="already registered"):
        register("wrong-width", lambda shape, k: nn.Linear(1, 1))


def test_a_submodel_method_refuses_a_model_without_maskable_units():
    with pytest.raises(ConfigError, match="needs maskable units"):
        fedhet.run(
            tiny_run(data__dataset="digits", data__validation_fraction=0.1),
            # a model the user configured (not fedhet's default one, which would become mlp200)
            overrides={"method.name": "fedsac", "model.params": {"hidden_sizes": [32]}},
        )


# --------------------------------------------------------------------------------------------------------
# Your own method
# --------------------------------------------------------------------------------------------------------
def test_a_method_registered_from_outside_the_package_runs_by_name():
    from fedhet.algorithms import method_names, register
    from fedhet.algorithms.fedavg import FedAvg

    class Frozen(FedAvg):
        """Never changes the global model (its accuracy stays the initial model's)."""

        name = "frozen-test"

        def aggregate(self, rnd, replies):
            pass

    register(Frozen, overwrite=True)
    assert "frozen-test" in method_names()
    cfg = tiny_run(data__dataset="digits", train__rounds=2, train__local_epochs=3)
    frozen = fedhet.run(cfg, overrides={"method.name": "frozen-test"})
    fedavg = fedhet.run(cfg)
    assert frozen.method == "frozen-test"
    accuracies = [line["accuracy"] for line in frozen.metrics]
    assert accuracies[0] == accuracies[1] < 0.3  # the untrained model, unchanged
    assert fedavg.accuracy > accuracies[0] + 0.3  # the same run with FedAvg's aggregation learns
    with pytest.raises(ConfigError, match="is a built-in method"):
        register(type("Clash", (FedAvg,), {}))  # inherits name = "fedavg"
    with pytest.raises(ConfigError, match="not a Strategy subclass"):
        register(dict)


# --------------------------------------------------------------------------------------------------------
# Named experiments, method defaults, python -m fedhet
# --------------------------------------------------------------------------------------------------------
def test_shipped_experiments_resolve_by_name_and_a_typo_gets_suggestions(capsys):
    on_disk = sorted(
        str(p.relative_to(ROOT / "configs").with_suffix(""))
        for p in (ROOT / "configs").glob("*/*.toml")
        if p.parent.name != "reproduce"
    )
    assert experiment_names() == on_disk and len(on_disk) > 30
    by_name = load_config("celm/fmnist-maverick")
    assert by_name == load_config(ROOT / "configs" / "celm" / "fmnist-maverick.toml")
    assert load_config("configs/celm/fmnist-maverick.toml") == by_name
    with pytest.raises(ConfigError, match="did you mean celm/fmnist-maverick"):
        load_config("celm/fmnist-maverik")
    assert main(["experiments", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [e["name"] for e in listed] == on_disk
    assert all(e["description"] for e in listed)


def test_a_method_needing_a_validation_set_gets_it_with_a_notice_and_compare_shares_it(tmp_path, capsys):
    out = tmp_path / "cffl"
    argv = ["run", "--method", "cffl", "--dataset", "digits", "--clients", "3", "--rounds", "1",
            "--model", "mlp", "--out", str(out), "--quiet"]  # fmt: skip
    assert main(argv) == 0
    assert "note: method 'cffl' needs data.validation_fraction = 0.1" in capsys.readouterr().err
    assert load_config(out / "config.toml").data.validation_fraction == 0.1
    # compare: the defaults of one method apply to every method (one split, one model)
    result = fedhet.compare(
        tiny_run(data__dataset="digits", train__rounds=1, data__clients=4),
        methods=["fedavg", "fedrac"],
        out=tmp_path / "cmp",
    )
    for method in ("fedavg", "fedrac"):
        cfg = load_config(tmp_path / "cmp" / f"{method}-seed0" / "config.toml")
        assert cfg.data.validation_fraction == 0.1 and cfg.model.name == "mlp200"
    assert result.row("fedrac")["mean"]["accuracy"] > 0
    # a value the user chose is never replaced
    chosen = tmp_path / "cffl-chosen"
    assert main([*argv[:-3], "--set", "data.validation_fraction=0.2", "--out", str(chosen), "--quiet"]) == 0
    assert "note: method" not in capsys.readouterr().err  # (the pre-pass still announces itself)
    assert load_config(chosen / "config.toml").data.validation_fraction == 0.2


def test_the_api_names_are_functions_after_every_submodule_is_imported():
    import importlib
    import pkgutil

    for module in pkgutil.walk_packages(fedhet.__path__, "fedhet."):
        if not module.name.startswith("fedhet.flower") and module.name != "fedhet.__main__":
            importlib.import_module(module.name)
    for name in ("run", "compare", "load_config"):
        assert callable(getattr(fedhet, name)) and not isinstance(getattr(fedhet, name), type(fedhet)), name


def test_split_advice_names_shipped_experiments_that_use_that_split():
    import re

    from fedhet.data.splits import SPLIT_ADVICE, SPLITS

    for split, advice in SPLIT_ADVICE.items():
        assert split in SPLITS
        [name] = re.findall(r"\b(\w+/[\w.-]+)\)?", advice)
        assert load_config(name).data.split == split, (split, name)


def test_python_dash_m_fedhet_is_the_cli():
    done = subprocess.run(
        [sys.executable, "-m", "fedhet", "methods"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert "celm:" in done.stdout and "needs: a server validation set" in done.stdout


# --------------------------------------------------------------------------------------------------------
# The examples, at tiny scale
# --------------------------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize(
    "script", ["quickstart", "own_data", "own_model", "own_method", "own_attack", "tabular"]
)
def test_every_example_runs(script, tmp_path):
    env = {**os.environ, "FEDHET_CACHE": str(tmp_path / "cache")}
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / f"{script}.py"), "--tiny"],
        capture_output=True, text=True, timeout=600, cwd=tmp_path, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "accuracy" in done.stdout


# --------------------------------------------------------------------------------------------------------
# Tracking: TensorBoard scalars and CSV tables
# --------------------------------------------------------------------------------------------------------
def test_tensorboard_scalars_are_the_metrics_lines(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    cfg = tiny_run(data__dataset="digits", method__name="celm", train__rounds=3, eval__tensorboard=True)
    cfg["method"]["params"] = {"warmup_fraction": 0.34, "probe_steps": 5}
    result = fedhet.run(cfg, out=tmp_path / "run")
    events = EventAccumulator(str(tmp_path / "run" / "tensorboard"))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {"accuracy", "loss", "per_class_recall/9", "contributions/2", "aggregation_weights/0"} <= tags
    for line in result.metrics:
        by_round = {e.step: e.value for e in events.Scalars("accuracy")}
        assert by_round[line["round"]] == pytest.approx(line["accuracy"], rel=1e-6)
        weights = {e.step: e.value for e in events.Scalars("contributions/2")}
        assert weights[line["round"]] == pytest.approx(line["contributions"][2], rel=1e-6)
    # tracking changes no result: the same experiment as without it
    assert (
        load_config(tmp_path / "run" / "config.toml").run_fingerprint()
        == fedhet.api.as_config({**cfg, "eval": {"fairness": False}}).run_fingerprint()
    )


def test_installed_packages_add_methods_models_and_data_through_entry_points(tmp_path, monkeypatch):
    """A package's entry points (a dist-info written here, as pip would) make its names resolve."""
    (tmp_path / "my_plugin.py").write_text(
        "import numpy as np\n"
        "from torch import nn\n"
        "from fedhet.algorithms.fedavg import FedAvg\n"
        "from fedhet.data import from_arrays\n"
        "class Uniform(FedAvg):\n"
        "    name = 'plugin-uniform'\n"
        "    def __init__(self, **kw):\n"
        "        super().__init__(weighting='uniform', **kw)\n"
        "def linear(shape, k):\n"
        "    return nn.Sequential(nn.Flatten(), nn.Linear(shape[0] * shape[1] * shape[2], k))\n"
        "def tiny_data():\n"
        "    rng = np.random.default_rng(0)\n"
        "    y = np.arange(90) % 3\n"
        "    x = (rng.random((90, 6, 6)) * 40 + y[:, None, None] * 80).astype(np.uint8)\n"
        "    return from_arrays(x[:60], y[:60], x[60:], y[60:], name='plugin-data')\n"
    )
    info = tmp_path / "my_plugin-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: my-plugin\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(
        "[fedhet.methods]\nplugin-uniform = my_plugin:Uniform\n"
        "[fedhet.models]\nplugin-linear = my_plugin:linear\n"
        "[fedhet.datasets]\nplugin-data = my_plugin:tiny_data\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    from fedhet.algorithms import method_names

    assert "plugin-uniform" in method_names()
    cfg = tiny_run(data__dataset="plugin-data", model__name="plugin-linear", method__name="plugin-uniform")
    cfg["data"].update(split="dirichlet-per-client", split_params={"alpha": 1.0})  # unequal client sizes
    result = fedhet.run(cfg)
    assert result.method == "plugin-uniform" and len(result.final["per_class_recall"]) == 3
    shares = list(result.metrics[-1]["aggregation_weights"].values())
    assert shares == pytest.approx([1 / 3] * 3)  # the plugin's uniform weighting, whatever the sizes
    assert result.accuracy > 0.6  # three well-separated classes; chance is 1/3


@pytest.mark.slow
def test_a_method_registered_at_import_time_reaches_compare_worker_processes(tmp_path):
    """docs/your-own-data.md: compare --jobs N spawns workers that import the calling script again, so a
    registration at its top level is seen there."""
    script = tmp_path / "my_study.py"
    script.write_text(
        "import fedhet\n"
        "from fedhet.algorithms import register\n"
        "from fedhet.algorithms.fedavg import FedAvg\n"
        "class Renamed(FedAvg):\n"  # FedAvg under a name only this script registers
        "    name = 'fedavg-renamed'\n"
        "register(Renamed)\n"
        "if __name__ == '__main__':\n"
        "    cfg = {'data': {'dataset': 'digits', 'clients': 3}, 'model': {'name': 'mlp'},\n"
        "           'train': {'rounds': 1}, 'eval': {'fairness': False}}\n"
        "    methods = ['fedavg', 'fedavg-renamed']\n"
        "    table = fedhet.compare(cfg, methods=methods, seeds=[0, 1], jobs=2, out='cmp')\n"
        "    print('ROWS', [r['method'] for r in table.rows], table.runs['fedavg-renamed'][1].method)\n"
    )
    env = {**os.environ, "FEDHET_CACHE": str(tmp_path / "cache")}
    done = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "ROWS ['fedavg', 'fedavg-renamed'] fedavg-renamed" in done.stdout
