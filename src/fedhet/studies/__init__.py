"""Studies: the measurements behind docs pages that are not a paper's table, run by ``fedhet study NAME``.

Each module defines ``STUDY`` (:class:`fedhet.studies.base.Study`); they are imported when asked for, so
``fedhet study`` lists them without importing torch-heavy code.
"""

from __future__ import annotations

import importlib

from fedhet.errors import ConfigError
from fedhet.studies.base import CompareCell, Option, Study, run_study

#: study name -> its module
STUDIES = {
    "robustness": "fedhet.studies.robustness",
    "audit-validation": "fedhet.studies.audit_validation",
    "data-free-fairness": "fedhet.studies.data_free_fairness",
    "celm-table1-causes": "fedhet.studies.celm_table1_causes",
    "fedrac-causes": "fedhet.studies.fedrac_causes",
    "gated-fssl": "fedhet.studies.gated_fssl",
    "contribution-estimators": "fedhet.studies.contribution_estimators",
    "table-defaults": "fedhet.studies.table_defaults",
    "robustness-settings": "fedhet.studies.robustness_settings",
}


def get_study(name: str) -> Study:
    """The study called ``name``; a ConfigError naming the accepted ones otherwise."""
    if name not in STUDIES:
        raise ConfigError(f"unknown study {name!r}; accepted: {', '.join(STUDIES)}")
    return importlib.import_module(STUDIES[name]).STUDY


__all__ = ["STUDIES", "CompareCell", "Option", "Study", "get_study", "run_study"]
