"""Ground truth for who contributed what: every coalition's model, and the exact values made of them.

:mod:`~fedhet.ground_truth.coalitions` trains every coalition of a federation (together, for FedAvg);
:mod:`~fedhet.ground_truth.values` turns their utilities into exact Shapley, Banzhaf and leave-one-out values;
``fedhet shapley`` records them per seed in the record store.
"""
