"""Result pages (docs/results/<name>.md): provenance, the table, figures and the causes of the gaps; the rows
a page already holds, kept when a table is measured a few rows at a time; the index README.md."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedhet.engine.rundir import SUMMARY_FILE, run_name
from fedhet.errors import ConfigError
from fedhet.reproduce.claims import findings_section
from fedhet.reproduce.figures import (
    REWARD_METRICS,
    accuracy_figure,
    metric_figure,
    rewards_figure,
    weights_figure,
)
from fedhet.reproduce.render import GATES_HEADING, finding_unit, render_markdown, row_label
from fedhet.reproduce.runner import data_was_missing
from fedhet.reproduce.spec import Spec, list_specs, load_spec

#: A result page's first line: which table, scale and commit, and how many rows it holds measured.
PAGE_MARK = "<!-- fedhet reproduce: table={table} scale={scale} commit={commit} rows={rows} -->"
#: How a page's first line is read back (its table, scale, commit and measured rows).
PAGE_MARK_RE = re.compile(
    r"<!-- fedhet reproduce: table=(\S+) scale=(\S+) commit=(.+?)(?: rows=(\d+)/(\d+))? -->"
)


def cell_provenance(results: list[dict[str, Any]]) -> dict[str, Any]:
    """The runs behind a page's cells (read from their summary.json, or from the cell record a cell was taken
    from): how many, how many of those from records, their summed wall time, and the fedhet commits that
    computed them (where recorded)."""
    runs, from_records, seconds, commits = 0, 0, 0.0, set()
    seen = set()
    for r in results:
        if not (r["available"] and r.get("run_dir")):
            continue
        for m in r["methods"]:
            for seed in r["seeds"]:
                path = Path(r["run_dir"]) / run_name(m, seed) / SUMMARY_FILE
                summary = (r.get("recorded") or {}).get(m, {}).get(str(seed))
                from_record = summary is not None
                if from_record:
                    path = Path(f"record:{r['run_dir']}/{run_name(m, seed)}")
                elif path in seen or not path.is_file():
                    continue
                else:
                    summary = json.loads(path.read_text())
                if path in seen:  # rows that share their runs (one metric each, or another view) count once
                    continue
                seen.add(path)
                runs += 1
                from_records += from_record
                seconds += float(summary.get("wall_time_s") or 0.0)
                # every commit a run's rounds were computed at (a resumed run may have several); older
                # summaries name one, read when they were written
                stretches = (
                    summary.get("fedhet_commits")
                    or summary.get("commits")  # a cell taken from its record: the run's stretches
                    or [{"commit": summary.get("fedhet_commit")}]
                )
                commits.update(str(c["commit"]) for c in stretches if c.get("commit"))
    return {"runs": runs, "from_records": from_records, "run_seconds": seconds, "commits": sorted(commits)}


def render_page(
    spec: Spec,
    results: list[dict[str, Any]],
    *,
    scale: str,
    command: str | None,
    commit: str,
    wall_s: float,
    machine: str,
    figures: list[tuple[str, str]],
    kept: PageRows | None = None,
) -> str:
    """A result page: provenance, the paper-layout table (ours ± std / paper / Δ), figures, and the
    verified causes of the gaps. With ``kept`` (the page as it was), rows kept from it keep their lines,
    commands, provenance and figures. With ``kept`` and no ``command`` (``--page-only``: nothing ran), the
    page keeps its own provenance as it was: its commit, its "Page written" line and its paragraphs on kept
    rows, so that rendering a page again from what it holds gives it back unchanged (``commit`` is used only
    by a page that had no such line)."""
    table = render_markdown(spec, results, scale=scale, findings=False).split("\n", 2)[
        2
    ]  # without its "## title" line
    cells = cell_provenance(results)
    if cells["runs"]:
        made = (
            ", ".join(cells["commits"])
            if cells["commits"]
            else "not recorded (runs from before commits were)"
        )
        # rows that share a name (one per metric or view of the same runs) are named once
        ran = list(dict.fromkeys(f"`{r['row']}`" for r in results if r["available"] and r.get("run_dir")))
        which = f" (rows {', '.join(ran)})" if any(r.get("kept") for r in results) else ""
        records = (
            f" ({cells['from_records']} of them taken from their cell records under cells/: same experiment, "
            "same method code)"
            if cells["from_records"]
            else ""
        )
        computed = (
            f" Its {cells['runs']} runs{which}{records} took {cells['run_seconds'] / 60:.1f} min of compute "
            f"together; they were computed at commit {made}."
        )
    else:
        computed = ""
    kept_rows = list(dict.fromkeys(r["row"] for r in results if r.get("kept")))
    rerendered = command is None and kept is not None  # --page-only: the page's provenance as it was
    if rerendered:
        commit = kept.commit
    # a page rewritten from its rows (command None: nothing ran) keeps the commands that measured them
    commands = [c for c in (kept.commands if kept and kept_rows else []) if c != command] + (
        [command] if command else []
    )
    findings = findings_section(spec.claims, results, finding_unit(spec))
    lines = [
        PAGE_MARK.format(table=spec.path.stem, scale=scale, commit=commit, rows=rows_measured(results)),
        f"# {spec.title}",
        "",
        *([*findings, ""] if findings else []),
        "Regenerate every number on this page with:"
        if len(commands) == 1
        else "Regenerate every number on this page with these commands, in this order (each measures the "
        "rows it names; a later one keeps the rows already on the page, `--keep-page-rows`):",
        "",
        "```",
        *commands,
        "```",
        "",
        kept.written
        if rerendered and kept.written
        else (
            f"Page written at commit {commit}, scale **{scale}**, on {machine}; this invocation took "
            f"{wall_s / 60:.1f} min (runs already finished in the output directory are reused, not rerun)."
            if command
            else f"Page rewritten at commit {commit} from the rows it held, with the table's current "
            "findings, notes and gaps (`--page-only`: nothing was run)."
        )
        + f"{computed} Cells: ours as mean ± std over seeds / the paper's value / the difference.",
    ]
    # kept rows that page measured itself (a page written again from what it holds already says so)
    own = [name for name in kept_rows if kept and name in kept.ran and not (rerendered and kept.written)]
    if kept and own:
        names = ", ".join(f"`{name}`" for name in own)
        lines += ["", f"{KEPT_PARAGRAPH} at commit {kept.commit}: {names}. {kept.provenance}".rstrip()]
    if kept and kept_rows:
        for earlier in kept.earlier:  # what an earlier keeping said of rows still kept
            if any(f"`{name}`" in earlier for name in kept_rows):
                lines += ["", earlier]
    lines += ["", table.rstrip()]
    for title, rel in figures:
        lines += ["", f"![{title}]({rel})"]
    lines += ["", "## Gaps and their causes", ""]
    lines.append(
        spec.gaps.strip()
        if spec.gaps.strip()
        else "No cause has been verified for these differences yet; none is claimed."
    )
    if scale != "full":
        lines += [
            "",
            f"This page is at the **{scale}** scale ({spec.at_scale(scale).note}); differences to the paper "
            "include what that scale cut.",
        ]
    return "\n".join(lines) + "\n"


def write_page(
    spec: Spec,
    results: list[dict[str, Any]],
    page: Path,
    *,
    scale: str,
    command: str | None,
    commit: str,
    wall_s: float,
    kept: PageRows | None = None,
) -> Path:
    """Write ``page`` (and its figures beside it, in figures/) and refresh the index README.md there.
    With ``kept`` (rows kept from the page as it was), the new figures are named after the rows run now, so
    the kept rows' figures stay beside them."""
    from fedhet.report.provenance import machine_line

    figures = []
    fig_dir = page.parent / "figures"
    keeping = bool(kept) and any(r.get("kept") for r in results)
    ran = [Path(r["run_dir"]).name for r in results if r["available"] and r.get("run_dir")]
    tag = "-" + "+".join(dict.fromkeys(ran)) if keeping and ran else ""
    reward_table = spec.metric in REWARD_METRICS
    for title, fn, suffix in (
        ("the table's metric over rounds", metric_figure, "metric"),
        ("accuracy over rounds", accuracy_figure, "accuracy"),
        ("final rewards against standalone accuracies", rewards_figure, "rewards")
        if reward_table
        else ("final contribution weights or rewards", weights_figure, "weights"),
    ):
        made = fn(spec, results, fig_dir / f"{page.stem}-{suffix}{tag}.png")
        if made is not None:
            figures.append((title + (f" (rows {', '.join(ran)})" if tag else ""), f"figures/{made.name}"))
    if keeping:  # the kept rows' figures, where their files still are
        new = {rel for _, rel in figures}
        figures += [(t, rel) for t, rel in kept.figures if rel not in new and (page.parent / rel).is_file()]
    page.parent.mkdir(parents=True, exist_ok=True)
    page.write_text(
        render_page(
            spec,
            results,
            scale=scale,
            command=command,
            commit=commit,
            wall_s=wall_s,
            machine=machine_line(),
            figures=figures,
            kept=kept,
        )  # fmt: skip
    )
    write_index(page.parent)
    return page


