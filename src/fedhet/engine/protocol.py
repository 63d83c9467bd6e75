"""The message boundary: the messages server and clients exchange, and the interfaces on either side.

An algorithm is a server-side :class:`Strategy` and a client-side :class:`Trainer`. They share nothing but
messages: the server sends each client an :class:`Instruction` and receives a :class:`Reply`; it knows the
federation only through :class:`FederationInfo` and what clients tell it (their replies and a round-0
describe exchange). A client sees its instruction, its own :class:`ClientState` and its own
:class:`ClientData`. Messages hold tensors and small config values only, so the same objects run in the
embedded simulation (``fedhet.engine.simulation``) and over Flower's Message API; a :class:`Transport`
carries them either way.

This module holds messages and interfaces and nothing else; the client-side entry is
``fedhet.engine.client.run_client``; the SGD trainer and FedAvg, the bases every method extends, sit a
layer above, in the algorithms package (``algorithms/fedavg.py``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, ClassVar

import numpy as np
import torch
from torch import Tensor, nn

Weights = dict[str, Tensor]
ConfigValue = float | int | str | bool

#: Instruction.config keys the engine owns (methods use their own, prefixed names).
LR_KEY = "lr"  #: the round's learning rate, set by the round loop for every client
KEEP_KEY = "keep"  #: what the client keeps between rounds: "none" (default), "head" or "model"
ACTION_KEY = "action"  #: "train" (default) or "describe" (the round-0 exchange)
KEEP_CHOICES = ("none", "head", "model")
DESCRIBE = "describe"


# --------------------------------------------------------------------------------------------------------
# Messages
# --------------------------------------------------------------------------------------------------------
@dataclass
class Instruction:
    """Server -> one client, one round.

    ``weights`` is a full or partial state dict; keys it lacks come from what the client keeps
    (:attr:`ClientState.weights`). With ``delta=True`` they are an increment to the client's own model
    (reward downloads of CGSV/CFFL/IAFL). ``mask`` is a submodel mask (FedRAC/FedSAC), ``payload`` extra
    tensors (ProxyFL's class prior, FedProto's prototypes), ``config`` scalars (``lr``, ``keep``, the
    method's settings).
    """

    weights: Weights
    mask: Tensor | None = None
    payload: dict[str, Tensor] = field(default_factory=dict)
    config: dict[str, ConfigValue] = field(default_factory=dict)
    delta: bool = False


@dataclass
class Reply:
    """One client -> server: trained weights (or an update), the self-reported number of examples,
    metrics for logging and extra tensors (``payload``: class counts, prototypes, kept updates)."""

    weights: Weights
    num_examples: int
    metrics: dict[str, float] = field(default_factory=dict)
    payload: dict[str, Tensor] = field(default_factory=dict)


@dataclass
class ClientState:
    """What a client keeps between rounds (Flower's ``context.state``): tensors and JSON values only.

    ``weights`` is what the instruction told the client to keep (its head during CELM's warm-up, its own
    model for Standalone and the own-model methods), ``values`` any other JSON-able value.
    """

    weights: Weights | None = None
    values: dict[str, Any] = field(default_factory=dict)


@dataclass
class ClientData:
    """A client's local data, as indices into tensors (the simulation shares them between clients).

    ``inputs`` are normalized float tensors for supervised trainers, or raw floats in [0, 1] when the
    trainer augments first (then ``normalize`` maps a batch to model inputs).
    """

    cid: int
    inputs: Tensor
    labels: Tensor
    indices: Tensor
    num_classes: int
    unlabeled_indices: Tensor | None = None
    normalize: Callable[[Tensor], Tensor] | None = None

    @property
    def num_examples(self) -> int:
        return int(self.indices.numel())

    def class_counts(self) -> Tensor:
        """Per-class sample counts of the labeled data (FedRS, ProxyFL, CFFL's class weighting)."""
        return torch.bincount(self.labels[self.indices], minlength=self.num_classes)


# --------------------------------------------------------------------------------------------------------
# What each side knows
# --------------------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class FederationInfo:
    """Everything a server knows besides the replies it receives, and nothing a real one would not.

    ``model`` is the initial global model (built from the run's model config and seed), ``rng`` the server's
    own seeded generator (checkpointed). ``validation`` is the server's own held-out data when the config
    gives it one; ``reference_contributions`` are per-client reference accuracies supplied as an input
    (the standalone pre-pass), for methods that declare they need them. Client sizes and class counts are
    not here: they arrive as self-reported descriptions (:meth:`Strategy.receive_descriptions`).
    """

    model: nn.Module
    num_clients: int
    num_classes: int
    input_shape: tuple[int, ...]
    rounds: int
    seed: int
    rng: np.random.Generator
    device: torch.device
    eval_batch_size: int = 2048
    validation: tuple[Tensor, Tensor] | None = None
    reference_contributions: np.ndarray | None = None
    #: How the server combines client models (``[aggregation]``: rule and its parameters); None = the mean.
    aggregation: Mapping[str, Any] | None = None


@dataclass
class TrainContext:
    """What a client's runtime gives its trainer: the round, a seeded generator, the device, the local
    training settings and a work model to train in (its weights are overwritten).

    ``shared`` is memory shared by every client of a run, offered only by the embedded simulation (for
    quirks that need it, e.g. ``shared_optimizer``); other transports pass None.
    """

    round: int
    generator: torch.Generator
    device: torch.device
    train: Any  # fedhet.config.TrainConfig
    model: nn.Module
    shared: dict[str, Any] | None = None


@dataclass
class LocalUpdate:
    """One local update: what every trainer hook receives, so that a trainer keeps nothing on ``self``.

    ``state`` is the client's new state (a copy of the old one that the trainer updates), ``start`` the
    weights training started from, ``scratch`` values the hooks of this one update share.
    """

    model: nn.Module
    data: ClientData
    instruction: Instruction
    state: ClientState
    context: TrainContext
    start: Weights
    scratch: SimpleNamespace = field(default_factory=SimpleNamespace)

    @property
    def config(self) -> dict[str, ConfigValue]:
        return self.instruction.config


# --------------------------------------------------------------------------------------------------------
# Interfaces
# --------------------------------------------------------------------------------------------------------
#: The hooks of a trainer's training loop: a :attr:`Trainer.functional_form` holds for a class only while it
#: keeps all of them from the class that declared the form. Its other hooks (``num_steps``, ``num_examples``,
#: ``finish``, ``kept_weights``) the vectorized engine calls as the sequential loop calls them.
TRAINING_HOOKS = ("fit", "prepare", "make_optimizer", "batches", "loss")

#: The functional forms the vectorized engine computes (``fedhet.engine.vectorized``): "plain" (cross-entropy
#: SGD), "proximal" (+ μ/2‖w − w_g‖², μ in ``u.scratch.proximal_mu``) and "restricted" (cross-entropy of
#: the logits scaled by ``u.scratch.fedrs_scales``), each after the trainer's own ``prepare``.
FUNCTIONAL_FORMS = ("plain", "proximal", "restricted")


class Trainer(ABC):
    """Client side of a method: a local update from an instruction (the SGD trainer in
    ``algorithms/fedavg.py`` is the base every method extends)."""

    #: True when the trainer wants raw [0, 1] inputs and a ``normalize`` function (augmenting trainers).
    needs_raw_inputs: bool = False
    #: The form of this class's training loop (one of :data:`FUNCTIONAL_FORMS`), declared by the class that
    #: implements it; it holds for a subclass only while the subclass keeps that class's
    #: :data:`TRAINING_HOOKS`. None: no form (``engine.mode = "vectorized"`` refuses it, "auto" trains it
    #: sequentially).
    functional_form: ClassVar[str | None] = None
    #: True on a class whose ``finish`` replies exactly the trained weights, ``num_examples(data)`` and the
    #: metrics; it holds for a subclass only while the subclass keeps that class's ``finish``.
    finish_replies_trained_weights: ClassVar[bool] = False
    #: True where a reply's weights are the update Δ = w_new − w_start, not a model (clients that keep their
    #: own models: CFFL, CGSV, ShapFed, IAFL): the guards measure ‖Δ‖, and an injected fault alters Δ.
    uploads_updates: ClassVar[bool] = False

    def num_examples(self, data: ClientData) -> int:
        """The sample count this client reports (FedAvg's n_i): its labeled samples by default."""
        return data.num_examples

    def describe(self, data: ClientData) -> Reply:
        """The round-0 description: the self-reported sample count and per-class counts, no weights."""
        return Reply(
            weights={}, num_examples=self.num_examples(data), payload={"class_counts": data.class_counts()}
        )

    @abstractmethod
    def fit(self, update: LocalUpdate) -> Reply:
        """Train ``update.model`` from ``update.start`` and return the reply (updating ``update.state``)."""


class Strategy(ABC):
    """Server side of a method (FedAvg in ``algorithms/fedavg.py`` is the base every method extends).

    Per round the engine calls :meth:`configure`, sends the instructions, and passes the validated replies
    (client-id order) to :meth:`before_aggregate`, :meth:`aggregate` and :meth:`after_aggregate`.
    """

    name: str = "strategy"
    #: The client-side trainer of this method (what a client runs; built without any server object).
    trainer_class: type[Trainer]
    #: True for a method whose rewards *are* the fairness reference (Standalone): no fairness against itself.
    rewards_are_reference: bool = False
    #: True for a method whose rewards are its result (CGSV, CFFL, IAFL, ShapFed, FedRAC, FedSAC): under
    #: ``eval.fairness = "auto"`` its runs measure fairness, paying for the standalone pre-pass. Other methods
    #: (FedAvg, CELM, ...) measure it only when asked (``eval.fairness = true``) or beside one of these.
    fairness_by_default: bool = False
    #: What the method needs of its model beyond forward/state_dict (``fedhet.models.registry.MODEL_NEEDS``):
    #: "head" (features + a Linear head), "masks" (maskable units). Checked before the first round.
    model_needs: frozenset[str] = frozenset()
    #: True for a method whose server step is an average of client models that ``[aggregation]``'s robust
    #: rules (median, trimmed mean, Krum, centered clipping) may replace; the others refuse a rule but "mean".
    supports_aggregation_rules: bool = False

    def requirements(self) -> frozenset[str]:
        """Inputs beyond messages: ``"validation"`` (a server validation split), ``"reference_contributions"``
        (per-client reference accuracies, the standalone pre-pass)."""
        return frozenset()

    def config_defaults(self) -> dict[str, Any]:
        """Config values the method needs where the user left fedhet's general default (dotted key ->
        value; ``fedhet.experiment.apply_method_defaults`` applies them with a notice), e.g. a server
        validation split for CFFL, a model with maskable units for FedRAC."""
        return {"data.validation_fraction": 0.1} if "validation" in self.requirements() else {}

    def simulation_only(self) -> list[str]:
        """Features of this configuration that need memory shared between clients (refused on Flower)."""
        return []

    @abstractmethod
    def setup(self, info: FederationInfo) -> None:
        """Receive the initial global model and what the server knows of the federation."""

    def receive_descriptions(self, descriptions: Mapping[int, Reply]) -> None:  # noqa: B027 (an optional hook)
        """The clients' self-reported descriptions (sample and class counts) from the round-0 exchange."""

    @abstractmethod
    def configure(self, rnd: int, client_ids: list[int]) -> dict[int, Instruction]:
        """One instruction per sampled client."""

    def before_aggregate(self, rnd: int, replies: Mapping[int, Reply]) -> None:  # noqa: B027 (an optional hook)
        """Called with the round's replies before :meth:`aggregate` (e.g. CELM's probes)."""

    @abstractmethod
    def aggregate(self, rnd: int, replies: Mapping[int, Reply]) -> None:
        """Combine the replies into the server's model(s)."""

    def after_aggregate(self, rnd: int, replies: Mapping[int, Reply]) -> None:  # noqa: B027 (an optional hook)
        """Called after :meth:`aggregate` (e.g. ProxyFL's proxy tuning and prior)."""

    @abstractmethod
    def global_model(self) -> nn.Module | None:
        """The model evaluated as the federation's result (None if there is none, e.g. Standalone)."""

    def has_rewards(self) -> bool:
        """Whether per-client reward models exist (fairness metrics need them)."""
        return False

    def reward_model(self, cid: int) -> nn.Module | None:
        """What client ``cid`` ends with (its reward); None when the method defines none."""
        return None

    def evaluate_rewards(self, x: Tensor, y: Tensor, batch_size: int) -> list[float] | None:
        """Test accuracy of every client's reward model (NaN where none yet), or None without rewards."""
        return None

    def contributions(self) -> np.ndarray | None:
        """Estimated per-client contribution weights (CELM, ShapFed, CGSV, ...), or None."""
        return None

    def round_metrics(self, rnd: int) -> dict[str, Any]:
        """Extra per-round values for metrics.jsonl."""
        return {}

    def run_records(self) -> dict[str, Any]:
        """JSON-able records the report layer turns into CSVs and figures (written to records.json)."""
        return {}

    @abstractmethod
    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume: tensors and JSON-able values (nested dicts allowed)."""

    @abstractmethod
    def load_state_dict(self, sd: Mapping[str, Any]) -> None:
        """Inverse of :meth:`state_dict`."""


# --------------------------------------------------------------------------------------------------------
# Transports
# --------------------------------------------------------------------------------------------------------
#: Client id -> what went wrong, for clients whose reply never came (a crash, a timeout, a lost node).
Failures = dict[int, str]


class Transport(ABC):
    """Carries instructions to clients and their replies back; holds no algorithm."""

    #: ``simulation`` (clients in this process, with memory they may share) or the name of another transport.
    name: str = "simulation"

    @abstractmethod
    def describe(self, client_ids: Sequence[int]) -> tuple[dict[int, Reply], Failures]:
        """The round-0 exchange: every client's description (sample and class counts)."""

    @abstractmethod
    def send(self, rnd: int, instructions: dict[int, Instruction]) -> tuple[dict[int, Reply], Failures]:
        """One round: each instruction to its client; the replies that came back, and the failures."""

    def round_timing(self) -> dict[str, float]:
        """Seconds of the last :meth:`send`'s parts, for ``timings.jsonl`` (none by default)."""
        return {}

    def state_dict(self) -> dict[str, Any]:
        """What the transport holds for its clients (their states, in the simulation), for checkpoints."""
        return {}

    def load_state_dict(self, sd: dict[str, Any]) -> None:  # noqa: B027 (nothing to restore by default)
        """Inverse of :meth:`state_dict`."""
