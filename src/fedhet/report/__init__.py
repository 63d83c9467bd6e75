"""Reports from run directories: Markdown pages (``markdown``), their self-contained HTML (``html``), the
figures (``figures``), each run's CSVs and method figures (``artifacts``) and fairness summaries
(``fairness``)."""

from fedhet.report.markdown import find_runs, load_run, write_report

__all__ = ["find_runs", "load_run", "write_report"]
