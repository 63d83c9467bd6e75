"""Federated imputation of a table's missing numbers (data.impute, data.missing_indicator): each strategy
against a hand computation on two sites, the test rows, the indicator, the default refusal, the file and
data-frame routes, and a run on a real table with missing cells."""

from __future__ import annotations

import csv
import json
import logging

import numpy as np
import pytest

from fedhet.cli import main
from fedhet.config import from_dict
from fedhet.data.datasets.standardization import federated_order_statistic, order_statistic_search
from fedhet.data.datasets.tables import from_table, load_table_files
from fedhet.errors import ConfigError, DataError

NA = "NA"


@pytest.fixture(autouse=True)
def _tmp_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDHET_CACHE", str(tmp_path / "cache"))


# Two sites whose own statistics differ from the federation's: present values of x are 1, 2, 3 at north and
# 5, 10, 20, 20, 40 at south. By hand, over the 8 present values: sum 101, mean 101 / 8 = 12.625; sorted
# 1 2 3 5 | 10 20 20 40, median (5 + 10) / 2 = 7.5; most frequent 20 (twice). A per-site average would
# differ: of the means (2 + 19) / 2 = 10.5, of the medians (2 + 20) / 2 = 11.
TRAIN = {
    "x": ["1", "2", "3", NA, "5", "10", "20", "20", "40", ""],
    "y": ["0.5", "1.5", "2.5", "3.5", "4.5", "5.5", "6.5", "7.5", "8.5", "9.5"],  # never missing
    "z": ["4", "4", "4", "8", "8", "8", "8", "8", "8", "8"],  # missing in a test row only
    "ward": ["a", "?", "b", "a", "b", "a", "b", "a", "b", "a"],  # a missing category stays "(missing)"
    "site": ["north"] * 4 + ["south"] * 6,
    "label": ["ill", "well"] * 5,
}
TEST = {
    "x": [NA, "7"],
    "y": ["1", "2"],
    "z": ["4", "null"],
    "ward": ["a", "b"],
    "site": ["north", "south"],
    "label": ["ill", "well"],
}
X_PRESENT = [1, 2, 3, None, 5, 10, 20, 20, 40, None]  # train x, None where missing
# z's fill: mean 68 / 10 = 6.8, median 8, most frequent 8 (its 10 training values are all present)
FILLS = {"mean": (12.625, 6.8), "median": (7.5, 8.0), "most_frequent": (20.0, 8.0)}


def _table(impute, indicator=False):
    return from_table(TRAIN, TEST, label="label", client="site", impute=impute, missing_indicator=indicator)


@pytest.mark.parametrize("strategy", ["mean", "median", "most_frequent"])
def test_each_strategy_fills_train_and_test_with_the_federations_value_not_a_site_average(strategy):
    x_fill, z_fill = FILLS[strategy]
    data = _table(strategy)
    assert data.feature_names == ("x", "y", "z", "ward=(missing)", "ward=a", "ward=b")
    x = data.train_x[:, 0].numpy()
    expected = np.array([x_fill if v is None else v for v in X_PRESENT], dtype=np.float32)
    np.testing.assert_allclose(x, expected, rtol=1e-7)  # float32 features: exact to their rounding
    np.testing.assert_allclose(data.test_x[:, 0].numpy(), [x_fill, 7.0], rtol=1e-7)  # a test NA: train fill
    np.testing.assert_allclose(data.test_x[:, 2].numpy(), [4.0, z_fill], rtol=1e-7)
    np.testing.assert_allclose(data.train_x[:, 1].numpy(), np.arange(10) + 0.5)  # untouched
    assert data.train_x[1, 3] == 1.0  # ward "?" is the (missing) category, not imputed


def test_the_median_is_exact_on_odd_counts_ties_and_negatives():
    # 7 values: sorted -3.25 -0.5 0 0 1e-300 2 1e300, the middle (index 3) is 0
    sites = [np.array([0.0, -3.25, np.nan, 1e300]), np.array([2.0, 0.0, -0.5, 1e-300])]
    values = np.sort(np.concatenate(sites)[~np.isnan(np.concatenate(sites))])

    def count_at_most(t):
        return int(np.sum(values <= t))

    assert [federated_order_statistic(k, count_at_most) for k in range(7)] == [
        -3.25, -0.5, 0.0, 0.0, 1e-300, 2.0, 1e300,
    ]  # fmt: skip


