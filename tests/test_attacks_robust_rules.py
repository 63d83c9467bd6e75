"""Attacks as an extension point (fedhet.attacks: the registry, the parameters block, a user's own attack)
and the attacks built to beat robust rules: min-max and min-sum (Shejwalkar and Houmansadr, NDSS 2021),
mimic (Karimireddy, He and Jaggi, ICLR 2022), inf. Each expected value is worked out by hand in the test's
docstring (three honest 2-D updates), or by a second computation that shares no code with fedhet's."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from fedhet.attacks import attack_names, build_attack, register
from fedhet.attacks.base import Attack
from fedhet.config import FaultsConfig, apply_override, from_dict
from fedhet.engine.faults import coordinated_attack, fault_for
from fedhet.engine.protocol import Instruction, Reply
from fedhet.errors import ConfigError
from fedhet.experiment import make_simulation
from support import digits_config, lines_of

pytestmark = pytest.mark.usefixtures("forget_registrations")  # its registrations stay in it


@pytest.fixture(autouse=True)
def _tmp_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDHET_CACHE", str(tmp_path / "cache"))


#: three honest 2-D updates, clients 1, 2, 3 (client 0 the colluder); worked examples below
HONEST = {1: (-1.0, 0.0), 2: (1.0, 0.0), 3: (0.0, 3.0)}


def round_of(honest, colluders=(0,), w0=(0.5, -2.0)):
    """Replies w0 + Δ_i (float64) of the honest clients, and of the colluders (their own Δ = (7, 7)), all sent
    w0."""
    base = torch.tensor(w0, dtype=torch.float64)
    replies = {c: Reply(weights={"w": base + torch.tensor([7.0, 7.0], dtype=torch.float64)}, num_examples=5)
               for c in colluders}  # fmt: skip
    for cid, delta in honest.items():
        replies[cid] = Reply(weights={"w": base + torch.tensor(delta, dtype=torch.float64)}, num_examples=5)
    sent = {cid: Instruction(weights={"w": base.clone()}) for cid in replies}
    return base, dict(sorted(replies.items())), sent


def sent_update(name, params=None, honest=HONEST, colluders=(0,)):
    """What the colluders send (their Δ), for attack ``name`` with ``params`` in its block."""
    sets = {"faults__clients": {str(c): name for c in colluders}}
    cfg = digits_config(clients=6, **sets)
    if params:
        cfg.faults.params = {name: params}
    base, replies, sent = round_of(honest, colluders)
    out = coordinated_attack(cfg, 1, replies, sent)
    for cid in honest:
        assert out[cid] is replies[cid]  # honest replies untouched
    deltas = [(out[c].weights["w"] - base).numpy() for c in colluders]
    for d in deltas[1:]:
        np.testing.assert_array_equal(d, deltas[0])  # colluders send the same update
    return deltas[0]


# -- min-max -------------------------------------------------------------------------------------------------
def test_min_max_unit_vector_by_hand():
    """μ = (0, 1), ∇p = −μ/‖μ‖ = (0, −1), m = (0, 1 − γ). Largest benign squared distance: ‖x1 − x3‖² = 10.
    The binding constraint is ‖m − x3‖² = (2 + γ)² ≤ 10 (the others stay below): γ* = √10 − 2."""
    got = sent_update("min-max", {"direction": "unit-vec"})
    gamma = math.sqrt(10) - 2
    np.testing.assert_allclose(got, [0.0, 1.0 - gamma], atol=1e-4)


def test_min_max_inverse_std_by_hand():
    """std with Bessel's correction: (1, √3), ∇p = (−1, −√3), m = (−γ, 1 − √3γ). ‖m − x3‖² = 4γ² + 4√3γ + 4
    ≤ 10 binds first: γ* = (3 − √3)/2 (the other two are below 10 there)."""
    got = sent_update("min-max")  # direction = "std", the default
    gamma = (3 - math.sqrt(3)) / 2
    np.testing.assert_allclose(got, [-gamma, 1 - math.sqrt(3) * gamma], atol=1e-4)


def test_min_max_inverse_sign_by_hand():
    """x = (1, 0), (3, 0), (2, 3): μ = (2, 1), ∇p = −sign(μ) = (−1, −1), m = (2 − γ, 1 − γ); the largest
    benign squared distance is 10 and ‖m − x3‖² = 2γ² + 4γ + 4 ≤ 10 gives γ* = 1: m = (1, 0)."""
    honest = {1: (1.0, 0.0), 2: (3.0, 0.0), 3: (2.0, 3.0)}
    got = sent_update("min-max", {"direction": "sign"}, honest=honest, colluders=(0, 4))
    np.testing.assert_allclose(got, [1.0, 0.0], atol=1e-4)


# -- min-sum -------------------------------------------------------------------------------------------------
def test_min_sum_inverse_std_by_hand_with_the_papers_bound_and_the_codes():
    """Σ_i ‖m − x_i‖² = 3‖m − μ‖² + Σ_i ‖x_i − μ‖² = 3·4γ² + 8. Benign sums Σ_j ‖x_i − x_j‖²: 14, 14, 20.
    Paper (max, 20): 12γ² + 8 ≤ 20, γ* = 1. Authors' code (min, 14): 12γ² + 8 ≤ 14, γ* = 1/√2."""
    got = sent_update("min-sum")
    np.testing.assert_allclose(got, [-1.0, 1 - math.sqrt(3)], atol=1e-4)
    got = sent_update("min-sum", {"bound": "min"})
    g = 1 / math.sqrt(2)
    np.testing.assert_allclose(got, [-g, 1 - math.sqrt(3) * g], atol=1e-4)


