"""The diabetes table held by sites that each see one group of patients, by a real attribute of the rows
(not a random split): the natural federations of the studies (contribution-estimators, table-defaults,
robustness-settings). scikit-learn ships the table, so nothing is downloaded; the files are written under
runs/tables/, the same bytes every time."""

from __future__ import annotations

from pathlib import Path

import numpy as np

#: Natural federations: scikit-learn's diabetes table (442 patients; label: disease progression after a year
#: above the median, 140.5) held by six sites that each see one group of patients, by a real attribute of
#: the rows (not a random split); 20 % of the patients, drawn at random, are the shared test set. The files
#: are written by :func:`write_tables` under runs/tables/ (scikit-learn ships the table: nothing downloaded).
TABLES = {
    "diabetes-by-age": "age band (sextiles of age: 19-33, 34-41, 42-49, 50-54, 55-60, 61-79 years)",
    "diabetes-by-sex-age": "sex x age tercile (six groups)",
}
TABLE_DIR = Path("runs/tables")


def age_bands(bands: int) -> list[str]:
    """Each patient's age band among ``bands`` quantile bands of the training patients' ages (the split of
    :func:`write_site_tables`), ``age-band-<k>``, k = 0 the youngest."""
    from sklearn.datasets import load_diabetes

    age = load_diabetes(scaled=False).data[:, 0]
    edges = np.quantile(age[_diabetes_split()[1]], [k / bands for k in range(1, bands)])
    return [f"age-band-{int(np.searchsorted(edges, a, side='right'))}" for a in age]


def _diabetes_split() -> tuple[np.ndarray, np.ndarray]:
    """(test, train) patient indices: 20 % at random (seed 0) are the shared test set."""
    order = np.random.default_rng(0).permutation(442)
    return np.sort(order[: len(order) // 5]), np.sort(order[len(order) // 5 :])


def write_site_tables(sites: dict[str, list[str]]) -> None:
    """Per name, a CSV of the training patients with each one's site (from ``sites``, one per patient) in
    column ``site``, and the shared test set, from scikit-learn's diabetes table (label: progression above
    the median); the same bytes every time."""
    from sklearn.datasets import load_diabetes

    table = load_diabetes(scaled=False)
    x, target = table.data, table.target
    names = [str(n) for n in table.feature_names]
    label = (target > np.median(target)).astype(int)
    test, train = _diabetes_split()
    TABLE_DIR.mkdir(parents=True, exist_ok=True)
    header = ",".join([*names, "progression"])
    rows = [",".join([*(f"{v:g}" for v in x[i]), str(label[i])]) for i in range(len(label))]
    test_file = TABLE_DIR / "diabetes-test.csv"
    test_file.write_text("\n".join([header, *(rows[i] for i in test)]) + "\n")
    for name, site in sites.items():
        lines = [header + ",site", *(f"{rows[i]},{site[i]}" for i in train)]
        (TABLE_DIR / f"{name}.csv").write_text("\n".join(lines) + "\n")


def write_tables() -> None:
    """The natural federations' CSV files (:data:`TABLES`; :func:`write_site_tables`)."""
    from sklearn.datasets import load_diabetes

    x = load_diabetes(scaled=False).data
    age, sex = x[:, 0], x[:, 1]
    terciles = np.quantile(age[_diabetes_split()[1]], [1 / 3, 2 / 3])
    write_site_tables(
        {
            "diabetes-by-age": age_bands(6),
            "diabetes-by-sex-age": [
                f"sex-{int(s)}-age-{int(np.searchsorted(terciles, a, side='right'))}"
                for s, a in zip(sex, age, strict=True)
            ],
        }
    )
