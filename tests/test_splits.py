"""Exact properties of every data split (baselines.md §4, methods.md §1.2, §2.2, §3.2).

Real Fashion-MNIST train labels where the property allows, balanced synthetic CIFAR-like labels elsewhere.
"""

from __future__ import annotations

import gzip
import math

import numpy as np
import pytest

from fedhet.data.splits import (
    SPLITS,
    Partition,
    holdout_validation,
    make_partition,
    validate_split_params,
)
from fedhet.errors import ConfigError

FMNIST_LABELS = "/usr/share/datasets/fashion-mnist/train-labels-idx1-ubyte.gz"


@pytest.fixture(scope="module")
def fmnist() -> np.ndarray:
    with gzip.open(FMNIST_LABELS, "rb") as f:
        raw = f.read()
    assert int.from_bytes(raw[:4], "big") == 2049  # idx1 magic
    labels = np.frombuffer(raw, dtype=np.uint8, offset=8).astype(np.int64)
    assert len(labels) == 60_000
    return labels


@pytest.fixture(scope="module")
def cifar_like() -> np.ndarray:
    return np.repeat(np.arange(10), 5000)


# Parameters for the generic checks; every registered split must appear here.
CASES: dict[str, dict] = {
    "iid": {},
    "dirichlet-per-client": {},
    "dirichlet-per-class": {},
    "dirichlet-prior": {},
    "dirichlet-pairs": {},
    "pow": {},
    "cla": {},
    "pure-label-skew": {},
    "step-label-skew": {},
    "step-quantity": {"gamma": 0.01},  # the default 0.05 violates |gamma| < 2/(N(N-1)) at N = 10
    "maverick": {},
    "free-rider": {},
    "duplicate": {},
    "labeled-unlabeled": {},
}
# Splits that sample with replacement: a client may repeat an index (cla; the free rider's tiling) ...
REPEATS_WITHIN = {"cla", "free-rider"}
# ... and clients may share indices (cla draws every client from the same class pools; duplicate's copy).
OVERLAP_ACROSS = {"cla", "duplicate"}
# Splits that hand out every sample of the pool.
USES_ALL = {"iid", "dirichlet-per-client", "dirichlet-per-class", "dirichlet-prior", "dirichlet-pairs"}


# Splits that follow the data's own layout instead of drawing one (tested below and in test_tables.py).
LAYOUT_SPLITS = {"sites"}


def test_every_split_is_covered() -> None:
    assert set(CASES) | LAYOUT_SPLITS == set(SPLITS)
    for name, spec in SPLITS.items():
        assert spec.doc and spec.fn.__doc__, name
        defaults = validate_split_params(name, None)
        assert set(defaults) >= {p.name for p in spec.params}


def _check_indices(name: str, part: Partition, n: int, free_rider: int | None) -> None:
    for i, idx in enumerate(part.clients):
        assert idx.dtype == np.int64
        assert idx.size == 0 or (idx.min() >= 0 and idx.max() < n), (name, i)
        if name not in REPEATS_WITHIN or (name == "free-rider" and i != free_rider):
            assert len(np.unique(idx)) == len(idx), (name, i)
    if name not in OVERLAP_ACROSS:
        distinct = np.concatenate([np.unique(c) for c in part.clients])
        assert len(np.unique(distinct)) == len(distinct), f"{name}: clients overlap"


@pytest.mark.parametrize("name", sorted(CASES))
def test_indices_valid_disjoint_and_seeded(name: str, fmnist: np.ndarray) -> None:
    params = CASES[name]
    part = make_partition(name, fmnist, 10, 0, params)
    assert part.num_clients == 10
    assert part.info["split"] == name
    _check_indices(name, part, len(fmnist), part.info.get("free_rider"))
    if name in USES_ALL:
        assert sum(part.sizes()) == len(fmnist)
        assert np.array_equal(np.sort(np.concatenate(part.clients)), np.arange(len(fmnist)))
    counts = part.class_counts(fmnist, 10)
    assert counts.shape == (10, 10) and counts.dtype == np.int64
    assert counts.sum(axis=1).tolist() == part.sizes()
    if part.unlabeled is not None:
        for u in part.unlabeled:
            assert len(np.unique(u)) == len(u) and u.min() >= 0 and u.max() < len(fmnist)
        flat = np.concatenate(part.unlabeled)
        assert len(np.unique(flat)) == len(flat)

    again = make_partition(name, fmnist, 10, 0, params)
    from_generator = make_partition(name, fmnist, 10, np.random.default_rng(0), params)
    other = make_partition(name, fmnist, 10, 1, params)
    for a, b in zip(part.clients, again.clients, strict=True):
        assert np.array_equal(a, b)
    for a, b in zip(part.clients, from_generator.clients, strict=True):
        assert np.array_equal(a, b)
    assert any(
        len(a) != len(b) or not np.array_equal(a, b) for a, b in zip(part.clients, other.clients, strict=True)
    )