def test_the_float32_bisection_ends_on_each_order_statistic_within_32_questions():
    """Deployment nodes' median search: over float32 values (negative, zero, tiny, huge, repeated) it ends on
    numpy's sorted value of every rank, asking at most 32 thresholds (the float64 search may ask 64)."""
    rng = np.random.default_rng(0)
    values = np.concatenate([
        rng.normal(0, 10, 40), [-0.0, 0.0, 0.0, 1e-40, -1e-40, 3.4e38, -3.4e38, 7.25, 7.25],
    ]).astype(np.float32).astype(np.float64)  # fmt: skip
    ordered = np.sort(values)
    for k in range(len(values)):
        search, asked = order_statistic_search(k, width=32), 0
        try:
            threshold = next(search)
            while True:
                asked += 1
                threshold = search.send(int(np.sum(values <= threshold)))
        except StopIteration as done:
            assert done.value == ordered[k] and asked <= 32, (k, asked)


def test_most_frequent_breaks_a_tie_towards_the_smallest_value():
    data = from_table(
        {"v": ["3", "3", "1", "1", "2", NA], "s": ["p", "p", "q", "q", "q", "q"], "label": ["a", "b"] * 3},
        {"v": [NA], "s": ["p"], "label": ["a"]},
        label="label", client="s", impute="most_frequent",
    )  # fmt: skip
    assert data.train_x[5, 0] == 1.0 and data.test_x[0, 0] == 1.0


def test_the_indicator_marks_each_column_with_a_missing_training_cell():
    data = _table("median", indicator=True)
    # x has missing training cells: x=missing follows it; z is missing in a test row only: no indicator
    assert data.feature_names == ("x", "x=missing", "y", "z", "ward=(missing)", "ward=a", "ward=b")
    assert data.numeric == (True, False, True, True, False, False, False)  # the indicator is not standardised
    assert data.train_x[:, 1].tolist() == [0, 0, 0, 1, 0, 0, 0, 0, 0, 1]
    assert data.test_x[:, 1].tolist() == [1, 0]
    assert data.mean[1] == 0.0 and data.std[1] == 1.0


def test_the_run_log_names_each_imputed_column_its_cells_per_site_and_the_fill(caplog):
    with caplog.at_level(logging.WARNING, logger="fedhet"):
        _table("mean")
    text = caplog.text
    assert "imputed column 'x' with the mean of the sites' training rows, 12.625" in text
    assert "missing cells per site: north 1, south 1; test rows 1" in text
    assert "imputed column 'z' with the mean of the sites' training rows, 6.8" in text
    assert "'y'" not in text


def test_the_default_still_refuses_missing_numbers():
    with pytest.raises(DataError, match=r"column 'x' has 2 missing.*per site: north 1, south 1.*data.impute"):
        _table(None)


def test_bad_options_are_refused_with_the_accepted_values():
    with pytest.raises(ConfigError, match=r"impute='avg' is not accepted; choose one of \['mean', 'median'"):
        _table("avg")
    with pytest.raises(
        ConfigError, match="missing_indicator = true marks imputed cells, but impute is not set"
    ):
        _table(None, indicator=True)
    with pytest.raises(ConfigError, match=r"data.impute='avg' is not accepted.*'most_frequent'"):
        from_dict({"data": {"dataset": "csv", "path": "t.csv", "impute": "avg"}})
    with pytest.raises(ConfigError, match="not of 'wine': for a data frame pass impute= to"):
        from_dict({"data": {"dataset": "wine", "impute": "mean"}})
    with pytest.raises(ConfigError, match="data.missing_indicator = true .* data.impute is not set"):
        from_dict({"data": {"dataset": "csv", "path": "t.csv", "missing_indicator": True}})
    with pytest.raises(DataError, match="column 'x' has no present value in any site's training rows"):
        from_table({"x": [NA, NA], "label": ["a", "b"]}, {"x": ["1"], "label": ["a"]}, impute="mean")
    with pytest.raises(
        DataError, match=r"column 'x' has 1 infinite value\(s\) in train.*inf is never imputed"
    ):
        from_table({"x": ["inf", NA], "label": ["a", "b"]}, {"x": ["1"], "label": ["a"]}, impute="mean")