def rows_measured(results: list[dict[str, Any]]) -> str:
    """``k/n``: the rows this page holds measured (run now or kept), of those that can run here (a row left
    out with ``--rows`` counts in n; a row whose data are not here does not)."""
    ran = sum(1 for r in results if (r["available"] and r.get("run_dir")) or r.get("kept"))
    left_out = sum(1 for r in results if not r["available"] and r.get("left_out") and not r.get("kept"))
    return f"{ran}/{ran + left_out}"


# --------------------------------------------------------------------------------------------------------
# A table measured a few rows at a time: --keep-page-rows
# --------------------------------------------------------------------------------------------------------
#: How a page begins the paragraph on rows it kept from the page as it was.
KEPT_PARAGRAPH = "Rows kept from the page as it was"


@dataclass
class PageRows:
    """What a result page already holds, for the rows a new reproduction does not run (read back from the
    page as :func:`render_page` wrote it)."""

    commit: str  # the commit the page was written at
    #: row label (its name, with its metric and view where they are not the table's: one per row) -> line
    lines: dict[str, str]
    notes: dict[str, str]  # row label -> its "- row: note" line under the table
    commands: list[str]  # the page's regenerating commands
    provenance: str  # what the page said of the runs it ran ("Its N runs took ...")
    ran: list[str]  # the rows those runs measured (the rest of its measured rows it had kept itself)
    earlier: list[str]  # its own paragraphs on rows it had kept
    figures: list[tuple[str, str]]  # (title, path relative to the page)
    written: str = ""  # its "Page written at commit ..." (or "Page rewritten ...") line, as printed
    not_run: dict[str, str] | None = None  # row label -> why the page did not measure it ("← not run: ...")
    gates: dict[str, list[str]] | None = None  # row name -> its "### Validity gates" section, as printed


