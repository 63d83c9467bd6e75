"""Standalone training: every client trains alone, with the same budget as the federated runs.

Its per-client test accuracies are the contribution ground truth of the CFFL/CGSV/FedSAC/FedRAC line of
work (baselines.md §1.1); the engine caches them (``fedhet.engine.simulation.standalone_accuracies``).
"""

from __future__ import annotations

from fedhet.engine.protocol import Instruction, Reply, Strategy


class Standalone(Strategy):
    """No communication after round 1: each client keeps training its own model; nothing is aggregated."""

    name = "standalone"
    keeps_client_models = True

    def __init__(self) -> None:
        super().__init__(weighting="samples", reward="local")

    def configure(self, rnd: int, client_ids: list[int]) -> dict[int, Instruction]:
        # Empty weights: the client starts from its own model (the shared initial model in round 1).
        return {cid: Instruction(weights={}) for cid in client_ids}

    def aggregate(self, rnd: int, replies: dict[int, Reply]) -> None:
        for cid, rep in replies.items():
            self.local_weights[cid] = rep.weights

    def global_model(self):
        return None