def _write_csv(path, columns):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(list(columns))
        writer.writerows(zip(*columns.values(), strict=True))


def _without(columns, name, rows=None):
    return {
        k: [v[i] for i in (rows if rows is not None else range(len(v)))]
        for k, v in columns.items()
        if k != name
    }


def test_a_csv_folder_and_a_data_frame_give_the_same_features(tmp_path):
    pd = pytest.importorskip("pandas")
    for site, rows in (("north", range(4)), ("south", range(4, 10))):
        _write_csv(tmp_path / "t" / "train" / f"{site}.csv", _without(TRAIN, "site", rows))
    _write_csv(tmp_path / "t" / "test.csv", _without(TEST, "site"))
    files = load_table_files(tmp_path / "t", label="label", impute="median", missing_indicator=True)
    frame = pd.DataFrame({k: [None if v in (NA, "") else v for v in vs] for k, vs in TRAIN.items()})
    frame["x"] = pd.to_numeric(frame["x"])  # a float column with NaN, as pandas reads one
    frames = from_table(frame, pd.DataFrame(TEST), label="label", client="site", impute="median",
                        missing_indicator=True)  # fmt: skip
    assert files.feature_names == frames.feature_names and files.sites == frames.sites == ("north", "south")
    # One encoder, two readers (text cells, pandas floats): equal up to float32 rounding of the same numbers.
    np.testing.assert_allclose(files.train_x.numpy(), frames.train_x.numpy(), rtol=1e-7)
    np.testing.assert_allclose(files.test_x.numpy(), frames.test_x.numpy(), rtol=1e-7)
    assert files.train_x[3, 0] == 7.5


def _wine_sites(root, seed=0, missing=0.1):
    """scikit-learn's wine as two sites' CSV files and a test file, with a share of the numeric cells NA."""
    from sklearn.datasets import load_wine

    bunch = load_wine()
    gen = np.random.default_rng(seed)
    order = gen.permutation(len(bunch.target))
    parts = {"site-a": order[:70], "site-b": order[70:140], "test": order[140:]}
    for name, rows in parts.items():
        cells = [[f"{v:g}" for v in bunch.data[i]] for i in rows]
        for row in cells:
            for j in range(len(row)):
                if gen.random() < missing:
                    row[j] = NA
        columns = {f: [row[j] for row in cells] for j, f in enumerate(bunch.feature_names)}
        columns["cultivar"] = [str(bunch.target_names[bunch.target[i]]) for i in rows]
        _write_csv(root / ("test.csv" if name == "test" else f"train/{name}.csv"), columns)
    return root


def test_fedhet_run_learns_wine_with_missing_cells_imputed_and_refuses_them_without(tmp_path, capsys, caplog):
    folder = _wine_sites(tmp_path / "wine")
    args = ["run", "--method", "fedavg", "--dataset", "csv", "--data-path", str(folder), "--model",
            "tabular-mlp", "--rounds", "10", "--set", "data.label_column=cultivar", "--set",
            "data.split=sites", "--set", "data.clients=2", "--set", "train.batch_size=16",
            "--json"]  # fmt: skip
    assert main([*args, "--out", str(tmp_path / "refused")]) == 2
    assert "does not impute unless asked: set data.impute" in capsys.readouterr().err
    with caplog.at_level(logging.WARNING, logger="fedhet"):
        code = main([*args, "--set", "data.impute=mean", "--out", str(tmp_path / "run")])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    # 10 % of the cells missing, filled with the federated mean: 10 rounds reach 34 of the 38 test rows
    # (0.895; 0.921 with no cell missing). Filling with 0 instead reaches 0.763, with -1000 0.605: 0.85
    # tells a working imputation from a broken one.
    assert json.loads(captured.out)["final"]["accuracy"] >= 0.85
    assert "imputed column 'alcohol' with the mean" in caplog.text
