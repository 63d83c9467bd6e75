"""Known-answer tests for fedhet.metrics; every expected value is worked out by hand in the comments."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn.metrics import balanced_accuracy_score

from fedhet import metrics
from fedhet.errors import ConfigError

# 3 classes, 8 samples.
#   sample : 0 1 2 3 4 5 6 7
#   target : 0 0 0 1 1 2 2 2
#   pred   : 0 0 1 1 2 2 2 0
# correct  : y y n y n y y n  -> accuracy 5/8
# class 0: 3 samples, 2 right -> 2/3; class 1: 2 samples, 1 right -> 1/2; class 2: 3 samples, 2 right -> 2/3
# balanced = (2/3 + 1/2 + 2/3) / 3 = (11/6) / 3 = 11/18
TARGET = [0, 0, 0, 1, 1, 2, 2, 2]
PRED = [0, 0, 1, 1, 2, 2, 2, 0]


def test_confusion_matrix_hand_example():
    # rows = true class: true 0 -> pred (0,0,1); true 1 -> pred (1,2); true 2 -> pred (2,2,0)
    expected = np.array([[2, 1, 0], [0, 1, 1], [1, 0, 2]])
    matrix = metrics.confusion_matrix(PRED, TARGET, 3)
    assert matrix.dtype == np.int64
    np.testing.assert_array_equal(matrix, expected)


def test_accuracy_recall_balanced_hand_example():
    assert metrics.accuracy(PRED, TARGET) == pytest.approx(5 / 8, abs=1e-15)
    np.testing.assert_allclose(metrics.per_class_recall(PRED, TARGET, 3), [2 / 3, 1 / 2, 2 / 3], rtol=1e-15)
    assert metrics.balanced_accuracy(PRED, TARGET, 3) == pytest.approx(11 / 18, abs=1e-15)
    assert metrics.balanced_accuracy(PRED, TARGET) == pytest.approx(11 / 18, abs=1e-15)


def test_logits_and_tensors_are_accepted():
    # One-hot-ish logits whose argmax is PRED; torch tensors of both kinds.
    logits = np.full((8, 3), -1.0)
    logits[np.arange(8), PRED] = 2.0
    assert metrics.accuracy(torch.tensor(logits, dtype=torch.bfloat16), torch.tensor(TARGET)) == 5 / 8
    assert metrics.balanced_accuracy(logits, np.array(TARGET)) == pytest.approx(11 / 18)
    np.testing.assert_array_equal(metrics.confusion_matrix(torch.tensor(PRED), TARGET, 3)[0], [2, 1, 0])


def test_absent_class_is_nan_and_excluded_from_balanced_mean():
    # K = 4; target has classes 0 and 1 only; pred predicts class 3 once.
    # class 0: 2 samples, 1 right -> 1/2; class 1: 2 samples, 2 right -> 1; classes 2, 3 absent -> NaN
    # balanced = (1/2 + 1) / 2 = 3/4 (NOT (1/2 + 1 + 0 + 0) / 4)
    target = [0, 0, 1, 1]
    pred = [0, 3, 1, 1]
    recall = metrics.per_class_recall(pred, target, 4)
    assert recall[:2].tolist() == [0.5, 1.0]
    assert np.isnan(recall[2]) and np.isnan(recall[3])
    assert metrics.balanced_accuracy(pred, target, 4) == 0.75
    with pytest.warns(UserWarning):  # sklearn warns that y_pred has a class absent from y_true
        assert balanced_accuracy_score(target, pred) == 0.75


@pytest.mark.numerics
@pytest.mark.filterwarnings("ignore:A single label was found")  # sklearn notes one-class targets
def test_balanced_accuracy_matches_sklearn_on_random_data():
    rng = np.random.default_rng(0)
    for trial in range(20):
        num_classes = int(rng.integers(2, 8))
        n = int(rng.integers(5, 300))
        # skewed class priors so some classes can be missing from target
        prior = rng.dirichlet(np.full(num_classes, 0.5))
        target = rng.choice(num_classes, size=n, p=prior)
        # wrong predictions only among classes present in target: sklearn warns otherwise (tested above)
        pred = np.where(rng.random(n) < 0.6, target, rng.choice(np.unique(target), n))
        expected = balanced_accuracy_score(target, pred)
        assert metrics.balanced_accuracy(pred, target, num_classes) == pytest.approx(expected, abs=1e-12), (
            trial
        )


def test_rare_class_recall_pools_samples():
    # rare classes {1, 2}: 5 rare samples (idx 3..7), correct ones idx 3, 5, 6 -> 3/5
    # (the mean of their recalls would be (1/2 + 2/3)/2 = 7/12, a different number)
    assert metrics.rare_class_recall(PRED, TARGET, [1, 2]) == pytest.approx(3 / 5, abs=1e-15)
    assert metrics.rare_class_recall(PRED, TARGET, [1]) == 0.5
    assert math.isnan(metrics.rare_class_recall([0, 1], [0, 0], [1]))  # no rare sample in target
    with pytest.raises(ConfigError):
        metrics.rare_class_recall(PRED, TARGET, [])


def test_classification_metrics_dict_is_json_ready():
    result = metrics.classification_metrics([0, 3, 1, 1], [0, 0, 1, 1], 4, rare_classes=[1])
    assert result["accuracy"] == 0.75
    assert result["balanced_accuracy"] == 0.75
    assert result["per_class_recall"] == [0.5, 1.0, None, None]
    assert result["rare_class_recall"] == 1.0
    assert "rare_class_recall" not in metrics.classification_metrics(PRED, TARGET, 3)


def test_classification_input_errors():
    with pytest.raises(ConfigError, match="samples"):
        metrics.accuracy([0, 1], [0, 1, 1])
    with pytest.raises(ConfigError, match="num_classes"):
        metrics.confusion_matrix([0, 3], [0, 1], 3)
    with pytest.raises(ConfigError):
        metrics.accuracy([0.5, 1.0], [0, 1])
    with pytest.raises(ConfigError, match="empty"):
        metrics.accuracy([], [])


# ---------------------------------------------------------------- fairness


def test_fairness_linear_reversed_and_hand_pearson():
    x = [0.1, 0.2, 0.3, 0.4]
    assert metrics.fairness(x, [2 * v + 1 for v in x]) == pytest.approx(100.0)
    assert metrics.fairness(x, [-3 * v for v in x]) == pytest.approx(-100.0)
    # x = 1,2,3,4; y = 1,3,2,4. Deviations from 2.5: dx = (-1.5,-.5,.5,1.5), dy = (-1.5,.5,-.5,1.5)
    # sum dx*dy = 2.25 - .25 - .25 + 2.25 = 4; sum dx^2 = sum dy^2 = 5 -> r = 4/5 -> 80
    assert metrics.fairness([1, 2, 3, 4], [1, 3, 2, 4]) == pytest.approx(80.0, abs=1e-12)
    # Spearman on y = 10,30,20,40 has the same ranks 1,3,2,4 -> 80 as well
    assert metrics.fairness([1, 2, 3, 4], [10, 30, 20, 40], kind="spearman") == pytest.approx(80.0, abs=1e-12)


def test_fairness_spearman_monotone_nonlinear():
    x = np.arange(1.0, 6.0)
    y = np.exp(2 * x)
    assert metrics.fairness(x, y, kind="spearman") == pytest.approx(100.0)
    assert metrics.fairness(x, y, kind="pearson") < 95.0  # strongly convex, so Pearson falls short of 100
    assert metrics.fairness(torch.tensor(x), torch.tensor(-y), kind="spearman") == pytest.approx(-100.0)


def test_fairness_undefined_cases_are_nan():
    assert math.isnan(metrics.fairness([0.3, 0.3, 0.3], [0.1, 0.2, 0.3]))
    assert math.isnan(metrics.fairness([0.1, 0.2, 0.3], [0.5, 0.5, 0.5], kind="spearman"))
    assert math.isnan(metrics.fairness([0.1, math.nan], [0.2, 0.3]))  # one finite pair left
    assert math.isnan(metrics.fairness([0.1], [0.2]))
    # NaN pairs are dropped: (1,2), (2,4), (3,6) remain -> perfectly linear
    assert metrics.fairness([1, 2, math.nan, 3], [2, 4, 5, 6]) == pytest.approx(100.0)


def test_fairness_errors():
    with pytest.raises(ValueError, match="pearson, spearman"):
        metrics.fairness([1, 2], [1, 2], kind="kendall")
    with pytest.raises(ValueError, match="clients"):
        metrics.fairness([1, 2, 3], [1, 2])


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.floats(0.0, 1.0), min_size=3, max_size=12),
    st.floats(0.1, 10.0),
    st.floats(-5.0, 5.0),
)
def test_fairness_affine_invariance(values, scale, shift):
    x = np.array(values)
    y = np.sin(7 * x) + x  # an arbitrary non-linear partner
    if np.ptp(x) < 1e-3 or np.ptp(y) < 1e-3:
        return
    base = metrics.fairness(x, y)
    assert metrics.fairness(scale * x + shift, y) == pytest.approx(base, abs=1e-6)
    assert metrics.fairness(-x, y) == pytest.approx(-base, abs=1e-6)
    assert -100.0 - 1e-9 <= base <= 100.0 + 1e-9


# ---------------------------------------------------------------- BCF


def test_bcf_brief_example_assignment_quirk():
    # s = (.5,.6,.7,.8), a = (.6,.55,.75,.9), alpha = .5; max s = .8, max a = .9
    # upper_i = (.5 * s_i/.8 + .5) * .9:
    #   i0: (.3125 + .5)*.9 = .73125  -> .5 < .60 <= .73125  pass    code total  1
    #   i1: (.375  + .5)*.9 = .7875   -> .55 <= .6            FAIL    code total -10 (assigned)
    #   i2: (.4375 + .5)*.9 = .84375  -> .7 < .75 <= .84375  pass    code total -9
    #   i3: (.5    + .5)*.9 = .9      -> .8 < .9 <= .9       pass    code total -8
    # clean = 3/4; code = -8/4 = -2
    s = [0.5, 0.6, 0.7, 0.8]
    a = [0.6, 0.55, 0.75, 0.9]
    lower, upper = metrics.bcf_bounds(s, a, 0.5)
    np.testing.assert_allclose(lower, s)
    np.testing.assert_allclose(upper, [0.73125, 0.7875, 0.84375, 0.9], rtol=1e-12)
    assert metrics.bcf_rate(s, a) == 0.75
    assert metrics.bcf_rate_fedrac_code(s, a) == -2.0
    assert metrics.any_worse_than_standalone(s, a)
    assert metrics.incentivized_participation_rate(s, a) == 0.75


def test_bcf_failing_client_last_and_boundaries_dyadic():
    # Dyadic values so equality at the bounds is exact in floating point.
    # s = (.25,.5,.5), a = (.375,.75,.5); max s = .5, max a = .75; upper = (.5*s/.5 + .5)*.75
    #   i0: (.25+.5)*.75 = .5625 -> .25 < .375 <= .5625 pass   code 1
    #   i1: (.5 +.5)*.75 = .75   -> .5 < .75 <= .75     pass (upper bound inclusive)   code 2
    #   i2: .75                  -> .5 <= .5            FAIL (a == s is not a pass)    code -10
    # clean = 2/3; code = -10/3
    s = [0.25, 0.5, 0.5]
    a = [0.375, 0.75, 0.5]
    np.testing.assert_array_equal(metrics.bcf_bounds(s, a)[1], [0.5625, 0.75, 0.75])
    assert metrics.bcf_rate(s, a) == pytest.approx(2 / 3)
    assert metrics.bcf_rate_fedrac_code(s, a) == pytest.approx(-10 / 3)
    assert metrics.incentivized_participation_rate(s, a) == pytest.approx(2 / 3)


def test_bcf_above_upper_bound_is_neither_pass_nor_penalty():
    # s = (.25,.5), a = (.75,.75): upper0 = (.25+.5)*.75 = .5625 < .75 -> over-rewarded, no +1 and no -10
    # upper1 = .75 -> pass. clean = 1/2, code = 1/2, IPR = 1 (both beat standalone)
    s = [0.25, 0.5]
    a = [0.75, 0.75]
    assert metrics.bcf_rate(s, a) == 0.5
    assert metrics.bcf_rate_fedrac_code(s, a) == 0.5
    assert not metrics.any_worse_than_standalone(s, a)
    assert metrics.incentivized_participation_rate(s, a) == 1.0


def test_bcf_alpha_changes_upper_bound():
    # alpha = 1: upper_i = max a for everyone; alpha = 0: upper_i = s_i/max s * max a
    s = [0.25, 0.5]
    a = [0.5, 1.0]
    np.testing.assert_array_equal(metrics.bcf_bounds(s, a, 1.0)[1], [1.0, 1.0])
    np.testing.assert_array_equal(metrics.bcf_bounds(s, a, 0.0)[1], [0.5, 1.0])
    with pytest.raises(ConfigError, match="alpha"):
        metrics.bcf_rate(s, a, 1.5)
    with pytest.raises(ConfigError, match="clients"):
        metrics.bcf_rate(s, [0.5])


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.floats(0.05, 1.0), st.floats(0.0, 1.0)), min_size=1, max_size=10))
def test_bcf_properties(pairs):
    s = [p[0] for p in pairs]
    a = [p[1] for p in pairs]
    clean = metrics.bcf_rate(s, a)
    ipr = metrics.incentivized_participation_rate(s, a)
    assert 0.0 <= clean <= ipr <= 1.0  # a pass needs a_i > s_i
    assert metrics.any_worse_than_standalone(s, a) == (ipr < 1.0)
    code = metrics.bcf_rate_fedrac_code(s, a)
    if not metrics.any_worse_than_standalone(s, a):
        assert code == pytest.approx(clean)
    else:
        assert code < 0


# ---------------------------------------------------------------- free riders


def test_free_rider_report_hand_example():
    # raw weights (1, 6, 5, 8) sum to 20 -> normalized (.05, .30, .25, .40); N = 4, tau/N = (1/3)/4 = .0833
    weights = [1, 6, 5, 8]
    report = metrics.free_rider_report(weights, 0)
    assert report["weight"] == pytest.approx(0.05)
    assert report["rank"] == 0 and report["lowest"] and report["num_tied"] == 0
    assert report["ratio_to_uniform"] == pytest.approx(0.2)
    assert report["detected"]  # .05 < .0833
    report = metrics.free_rider_report(np.array(weights) / 20, 2)
    assert report["weight"] == pytest.approx(0.25)
    assert report["rank"] == 1 and not report["lowest"]  # only client 0 (.05) is lower
    assert report["ratio_to_uniform"] == pytest.approx(1.0)
    assert not report["detected"]
    # a larger coefficient tau = 1.5 -> threshold .375 flags .25 too
    assert metrics.free_rider_report(weights, 2, threshold_coef=1.5)["detected"]


def test_free_rider_report_ties():
    # (.1,.1,.4,.4): the free rider ties at the bottom -> rank 0 but not strictly lowest;
    # .1 >= (1/3)/4 = .0833 -> not detected
    report = metrics.free_rider_report(torch.tensor([0.1, 0.1, 0.4, 0.4]), 0)
    assert report["rank"] == 0 and not report["lowest"] and report["num_tied"] == 1
    assert not report["detected"]
    # uniform weights (FedAvg-uni): everyone tied, rank 0, ratio exactly 1
    report = metrics.free_rider_report([1, 1, 1], 1)
    assert report["rank"] == 0 and not report["lowest"] and report["num_tied"] == 2
    assert report["ratio_to_uniform"] == pytest.approx(1.0)


def test_free_rider_report_errors():
    with pytest.raises(ConfigError, match="free_rider"):
        metrics.free_rider_report([0.5, 0.5], 2)
    with pytest.raises(ConfigError, match="non-negative"):
        metrics.free_rider_report([0.5, -0.1, 0.6], 0)


# ---------------------------------------------------------------- summaries


def test_summarize_over_seeds():
    # (1, 2, 3) with the NaN ignored: mean 2, population variance (1 + 0 + 1)/3 = 2/3
    mean, std = metrics.summarize_over_seeds([1.0, 2.0, math.nan, 3.0])
    assert mean == pytest.approx(2.0)
    assert std == pytest.approx(math.sqrt(2 / 3))
    assert metrics.summarize_over_seeds([0.7]) == (0.7, 0.0)
    assert all(math.isnan(v) for v in metrics.summarize_over_seeds([math.nan, math.nan]))


def test_best_final_lastk_defaults_to_the_last_10_and_rejects_a_non_integer_window():
    series = [0.0, 0.0] + [1.0] * 10  # the last 10 are 1.0; a window of 11 would take in a 0
    assert metrics.best_final_lastk(series)["last_k_mean"] == 1.0
    for bad in (True, 2.5, 0):
        with pytest.raises(ConfigError):
            metrics.best_final_lastk(series, k=bad)


def test_best_final_lastk():
    series = [0.1, 0.5, 0.3, 0.4, 0.2]
    result = metrics.best_final_lastk(series, k=3)
    # best .5; final .2; last 3 = (.3 + .4 + .2)/3 = .3
    assert result == pytest.approx({"best": 0.5, "final": 0.2, "last_k_mean": 0.3})
    assert metrics.best_final_lastk(series, k=3, mode="min")["best"] == 0.1  # e.g. a loss curve
    assert metrics.best_final_lastk(series, k=50)["last_k_mean"] == pytest.approx(1.5 / 5)  # fewer than k
    # a NaN round is skipped by best and the last-k mean
    result = metrics.best_final_lastk([0.2, math.nan, 0.4], k=2)
    assert result["best"] == 0.4 and result["last_k_mean"] == 0.4 and result["final"] == 0.4
    with pytest.raises(ConfigError, match="max, min"):
        metrics.best_final_lastk(series, mode="median")
    with pytest.raises(ConfigError, match="k"):
        metrics.best_final_lastk(series, k=0)


# --------------------------------------------------------------------------------------------------------
# Cases that mutation testing (make mutation) found unchecked; answers by hand
# --------------------------------------------------------------------------------------------------------
def test_balanced_accuracy_infers_the_class_range_from_both_predictions_and_targets():
    # a predicted class (2) that no target holds: recalls of the target classes 0 and 1 are 1/2 and 1
    assert metrics.balanced_accuracy([2, 0, 1], [0, 0, 1]) == pytest.approx(0.75)
    # a target class (2) never predicted: recalls 1 (class 0) and 0 (class 2)
    assert metrics.balanced_accuracy([0, 0], [0, 2]) == pytest.approx(0.5)


def test_bcf_rate_fedrac_code_uses_its_alpha():
    # s = (0.2, 0.4), a = (0.5, 0.6): upper_i = ((1-α) s_i/0.4 + α)·0.6
    # α = 0.5: uppers 0.45, 0.6 -> client 0 above its bound (no change), client 1 passes: 1/2
    # α = 0.9: uppers 0.57, 0.6 -> both pass: 2/2
    assert metrics.bcf_rate_fedrac_code([0.2, 0.4], [0.5, 0.6], alpha=0.5) == pytest.approx(0.5)
    assert metrics.bcf_rate_fedrac_code([0.2, 0.4], [0.5, 0.6], alpha=0.9) == pytest.approx(1.0)


@pytest.mark.parametrize(
    ("call", "name"),
    [
        (lambda: metrics.bcf_rate_fedrac_code([0.5], [[0.5]]), "rewards"),
        (lambda: metrics.best_final_lastk([[1.0]]), "series"),
        (lambda: metrics.free_rider_report([[1.0]], 0), "weights"),
        (lambda: metrics.summarize_over_seeds([[1.0]]), "values"),
        (lambda: metrics.rare_class_recall([0, 1], [0, 1], [[0], [0, 1]]), "rare_classes"),  # ragged
    ],
)
def test_shape_errors_name_the_argument(call, name):
    with pytest.raises(ConfigError, match=rf"^{name} must be"):
        call()


def test_rare_class_recall_with_no_rare_class_says_so():
    with pytest.raises(ConfigError, match="rare_classes is empty; name at least one rare class index"):
        metrics.rare_class_recall([0, 1], [0, 1], [])


def test_best_final_lastk_boundaries():
    assert metrics.best_final_lastk([0.3, 0.5, 0.4], k=1) == {"best": 0.5, "final": 0.4, "last_k_mean": 0.4}
    assert metrics.best_final_lastk([0.7]) == {"best": 0.7, "final": 0.7, "last_k_mean": 0.7}  # one round
    out = metrics.best_final_lastk([math.nan, 0.2, math.nan], k=2)  # one finite value
    assert out["best"] == 0.2 and math.isnan(out["final"]) and out["last_k_mean"] == 0.2


def test_free_rider_report_boundaries():
    solo = metrics.free_rider_report([2.0], 0)  # one client: weight 1, nobody to compare with
    assert solo["weight"] == 1.0 and solo["rank"] == 0 and not solo["detected"]
    zero = metrics.free_rider_report([0.0, 1.0, 1.0], 0)  # a zero weight is allowed (non-negative)
    assert zero["weight"] == 0.0 and zero["lowest"] and zero["detected"]
    # exactly at the threshold τ/N = (1/3)/3: not below it, so not detected
    at = metrics.free_rider_report([1.0, 4.0, 4.0], 0, threshold_coef=1 / 3)
    assert at["weight"] == pytest.approx(1 / 9) and not at["detected"]
    with pytest.raises(ConfigError, match="not all zero"):
        metrics.free_rider_report([0.0, 0.0], 0)
    with pytest.raises(ConfigError, match=r"free_rider must be a client index in \[0, 2\], got True"):
        metrics.free_rider_report([1.0, 1.0, 1.0], True)
    with pytest.raises(ConfigError, match="threshold_coef must be positive"):
        metrics.free_rider_report([1.0, 1.0], 0, threshold_coef=0.0)


# -- tests for the mutants a mutation run left alive (tools/mutation.py) --------------------------------
def test_bcf_errors_name_the_bad_input():
    with pytest.raises(ConfigError, match="largest standalone accuracy must be positive, got 0$"):
        metrics.bcf_bounds([0.0, 0.0], [0.5, 0.5])
    for fn in (metrics.bcf_rate, metrics.bcf_rate_fedrac_code):
        with pytest.raises(ConfigError, match=r"^rewards must be numeric"):
            fn(np.array([0.5, 0.6]), np.array(["a", "b"], dtype=object))


def test_rare_class_recall_names_an_empty_rare_set():
    with pytest.raises(ConfigError, match="^rare_classes is empty; name at least one rare class index$"):
        metrics.rare_class_recall([0, 1], [0, 1], [])


def test_fairness_is_nan_quietly_for_constant_sides_and_defined_for_two_clients():
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # "we return NaN quietly": scipy's ConstantInputWarning would raise
        for x, y in (([1, 1, 1], [1, 2, 3]), ([1, 2, 3], [5, 5, 5]), ([1, 1], [2, 2]), ([1], [2])):
            assert math.isnan(metrics.fairness(x, y)), (x, y)
            assert math.isnan(metrics.fairness(x, y, kind="spearman")), (x, y)
        assert metrics.fairness([1, 2], [3, 5]) == pytest.approx(100.0)
        assert metrics.fairness([1, 2], [5, 3]) == pytest.approx(-100.0)


def test_fairness_errors_name_the_side():
    bad = np.array(["a", "b"], dtype=object)
    with pytest.raises(ConfigError, match="^contribution must be numeric"):
        metrics.fairness(bad, [1.0, 2.0])
    with pytest.raises(ConfigError, match="^reward must be numeric"):
        metrics.fairness([1.0, 2.0], bad)


def test_per_class_recall_leaves_absent_classes_nan_without_dividing_by_zero():
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # 0/0 for an absent class would warn
        recall = metrics.per_class_recall([0, 1, 0], [0, 0, 2], 4)
    assert recall[0] == 0.5 and recall[2] == 0.0 and math.isnan(recall[1]) and math.isnan(recall[3])


def test_confusion_matrix_checks_the_true_labels_too():
    with pytest.raises(
        ConfigError, match=r"labels must lie in \[0, 1\] for num_classes=2, found values in \[0, 3\]"
    ):
        metrics.confusion_matrix([0, 1], [0, 3], 2)