def test_no_global_rng_state_is_used(fmnist: np.ndarray) -> None:
    np.random.seed(1234)
    before = np.random.get_state()[1].copy()
    for name, params in CASES.items():
        make_partition(name, fmnist, 10, 3, params)
    assert np.array_equal(np.random.get_state()[1], before)


# ------------------------------------------------------------------------------------------- CLA / POW


def test_cla_client_i_holds_classes_0_to_i(fmnist: np.ndarray) -> None:
    part = make_partition("cla", fmnist, 10, 0)
    counts = part.class_counts(fmnist, 10)
    for i in range(10):
        k = i + 1
        per = 2000 // k
        expected = np.zeros(10, dtype=np.int64)
        expected[:k] = per
        expected[k - 1] += 2000 - per * k  # top-up from the last class
        assert counts[i].tolist() == expected.tolist(), i
    assert part.sizes() == [2000] * 10


def test_cla_class_counts_follow_linspace(fmnist: np.ndarray) -> None:
    part = make_partition("cla", fmnist, 5, 0, {"samples_per_client": 300})
    held = [(row > 0).sum() for row in part.class_counts(fmnist, 10)]
    assert held == [1, 3, 5, 7, 10]  # int(linspace(1, 10, 5)) = int([1, 3.25, 5.5, 7.75, 10])
    assert part.sizes() == [300] * 5


def test_pow_sizes_match_the_reference_ramp(fmnist: np.ndarray) -> None:
    from scipy.stats import powerlaw

    part = make_partition("pow", fmnist, 10, 0)
    sizes = part.sizes()
    assert sum(sizes) == 20_000
    assert all(a <= b for a, b in zip(sizes, sizes[1:], strict=False))
    b = np.linspace(powerlaw.ppf(0.01, 1.65911332899), powerlaw.ppf(0.99, 1.65911332899), 10)
    ceil = [math.ceil(x) for x in b / b.sum() * 20_000]
    assert sizes[:-1] == ceil[:-1]  # the reference's shards; its last slice is the remainder
    assert sizes[-1] == 20_000 - sum(ceil[:-1])
    # Many clients: the ceil excess (up to N-1) must still be removed without breaking the order.
    many = make_partition("pow", fmnist, 100, 0, {"samples_per_client": 500}).sizes()
    assert sum(many) == 50_000 and all(a <= b for a, b in zip(many, many[1:], strict=False))


# ------------------------------------------------------------------------------------------- PLS / SLS


def _simulate_pls(class_sizes, chosen_labels, num_clients, min_labels, min_spl, max_spl) -> np.ndarray:
    """The PLS v2 rule of baselines.md §4.4 applied to given label choices: raw (client, label) takes."""
    step = (max_spl - min_spl) // num_clients
    left = list(class_sizes)
    raw = np.zeros((num_clients, len(class_sizes)), dtype=np.int64)
    for i, chosen in enumerate(chosen_labels):
        need, total = min_spl + (num_clients - i) * step, 0
        for c in chosen:
            if left[c] < min_spl:
                continue
            take = min(need, left[c])
            raw[i, c], left[c], total = take, left[c] - take, total + take
            if total > min_labels * max_spl:
                break
    return raw


