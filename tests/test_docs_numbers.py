"""Every result number the prose docs quote comes from a record, or is marked as what else it is.

The docs checked are README.md and docs/*.md; docs/results/ is not, its pages being rendered from the cell
records (tests/test_pages_rerender.py). A *result number* there is, outside fenced code, inline code, HTML
comments and link targets:

- an ``x ± y`` (a mean and its spread);
- a percentage, ``n %`` or ``n%``;
- a duration, a number followed by ``ms``, ``s``, ``min``, ``minutes``, ``seconds`` or ``h``;
- a decimal number (``0.125``, ``−2.45``) in a paragraph or list item that names a measured quantity
  (accuracy, fairness, Pearson, recall, error, speed-up, weight, score, rate, points, time, measured, ...)
  or in a table whose header row does.

Section references (§2.4), versions (Flower 1.42), split names (DIR(7.0)) and integer counts are not.

Each must be covered by one of these markings (an HTML comment, invisible in the rendered page; on a line
with text it covers that line, alone on a line it opens a block that ``<!-- end -->`` closes):

- ``<!-- from: docs/results/PAGE.md#ROW -->``: the number appears in that row of the rendered result page
  (an ``x ± y`` as the same pair), and so in the records the page is rendered from. A ``from:`` block holding
  a table is an include block: the page's header and rows (``#ROW1|ROW2``, ``cols=...`` for some columns),
  which ``python tools/doc_numbers.py refresh`` copies and which must equal a fresh copy;
- ``<!-- paper -->``: a published value (the ``paper = {...}`` entries of the reproduce tables);
- ``<!-- timing -->``: its section shows the command that measured it and the commit it was measured at;
- ``<!-- constant -->``: a documented default, hyper-parameter, size or threshold (never an ``x ± y``).

docs/performance.md, written by ``make bench``, holds timings only: each section must print its
``Command:`` and the page the commit it was measured at. The rules live in tools/doc_numbers.py and are
described for writers in docs/reliability.md ("Quoting a number in the docs").
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _tool():
    spec = importlib.util.spec_from_file_location("doc_numbers", ROOT / "tools" / "doc_numbers.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def _check(tmp_path: Path, text: str) -> list[str]:
    tool = _tool()
    doc = tmp_path / "doc.md"
    doc.write_text(text, encoding="utf-8")
    return tool.check_doc(doc)


def test_every_result_number_in_the_docs_is_backed_or_marked():
    problems = _tool().check()
    assert not problems, "\n".join(problems)


def test_what_counts_as_a_result_number(tmp_path):
    tool = _tool()
    doc = tmp_path / "doc.md"
    doc.write_text(
        "# Results\n\n"
        "FedAvg reaches 84.75 ± 0.38 here, CELM 12 % more, in 91 s; its fairness is 99.08 on CLA.\n\n"
        "| method | accuracy |\n|---|---|\n| celm | 81.53 |\n\n"
        "Set `lr = 0.05` (methods.md §2.4, Flower 1.42, DIR(7.0)); it ran 3 of 5 seeds at lr 0.1.\n\n"
        "```\nfedhet run --set train.lr=0.25   # 50 %\n```\n",
        encoding="utf-8",
    )
    assert [f.text for f in tool.find_numbers(doc)] == ["84.75 ± 0.38", "12 %", "91 s", "99.08", "81.53"]


def test_the_docs_pass_and_a_changed_digit_fails(tmp_path):
    text = (ROOT / "docs" / "fedrac.md").read_text(encoding="utf-8")
    quoted = "FedAvg's mean of the last 100 evaluations there is 2.52 ± 8.70"
    assert quoted in text
    assert _check(tmp_path, text) == []
    problems = _check(tmp_path, text.replace(quoted, quoted.replace("2.52", "2.53")))
    assert (
        len(problems) == 1
        and "'2.53 ± 8.70' is not in docs/results/fedrac-fairness-substitute.md" in problems[0]
    )
    # the same digits as a mean with another spread, or taken from another row, are no match
    problems = _check(tmp_path, text.replace(quoted, quoted.replace("8.70", "8.33")))
    assert len(problems) == 1 and "8.33" in problems[0]


def test_an_unmarked_number_fails(tmp_path):
    problems = _check(tmp_path, "CELM ends at 83.64 % on Dir 0.05.\n")
    assert problems == ["doc.md:1: '83.64 %' is a result number without a record or a marking"]


def test_a_paper_marking_holds_only_published_values(tmp_path):
    assert _check(tmp_path, "The paper's CELM gets 83.64 ± 0.42 on Dir 0.05. <!-- paper -->\n") == []
    problems = _check(tmp_path, "The paper's CELM gets 83.65 ± 0.42 on Dir 0.05. <!-- paper -->\n")
    assert len(problems) == 1 and "no published table holds it" in problems[0]


def test_a_constant_is_never_a_mean_and_spread(tmp_path):
    assert _check(tmp_path, "The warm-up is 5 % of the rounds by default. <!-- constant -->\n") == []
    problems = _check(tmp_path, "Its accuracy is 81.5 ± 0.3 by default. <!-- constant -->\n")
    assert len(problems) == 1 and "not a constant" in problems[0]


def test_a_timing_needs_its_command_and_an_existing_commit(tmp_path):
    command = "## Speed\n\nRun `python benchmarks/celm_probe.py`.\n\n"
    ok = command + "A probe took 0.24 s, measured at commit 5f34e0e. <!-- timing -->\n"
    assert _check(tmp_path, ok) == []
    problems = _check(tmp_path, "## Speed\n\nA probe took 0.24 s. <!-- timing -->\n")
    assert any("without the command" in p for p in problems)
    assert any("without the commit" in p for p in problems)
    problems = _check(tmp_path, ok.replace("5f34e0e", "abcdef0"))
    assert any("abcdef0, not in this repository" in p for p in problems)


def test_an_include_block_is_refreshed_from_its_page_and_checked(tmp_path):
    tool = _tool()
    doc = tmp_path / "doc.md"
    mark = "<!-- from: docs/results/celm-free-rider.md#N = 5, identified cols=row,celm -->"
    doc.write_text(f"Free riders:\n\n{mark}\n<!-- end -->\n", encoding="utf-8")
    assert any("include block differs" in p for p in tool.check_doc(doc))
    assert tool.refresh([doc]) == 1
    assert tool.check_doc(doc) == []
    body = doc.read_text(encoding="utf-8")
    assert "| row | celm |" in body and "| N = 5, identified | **100.00 ± 0.00**" in body
    doc.write_text(body.replace("**100.00 ± 0.00**", "**100.00 ± 0.01**"), encoding="utf-8")
    problems = tool.check_doc(doc)
    assert any("include block differs" in p for p in problems)
    assert any("'100.00 ± 0.01' is not in" in p for p in problems)


def test_an_include_can_name_columns_that_hold_a_comma():
    parse = _tool()._parse_from
    assert parse("docs/results/r.md#clean|ipm/f3 cols=row;CELM, paper's evidence;FedAvg") == (
        "docs/results/r.md",
        ["clean", "ipm/f3"],
        ["row", "CELM, paper's evidence", "FedAvg"],
    )
    assert parse("docs/results/r.md#N = 5 cols=row,celm") == ("docs/results/r.md", ["N = 5"], ["row", "celm"])
    assert parse("docs/results/r.md#N = 5")[2] is None


def test_an_unclosed_block_and_an_unknown_row_fail(tmp_path):
    problems = _check(tmp_path, "<!-- constant -->\nlr 0.1 and 5 %\n")
    assert any("not closed" in p for p in problems)
    problems = _check(
        tmp_path, "It is 0.60 ± 0.19. <!-- from: docs/results/celm-free-rider.md#no such row -->\n"
    )
    assert any("no table row 'no such row'" in p for p in problems)
