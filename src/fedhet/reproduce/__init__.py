"""Reproduce a published table: run its rows with fedhet and print our numbers beside the paper's.

- :mod:`~fedhet.reproduce.spec`: table definitions (``configs/reproduce/*.toml``): their format, their loader;
- :mod:`~fedhet.reproduce.runner`: runs a table's cells at a scale, reusing finished runs;
- :mod:`~fedhet.reproduce.render`: the Markdown table, its gates, reproduce.md / .csv / .json;
- :mod:`~fedhet.reproduce.figures`: a result page's figures, drawn from the runs;
- :mod:`~fedhet.reproduce.page`: result pages under docs/results/, rows kept from them, their index.

Every name is importable from ``fedhet.reproduce`` as it was before the package was split.
"""

from __future__ import annotations

from fedhet.reproduce.figures import (
    REWARD_METRICS,
    accuracy_figure,
    metric_figure,
    rewards_figure,
    weights_figure,
)
from fedhet.reproduce.page import (
    KEPT_PARAGRAPH,
    PAGE_MARK,
    PageRows,
    cell_provenance,
    keep_page_rows,
    read_page_rows,
    render_page,
    rerender_page,
    rows_measured,
    write_index,
    write_page,
)
from fedhet.reproduce.render import (
    _cell,
    gates_section,
    labelled,
    render_markdown,
    row_label,
    write_results,
    write_results_csv,
)
from fedhet.reproduce.runner import configured, row_config, rows_without_data, run_spec
from fedhet.reproduce.spec import (
    GATES,
    QUICK,
    ROW_KEYS,
    SCALES,
    SPEC_DIR,
    Row,
    Scale,
    Spec,
    list_specs,
    load_spec,
    parse_paper_value,
    resolve_spec_path,
)

__all__ = [
    "GATES",
    "KEPT_PARAGRAPH",
    "PAGE_MARK",
    "QUICK",
    "REWARD_METRICS",
    "ROW_KEYS",
    "SCALES",
    "SPEC_DIR",
    "PageRows",
    "Row",
    "Scale",
    "Spec",
    "_cell",
    "accuracy_figure",
    "cell_provenance",
    "configured",
    "gates_section",
    "keep_page_rows",
    "labelled",
    "list_specs",
    "load_spec",
    "metric_figure",
    "parse_paper_value",
    "read_page_rows",
    "render_markdown",
    "render_page",
    "rerender_page",
    "resolve_spec_path",
    "rewards_figure",
    "row_config",
    "row_label",
    "rows_measured",
    "rows_without_data",
    "run_spec",
    "weights_figure",
    "write_index",
    "write_page",
    "write_results",
    "write_results_csv",
]