@pytest.mark.parametrize("seed", [0, 1])
def test_pls_fashion_mnist_matches_the_spec(fmnist: np.ndarray, seed: int) -> None:
    # `fedhet partition --dataset fashion-mnist --split pure-label-skew --clients 10 --seed 0` with the
    # F-MNIST defaults m_min = 2, min_spl = 100, max_spl = 3000: m_i = 2 + i·⌊8/9⌋ = 2 for everyone, and
    # client i aims for 100 + (10 − i)·⌊2900/10⌋ = 3000, 2710, ..., 390 samples per label; 2 labels never
    # exceed 2·3000, so the stopping rule never fires. Which labels collide (and run out) is random: the
    # raw takes are re-derived from the rule given the recorded label choices.
    part = make_partition("pure-label-skew", fmnist, 10, seed)
    info = part.info
    assert info["target_labels"] == [2] * 10
    assert info["target_samples_per_label"] == [100 + (10 - i) * 290 for i in range(10)]
    chosen = info["chosen_labels"]
    assert [len(set(c)) for c in chosen] == [2] * 10
    raw = _simulate_pls(np.bincount(fmnist, minlength=10).tolist(), chosen, 10, 2, 100, 3000)
    assert info["raw_sizes"] == raw.sum(axis=1).tolist()
    final = int(raw.sum(axis=1).min())
    counts = part.class_counts(fmnist, 10)
    assert part.sizes() == [final] * 10  # equal quantity: subsampled to the smallest client
    assert np.all(counts <= raw)  # a subsample of each client's raw takes
    assert np.all((counts > 0).sum(axis=1) <= 2)


def test_pls_known_answer_with_depletion_and_stopping() -> None:
    # Two classes, m_min = 2: every client takes both labels. N = 4, min 100, max 400: per label
    # 400, 325, 250, 175; classes of 1100 leave 125 for client 3 -> everyone is cut to 250 = 2·125.
    labels = np.repeat([0, 1], 1100)
    part = make_partition("pure-label-skew", labels, 4, 0, {"max_samples_per_label": 400})
    assert part.info["raw_sizes"] == [800, 650, 500, 250]
    assert part.sizes() == [250] * 4
    assert part.class_counts(labels, 2)[3].tolist() == [125, 125]
    # With 1000 per class only 25 are left: client 3 skips both labels and gets nothing -> error.
    with pytest.raises(ConfigError, match="max_samples_per_label"):
        make_partition("pure-label-skew", np.repeat([0, 1], 1000), 4, 0, {"max_samples_per_label": 400})
    # Stopping rule: N = 2, K = 6 gives m = [2, 6]; client 1 takes 250 per label and stops after the 4th
    # label, the first time its total exceeds m_min·max_spl = 800.
    labels6 = np.repeat(np.arange(6), 2000)
    part = make_partition("pure-label-skew", labels6, 2, 0, {"max_samples_per_label": 400})
    assert part.info["target_labels"] == [2, 6]
    assert part.info["raw_sizes"] == [800, 1000]
    assert part.sizes() == [800, 800]
    assert (part.class_counts(labels6, 6)[1] > 0).sum() == 4  # 200 dropped from 4×250 cannot empty a label


def test_sls_labels_step_and_equal_shares(fmnist: np.ndarray) -> None:
    part = make_partition("step-label-skew", fmnist, 5, 0)
    counts = part.class_counts(fmnist, 10)
    assert (counts > 0).sum(axis=1).tolist() == [2, 4, 6, 8, 10]  # m_min + i·⌊(10 − 2)/4⌋
    assert part.info["target_labels"] == [2, 4, 6, 8, 10]
    for k in range(10):
        held = counts[:, k][counts[:, k] > 0]
        assert held.sum() == 6000  # each chosen label's full index set is used (client 4 holds all labels)
        assert held.max() - held.min() <= 1  # split equally among its holders


def test_step_quantity_shares(fmnist: np.ndarray) -> None:
    part = make_partition("step-quantity", fmnist, 5, 0, {"gamma": 0.05})
    ratios = 1 / 5 - 2 * 0.05 + 0.05 * np.arange(5)  # 0.1, 0.15, ..., 0.3
    counts = part.class_counts(fmnist, 10)
    assert np.array_equal(counts, np.tile(np.floor(ratios * 6000).astype(np.int64)[:, None], (1, 10)))
    with pytest.raises(ConfigError, match="gamma"):
        make_partition("step-quantity", fmnist, 10, 0)  # 0.05 >= 2/(10·9)


# ------------------------------------------------------------------------------------------- Dirichlet family