def read_page_rows(page: Path, spec: Spec, scale: str) -> PageRows:
    """The measured rows of ``page``, a result page of ``spec`` at ``scale``, with their provenance."""
    lines = page.read_text().splitlines()
    mark = PAGE_MARK_RE.match(lines[0]) if lines else None
    if mark is None:
        raise ConfigError(
            f"{page} is not a result page written by `fedhet reproduce --page` (its first line is not the "
            "page mark); write it without --keep-page-rows, or give another --page"
        )
    if (mark.group(1), mark.group(2)) != (spec.path.stem, scale):
        raise ConfigError(
            f"{page} holds table {mark.group(1)} at scale {mark.group(2)}, not {spec.path.stem} at {scale}: "
            "rows are kept only from a page of the same table and scale (give that page's --scale, or "
            "another --page)"
        )
    body = lines[: lines.index("## Gaps and their causes")] if "## Gaps and their causes" in lines else lines
    shown = next((m for ln in body if (m := re.search(r"Metric: `([^`]+)` \(([a-z_0-9]+)\)", ln))), None)
    if shown and (shown.group(1), shown.group(2)) != (spec.metric, spec.view):
        raise ConfigError(
            f"{page} shows `{shown.group(1)}` ({shown.group(2)}) and the table now `{spec.metric}` "
            f"({spec.view}): its rows would be kept under the wrong heading; write the page again without "
            "--keep-page-rows (every row it should hold measured in one run), or give another --page"
        )
    labels = {row_label(spec, row): row.name for row in spec.rows}
    if len(labels) < len(spec.rows):
        raise ConfigError(f"{spec.path}: two rows print the same label; the page cannot tell them apart")
    table: dict[str, str] = {}
    not_run: dict[str, str] = {}
    for ln in body:
        for label in labels:
            if ln.startswith(f"| {label} | "):
                if NOT_RUN in ln:
                    not_run[label] = ln.split(NOT_RUN, 1)[1]
                else:
                    table[label] = ln
    notes = {label: ln for ln in body for label in labels if ln.startswith(f"- {note_name(spec, label)}: ")}
    fence = [i for i, ln in enumerate(body) if ln == "```"]
    commands = body[fence[0] + 1 : fence[1]] if len(fence) >= 2 else []
    written = next((ln for ln in body if ln.startswith("Page written at commit")), "")
    ran = re.search(r"(Its \d+ runs? .*?took .*?\.)(?: Cells:|$)", written)
    earlier = [ln for ln in body if ln.startswith(KEPT_PARAGRAPH)]
    return PageRows(
        commit=mark.group(3),
        lines=table,
        notes=notes,
        commands=commands,
        provenance=f"That page said of the runs it ran: {ran.group(1)}" if ran else "",
        ran=_rows_its_runs_measured(written, earlier, table, labels),
        earlier=earlier,
        figures=_figures(body),
        written=written,
        not_run=not_run,
        gates=_gates(body),
    )


