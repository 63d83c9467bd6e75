"""The sections of an experiment configuration: one dataclass per TOML table, with its defaults.

``[data]``, ``[model]``, ``[train]``, ``[method]``, ``[eval]``, ``[faults]``, ``[guards]``, ``[engine]``, and
:data:`CHOICES`, the accepted values of the fields that take one of a few. The experiment that holds them
(:class:`~fedhet.config.ExperimentConfig`), TOML in and out and the overrides are in ``config.py``, which
re-exports every name here; the checks of values are in ``config_validation.py``.

The field annotations stay strings (``from __future__ import annotations``): the validation reads them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import MISSING, Field, dataclass, field
from typing import Any

# -- how a field enters an experiment's fingerprint ----------------------------------------------------------
# Every field declares it (a test fails on one that does not), so a new key cannot silently change the
# fingerprint of every recorded run: records are reused only under an equal fingerprint
# (``ExperimentConfig.run_fingerprint``; docs/reliability.md, "When a record is reused").
#: The field's metadata key holding its kind: "always", "when-set" or "never".
FINGERPRINT = "fingerprint"
#: The field's metadata key holding the value a "when-set" field leaves out of the fingerprint.
NEUTRAL_VALUE = "neutral_value"
#: The field's metadata key, on a field whose default changed after runs were recorded: the value before.
WAS = "was"


def _declared(kind: str, default: Any, factory: Callable[[], Any] | Any, **meta: Any) -> Any:
    metadata = {FINGERPRINT: kind, **meta}
    if factory is not MISSING:
        return field(default_factory=factory, metadata=metadata)
    return field(default=default, metadata=metadata)


def fingerprinted(default: Any = MISSING, *, factory: Any = MISSING) -> Any:
    """A field that defines the experiment: always part of its fingerprint (the keys fingerprints began with;
    a new key whose default changes what runs compute is one too, and says so in its commit)."""
    return _declared("always", default, factory)


def neutral(default: Any = MISSING, *, factory: Any = MISSING, was: Any = MISSING) -> Any:
    """A field added after runs were recorded, whose neutral value computes exactly what those runs computed:
    part of the fingerprint only when set to another value, so every earlier record keeps its fingerprint.
    The neutral value is the default, or ``was`` where the default changed since: a run file written before
    the key existed reads as ``was`` (``load_run_config``), and a run at today's default is another
    experiment. The usual declaration of a new key."""
    value = factory() if factory is not MISSING else default
    meta = {NEUTRAL_VALUE: value if was is MISSING else was}
    if was is not MISSING:
        meta[WAS] = was
    return _declared("when-set", default, factory, **meta)


def unfingerprinted(default: Any = MISSING, *, factory: Any = MISSING) -> Any:
    """A field that changes no number a run computes (threads, extra output): never part of a fingerprint."""
    return _declared("never", default, factory)


def fingerprint_kind(f: Field) -> str:
    """A field's declared fingerprint kind; a clear error for a field that declares none."""
    kind = f.metadata.get(FINGERPRINT)
    if kind not in ("always", "when-set", "never"):
        raise TypeError(
            f"config field {f.name!r} does not declare how it enters the experiment fingerprint: define it "
            "with fingerprinted(...), neutral(...) or unfingerprinted(...) (fedhet.config_sections)"
        )
    return kind


