"""Contribution estimators that any FedAvg-family run can report beside its own method.

Each values the clients of every round from the models a server can rebuild out of that round's replies,
without training anything again: :mod:`~fedhet.contributions.reconstruction` holds the formulas (the model of
a subset of the replies, the exact per-round Shapley value over those models, GTG-Shapley's truncated,
guided Monte-Carlo estimate of it), :mod:`~fedhet.contributions.tracker` runs the estimators named in
``eval.contribution_estimators`` after each aggregation. Their values go to ``metrics.jsonl`` per round and,
summed over rounds, to ``summary["estimates"]``; they never replace a method's own ``contributions``.
This package imports nothing of the engine: the round loop hands it the weights, the replies and an
evaluation function.
"""
