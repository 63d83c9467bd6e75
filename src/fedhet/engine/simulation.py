"""The embedded engine: every client in this process, trained one after another, bit-reproducible.

:class:`Simulation` is the round loop (``fedhet.engine.rounds``) with :class:`InProcessClients` as its
transport: each client's data is a view of tensors shared by all clients (no copies), its state lives here
between rounds, and one work model and one trainer serve every client in turn through ``run_client``.
Every random choice flows from the run's seed (``fedhet.engine.seeds``), so the same config and seed give
identical ``metrics.jsonl``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from fedhet.config import ExperimentConfig
from fedhet.engine.client import describe_instruction, run_client
from fedhet.engine.faults import fault_for
from fedhet.engine.names import RunNames
from fedhet.engine.protocol import (
    ClientData,
    ClientState,
    Failures,
    Instruction,
    Reply,
    Strategy,
    TrainContext,
    Trainer,
    Transport,
)
from fedhet.engine.rounds import RoundLoop
from fedhet.engine.seeds import derived_rng, derived_torch_generator
from fedhet.errors import ConfigError

log = logging.getLogger("fedhet")

# --------------------------------------------------------------------------------------------------------
# Data preparation
# --------------------------------------------------------------------------------------------------------
_DATASET_CACHE: dict[tuple[str, str | None, str | None, str], Any] = {}


def get_dataset(name: str, root: str | None, path: str | None = None, table: dict[str, Any] | None = None):
    """Load a dataset once per process (compare runs share it); registered data sets are already in memory.
    ``table``: a table's reading options (label, client, categorical, test_path) for csv / parquet."""
    from fedhet.data import datasets

    if name in datasets._REGISTERED:
        return datasets.load_dataset(name, root, path=path)
    key = (name, root, path, repr(sorted((table or {}).items())))
    if key not in _DATASET_CACHE:
        _DATASET_CACHE.clear()  # keep at most one dataset in memory
        _DATASET_CACHE[key] = datasets.load_dataset(name, root, path=path, table=table)
    return _DATASET_CACHE[key]


def table_options(cfg: ExperimentConfig) -> dict[str, Any]:
    """The config's options for reading a table (data.dataset = csv / parquet): the keyword arguments of
    ``fedhet.data.datasets.tables.load_table_files``."""
    d = cfg.data
    return {
        "label": d.label_column,
        "client": d.client_column,
        "categorical": tuple(d.categorical_columns),
        "test_path": d.test_path,
        "impute": d.impute,
        "missing_indicator": d.missing_indicator,
    }


@dataclass
class Federation:
    """The data side of a run: tensors on the device, the partition and each client's view."""

    dataset: Any
    partition: Any
    clients: list[ClientData]
    test_x: Tensor
    test_y: Tensor
    validation: tuple[Tensor, Tensor] | None
    class_counts: np.ndarray
    pool_indices: np.ndarray
    info: dict[str, Any] = field(default_factory=dict)
    #: What the outputs call the clients (their sites, for a ``sites`` split) and the classes.
    names: RunNames = field(default_factory=RunNames)

    @property
    def num_classes(self) -> int:
        return self.dataset.num_classes

    @property
    def sizes(self) -> list[int]:
        return [c.num_examples for c in self.clients]


def _refuse_emptied_sites(cfg: ExperimentConfig, ds: Any, pool: np.ndarray) -> None:
    """A site whose every training row the validation hold-out or ``max_train_samples`` took: named, with the
    fix (the ``sites`` split would otherwise see one client fewer and ask for another data.clients)."""
    sites = ds.train_sites.numpy()
    emptied = [
        (ds.sites[s], int(np.sum(sites == s)))
        for s in range(len(ds.sites))
        if np.any(sites == s) and not np.any(sites[pool] == s)
    ]
    if emptied:
        named = ", ".join(f"{name!r} ({n} row{'s' if n != 1 else ''})" for name, n in emptied)
        raise ConfigError(
            f"site(s) {named} keep no training rows after data.validation_fraction = "
            f"{cfg.data.validation_fraction:g} and data.max_train_samples = {cfg.data.max_train_samples}: "
            "lower data.validation_fraction (or raise max_train_samples), or drop the site's rows"
        )