def test_the_search_never_goes_past_twice_gamma_init():
    """γ_init = 0.25: every γ tried is accepted (γ* = 1 above), so γ climbs 0.25 + 0.125 + … towards 0.5."""
    got = sent_update("min-sum", {"gamma_init": 0.25})
    assert 0.5 - 1e-4 < -got[0] < 0.5


def test_a_single_honest_update_gives_the_mean():
    """One honest update: no spread to hide in (and no std): the colluders send it (γ = 0)."""
    got = sent_update("min-max", honest={1: (2.0, -1.0)})
    np.testing.assert_allclose(got, [2.0, -1.0], atol=1e-12)


# -- mimic ---------------------------------------------------------------------------------------------------
def test_mimic_copies_the_honest_update_farthest_along_the_direction_of_largest_variance():
    """x = (4, 5), (−3, 5), (2, −2), (1, −4): numpy's SVD of the centred rows (a second computation) puts
    them at |projections| 3.44, 4.61, 3.13, 4.93 on the first principal direction: x4 = (1, −4) is copied.
    Not the update farthest from the mean (x2) nor the largest (x1): a wrong choice fails."""
    honest = {1: (4.0, 5.0), 2: (-3.0, 5.0), 3: (2.0, -2.0), 4: (1.0, -4.0)}
    x = np.array(list(honest.values()))
    centred = x - x.mean(axis=0)
    top = np.linalg.svd(centred)[2][0]
    assert int(np.argmax(np.abs(centred @ top))) == 3
    assert (
        int(np.argmax(np.linalg.norm(centred, axis=1))) == 1
        and int(np.argmax(np.linalg.norm(x, axis=1))) == 0
    )
    got = sent_update("mimic", honest=honest, colluders=(0, 5))
    np.testing.assert_array_equal(got, [1.0, -4.0])


def test_mimic_with_a_fixed_target_copies_that_client():
    got = sent_update("mimic", {"target": 3})
    np.testing.assert_array_equal(got, [0.0, 3.0])
    got = sent_update("mimic", {"target": 5})  # not in the round: the colluder sends its own update
    np.testing.assert_array_equal(got, [7.0, 7.0])


# -- inf -----------------------------------------------------------------------------------------------------
def test_inf_sets_every_coordinate_of_the_update_to_its_value():
    np.testing.assert_array_equal(sent_update("inf"), [1e20, 1e20])
    np.testing.assert_array_equal(sent_update("inf", {"value": -3.5}), [-3.5, -3.5])


def test_inf_in_a_run_is_rejected_by_the_norm_guard_and_recorded(tmp_path):
    cfg = digits_config(clients=5, rounds=2, faults__clients={"4": "inf"})
    make_simulation(cfg, run_dir=tmp_path / "run").run()
    for line in lines_of(tmp_path / "run"):
        assert 4 not in line["clients"] and line["update_norms"]["4"] > 1e20


# -- the registry and the parameters block -------------------------------------------------------------------
def test_every_built_in_attack_is_listed_and_builds_with_its_defaults():
    names = attack_names()
    assert names[:14] == [
        "noise", "scale", "sign-flip", "stale", "nan", "lie-num-examples", "crash", "drop",
        "label-flip", "free-rider", "replay", "alie", "ipm", "adaptive-scale",
    ]  # fmt: skip
    assert {"min-max", "min-sum", "mimic", "inf"} <= set(names)
    for name in names:
        assert build_attack(name, FaultsConfig()).name == name


def test_parameters_come_from_their_block_and_bad_ones_are_refused_with_the_fix_named():
    cfg = from_dict({"faults": {"clients": {"0": "min-max"}, "params": {"min-max": {"direction": "sign"}}}})
    assert fault_for(cfg, 0, 1).attack.direction == "sign"
    assert fault_for(cfg, 0, 1).attack.gamma_init == 10.0  # the declared default
    apply_override(cfg, "faults.params.min-max.direction", "unit-vec")
    assert fault_for(cfg, 0, 1).attack.direction == "unit-vec"
    for params, match in [
        ({"min-max": {"direction": "up"}}, "direction = 'up'; choose one of"),
        ({"min-max": {"gama_init": 3}}, r"no parameter\(s\) \['gama_init'\]; 'min-max' accepts"),
        ({"alie": {"z": 1.0}}, "set faults.z instead"),
        ({"mimic": {"target": "largest"}}, "choose 'variance' or a client id"),
    ]:
        bad = FaultsConfig(clients={"0": next(iter(params))}, params=params)
        with pytest.raises(ConfigError, match=match):
            build_attack(next(iter(params)), bad)
    with pytest.raises(ConfigError, match="faults.params.minmax: 'minmax' is not a fault; choose one of"):
        from_dict({"faults": {"params": {"minmax": {"direction": "sign"}}}})