def test_dirichlet_per_client_tiny_alpha_gives_near_single_class_clients(fmnist: np.ndarray) -> None:
    def top_share(alpha: float, seed: int) -> float:
        counts = make_partition("dirichlet-per-client", fmnist, 10, seed, {"alpha": alpha}).class_counts(
            fmnist, 10
        )
        full = counts[counts.sum(axis=1) > 0]
        return float((full.max(axis=1) / full.sum(axis=1)).mean())

    # With q_i ~ Dir(0.01) each client weighs one class ~1; a class nobody picked (≈ 10·0.9^10 ≈ 3.5 of
    # them at N = K = 10) goes whole to one client, so the expected top share is ≈ 1 − 3.5·0.5/10 ≈ 0.83.
    tiny = np.mean([top_share(0.01, s) for s in range(5)])
    assert tiny >= 0.78
    assert np.mean([top_share(1.0, s) for s in range(5)]) < 0.5


def test_dirichlet_per_class_min_size_retry(fmnist: np.ndarray) -> None:
    part = make_partition("dirichlet-per-class", fmnist, 10, 0, {"alpha": 0.1, "min_size": 2000})
    assert min(part.sizes()) >= 2000
    assert part.info["attempts"] >= 1
    with pytest.raises(ConfigError, match="min_size"):
        make_partition("dirichlet-per-class", fmnist, 10, 0, {"min_size": 6001})


def test_dirichlet_prior_equal_sizes_and_matched_mixture(cifar_like: np.ndarray) -> None:
    part = make_partition("dirichlet-prior", cifar_like, 10, 0, {"alpha": 3.0})
    info = part.info
    assert info["target_sizes"] == [5000] * 10
    q = np.asarray(info["mixtures"])
    s = np.asarray(info["target_sizes"], dtype=float)
    prior = np.full(10, 0.1)
    mixture = (s @ q) / s.sum()
    error = float(((mixture / mixture.sum() - prior) ** 2).sum())
    assert error == pytest.approx(info["mixture_error"], rel=1e-9, abs=1e-15)
    assert error <= info["tolerance_used"]
    assert error < 1e-2  # 10 unmatched Dir(0.3·1) mixtures average ≈ 0.07 away
    # Class k is cut ∝ q_ik·s_i, so client i gets s_i·Σ_k q_ik·p_k/m_k (± 1 per class) ...
    expected = s * (q * (prior / mixture)).sum(axis=1)
    assert np.all(np.abs(np.asarray(part.sizes()) - expected) <= 10)
    # ... which is the equal target up to the mixture mismatch.
    slack = s * np.max(np.abs(prior / mixture - 1)) + 10
    assert np.all(np.abs(np.asarray(part.sizes()) - s) <= slack)


def test_dirichlet_pairs_equal_parts(fmnist: np.ndarray) -> None:
    part = make_partition("dirichlet-pairs", fmnist, 20, 0, {"alpha": 0.1})
    assert part.sizes() == [3000] * 20
    odd = make_partition("dirichlet-pairs", fmnist[:59_997], 20, 0)
    assert odd.sizes() == [3000] * 17 + [2999] * 3  # 59,997 = 20·2999 + 17
    assert (
        make_partition("dirichlet-pairs", fmnist, 5, 0).sizes() == [12_000] * 5
    )  # odd N: a lone last worker
    counts = part.class_counts(fmnist, 10)
    classes_held = ((counts / counts.sum(axis=1, keepdims=True)) >= 0.05).sum(axis=1).mean()
    assert classes_held <= 7  # skewed; IID holds all 10
    iid = make_partition("dirichlet-pairs", fmnist, 20, 0, {"alpha": 0})
    assert np.all(iid.class_counts(fmnist, 10) == 300)  # alpha = 0: per class ⌊c/N·6000⌋ slices


# ------------------------------------------------------------------------------------------- composite


def test_maverick_rare_classes_on_maverick_clients_only(fmnist: np.ndarray) -> None:
    params = {
        "rare_classes": "0,3",
        "maverick_clients": [1, 2],
        "rare_fraction": 0.1,
        "base": "dirichlet-per-client",
        "base_alpha": 0.5,
    }
    part = make_partition("maverick", fmnist, 5, 0, params)
    counts = part.class_counts(fmnist, 10)
    for r in (0, 3):
        assert counts[[0, 3, 4], r].sum() == 0
        assert counts[:, r].sum() == round(0.1 * 6000)
        assert counts[1, r] == counts[2, r] == 300  # split evenly among the mavericks
    others = [k for k in range(10) if k not in (0, 3)]
    assert np.all(counts[:, others].sum(axis=0) == 6000)  # the base split uses every other sample
    assert part.info["rare_classes"] == [0, 3] and part.info["maverick_clients"] == [1, 2]
    assert part.info["params"]["base_alpha"] == 0.5

    default = make_partition("maverick", fmnist, 10, 0)
    c = default.class_counts(fmnist, 10)
    assert c[0, 0] == 600 and c[1:, 0].sum() == 0
    assert c[:, 1:].sum(axis=1).tolist() == [5400] * 10  # IID base: 54,000 other samples in equal shards


