"""Every committed result page renders again, byte for byte, from what is committed: the page itself and its
cell records (``fedhet reproduce NAME --page-only``; the robustness page, ``fedhet robustness page``, from its
records). Nothing runs. The figures' PNGs are not drawn again: they need the runs' per-round metrics, which
no record holds; a page keeps its figure lines.

Rows that share a name (one row per metric or view of the same runs) are told apart by name, metric and view
when a page is read back and its rows are kept."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from fedhet.reproduce import (
    PAGE_MARK,
    keep_page_rows,
    load_spec,
    read_page_rows,
    render_page,
    rerender_page,
    run_spec,
    write_index,
)
from fedhet.reproduce.spec import Row, Spec

RESULTS = Path(__file__).resolve().parents[1] / "docs" / "results"
_MARK = re.compile(PAGE_MARK.split(" table=")[0] + r" table=(\S+) scale=(\S+) ")


def _pages() -> list[tuple[Path, str, str]]:
    """(page, table, scale) of every committed page written by `fedhet reproduce --page`."""
    out = []
    for page in sorted(RESULTS.glob("*.md")):
        m = _MARK.match(page.read_text().split("\n", 1)[0])
        if m:
            out.append((page, m.group(1), m.group(2)))
    return out


PAGES = _pages()


def test_the_committed_pages_are_found():
    assert len(PAGES) >= 15 and {"celm-table2-maverick", "fedrac-fairness-substitute", "proxyfl-gated"} <= {
        table for _, table, _ in PAGES
    }


@pytest.mark.parametrize("page,table,scale", PAGES, ids=[table for _, table, _ in PAGES])
def test_a_committed_page_renders_again_byte_for_byte(tmp_path, page, table, scale):
    out = rerender_page(load_spec(table), page, scale=scale, out=tmp_path / page.name, index=False)
    assert out.read_text() == page.read_text()


def test_the_results_index_renders_again_byte_for_byte(tmp_path):
    for page, table, scale in PAGES:
        rerender_page(load_spec(table), page, scale=scale, out=tmp_path / page.name, index=False)
    assert write_index(tmp_path).read_text() == (RESULTS / "README.md").read_text()


def test_the_robustness_page_renders_again_from_its_records_byte_for_byte():
    from fedhet.studies.robustness import PAGE, RECORDS, collect
    from fedhet.studies.robustness_page import page

    root = RESULTS.parents[1]
    records = root / RECORDS
    text = page(None, root / "docs" / "figures" / "robustness.png", records, collect(None, records))
    assert text == (root / PAGE).read_text()


def _two_views_spec(tmp_path: Path) -> Spec:
    """A table of one row name shown in two views (the table's and the best), each with its own note."""
    return Spec(
        path=tmp_path / "views.toml",
        title="views",
        source="",
        metric="fairness_pearson",
        view="last_100",
        scale=100,
        seeds=2,
        methods=["fedavg", "fedrac"],
        rows=[
            Row(name="POW", config=None, note="the level"),
            Row(name="POW", config=None, view="best", note="the maximum"),
            Row(name="POW", config=None, metric="accuracy"),
            Row(name="CLA", config=None),
        ],
    )


def _measured(spec: Spec, values: list[float]) -> list[dict]:
    """Result rows as run_spec returns them, the first three measured (one value per row), the last not."""
    results = []
    for row, value in zip(spec.rows, [*values, None], strict=True):
        entry = {
            "row": row.name,
            "metric": row.metric or spec.metric,
            "view": row.view or spec.view,
            "judged": (row.view or spec.view) == spec.view,
            "note": row.note,
            "methods": {},
        }
        if value is None:
            entry.update(available=False, left_out=True, note="not part of this reproduction")
            entry["methods"] = {m: {"paper": None} for m in spec.methods}
        else:
            entry.update(available=True, rounds=10, seeds=[0, 1], clients=5, model="mlp", run_dir="runs/pow")
            entry["methods"] = {
                m: {"ours": value + i, "ours_std": 0.5, "paper": (90.0, None)}
                for i, m in enumerate(spec.methods)
            }
        results.append(entry)
    return results


def test_rows_sharing_a_name_in_different_views_both_survive_reading_and_keeping(tmp_path):
    spec = _two_views_spec(tmp_path)
    page = tmp_path / "views.md"
    command = "fedhet reproduce views --page views.md"
    first = render_page(
        spec, _measured(spec, [11.0, 22.0, 33.0]), scale="full", command=command, commit="abc1234",
        wall_s=60.0, machine="here", figures=[],
    )  # fmt: skip
    page.write_text(first)
    kept = read_page_rows(page, spec, "full")
    # one line and one note per row, none taken for another row of the same name
    assert [ln.split(" | ")[0] for ln in kept.lines.values()] == ["| POW", "| POW (best)", "| POW (accuracy)"]
    assert len(set(kept.lines.values())) == 3
    assert kept.notes == {"POW": "- POW: the level", "POW (best)": "- POW (best): the maximum"}
    assert kept.not_run == {"CLA": "not part of this reproduction"}
    # --keep-page-rows (another row measured now) and --page-only (nothing measured) keep all three
    for rerender in (False, True):
        results = keep_page_rows(
            spec, run_spec(spec, out_dir=tmp_path, measure=False), kept, rerender=rerender
        )
        assert [r["kept"]["line"] for r in results[:3]] == list(kept.lines.values())
        assert [r["kept"]["note"] for r in results[:3]] == [
            "- POW: the level",
            "- POW (best): the maximum",
            None,
        ]
    # and the page written again from what it holds is the page as it was
    assert rerender_page(spec, page, out=tmp_path / "again.md", index=False).read_text() == first


def test_a_table_whose_rows_share_name_metric_and_view_is_refused(tmp_path):
    from fedhet.errors import ConfigError

    spec = tmp_path / "twice.toml"
    rows = "[[rows]]\nname = 'POW'\navailable = false\n"
    head = "title = 't'\nmethods = ['fedavg']\n"
    spec.write_text(head + rows + rows.replace("false\n", "false\nview = 'best'\n"))
    assert [r.view for r in load_spec(str(spec)).rows] == [None, "best"]  # another view: two rows
    spec.write_text(head + rows + rows)
    with pytest.raises(ConfigError, match="two rows are named 'POW' with the same metric and view"):
        load_spec(str(spec))