def build_federation(cfg: ExperimentConfig, device: torch.device, raw_inputs: bool = False) -> Federation:
    """Load the dataset, hold out validation data, split the pool over clients, move tensors to ``device``."""
    from fedhet.data.splits import holdout_validation, make_partition

    ds = get_dataset(cfg.data.dataset, cfg.data.root, cfg.data.path, table_options(cfg))
    n_train = int(ds.train_y.numel())
    all_idx = np.arange(n_train)
    if cfg.data.max_train_samples is not None and cfg.data.max_train_samples < n_train:
        all_idx = np.sort(
            derived_rng(cfg.seed, "subset").choice(n_train, cfg.data.max_train_samples, replace=False)
        )
    val_idx = None
    if cfg.data.validation_fraction > 0:
        pool_pos, val_pos = holdout_validation(
            len(all_idx), cfg.data.validation_fraction, derived_rng(cfg.seed, "validation")
        )
        val_idx, pool = all_idx[val_pos], all_idx[pool_pos]
    else:
        pool = all_idx
    if cfg.data.split == "sites" and ds.train_sites is not None:
        _refuse_emptied_sites(cfg, ds, pool)
    labels_np = ds.train_y.numpy()
    pool_labels = labels_np[pool]
    if cfg.data.clients > len(pool):
        raise ConfigError(
            f"data.clients={cfg.data.clients} exceeds the {len(pool)} training samples available"
        )
    partition = make_partition(
        cfg.data.split,
        pool_labels,
        cfg.data.clients,
        derived_rng(cfg.seed, "partition"),
        cfg.data.split_params,
        num_classes=ds.num_classes,
        site_of=None if ds.train_sites is None else ds.train_sites.numpy()[pool],
    )
    if ds.is_table:
        ds = federated_standardization(ds, pool, partition)

    if raw_inputs and ds.is_table:
        # A table's augmentations (fedhet.data.augment.tabular) work on standardised rows.
        train_inputs = ds.normalize(ds.train_x).to(device)

        def normalize(x: Tensor) -> Tensor:
            return x
    elif raw_inputs:
        train_inputs = ds.unit_inputs(ds.train_x).to(device)

        def normalize(x: Tensor) -> Tensor:
            return ds.normalize(x)
    else:
        train_inputs = ds.normalize(ds.train_x).to(device)
        normalize = None
    train_labels = ds.train_y.to(device)
    to_dev = lambda a: torch.as_tensor(pool[a], dtype=torch.long, device=device)  # noqa: E731
    clients = []
    for cid, idx in enumerate(partition.clients):
        unl = None
        if partition.unlabeled is not None:
            unl = to_dev(partition.unlabeled[cid])
        clients.append(
            ClientData(
                cid=cid,
                inputs=train_inputs,
                labels=train_labels,
                indices=to_dev(idx),
                num_classes=ds.num_classes,
                unlabeled_indices=unl,
                normalize=normalize,
            )
        )
    test_x, test_y = ds.test_x, ds.test_y
    if cfg.data.max_test_samples is not None and cfg.data.max_test_samples < len(test_y):
        sel = np.sort(
            derived_rng(cfg.seed, "test_subset").choice(len(test_y), cfg.data.max_test_samples, replace=False)
        )
        test_x, test_y = test_x[torch.as_tensor(sel)], test_y[torch.as_tensor(sel)]
    validation = None
    if val_idx is not None:
        vi = torch.as_tensor(val_idx)
        validation = (ds.normalize(ds.train_x[vi]).to(device), ds.train_y[vi].to(device))
    return Federation(
        dataset=ds,
        partition=partition,
        clients=clients,
        test_x=ds.normalize(test_x).to(device),
        test_y=test_y.to(device),
        validation=validation,
        class_counts=partition.class_counts(pool_labels, ds.num_classes),
        pool_indices=pool,
        info=dict(partition.info),
        names=RunNames.of_data(ds, cfg.data.split, len(partition.clients)),
    )


def federated_standardization(ds: Any, pool: np.ndarray, partition: Any) -> Any:
    """A table normalised with statistics the server aggregates from each client's report on its own rows
    (count, sums, sums of squares: ``fedhet.data.datasets.tables``), as a deployment would compute them."""
    from fedhet.data.datasets.standardization import client_feature_statistics, combine_feature_statistics

    rows = ds.train_x.numpy()
    reports = []
    for cid, idx in enumerate(partition.clients):
        held = idx if partition.unlabeled is None else np.concatenate([idx, partition.unlabeled[cid]])
        reports.append(client_feature_statistics(rows[pool[held]]))
    numeric = ds.numeric or (True,) * rows.shape[1]
    return ds.with_statistics(*combine_feature_statistics(reports, numeric))