@dataclass
class DataConfig:
    """Which data, how it is split over clients, and what the server holds out."""

    #: A built-in name (``fedhet datasets``), "npz" or "folder" (your own files at ``path``), or a name
    #: registered with ``fedhet.data.register_dataset``.
    dataset: str = fingerprinted("fashion-mnist")
    root: str | None = fingerprinted(None)
    #: Your own data for dataset = "npz" (one .npz file), "folder" (train/<class>/, test/<class>/), "csv" or
    #: "parquet" (one table, or a folder with train/<client>.csv and test.csv).
    path: str | None = neutral(None)
    #: A table's class column (csv / parquet).
    label_column: str = neutral("label")
    #: A table's column naming each row's client (then split = "sites" gives each client its rows).
    client_column: str | None = neutral(None)
    #: A table's columns to one-hot encode although they hold numbers (text columns always are).
    categorical_columns: list[str] = neutral(factory=list)
    #: A table's test file; without it (and without a test file in the folder) 20 % of the rows are held
    #: out, stratified, seed 0.
    test_path: str | None = neutral(None)
    #: A table's missing numbers: None refuses them (naming columns, rows and counts per site); "mean",
    #: "median" or "most_frequent" fills each numeric column with that value of the sites' training rows,
    #: computed from what each site reports (fedhet.data.datasets.imputation), in train and test rows.
    impute: str | None = neutral(None)
    #: With ``impute``: a 0/1 feature ``<column>=missing`` per numeric column with a missing training cell.
    missing_indicator: bool = neutral(False)
    split: str = fingerprinted("iid")
    split_params: dict[str, Any] = fingerprinted(factory=dict)
    clients: int = fingerprinted(10)
    #: Fraction of the training set held out as the server's validation set (CFFL, FedRAC, FedSAC).
    validation_fraction: float = fingerprinted(0.0)
    #: Use only this many training samples (a seeded random subset, before splitting); None = all.
    max_train_samples: int | None = fingerprinted(None)
    #: Evaluate on only this many test samples (a seeded random subset); None = the full test set.
    max_test_samples: int | None = fingerprinted(None)


@dataclass
class ModelConfig:
    name: str = fingerprinted("mlp")
    params: dict[str, Any] = fingerprinted(factory=dict)
    #: Start from another run's final global model (its run directory) instead of the seeded initial one.
    init_from: str | None = fingerprinted(None)


@dataclass
class TrainConfig:
    """Rounds, participation and local training of every client."""

    rounds: int = fingerprinted(10)
    #: Clients per round: a fraction in (0, 1] (float) or a count >= 1 (int).
    clients_per_round: float | int = fingerprinted(1.0)
    local_epochs: float = fingerprinted(1.0)
    #: If set, a fixed number of local SGD steps per round instead of epochs (FedRAC's ``num_steps``).
    local_steps: int | None = fingerprinted(None)
    batch_size: int = fingerprinted(64)
    optimizer: str = fingerprinted("sgd")
    #: The learning rate; None (unset) = the model's own default (:data:`MODEL_LR`, else 0.1). A run's
    #: fingerprint holds the rate it trains with, so an unset rate and the same rate set are one experiment;
    #: every round's rate is in its metrics.jsonl.
    lr: float | None = fingerprinted(None)
    momentum: float = fingerprinted(0.0)
    weight_decay: float = fingerprinted(0.0)
    nesterov: bool = fingerprinted(False)
    #: Learning-rate schedule over rounds: constant, cosine (to ``lr_min``) or exponential (× ``lr_decay``).
    schedule: str = fingerprinted("constant")
    lr_min: float = fingerprinted(1e-6)
    lr_decay: float = fingerprinted(0.977)
    #: Gradient-norm clipping in local training; None = off.
    grad_clip: float | None = fingerprinted(None)
    #: Probability that a sampled client sends nothing in a round (robustness experiments).
    client_dropout: float = fingerprinted(0.0)
    #: Only these clients take part (their ids; None = every client): the others are never described, sampled
    #: or trained, while the split is still made over all ``data.clients`` (a coalition of a federation, as
    #: ``fedhet shapley`` trains one). Clients per round then count among the participants.
    participants: list[int] | None = neutral(None)
    device: str = fingerprinted("auto")
    #: torch threads for this process; None leaves torch's default.
    threads: int | None = unfingerprinted(None)


@dataclass
class EvalConfig:
    every: int = fingerprinted(1)
    #: Also evaluate each of the last N rounds (0: none). With ``every = 10`` and N = 100 a run's final
    #: evaluation and the mean of its last 100 are those of evaluating every round (evaluation changes no
    #: training), for a fraction of the cost: what a long run's level needs, where its best needs every round.
    every_round_last: int = neutral(0)
    batch_size: int = fingerprinted(2048)
    #: Evaluate every client's reward model (where the method defines one).
    rewards: bool = fingerprinted(True)
    #: Fairness against standalone accuracies: "auto" (when rewards exist), true, or false.
    fairness: str | bool = fingerprinted("auto")
    #: BCF rate α (FedSAC/FedRAC).
    bcf_alpha: float = fingerprinted(0.5)
    #: Save a checkpoint every k rounds (and always after the last round); 0 = last round only.
    checkpoint_every: int = fingerprinted(10)
    #: Also write every metrics.jsonl number as TensorBoard scalars under RUN_DIR/tensorboard/
    #: (the fedhet[tensorboard] extra). Not part of the experiment: it changes no result.
    tensorboard: bool = unfingerprinted(False)
    #: Contribution estimators to report beside the method's own (:data:`CONTRIBUTION_ESTIMATORS`; needs a
    #: FedAvg-family method and a server validation set): per round in metrics.jsonl, summed over the rounds
    #: in summary.json's ``estimates`` (fedhet.contributions; docs/contributions.md). They change no training.
    contribution_estimators: list[str] = neutral(factory=list)


