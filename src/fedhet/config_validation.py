"""Validation of an experiment configuration: each value against its field's type, then the ranges.

:func:`coerce_value` checks one value against its field's annotation (converting ints to floats where a
float is expected, tables to what TOML can hold); :func:`check_ranges` checks what the types alone do not
express, across sections. Every bad value raises :class:`~fedhet.errors.ConfigError` naming the field, the
value and what is accepted. :func:`~fedhet.config.from_dict` calls both.
"""

from __future__ import annotations

import importlib.util
import math
from typing import Any, Protocol

from fedhet.attacks import is_attack, unknown_attack
from fedhet.config_sections import (
    CHOICES,
    CONTRIBUTION_ESTIMATORS,
    PRE_AGGREGATION_STEPS,
    PRE_STEPS_READING_F,
    AggregationConfig,
    DataConfig,
    EvalConfig,
    FaultsConfig,
    GuardsConfig,
    TrainConfig,
)
from fedhet.errors import ConfigError


class ExperimentSections(Protocol):
    """What the range checks read of an ``ExperimentConfig`` (config.py imports this module, not back)."""

    data: DataConfig
    train: TrainConfig
    eval: EvalConfig
    faults: FaultsConfig
    guards: GuardsConfig
    aggregation: AggregationConfig


# --------------------------------------------------------------------------------------------------------
# Validation
# --------------------------------------------------------------------------------------------------------
def _type_name(tp: Any) -> str:
    return str(tp).replace("typing.", "")


def coerce_value(section: str, name: str, value: Any, annotation: str) -> Any:
    """Check ``value`` against the field's annotation (given as a string), converting ints to floats."""
    where = f"{section}.{name}"
    ann = annotation.replace(" ", "")
    optional = "None" in ann
    if value is None:
        if optional:
            return None
        raise ConfigError(f"{where} must not be empty (None); expected {annotation}")
    base = ann.replace("|None", "").replace("None|", "")
    if base.startswith("dict"):
        if not isinstance(value, dict):
            raise ConfigError(f"{where}={value!r} must be a table/dict, e.g. {where}.alpha=0.1")
        return _table(where, value)
    if base == "float|int":
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"{where}={value!r} must be a number")
        if not math.isfinite(value):
            raise ConfigError(f"{where}={value!r} must be a finite number")
        return value
    if base == "str|bool":
        if not isinstance(value, str | bool):
            raise ConfigError(f"{where}={value!r} must be a string or boolean")
        return value
    if base == "bool":
        if not isinstance(value, bool):
            raise ConfigError(f"{where}={value!r} must be true or false")
        return value
    if base == "int":
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, float) and value.is_integer():
                return int(value)
            raise ConfigError(f"{where}={value!r} must be an integer")
        return value
    if base == "float":
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"{where}={value!r} must be a number")
        if not math.isfinite(value):
            raise ConfigError(f"{where}={value!r} must be a finite number")
        return float(value)
    if base == "str":
        if not isinstance(value, str):
            raise ConfigError(f"{where}={value!r} must be a string")
        return value
    return value


def _table(where: str, table: dict[Any, Any]) -> dict[str, Any]:
    """A table value (e.g. method.params) as TOML can hold it: string keys; booleans, numbers, strings,
    lists and tables as values. An entry set to None is dropped: None means the method's default."""
    out: dict[str, Any] = {}
    for key, value in table.items():
        if not isinstance(key, str):
            raise ConfigError(f"{where} has the key {key!r}; keys must be strings")
        if value is None:
            continue
        out[key] = (
            _table(f"{where}.{key}", value) if isinstance(value, dict) else _plain(f"{where}.{key}", value)
        )
    return out


def _plain(where: str, value: Any) -> Any:
    if isinstance(value, dict):
        return _table(where, value)
    if isinstance(value, list | tuple):
        return [_plain(where, v) for v in value]
    if isinstance(value, bool | int | float | str):
        return value
    raise ConfigError(
        f"{where}={value!r} is a {type(value).__name__}; use a boolean, number, string, list or table"
    )