def test_free_rider(fmnist: np.ndarray) -> None:
    part = make_partition("free-rider", fmnist, 5, 0, {"free_rider": 2, "actual_size": 10})
    rider = part.clients[2]
    sizes = part.sizes()
    assert len(np.unique(rider)) == 10
    assert sizes[2] == int(np.mean([sizes[i] for i in (0, 1, 3, 4)]))  # floor of the others' mean
    assert part.info["free_rider"] == 2 and part.info["free_rider_source"] == "shard"
    repeats = np.unique(rider, return_counts=True)[1]
    assert repeats.max() - repeats.min() <= 1  # tiled evenly
    rest = np.concatenate([part.clients[i] for i in (0, 1, 3, 4)])
    assert not np.isin(rider, rest).any()  # its 10 come from its own shard

    tiny = np.repeat(np.arange(3), 10)  # shards far below actual_size: keeps all of its shard
    small = make_partition("free-rider", tiny, 3, 0, {"actual_size": 50})
    info = small.info
    kept = info["free_rider_shard_size"] if info["free_rider_shard_size"] else 30
    assert (
        info["free_rider_distinct"] == len(np.unique(small.clients[0])) == min(kept, info["free_rider_size"])
    )


def test_labeled_unlabeled(cifar_like: np.ndarray) -> None:
    for base in ("dirichlet-pairs", "iid"):
        part = make_partition("labeled-unlabeled", cifar_like, 20, 0, {"base": base})
        assert part.unlabeled is not None
        labeled_counts = part.class_counts(cifar_like, 10)
        assert labeled_counts.sum(axis=0).tolist() == [500] * 10
        assert part.sizes() == [250] * 20  # both bases cut equal parts
        all_labeled = np.concatenate(part.clients)
        heads = []
        for lab, unl in zip(part.clients, part.unlabeled, strict=True):
            assert np.array_equal(unl[len(unl) - len(lab) :], lab)  # the labeled copies are appended
            head = unl[: len(unl) - len(lab)]
            assert not np.isin(head, all_labeled).any()  # pools disjoint before the append
            heads.append(head)
        assert [len(h) for h in heads] == [2250] * 20
        every = np.sort(np.concatenate([*heads, all_labeled]))
        assert np.array_equal(every, np.arange(50_000))
    with pytest.raises(ConfigError, match="labeled_per_class"):
        make_partition("labeled-unlabeled", cifar_like, 20, 0, {"labeled_per_class": 5001})


@pytest.mark.parametrize("holders", [[3], [0, 7, 12], [19, 2, 5, 11]])
def test_labeled_unlabeled_with_labels_at_some_clients(cifar_like: np.ndarray, holders: list[int]) -> None:
    part = make_partition("labeled-unlabeled", cifar_like, 20, 0, {"labeled_clients": holders})
    sizes = part.sizes()
    # only the listed clients hold labels, and together they hold the whole budget of 500 per class
    assert [i for i, n in enumerate(sizes) if n > 0] == sorted(holders)
    assert part.class_counts(cifar_like, 10).sum(axis=0).tolist() == [500] * 10
    assert sum(sizes[h] for h in holders) == 5000 and max(sizes) - min(sizes[h] for h in holders) <= 1
    labeled = np.concatenate(part.clients)
    for i, (lab, unl) in enumerate(zip(part.clients, part.unlabeled, strict=True)):
        assert np.array_equal(unl[len(unl) - len(lab) :], lab)
        if i not in holders:
            assert len(lab) == 0 and not np.isin(unl, labeled).any()  # unlabeled data only
    # the unlabeled pool is split over all 20 clients as without the parameter, and every sample is used
    assert [len(u) - len(c) for u, c in zip(part.unlabeled, part.clients, strict=True)] == [2250] * 20
    heads = [u[: len(u) - len(c)] for u, c in zip(part.unlabeled, part.clients, strict=True)]
    every = np.sort(np.concatenate([*heads, labeled]))
    assert np.array_equal(every, np.arange(50_000))
    assert part.info["labeled_clients"] == sorted(holders)