#: The estimators ``eval.contribution_estimators`` may name: GTG-Shapley (Liu et al. 2022) and the exact
#: per-round reconstruction Shapley value (Song et al. 2019), both over FedAvg models rebuilt from replies.
CONTRIBUTION_ESTIMATORS = ("gtg-shapley", "or-shapley")


@dataclass
class FaultsConfig:
    """Injected client faults, for robustness experiments: which clients misbehave and how.

    ``clients`` maps a client id to an attack's name (``--set faults.clients.3=noise``): a built-in one or
    one registered with ``fedhet.attacks.register`` (fedhet.attacks; docs/writing-an-attack.md).
    ``noise``: weights drawn from N(0, ``noise_std``²), a random model; ``scale``: the update × ``factor``;
    ``sign-flip``: the update negated; ``stale``: the unchanged model it was sent (a free rider); ``nan``:
    NaN weights; ``lie-num-examples``: ``factor`` × its sample count (in its description too); ``crash``:
    an error; ``drop``: no reply; ``label-flip``: trains on labels y → K−1−y; ``free-rider``: the model it
    was sent plus N(0, ``noise_std``²) noise; ``replay``: re-sends its first update; ``alie``: mean − z·std of
    the round's honest updates; ``ipm``: −``epsilon`` × their mean; ``adaptive-scale``: its update scaled to
    just under the update-norm guard's bound; ``min-max``, ``min-sum``, ``mimic``, ``inf``: the attacks
    built to beat robust rules, with their parameters in ``params``. The clients' standalone reference runs
    without faults. Sources and the threat model: docs/reliability.md and fedhet.engine.faults.
    """

    clients: dict[str, Any] = fingerprinted(factory=dict)
    #: The multiplier of ``scale`` and ``lie-num-examples`` (and of ``adaptive-scale`` with the guard off).
    factor: float = fingerprinted(100.0)
    #: The standard deviation of ``noise`` weights and of ``free-rider``'s noise.
    noise_std: float = fingerprinted(1.0)
    #: The first round the faults act in (the round-0 description lies from the start).
    from_round: int = fingerprinted(1)
    #: Act in every k-th round from ``from_round`` (1 = every round; 2 = rounds from_round, from_round+2, …).
    every: int = neutral(1)
    #: ALIE's z; None = the paper's z_max = Φ⁻¹((n − s)/n), s = ⌊n/2 + 1⌋ − f (n replies, f colluders).
    z: float | None = neutral(None)
    #: IPM's ε: colluders send −ε × the mean honest update (0.5 the paper's small ε; 100 its large ε).
    epsilon: float = neutral(0.5)
    #: Each attack's own parameters, one table per attack name (``[faults.params.min-max] direction =
    #: "sign"``); an attack not named here runs with its declared defaults.
    params: dict[str, Any] = neutral(factory=dict)


