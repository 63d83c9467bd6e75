"""FedAvg (McMahan et al., AISTATS 2017): the base every other method subclasses."""

from __future__ import annotations

from fedhet.engine.protocol import Strategy, Trainer


class FedAvg(Strategy):
    """FedAvg: w_g ← Σ_i p_i w_i, p_i = n_i/Σ_j n_j (``weighting='samples'``) or 1/N (``'uniform'``).

    The reward of client i is its locally trained model of its last round (``reward='local'``, FedRAC's
    FedAvg-baseline convention) or the global model (``reward='global'``).
    """

    name = "fedavg"
    trainer_class = Trainer