def test_labeled_clients_listing_every_client_is_the_default_split(cifar_like: np.ndarray) -> None:
    default = make_partition("labeled-unlabeled", cifar_like, 10, 4, {})
    every = make_partition("labeled-unlabeled", cifar_like, 10, 4, {"labeled_clients": list(range(10))})
    for a, b in zip(default.clients + default.unlabeled, every.clients + every.unlabeled, strict=True):
        assert np.array_equal(a, b)
    assert "labeled_clients" not in default.info  # earlier runs' partition records are unchanged


def test_labeled_clients_errors_name_the_problem(cifar_like: np.ndarray) -> None:
    with pytest.raises(ConfigError, match=r"labeled_clients \[20\] are not clients.*0\.\.19"):
        make_partition("labeled-unlabeled", cifar_like, 20, 0, {"labeled_clients": [1, 20]})
    with pytest.raises(ConfigError, match="repeats a value"):
        make_partition("labeled-unlabeled", cifar_like, 20, 0, {"labeled_clients": "2,2"})
    with pytest.raises(ConfigError, match="is empty"):
        make_partition("labeled-unlabeled", cifar_like, 20, 0, {"labeled_clients": []})


# ------------------------------------------------------------------------------------------- validation


def test_validate_split_params_coerces_and_fills_defaults() -> None:
    assert validate_split_params("dirichlet-per-client", {"alpha": "0.05"}) == {"alpha": 0.05}
    assert validate_split_params("dirichlet-per-class", None) == {"alpha": 0.5, "min_size": 10}
    out = validate_split_params(
        "maverick", {"rare_classes": "0,1", "maverick_clients": "[2, 3]", "base": "iid"}
    )
    assert out["rare_classes"] == [0, 1] and out["maverick_clients"] == [2, 3]
    assert validate_split_params("pow", {"samples_per_client": "600"})["samples_per_client"] == 600
    assert validate_split_params("dirichlet-pairs", {"alpha": 0})["alpha"] == 0.0  # 0 = IID is allowed here
    full = validate_split_params("maverick", {"base": "dirichlet-prior"})
    assert full["base_alpha"] == 3.0 and full["base_tolerance"] == 1e-6


@pytest.mark.parametrize(
    ("name", "params", "words"),
    [
        ("no-such-split", {}, ["no-such-split", "dirichlet-per-client", "pure-label-skew"]),
        ("iid", {"alpha": 1}, ["'alpha'", "(none)"]),
        ("dirichlet-per-class", {"beta": 1}, ["'beta'", "alpha", "min_size"]),
        ("dirichlet-per-client", {"alpha": 0}, ["'alpha'", "0", "> 0"]),
        ("dirichlet-per-client", {"alpha": "-0.5"}, ["'alpha'", "-0.5"]),
        ("dirichlet-per-client", {"alpha": "abc"}, ["'alpha'", "abc", "a number"]),
        ("pow", {"samples_per_client": "2.5"}, ["'samples_per_client'", "2.5", "integer"]),
        ("cla", {"samples_per_client": True}, ["'samples_per_client'"]),
        ("maverick", {"base": "cla"}, ["'base'", "'iid'", "'dirichlet-per-client'"]),
        ("maverick", {"base_alpha": 0.5}, ["'base_alpha'", "rare_classes"]),
        ("maverick", {"rare_classes": "0,0"}, ["'rare_classes'", "repeats"]),
        ("maverick", {"rare_fraction": 1.5}, ["'rare_fraction'", "1.5", "<= 1"]),
        (
            "pure-label-skew",
            {"max_samples_per_label": 50},
            ["max_samples_per_label", "min_samples_per_label"],
        ),
    ],
)
def test_validate_split_params_errors(name: str, params: dict, words: list[str]) -> None:
    with pytest.raises(ConfigError) as err:
        validate_split_params(name, params)
    for word in words:
        assert word in str(err.value), (word, str(err.value))