@dataclass
class GuardsConfig:
    """Server-side checks of each round's accepted updates, beyond the protocol checks (docs/reliability.md).

    A guarded update is rejected, logged and recorded in ``metrics.jsonl`` like a malformed one. The two
    median guards are on by default for every method: a run in which they reject nothing is the run without
    them, bit for bit (they only read the updates).
    """

    #: Reject an update whose norm ‖w_i − w_sent‖ exceeds this × the median over the round's updates
    #: (with 3 or more updates); 0 = off. 10 keeps honest non-IID clients (the largest honest ratio in the
    #: robustness table's clean runs is 4.4, ShapFed; docs/reliability.md) and stops scaled or random ones.
    update_norm_factor: float | None = fingerprinted(10.0)
    #: The update-norm guard's scale is never below this × the norm of the model the client was sent
    #: (0 = no floor): in a round of 3 or 4 the median is one client's own norm, and two converged clients
    #: made a third, still learning, honest one exceed 10× it. At 0.01 an update is never rejected for
    #: moving the model by under a tenth of its norm; noise and ×100 updates exceed that
    #: (docs/reliability.md).
    update_norm_floor: float | None = neutral(0.01)
    #: Scale every kept update longer than this × the round's median update norm (never below the floor
    #: above) down to that length; 0 = off. Unlike the rejecting guard it bounds what any one update can
    #: move, so an update scaled to just under the rejecting bound weighs no more than 2 medians; a round
    #: where no update is longer is the same as without it, bit for bit. The largest honest ratio in the
    #: robustness table's clean runs is 3.4 for FedAvg and CELM, so 2 touches few honest updates (the
    #: results page counts them; docs/robustness.md).
    update_norm_clip: float | None = neutral(2.0, was=0.0)
    #: Reject a reply whose num_examples exceeds this × the round's median num_examples; 0 = off. A client
    #: that truly holds more than 10× the median needs a larger factor (its rejection says so).
    num_examples_factor: float | None = fingerprinted(10.0)
    #: Reject an update pointing away from the round's consensus: cos(Δ_i, coordinate-wise median Δ) below
    #: this (3 or more updates); None = off. Off by default: honest updates of very non-IID clients point
    #: away too (cosines down to −0.56 measured on Dir(0.05) with 5 clients, docs/robustness.md), so no
    #: threshold both spares them and stops every sign-flip; −0.8 stops IPM-like updates on milder splits.
    min_update_cosine: float | None = fingerprinted(None)
    #: Reject a reply (or description) claiming more samples than this; None = no bound.
    max_num_examples: int | None = fingerprinted(None)
    #: Undo a round whose aggregated global model is not finite (the round is logged and recorded).
    rollback_non_finite: bool = fingerprinted(True)
    #: Stop the run when every reply of this many consecutive rounds was rejected (0 = never).
    max_all_rejected_rounds: int = fingerprinted(3)

    def __post_init__(self) -> None:
        # "none" (the CLI's word for no value) turns a median guard off, as 0 does; 0 is what TOML can hold
        for key in ("update_norm_factor", "num_examples_factor", "update_norm_floor", "update_norm_clip"):
            if getattr(self, key) is None:
                setattr(self, key, 0.0)


#: The pre-aggregation steps ``aggregation.pre`` may list (fedhet.algorithms.robust_aggregation):
#: nearest-neighbour mixing (Allouah et al. 2023), bucketing (Karimireddy et al. 2022), adaptive robust
#: clipping (Allouah et al. 2024); and those that read f = ``aggregation.num_malicious_nodes``.
PRE_AGGREGATION_STEPS = ("nnm", "bucketing", "arc")
PRE_STEPS_READING_F = ("nnm", "arc")


@dataclass
class AggregationConfig:
    """How the server combines the accepted client models (docs/robustness.md). Parameter names follow
    Flower's FedTrimmedAvg (``beta``) and Krum / MultiKrum (``num_malicious_nodes``, ``num_nodes_to_select``)
    strategies, so a federation moving to Flower keeps its settings.

    ``mean`` is each method's own weighted average (FedAvg's sample counts, CELM's contributions); the
    robust rules replace it for methods that average client models (FedAvg, FedProx, FedRS, CELM, the
    semi-supervised ones) and inside the weighted sums of CGSV, CFFL, IAFL and ShapFed; Krum, Multi-Krum,
    centered clipping and the geometric median keep the method's weights, the median and the trimmed mean
    weigh every model alike. ``pre`` lists pre-aggregation steps run before the rule, in order
    (fedhet.algorithms.robust_aggregation). FedRAC, FedSAC and Standalone refuse them.
    """

    rule: str = fingerprinted("mean")
    #: trimmed-mean: the fraction cut from each end of every coordinate (0 <= beta < 0.5).
    beta: float = fingerprinted(0.2)
    #: krum / multi-krum: f, the number of hostile clients assumed (scores sum the n - f - 2 nearest).
    num_malicious_nodes: int = fingerprinted(0)
    #: multi-krum: m, how many of the lowest-scoring models are averaged.
    num_nodes_to_select: int = fingerprinted(1)
    #: centered-clipping: the radius tau and the number of clipping iterations L.
    clipping_tau: float = fingerprinted(1.0)
    clipping_iterations: int = fingerprinted(1)
    #: Pre-aggregation steps run, in this order, before the rule: "nnm" (nearest-neighbour mixing),
    #: "bucketing", "arc" (adaptive robust clipping); nnm and arc read f = num_malicious_nodes. [] = none.
    pre: list[str] = neutral(factory=list)
    #: bucketing: s, the number of client models averaged into each bucket.
    bucket_size: int = neutral(2)
    #: geometric-median: the smoothing ν of the smoothed Weiszfeld algorithm, its maximal number of
    #: iterations, and when it stops early: a step shorter than this × the models' mean distance from the
    #: estimate (0: never).
    gm_nu: float = neutral(1e-6)
    gm_iterations: int = neutral(100)
    gm_tolerance: float = neutral(1e-6)
    #: "fedhet" (its own rules) or "flower": the rule computed by Flower's strategy of the same name
    #: (FedAvg, FedMedian, FedTrimmedAvg, Krum, MultiKrum; needs fedhet[flower]): the anchor of the rules.
    implementation: str = neutral("fedhet")