# --------------------------------------------------------------------------------------------------------
# The in-process transport and the simulation
# --------------------------------------------------------------------------------------------------------
class InProcessClients(Transport):
    """Every client in this process: its data, its state between rounds, one shared work model and trainer.

    ``shared`` is memory all clients of the run share, which only this transport offers (for quirks such
    as ``shared_optimizer``).
    """

    name = "simulation"

    def __init__(
        self, cfg: ExperimentConfig, clients: Sequence[ClientData], trainer: Trainer, work_model: nn.Module
    ) -> None:
        self.cfg = cfg
        self.clients = list(clients)
        self.trainer = trainer
        self.work_model = work_model
        self.states = {c.cid: ClientState() for c in self.clients}
        self.shared: dict[str, Any] = {}
        #: Why this run's training cannot be vectorized ("" when it can; None before the first round).
        self.vector_refusal: str | None = None

    def context(self, rnd: int, cid: int) -> TrainContext:
        return TrainContext(
            round=rnd,
            generator=derived_torch_generator(self.cfg.seed, "client", rnd, cid),
            device=next(self.work_model.parameters()).device,
            train=self.cfg.train,
            model=self.work_model,
            shared=self.shared,
        )

    def describe(self, client_ids: Sequence[int]) -> tuple[dict[int, Reply], Failures]:
        ins = describe_instruction()
        return {
            cid: run_client(
                self.trainer,
                ins,
                self.states[cid],
                self.clients[cid],
                self.context(0, cid),
                fault_for(self.cfg, cid, 0),
            )[0]
            for cid in client_ids
        }, {}

    def vectorize(self, instructions: Mapping[int, Instruction]) -> bool:
        """Whether this round's clients train at once (``engine.mode``; fedhet.engine.vectorized)."""
        mode = self.cfg.engine.mode
        if mode == "sequential" or not instructions:
            return False
        if self.vector_refusal is None:
            from fedhet.engine.vectorized import why_not_vectorized

            reason = why_not_vectorized(
                self.trainer, self.work_model, self.cfg.train, faults=bool(self.cfg.faults.clients)
            )
            self.vector_refusal = reason or ""
            if reason and mode == "vectorized":
                raise ConfigError(
                    f"engine.mode = 'vectorized' cannot train this run: {reason}. Use engine.mode = 'auto' "
                    "(sequential where vectorizing does not apply) or 'sequential'"
                )
            if reason:
                log.info("engine.mode = 'auto': training sequentially because %s", reason)
        if self.vector_refusal:
            return False
        from fedhet.engine.vectorized import auto_threshold

        return mode == "vectorized" or len(instructions) >= auto_threshold()

    def send(self, rnd: int, instructions: dict[int, Instruction]) -> tuple[dict[int, Reply], Failures]:
        """Run each instructed client. A client whose training raises is a failed client of this round
        (as a node that errors is on Flower): recorded, its state unchanged, the round goes on. A
        ConfigError is not a client's failure but the run's, and stops it."""
        replies: dict[int, Reply] = {}
        failures: Failures = {}
        if self.vectorize(instructions):
            from fedhet.engine.vectorized import train_group

            ids = sorted(instructions)
            try:
                done = train_group(
                    self.trainer,
                    instructions,
                    {c: self.states[c] for c in ids},
                    {c: self.clients[c] for c in ids},
                    {c: self.context(rnd, c) for c in ids},
                )
            except ConfigError:
                raise
            except Exception as exc:  # noqa: BLE001 - one client's error: rerun the round one by one
                log.warning(
                    "round %d: vectorized training raised %r; training its clients one by one", rnd, exc
                )
            else:
                for cid, (reply, state) in done.items():
                    replies[cid], self.states[cid] = reply, state
                return replies, failures
        for cid in sorted(instructions):
            try:
                data, context = self.clients[cid], self.context(rnd, cid)
                fault = fault_for(self.cfg, cid, rnd)
                reply, state = run_client(
                    self.trainer, instructions[cid], self.states[cid], data, context, fault
                )
            except ConfigError:
                raise
            except Exception as exc:  # noqa: BLE001 - any error inside one client's training
                failures[cid] = f"training raised {type(exc).__name__}: {exc}"
                continue
            # The client keeps its new state whatever the server makes of its reply.
            replies[cid], self.states[cid] = reply, state
        return replies, failures

    def state_dict(self) -> dict[str, Any]:
        return {
            str(cid): {"weights": st.weights, "values": st.values}
            for cid, st in self.states.items()
            if st.weights is not None or st.values
        }

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        for cid, st in sd.items():
            self.states[int(cid)] = ClientState(weights=st["weights"], values=dict(st["values"]))


class Simulation(RoundLoop):
    """Run one experiment in-process: ``Simulation(cfg, strategy, run_dir=...).run()`` returns the summary.

    The server side (``strategy``) and the clients (one ``trainer``, each client's state and data) meet
    only through messages: a round-0 describe exchange, then per round the instructions of
    ``strategy.configure`` and the clients' replies from :func:`~fedhet.engine.client.run_client`.
    """

    def __init__(
        self,
        cfg: ExperimentConfig,
        strategy: Strategy,
        *,
        trainer: Trainer | None = None,
        **kwargs: Any,
    ) -> None:
        """``trainer``: the clients' (default: the strategy's ``trainer_class``); ``kwargs``: the
        :class:`~fedhet.engine.rounds.RoundLoop`'s (``run_dir``, ``progress``, ``resume``, ...)."""
        super().__init__(cfg, strategy, **kwargs)
        self.trainer = trainer if trainer is not None else strategy.trainer_class()

    def build_data(self) -> Federation:
        return build_federation(self.cfg, self.device, raw_inputs=self.trainer.needs_raw_inputs)

    def make_transport(self) -> InProcessClients:
        self.work_model = self.model_factory()
        return InProcessClients(self.cfg, self.fed.clients, self.trainer, self.work_model)

    @property
    def client_states(self) -> dict[int, ClientState]:
        """Each client's state between rounds (held by the in-process transport)."""
        return self.transport.states