#: What a table line of a row the page did not measure holds before the reason (render_markdown).
NOT_RUN = " ← not run: "


def note_name(spec: Spec, label: str) -> str:
    """How the note of the row printed as ``label`` begins ("- NAME: "): its name, or its label where
    another row of the table shares the name (render_markdown)."""
    row = next(row for row in spec.rows if row_label(spec, row) == label)
    return label if sum(r.name == row.name for r in spec.rows) > 1 else row.name


def _gates(body: list[str]) -> dict[str, list[str]]:
    """A page's validity-gate sections (``### Validity gates: ROW`` to the next section, figure or heading),
    as printed, by row name."""
    out: dict[str, list[str]] = {}
    current: list[str] | None = None
    for ln in body:
        if ln.startswith(GATES_HEADING):
            current = out[ln[len(GATES_HEADING) :]] = [ln]
        elif current is not None and (ln.startswith("![") or ln.startswith("## ")):
            current = None
        elif current is not None:
            current.append(ln)
    return {name: _strip_blank(lines) for name, lines in out.items()}


def _strip_blank(lines: list[str]) -> list[str]:
    while lines and not lines[-1].strip():
        lines = lines[:-1]
    return lines


def _rows_its_runs_measured(
    written: str, earlier: list[str], table: dict[str, str], labels: dict[str, str]
) -> list[str]:
    """The rows a page's own runs measured, from its "Page written at commit" line ``written``, its
    paragraphs on rows it had kept (``earlier``) and its table lines (row label -> line)."""
    named = re.search(r"runs \(rows (.*?)\) took", written)
    if named:  # a page that kept rows names the rows its own runs measured
        return list(dict.fromkeys(re.findall(r"`([^`]+)`", named.group(1))))
    # an older page ran every measured row it did not keep
    kept_earlier = {name for p in earlier for name in re.findall(r"`([^`]+)`", p.split(". ")[0])}
    return list(dict.fromkeys(labels[label] for label in table if labels[label] not in kept_earlier))


def _figures(body: list[str]) -> list[tuple[str, str]]:
    """A page's figures: (title, path relative to the page) of each image line."""
    return [
        (m.group(1), m.group(2)) for ln in body if (m := re.fullmatch(r"!\[(.*)\]\((figures/[^)]+)\)", ln))
    ]


def keep_page_rows(
    spec: Spec, results: list[dict[str, Any]], kept: PageRows, *, rerender: bool = False
) -> list[dict[str, Any]]:
    """``results`` with every row this reproduction left out (``--rows``) and the page holds measured
    taken from the page: its line as printed, its note, its differences to the paper (Δ as printed) and its
    validity gates. A row is found by its identity (name, metric and view: rows may share a name), never by
    its name alone. With ``rerender`` (``--page-only``: nothing ran), a row the page lists as not run keeps
    the reason the page gives, and counts among the rows the page could measure only where that reason is
    not a missing dataset (as where the page was written)."""
    labels = {spec.row_key(row): row_label(spec, row) for row in spec.rows}
    out = []
    for r in results:
        label = labels.get(spec.result_key(r), "")
        line = kept.lines.get(label)
        if r.get("left_out") and line:
            diffs = [float(d) for d in re.findall(r"Δ ([+-][0-9.]+)", line)]
            gates = (kept.gates or {}).get(r["row"])
            r = {**r, "kept": {"line": line, "note": kept.notes.get(label), "diffs": diffs, "gates": gates}}
        elif rerender and r.get("left_out") and label in (kept.not_run or {}):
            note = (kept.not_run or {})[label]
            r = {**r, "note": note, "left_out": not data_was_missing(note)}
        out.append(r)
    return out