def test_make_partition_argument_errors(fmnist: np.ndarray) -> None:
    with pytest.raises(ConfigError, match="num_clients=11"):
        make_partition("iid", fmnist[:10], 11, 0)
    with pytest.raises(ConfigError, match="alpha"):
        make_partition("dirichlet-per-client", fmnist, 10, 0, {"alpha": -1})
    with pytest.raises(ConfigError, match="maverick_clients"):
        make_partition("maverick", fmnist, 3, 0, {"maverick_clients": [5]})
    with pytest.raises(ConfigError, match="free_rider"):
        make_partition("free-rider", fmnist, 3, 0, {"free_rider": 3})
    with pytest.raises(ConfigError, match="samples_per_client"):
        make_partition("pow", fmnist, 40, 0)  # 40·2000 > 60,000


def test_holdout_validation() -> None:
    pool, val = holdout_validation(60_000, 0.1, np.random.default_rng(0))
    assert len(val) == 6000 and len(pool) == 54_000
    assert np.array_equal(np.sort(np.concatenate([pool, val])), np.arange(60_000))
    _, val_other = holdout_validation(60_000, 0.1, np.random.default_rng(1))
    assert not np.array_equal(val, val_other)
    assert len(holdout_validation(7, 0.5, np.random.default_rng(0))[1]) == round(3.5)
    assert len(holdout_validation(10, 0.0, np.random.default_rng(0))[1]) == 0
    with pytest.raises(ConfigError, match="fraction"):
        holdout_validation(10, 1.0, np.random.default_rng(0))


def test_plot_class_counts(tmp_path, fmnist: np.ndarray) -> None:
    from PIL import Image

    from fedhet.report.figures import plot_class_counts

    counts = make_partition("dirichlet-per-client", fmnist, 10, 0).class_counts(fmnist, 10)
    out = tmp_path / "figs" / "counts.png"
    plot_class_counts(counts, out, title="Dir(0.1)", class_names=[f"c{k}" for k in range(10)])
    with Image.open(out) as img:
        assert img.format == "PNG" and img.size[0] > 200 and img.size[1] > 200
    big = tmp_path / "big.png"
    plot_class_counts(np.arange(100 * 30).reshape(100, 30), big)  # too many cells to annotate
    assert big.stat().st_size > 0
    with pytest.raises(ValueError, match="class_names"):
        plot_class_counts(counts, tmp_path / "x.png", class_names=["a"])


# ------------------------------------------------------------------------------------------- sites


def test_sites_gives_each_client_exactly_its_rows_and_refuses_a_count_mismatch() -> None:
    labels = np.array([0, 1, 0, 1, 1, 0, 0])
    site_of = np.array([2, 0, 1, 2, 0, 0, 1])
    part = make_partition("sites", labels, 3, 0, site_of=site_of)
    assert [c.tolist() for c in part.clients] == [[1, 4, 5], [2, 6], [0, 3]]
    with pytest.raises(ConfigError, match="data name 3 clients but data.clients = 2"):
        make_partition("sites", labels, 2, 0, site_of=site_of)
    with pytest.raises(ConfigError, match="client.s. \\[1\\] hold no training rows"):
        make_partition("sites", labels, 3, 0, site_of=np.array([0, 0, 2, 2, 0, 2, 0]))
    with pytest.raises(ConfigError, match="rows name their client"):
        make_partition("sites", labels, 3, 0)


def test_duplicate_gives_one_client_an_exact_copy_of_another(fmnist: np.ndarray) -> None:
    part = make_partition("duplicate", fmnist, 10, 0, {"source": 2, "copy": 7})
    assert np.array_equal(part.clients[7], part.clients[2]) and part.clients[2].size > 0
    # the nine others are a dirichlet-per-class split: every sample of the pool exactly once
    others = np.concatenate([c for i, c in enumerate(part.clients) if i != 7])
    assert np.array_equal(np.sort(others), np.arange(len(fmnist)))
    assert part.info["duplicate"] == {"source": 2, "copy": 7}
    with pytest.raises(ConfigError, match="source and copy are both client 3"):
        make_partition("duplicate", fmnist, 10, 0, {"source": 3, "copy": 3})
    with pytest.raises(ConfigError, match="do not exist"):
        make_partition("duplicate", fmnist, 10, 0, {"copy": 10})
