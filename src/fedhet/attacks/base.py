"""What an attack is: a small class that declares its kind and its parameters, and the views it acts on.

The kinds, by where an attack acts (the engine, fedhet.engine.faults, calls the one hook of its kind):

- ``"reply"``: one client's reply, :meth:`Attack.alter` (default: :meth:`Attack.tensor` per float tensor);
- ``"data"``: the client's training data, :meth:`Attack.relabel` (its own labels; it trains honestly on them);
- ``"refuse"``: the client sends nothing, :attr:`Attack.refusal` says why;
- ``"count"``: the sample count it reports, :meth:`Attack.claim` (in its round-0 description too);
- ``"coordinated"``: the round's replies with the honest updates in view, :meth:`Attack.forge`: an
  omniscient, colluding adversary (the threat model of fedhet.engine.faults and docs/reliability.md).

Parameters come from the attack's own block ``[faults.params.<name>]`` over :attr:`Attack.parameters` (the
defaults); the built-in attacks of the first robustness table read the flat ``[faults]`` keys they always
read instead (:attr:`Attack.flat_parameters`), so their runs keep their fingerprints. Every update handed
to an attack is float64, measured as the guards measure it (w_i − w_sent; the reply itself where the
trainer uploads updates).
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from torch import Tensor

from fedhet.errors import ConfigError


@dataclass(frozen=True)
class NormGuard:
    """The update-norm guard a coordinated attack may aim under: ``factor`` × max(median norm, ``floor``),
    judged with ``min_updates`` or more updates (``factor`` 0: off)."""

    factor: float
    floor: float
    min_updates: int


@dataclass(frozen=True)
class RoundView:
    """What a coordinated attack sees in one round.

    ``honest``: key -> the stacked honest updates Δ_i, shape (h, *tensor shape), float64, over the tensors
    every honest client and every colluder of this attack hold (the colluders' own where no honest client
    replied); ``honest_ids``: whose they are, row by row (client-id order); ``own``: colluder -> its own
    honest Δ (all its float tensors); ``replies``: n, the replies the round gathered; ``norms`` (for
    ``after_others`` attacks): every reply's update norm once the other colluders replaced theirs;
    ``guard``: the update-norm guard of the run.
    """

    honest: Mapping[str, Tensor]
    honest_ids: list[int]
    own: Mapping[int, Mapping[str, Tensor]]
    replies: int
    guard: NormGuard
    norms: Mapping[int, float] = field(default_factory=dict)

    @property
    def colluders(self) -> list[int]:
        """This attack's colluders in the round, in client-id order."""
        return sorted(self.own)

    def flat_honest(self) -> Tensor:
        """The honest updates as rows of one vector each, shape (h, d): the keys sorted, flattened."""
        keys = sorted(self.honest)
        return torch.cat([self.honest[k].reshape(self.honest[k].shape[0], -1) for k in keys], dim=1)

    def unflatten(self, vector: Tensor) -> dict[str, Tensor]:
        """One flat vector (d,) back into the keys and shapes of :attr:`honest` (the inverse of a row)."""
        out, start = {}, 0
        for key in sorted(self.honest):
            shape = self.honest[key].shape[1:]
            size = int(torch.Size(shape).numel())
            out[key] = vector[start : start + size].reshape(shape)
            start += size
        return out


class Attack:
    """An injected client fault. Subclass it, set ``name``, ``kind`` and ``parameters`` (name -> default),
    implement the hook of the kind, and register it (``fedhet.attacks.register``)."""

    #: The name a config gives it (``faults.clients.K = name``).
    name: ClassVar[str] = "attack"
    #: Where it acts: "reply", "data", "refuse", "count" or "coordinated".
    kind: ClassVar[str] = "reply"
    #: Its parameters and their defaults, read from ``[faults.params.<name>]``.
    parameters: ClassVar[Mapping[str, Any]] = {}
    #: The flat [faults] keys it reads instead (the built-in attacks of the first robustness table only).
    flat_parameters: ClassVar[tuple[str, ...]] = ()
    #: coordinated: run after the other coordinated attacks of the round, with their replies' norms in view.
    after_others: ClassVar[bool] = False
    #: refuse: why no reply comes (the failure the round records).
    refusal: ClassVar[str] = ""

    def __init__(self, **params: Any) -> None:
        for key, value in params.items():
            setattr(self, key, value)
        self.check()

    def check(self) -> None:
        """Refuse bad parameter values with a ConfigError naming the fix (called on construction)."""

    def fail(self, message: str) -> None:
        """Raise the ConfigError of a bad parameter of this attack."""
        raise ConfigError(f"faults.params.{self.name}: {message}")

    # -- "reply" --------------------------------------------------------------------------------------------
    def alter(
        self,
        trained: Mapping[str, Tensor],
        bases: Mapping[str, Tensor],
        generator: torch.Generator,
        memory: MutableMapping[str, Any],
    ) -> dict[str, Tensor]:
        """The float tensors to send instead of the trained ones (key -> tensor; a key left out is sent as
        trained). ``bases`` are the references (w_sent, or zero for an update), in the reply's key order;
        ``memory`` is the client's JSON fault memory, kept across rounds."""
        return {key: self.tensor(trained[key], base, generator) for key, base in bases.items()}

    def tensor(self, trained: Tensor, base: Tensor, generator: torch.Generator) -> Tensor:
        """One tensor to send, from the trained one and its reference."""
        raise NotImplementedError(f"attack {self.name!r} of kind 'reply' defines neither alter nor tensor")

    # -- "data" ---------------------------------------------------------------------------------------------
    def relabel(self, labels: Tensor, num_classes: int) -> Tensor:
        """The labels the client trains on, from its own true ``labels``."""
        raise NotImplementedError(f"attack {self.name!r} of kind 'data' defines no relabel")

    # -- "count" --------------------------------------------------------------------------------------------
    def claim(self, num_examples: int) -> int:
        """The sample count the client reports instead of its true ``num_examples``."""
        raise NotImplementedError(f"attack {self.name!r} of kind 'count' defines no claim")

    # -- "coordinated" --------------------------------------------------------------------------------------
    def forge(self, view: RoundView) -> dict[int, dict[str, Tensor]]:
        """Each colluder's malicious update (colluder -> key -> Δ, float64), from what the round shows."""
        raise NotImplementedError(f"attack {self.name!r} of kind 'coordinated' defines no forge")

    def same_for_all(self, view: RoundView, update: Mapping[str, Tensor]) -> dict[int, dict[str, Tensor]]:
        """Every colluder sends ``update`` (collusion: one set of statistics, one update)."""
        return {c: dict(update) for c in view.colluders}