def check_ranges(cfg: ExperimentSections) -> None:
    """Range checks that the types alone do not express."""
    d, t, e = cfg.data, cfg.train, cfg.eval

    def need(cond: bool, msg: str) -> None:
        if not cond:
            raise ConfigError(msg)

    for (sec, key), accepted in CHOICES.items():
        value = getattr(getattr(cfg, sec), key)
        need(value in accepted, f"{sec}.{key}={value!r} is not accepted; choose one of {list(accepted)}")
    need(d.clients >= 1, f"data.clients={d.clients} must be >= 1")
    if d.impute is not None or d.missing_indicator:
        need(
            d.dataset in ("csv", "parquet"),
            "data.impute / data.missing_indicator fill the missing numbers of a table fedhet reads "
            f"(data.dataset = 'csv' or 'parquet'), not of {d.dataset!r}: for a data frame pass impute= to "
            "fedhet.data.from_table, or drop them",
        )
        need(
            d.impute is not None or not d.missing_indicator,
            "data.missing_indicator = true marks imputed cells, but data.impute is not set (missing numbers "
            "are refused): set data.impute to 'mean', 'median' or 'most_frequent', or drop "
            "data.missing_indicator",
        )
    need(
        0.0 <= d.validation_fraction < 1.0,
        f"data.validation_fraction={d.validation_fraction} must be in [0, 1)",
    )
    for key in ("max_train_samples", "max_test_samples"):
        v = getattr(d, key)
        need(v is None or v >= 1, f"data.{key}={v} must be >= 1 (or omitted for all samples)")
    need(t.rounds >= 1, f"train.rounds={t.rounds} must be >= 1")
    cpr = t.clients_per_round
    if isinstance(cpr, float):
        need(
            0.0 < cpr <= 1.0,
            f"train.clients_per_round={cpr}: a fraction must be in (0, 1]; use an int for a count",
        )
    else:
        need(cpr >= 1, f"train.clients_per_round={cpr} must be >= 1")
    need(
        t.local_epochs > 0 or (t.local_steps or 0) > 0,
        "train.local_epochs must be > 0 (or set train.local_steps)",
    )
    need(t.local_steps is None or t.local_steps >= 1, f"train.local_steps={t.local_steps} must be >= 1")
    need(t.batch_size >= 1, f"train.batch_size={t.batch_size} must be >= 1")
    need(t.lr is None or t.lr > 0, f"train.lr={t.lr} must be > 0")
    need(t.lr_min >= 0, f"train.lr_min={t.lr_min} must be >= 0 (the cosine schedule's final learning rate)")
    need(
        0.0 < t.lr_decay <= 1.0,
        f"train.lr_decay={t.lr_decay} must be in (0, 1] (the exponential schedule's factor per round)",
    )
    if t.client_dropout > 0:
        per_round = (
            t.clients_per_round * d.clients if isinstance(t.clients_per_round, float) else t.clients_per_round
        )
        replying = (1.0 - t.client_dropout) * min(per_round, d.clients)
        need(
            replying >= 1.0 - 1e-9,  # (1 − 0.9)·10 is 0.9999999999999998
            f"train.client_dropout={t.client_dropout} with {min(per_round, d.clients):g} clients per round "
            f"leaves {replying:.2g} replying clients per round on average (fewer than one): most rounds "
            "would train nothing. Lower train.client_dropout or sample more clients",
        )
    if t.participants is not None:
        ids = t.participants
        well_formed = (
            isinstance(ids, list)
            and len(ids) > 0
            and all(isinstance(c, int) and not isinstance(c, bool) for c in ids)
        )
        need(well_formed, f"train.participants={ids!r} must be a non-empty list of client ids (or omitted)")
        need(
            not well_formed or (all(0 <= c < d.clients for c in ids) and len(set(ids)) == len(ids)),
            f"train.participants={ids!r}: each id must be in 0..{d.clients - 1} (data.clients = "
            f"{d.clients}), and appear once",
        )
    need(0.0 <= t.momentum < 1.0, f"train.momentum={t.momentum} must be in [0, 1)")
    need(t.weight_decay >= 0, f"train.weight_decay={t.weight_decay} must be >= 0")
    need(t.grad_clip is None or t.grad_clip > 0, f"train.grad_clip={t.grad_clip} must be > 0 (or omitted)")
    need(0.0 <= t.client_dropout < 1.0, f"train.client_dropout={t.client_dropout} must be in [0, 1)")
    need(t.threads is None or t.threads >= 1, f"train.threads={t.threads} must be >= 1")
    need(e.every >= 1, f"eval.every={e.every} must be >= 1")
    need(e.every_round_last >= 0, f"eval.every_round_last={e.every_round_last} must be >= 0 (0: none)")
    need(e.batch_size >= 1, f"eval.batch_size={e.batch_size} must be >= 1")
    need(e.checkpoint_every >= 0, f"eval.checkpoint_every={e.checkpoint_every} must be >= 0")
    need(0.0 < e.bcf_alpha <= 1.0, f"eval.bcf_alpha={e.bcf_alpha} must be in (0, 1]")
    estimators = e.contribution_estimators
    need(
        isinstance(estimators, list),
        f"eval.contribution_estimators={estimators!r} must be a list, e.g. "
        f'eval.contribution_estimators=["gtg-shapley"]; choose among {list(CONTRIBUTION_ESTIMATORS)}',
    )
    unknown = [n for n in estimators if n not in CONTRIBUTION_ESTIMATORS]
    need(
        not unknown,
        f"eval.contribution_estimators names {unknown}, which fedhet does not estimate; choose among "
        f"{list(CONTRIBUTION_ESTIMATORS)}",
    )
    _check_faults(cfg)
    g = cfg.guards
    for key in ("update_norm_factor", "num_examples_factor"):
        v = getattr(g, key)
        need(v == 0 or v > 1.0, f"guards.{key}={v} must be > 1 (a multiple of the median), or 0 (off)")
    need(
        g.update_norm_clip == 0 or g.update_norm_clip >= 1.0,
        f"guards.update_norm_clip={g.update_norm_clip} must be >= 1 (a multiple of the round's median update "
        "norm), or 0 (off)",
    )
    need(
        0.0 <= g.update_norm_floor < 1.0,
        f"guards.update_norm_floor={g.update_norm_floor} must be in [0, 1) (a fraction of the model's "
        "norm; 0: off)",
    )
    need(
        g.min_update_cosine is None or -1.0 <= g.min_update_cosine < 1.0,
        f"guards.min_update_cosine={g.min_update_cosine} must be in [-1, 1) (or none: off)",
    )
    need(
        g.max_num_examples is None or g.max_num_examples >= 1,
        f"guards.max_num_examples={g.max_num_examples} must be >= 1 (or omitted for no bound)",
    )
    need(
        g.max_all_rejected_rounds >= 0,
        f"guards.max_all_rejected_rounds={g.max_all_rejected_rounds} must be >= 0 (0 = never stop)",
    )
    a = cfg.aggregation
    need(
        0.0 <= a.beta < 0.5, f"aggregation.beta={a.beta} must be in [0, 0.5) (the fraction cut from each end)"
    )
    need(
        0 <= a.num_malicious_nodes < cfg.data.clients,
        f"aggregation.num_malicious_nodes={a.num_malicious_nodes} must be in 0..{cfg.data.clients - 1}",
    )
    need(
        1 <= a.num_nodes_to_select <= cfg.data.clients,
        f"aggregation.num_nodes_to_select={a.num_nodes_to_select} must be in 1..{cfg.data.clients}",
    )
    need(a.clipping_tau > 0, f"aggregation.clipping_tau={a.clipping_tau} must be > 0")
    need(a.clipping_iterations >= 1, f"aggregation.clipping_iterations={a.clipping_iterations} must be >= 1")
    _check_pre_steps(cfg)
    need(a.gm_nu > 0, f"aggregation.gm_nu={a.gm_nu} must be > 0 (the smoothing of the smoothed Weiszfeld)")
    need(a.gm_iterations >= 1, f"aggregation.gm_iterations={a.gm_iterations} must be >= 1")
    need(a.gm_tolerance >= 0, f"aggregation.gm_tolerance={a.gm_tolerance} must be >= 0 (0: every iteration)")
    if a.implementation == "flower":
        need(
            a.rule not in ("centered-clipping", "geometric-median"),
            f"aggregation.implementation=flower: Flower has no {a.rule} strategy (it has FedAvg, "
            f"FedMedian, FedTrimmedAvg, Krum and MultiKrum); use implementation=fedhet for it",
        )
        need(
            not a.pre,
            f"aggregation.implementation=flower: Flower's strategies have no pre-aggregation step "
            f"(aggregation.pre = {a.pre}); use implementation=fedhet for them",
        )
        need(
            importlib.util.find_spec("flwr") is not None,
            "aggregation.implementation=flower needs Flower: pip install 'fedhet[flower]'",
        )


