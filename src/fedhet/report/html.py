"""``fedhet report --html``: the Markdown report as one self-contained HTML file (figures embedded).

The converter covers exactly the Markdown that :func:`fedhet.report.markdown.write_report` writes:
headings, paragraphs, pipe tables, images, two-level lists, fenced code, inline code and bold. Images
become ``data:`` URIs, so the file can be mailed or archived alone.
"""

from __future__ import annotations

import base64
import html
import re
from pathlib import Path

STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; max-width: 1100px; margin: 2em auto;
       padding: 0 1em; color: #1d2330; line-height: 1.45; }
h1 { border-bottom: 2px solid #3b6ea5; padding-bottom: .2em; }
h2 { margin-top: 1.6em; color: #3b6ea5; }
table { border-collapse: collapse; margin: 1em 0; font-variant-numeric: tabular-nums; }
th, td { border: 1px solid #c9d1dc; padding: .3em .7em; text-align: right; }
th:first-child, td:first-child { text-align: left; }
th { background: #eef2f7; }
tr:nth-child(even) td { background: #f8fafc; }
img { max-width: 100%; border: 1px solid #e3e8ef; }
pre { background: #f4f6f9; padding: .8em; overflow-x: auto; }
code { background: #f4f6f9; padding: 0 .2em; }
"""

_IMAGE = re.compile(r"^!\[(?P<alt>[^\]]*)\]\((?P<src><[^>]+>|[^)]+)\)$")


def _inline(text: str) -> str:
    """Escape, then `code` and **bold**."""
    out = html.escape(text, quote=False)
    out = re.sub(r"`([^`]+)`", r"<code>\1</code>", out)
    return re.sub(r"\*\*([^*]+)\*\*", r"<strong>\1</strong>", out)


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def _data_uri(src: str, base: Path) -> str:
    path = Path(src.strip("<>"))
    path = path if path.is_absolute() else base / path
    mime = "image/png" if path.suffix.lower() == ".png" else "image/jpeg"
    return f"data:{mime};base64," + base64.b64encode(path.read_bytes()).decode("ascii")


def markdown_to_html(markdown: str, base: Path, title: str = "fedhet report") -> str:
    """The HTML page of a report whose image paths are relative to ``base``."""
    body: list[str] = []
    lines = markdown.splitlines()
    i = 0
    paragraph: list[str] = []

    def flush() -> None:
        if paragraph:
            body.append(f"<p>{_inline(' '.join(paragraph))}</p>")
            paragraph.clear()

    while i < len(lines):
        line = lines[i]
        stripped = line.strip()
        if not stripped:
            flush()
        elif stripped.startswith("```"):
            flush()
            block = []
            i += 1
            while i < len(lines) and not lines[i].strip().startswith("```"):
                block.append(lines[i])
                i += 1
            body.append(f"<pre><code>{html.escape(chr(10).join(block), quote=False)}</code></pre>")
        elif m := re.match(r"^(#{1,6}) (.*)$", stripped):
            flush()
            level = len(m.group(1))
            body.append(f"<h{level}>{_inline(m.group(2))}</h{level}>")
        elif (
            stripped.startswith("|")
            and i + 1 < len(lines)
            and re.match(r"^\|[\s:|-]+\|$", lines[i + 1].strip())
        ):
            flush()
            header = _cells(stripped)
            rows = []
            i += 2
            while i < len(lines) and lines[i].strip().startswith("|"):
                rows.append(_cells(lines[i]))
                i += 1
            head = "".join(f"<th>{_inline(c)}</th>" for c in header)
            cells = "".join("<tr>" + "".join(f"<td>{_inline(c)}</td>" for c in r) + "</tr>" for r in rows)
            body.append(f"<table><thead><tr>{head}</tr></thead><tbody>{cells}</tbody></table>")
            continue
        elif m := _IMAGE.match(stripped):
            flush()
            alt = html.escape(m.group("alt"))
            body.append(f'<figure><img alt="{alt}" src="{_data_uri(m.group("src"), base)}"></figure>')
        elif re.match(r"^ {0,3}- ", line):
            flush()
            items = []
            while i < len(lines) and re.match(r"^ *- ", lines[i]):
                nested = lines[i].startswith("  ")
                text = _inline(lines[i].strip()[2:])
                items.append(f"<ul><li>{text}</li></ul>" if nested else f"<li>{text}</li>")
                i += 1
            body.append("<ul>" + "".join(items) + "</ul>")
            continue
        else:
            paragraph.append(stripped)
        i += 1
    flush()
    return (
        f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
        f"<style>{STYLE}</style></head>\n<body>\n" + "\n".join(body) + "\n</body></html>\n"
    )


def write_html(markdown_path: Path, out: Path | None = None, title: str | None = None) -> Path:
    """Write the self-contained HTML of the report at ``markdown_path`` (default: the same name, .html)."""
    out = out or markdown_path.with_suffix(".html")
    text = markdown_path.read_text(encoding="utf-8")
    first = next((ln[2:] for ln in text.splitlines() if ln.startswith("# ")), "fedhet report")
    out.write_text(markdown_to_html(text, markdown_path.parent, title or first), encoding="utf-8")
    return out
