"""Standalone training: every client trains alone, with the same budget as the federated runs.

Its per-client test accuracies are the contribution ground truth of the CFFL/CGSV/FedSAC/FedRAC line of
work (baselines.md §1.1); ``fedhet.experiment.standalone_accuracies`` runs it as a cached pre-pass and hands
the result to the methods and metrics that declare they need it.
"""

from __future__ import annotations

from collections.abc import Mapping

from fedhet.algorithms.fedavg import FedAvg
from fedhet.engine.protocol import KEEP_KEY, Instruction, Reply

#: The version of the numbers this module computes: bump it in the commit that changes them, which
#: invalidates the cell records of every method reaching this module (fedhet.code_version).
RESULTS_VERSION = 1


class Standalone(FedAvg):
    """No communication after a client's first round: it keeps training its own model; nothing is averaged.

    A client the server has not heard from yet receives the initial model; afterwards it trains from the
    model it keeps (``keep = "model"``) and the server only records its replies (the reward models).
    """

    supports_aggregation_rules = False  # nothing is averaged

    name = "standalone"
    rewards_are_reference = True

    def __init__(self) -> None:
        super().__init__(weighting="samples", reward="local")

    def configure(self, rnd: int, client_ids: list[int]) -> dict[int, Instruction]:
        initial = self.global_weights()  # never aggregated: the shared initial model
        return {
            cid: Instruction(weights={} if cid in self.local_weights else initial, config={KEEP_KEY: "model"})
            for cid in client_ids
        }

    def aggregate(self, rnd: int, replies: Mapping[int, Reply]) -> None:
        for cid, rep in replies.items():
            self.local_weights[cid] = rep.weights

    def global_model(self):
        return None