def test_a_bad_parameter_stops_the_run_before_any_training(tmp_path):
    """Checked at the run's start, also in the block of an attack no client runs this time."""
    cfg = digits_config(clients=4, faults__clients={"0": "alie"})
    cfg.faults.params = {"min-sum": {"bound": "median"}}
    with pytest.raises(ConfigError, match="bound = 'median'"):
        make_simulation(cfg, run_dir=tmp_path / "run").run()
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_an_empty_params_block_is_neutral_and_a_set_one_is_another_experiment():
    plain = digits_config(faults__clients={"0": "alie"})
    with_block = digits_config(faults__clients={"0": "alie"})
    with_block.faults.params = {"min-max": {"direction": "sign"}}
    assert plain.run_fingerprint() != with_block.run_fingerprint()
    assert plain.run_fingerprint() == digits_config(faults__clients={"0": "alie"}).run_fingerprint()


class Zero(Attack):
    """A user's attack: the model it was sent plus a constant ``shift`` (0: a free rider)."""

    name = "test-zero"
    kind = "reply"
    parameters = {"shift": 0.0}

    def tensor(self, trained, base, generator):
        return base + self.shift


def test_a_users_attack_registers_by_name_and_runs_in_a_config(tmp_path):
    register(Zero, overwrite=True)
    assert "test-zero" in attack_names()
    cfg = digits_config(clients=4, rounds=2, faults__clients={"1": "test-zero"})
    cfg.faults.params = {"test-zero": {"shift": 0.0}}
    make_simulation(cfg, run_dir=tmp_path / "run").run()
    assert all(line["update_norms"]["1"] == 0.0 for line in lines_of(tmp_path / "run"))
    with pytest.raises(ConfigError, match="built-in attack"):
        register(Zero, name="noise")
    with pytest.raises(ConfigError, match="not an Attack subclass"):
        register(int)


# -- on Flower -----------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_the_attacks_built_to_beat_robust_rules_act_on_flower_as_in_the_embedded_engine(tmp_path):
    """min-max, min-sum, mimic and inf are a step of the round loop the Flower server shares: metrics.jsonl
    bit for bit as the embedded engine's, with a robust rule aggregating what they sent."""
    pytest.importorskip("flwr", reason="the Flower tests need fedhet[flower]")
    from fedhet.config import ExperimentConfig
    from fedhet.flower.server import run_flower_simulation

    cfg = ExperimentConfig()
    cfg.data.dataset, cfg.data.split, cfg.data.clients = "fashion-mnist", "iid", 6
    cfg.data.max_train_samples, cfg.data.max_test_samples = 900, 200
    cfg.train.rounds, cfg.train.local_steps, cfg.train.batch_size, cfg.train.threads = 2, 3, 16, 1
    cfg.eval.fairness = False
    cfg.faults.clients = {"0": "min-max", "1": "min-sum", "2": "mimic", "3": "inf"}
    cfg.faults.params = {"min-max": {"direction": "sign"}}
    cfg.aggregation.rule = "median"
    run_flower_simulation(cfg, tmp_path / "flower")
    make_simulation(cfg, run_dir=tmp_path / "embedded").run()
    flower, embedded = lines_of(tmp_path / "flower"), lines_of(tmp_path / "embedded")
    assert flower == embedded
    for line in embedded:
        norms = line["update_norms"]
        assert norms["3"] > 1e20  # inf acted (and the norm guard rejected it)
        # mimic sent a copy of one honest update (float32 rounding of w_sent + Δ aside)
        assert any(norms["2"] == pytest.approx(norms[h], rel=1e-6) for h in ("4", "5"))


def test_an_installed_packages_attack_is_found_through_the_entry_point_group(tmp_path, monkeypatch):
    """A real distribution on sys.path (a dist-info folder with entry_points.txt) advertising an attack in the
    'fedhet.attacks' group: the config accepts its name and the registry loads its class by it."""
    (tmp_path / "shift_attack_pkg.py").write_text(
        "from fedhet.attacks.base import Attack\n\n"
        "class Shift(Attack):\n"
        "    name = 'ep-shift'\n"
        "    kind = 'reply'\n"
        "    parameters = {'shift': 1.0}\n\n"
        "    def tensor(self, trained, base, generator):\n"
        "        return base + self.shift\n"
    )
    info = tmp_path / "shift_attack_pkg-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: shift-attack-pkg\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[fedhet.attacks]\nep-shift = shift_attack_pkg:Shift\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert "ep-shift" in attack_names()
    cfg = from_dict({"faults": {"clients": {"0": "ep-shift"}, "params": {"ep-shift": {"shift": 0.5}}}})
    attack = fault_for(cfg, 0, 1).attack
    assert type(attack).__name__ == "Shift" and attack.shift == 0.5
    assert attack.tensor(torch.zeros(2), torch.ones(2), None).tolist() == [1.5, 1.5]