@dataclass
class EngineConfig:
    """How the embedded engine runs the clients of a round (docs/performance.md)."""

    #: "sequential": one client after another; "vectorized": the round's clients at once with torch.func
    #: (trainers with FedAvg's, FedProx's or FedRS's training loop; SGD; no BatchNorm; submodel masks on
    #: ``mlp200`` only), refused with the reason otherwise;
    #: "auto": vectorized where it applies and the round has enough clients, else sequential (logged).
    mode: str = fingerprinted("sequential")


@dataclass
class MethodConfig:
    name: str = fingerprinted("fedavg")
    params: dict[str, Any] = fingerprinted(factory=dict)


#: The learning rate of every model without its own (``train.lr`` unset).
GENERAL_LR = 0.1
#: Models with a learning rate of their own where ``train.lr`` is unset. ``tabular-mlp``: 0.3, within 2 points
#: of pooled logistic regression on breast-cancer, wine and diabetes by age band at 100 rounds where 0.1
#: misses on diabetes (docs/results/table-defaults.md: a site of 60 rows takes one step a round at batch
#: 64); first found on those tables' test rows, and picked too by a rule fixed before its measurement on
#: validation rows and fresh seeds (the best mean validation accuracy among 0.1, 0.2, 0.3 and 0.5).
MODEL_LR: dict[str, float] = {"tabular-mlp": 0.3}


def effective_lr(model: str, lr: float | None) -> float:
    """The learning rate a run trains with: ``train.lr`` where set, else the model's own default."""
    return lr if lr is not None else MODEL_LR.get(model, GENERAL_LR)


#: Method parameters whose default changed after runs were recorded: method -> {parameter: (the value
#: before, the default now)}; the method's own signature holds the default now (a test checks it). A
#: fingerprint holds such a parameter at its value (the default now where ``params`` leave it out) and
#: leaves it out at its value before, so the records of earlier runs, which ran with that value, keep their
#: fingerprint, and a run at today's default is another experiment; a run's config.toml written before the
#: change, which holds no such key, reads as the value before (``fedhet.config.load_run_config``).
#: CELM's evidence clip: 0 (the paper's evidence) until the robustness page measured clipping at the
#: round's median (docs/robustness.md, "CELM under an adaptive-scaling attack").
CHANGED_METHOD_DEFAULTS: dict[str, dict[str, tuple[Any, Any]]] = {
    "celm": {"evidence_clip": (0, 1)},
    "celm-rs": {"evidence_clip": (0, 1)},
}


#: (section, key) -> the accepted values of a field that takes one of a few.
CHOICES: dict[tuple[str, str], tuple[Any, ...]] = {
    ("train", "optimizer"): ("sgd", "adam"),
    ("train", "schedule"): ("constant", "cosine", "exponential"),
    ("train", "device"): ("auto", "cpu", "cuda"),
    ("engine", "mode"): ("sequential", "vectorized", "auto"),
    ("eval", "fairness"): ("auto", True, False),
    ("aggregation", "rule"): (
        "mean",
        "median",
        "trimmed-mean",
        "krum",
        "multi-krum",
        "centered-clipping",
        "geometric-median",
    ),
    ("aggregation", "implementation"): ("fedhet", "flower"),
    ("data", "impute"): (None, "mean", "median", "most_frequent"),
}