def _check_pre_steps(cfg: ExperimentSections) -> None:
    """aggregation.pre names known steps, and f (num_malicious_nodes) suits the ones that read it: at least 1
    and below half the rows they see in a full round (the clients per round, divided into buckets when
    bucketing runs first)."""
    a, d, t = cfg.aggregation, cfg.data, cfg.train
    steps = a.pre
    if not isinstance(steps, list) or not all(isinstance(s, str) for s in steps):
        raise ConfigError(
            f'aggregation.pre={steps!r} must be a list of step names, e.g. aggregation.pre=["nnm"]; choose '
            f"among {list(PRE_AGGREGATION_STEPS)}"
        )
    unknown = [s for s in steps if s not in PRE_AGGREGATION_STEPS]
    if unknown:
        raise ConfigError(f"aggregation.pre names {unknown}; choose among {list(PRE_AGGREGATION_STEPS)}")
    if a.bucket_size < 1:
        raise ConfigError(f"aggregation.bucket_size={a.bucket_size} must be >= 1")
    cpr = t.clients_per_round
    rows = min(d.clients, round(cpr * d.clients) if isinstance(cpr, float) else cpr)
    if t.participants is not None:
        rows = min(rows, len(t.participants))
    f = a.num_malicious_nodes
    for step in steps:
        if step == "bucketing":
            rows = -(-rows // a.bucket_size)
        elif step in PRE_STEPS_READING_F and not 1 <= f < rows / 2:
            raise ConfigError(
                f"aggregation.pre step {step!r} reads f = aggregation.num_malicious_nodes, the number of "
                f"hostile clients assumed, which must be >= 1 and below half of the {rows} models it sees "
                f"per round; it is {f}. Set it, e.g. --set aggregation.num_malicious_nodes=1"
            )


def _check_faults(cfg: ExperimentSections) -> None:
    f, n = cfg.faults, cfg.data.clients
    for key, behaviour in list(f.clients.items()):
        if isinstance(behaviour, float) and math.isnan(behaviour):  # --set faults.clients.0=nan reads NaN
            f.clients[key] = behaviour = "nan"
        if not (isinstance(key, str) and key.isascii() and key.isdigit() and int(key) < n):
            raise ConfigError(
                f"faults.clients has key {key!r}; keys are client ids 0..{n - 1}, e.g. faults.clients.0=noise"
            )
        if not is_attack(behaviour):
            raise unknown_attack(f"faults.clients.{key}={behaviour!r}")
    for name, block in f.params.items():
        if not is_attack(name):
            raise unknown_attack(f"faults.params.{name}: {name!r}")
        if not isinstance(block, dict):
            raise ConfigError(
                f"faults.params.{name}={block!r} must be a table of the attack's parameters, e.g. "
                f'faults.params.{name}.direction="sign"'
            )
    if not f.factor > 0:
        raise ConfigError(f"faults.factor={f.factor} must be > 0")
    if not f.noise_std > 0:
        raise ConfigError(f"faults.noise_std={f.noise_std} must be > 0")
    if f.from_round < 1:
        raise ConfigError(f"faults.from_round={f.from_round} must be >= 1")
    if f.every < 1:
        raise ConfigError(
            f"faults.every={f.every} must be >= 1: attack every k-th round from faults.from_round "
            "(1 = every round, 2 = every other round)"
        )
    if f.z is not None and not f.z >= 0:
        raise ConfigError(
            f"faults.z={f.z} must be >= 0 (ALIE sends mean − z·std of the honest updates); "
            "omit it (or faults.z=none) for the paper's z_max"
        )
    if not f.epsilon > 0:
        raise ConfigError(
            f"faults.epsilon={f.epsilon} must be > 0 (IPM sends −epsilon × the mean honest update; "
            "0.5 is the paper's small epsilon, 100 its large one)"
        )
