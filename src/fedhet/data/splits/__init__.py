"""Every data split of CELM, FedRAC and ProxyFL, registered by name.

Spec: baselines.md §4, methods.md §1.2 (Splits), §2.2 (Client split), §3.2 (Data).

A split is a pure function ``fn(labels, num_clients, rng, num_classes, **params) -> Partition`` of the pool's
labels; all randomness comes from the ``numpy.random.Generator`` it is given. Indices in a :class:`Partition`
index the ``labels`` array passed in (the caller maps them back to dataset indices).

Names used in the spec: "Dir-client" = ``dirichlet-per-client``, "Dir-class" = ``dirichlet-per-class``,
"Dir-flgo" = ``dirichlet-prior``, "Dir-pair" = ``dirichlet-pairs`` (they are not interchangeable, §4.1).

Layout: ``registry`` (Partition, parameter specs and validation, :func:`make_partition`), ``common`` (index
helpers), then one module per family: ``uniform`` (iid), ``dirichlet``, ``skew`` (POW, CLA, PLS, SLS, step
quantity), ``contribution`` (maverick, free rider), ``semi_supervised`` (labeled-unlabeled), ``sites``
(the data's own client layout).
"""

# The families register their splits when imported, so the order of these imports is the order of SPLITS
# (and of `fedhet partition --list`); keep it.
# isort: off
from fedhet.data.splits.registry import (
    SPLIT_ADVICE,
    SPLITS,
    Partition,
    SplitParam,
    SplitSpec,
    holdout_validation,
    make_partition,
    validate_split_params,
)
from fedhet.data.splits.uniform import iid
from fedhet.data.splits.dirichlet import (
    MAX_ATTEMPTS,
    dirichlet_pairs,
    dirichlet_per_class,
    dirichlet_per_client,
    dirichlet_prior,
)
from fedhet.data.splits.skew import (
    POWERLAW_SHAPE,
    cla,
    pow_split,
    pure_label_skew,
    step_label_skew,
    step_quantity,
)
from fedhet.data.splits.contribution import free_rider, maverick
from fedhet.data.splits.semi_supervised import labeled_unlabeled
from fedhet.data.splits.sites import sites

# isort: on

__all__ = [
    "MAX_ATTEMPTS",
    "POWERLAW_SHAPE",
    "SPLITS",
    "SPLIT_ADVICE",
    "Partition",
    "SplitParam",
    "SplitSpec",
    "cla",
    "dirichlet_pairs",
    "dirichlet_per_class",
    "dirichlet_per_client",
    "dirichlet_prior",
    "free_rider",
    "holdout_validation",
    "iid",
    "labeled_unlabeled",
    "make_partition",
    "maverick",
    "pow_split",
    "pure_label_skew",
    "sites",
    "step_label_skew",
    "step_quantity",
    "validate_split_params",
]