def rerender_page(
    spec: Spec, page: Path, *, scale: str | None = None, out: Path | None = None, index: bool = True
) -> Path:
    """``--page-only``: ``page`` written again (to ``out``, default the page itself) from what it holds and
    its cell records (``cells/`` beside it), running nothing: the rows it measured keep their lines, notes,
    gates and figures, the page its commands and provenance; the findings are judged again from the records,
    and the table's notes and gaps are its current ones. A page rendered from the same table, records and
    page comes back unchanged, byte for byte. ``scale``: the page's (read from its first line) unless given;
    ``index``: also refresh README.md beside ``out``."""
    from fedhet.reproduce.cells import fill_from_records
    from fedhet.reproduce.runner import run_spec

    if scale is None:
        mark = PAGE_MARK_RE.match(page.read_text().split("\n", 1)[0])
        if mark is None:
            raise ConfigError(f"{page} is not a result page written by `fedhet reproduce --page`")
        scale = mark.group(2)
    kept = read_page_rows(page, spec, scale)
    results = run_spec(spec, out_dir=page.parent, scale=scale, measure=False)
    page_results = keep_page_rows(spec, results, kept, rerender=True)
    fill_from_records(spec, page_results, page.parent / "cells", scale=scale)
    figures = [(title, rel) for title, rel in kept.figures if (page.parent / rel).is_file()]
    text = render_page(
        spec, page_results, scale=scale, command=None, commit=kept.commit, wall_s=0.0, machine="",
        figures=figures, kept=kept,
    )  # fmt: skip
    target = out or page
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text)
    if index:
        write_index(target.parent)
    return target


def write_index(pages_dir: Path) -> Path:
    """``README.md`` of the result pages: every reproduction table, its page and scale where one exists."""
    pages = {}
    for p in sorted(pages_dir.glob("*.md")):
        if p.name == "README.md":
            continue
        head = p.read_text().split("\n", 1)[0]
        m = PAGE_MARK_RE.match(head)
        if m:
            some = m.group(4) is not None and m.group(4) != m.group(5)
            pages[m.group(1)] = (
                p.name,
                m.group(2) + (f" ({m.group(4)} of {m.group(5)} rows)" if some else ""),
                m.group(3),
            )
    lines = [
        "# Reproduction results",
        "",
        "One page per published table, each regenerated by the command printed on it "
        "(`fedhet reproduce NAME --scale quick|cpu|full --page docs/results/NAME.md`). `fedhet reproduce "
        "--list` lists the tables. Rows whose data are not obtainable offline are listed on each page and "
        "run for a user who passes `--set data.root=DIR`.",
        "",
        "Each finished cell (one method, one seed) is kept as a small record under `cells/NAME/` as soon as "
        "its seed ends: a later `--page` run takes every cell whose record holds the same experiment and "
        "results stamp from it instead of running it again, so a long table fills over several sittings and "
        "its findings are judged from every seed ever recorded ([when a record is reused]"
        "(../reliability.md#when-a-record-is-reused); `fedhet records` says, per page, how many cells the "
        "code at hand takes from records and how many it would run). The robustness table "
        "([robustness.md](robustness.md), `fedhet robustness run`) keeps its runs the same way, under "
        "`cells/robustness/`.",
        "",
        "| table | what | page | scale | commit |",
        "|---|---|---|---|---|",
    ]
    for name in list_specs():
        spec = load_spec(name)
        if name in pages:
            file, scale, commit = pages[name]
            lines.append(f"| `{name}` | {spec.title} | [{file}]({file}) | {scale} | {commit} |")
        else:
            lines.append(f"| `{name}` | {spec.title} | not measured yet | | |")
    index = pages_dir / "README.md"
    index.write_text("\n".join(lines) + "\n")
    return index
