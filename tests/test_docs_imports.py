"""Every import the user docs show works: a snippet a user copies must not fail at its first line."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FROM_IMPORT = re.compile(r"^\s*from (fedhet[\w.]*) import ([\w, ]+)$", re.M)


def shown_imports() -> list[tuple[str, str, str]]:
    """(doc, module, name) for each ``from fedhet... import a, b`` line of the docs."""
    found = []
    for doc in DOCS:
        for module, names in FROM_IMPORT.findall(doc.read_text(encoding="utf-8")):
            found += [(doc.name, module, name.strip()) for name in names.split(",") if name.strip()]
    return sorted(set(found))


def test_the_docs_show_imports_to_check():
    assert ("your-own-data.md", "fedhet.data", "from_table") in shown_imports()


@pytest.mark.parametrize(("doc", "module", "name"), shown_imports())
def test_an_import_shown_in_the_docs_works(doc, module, name):
    assert hasattr(importlib.import_module(module), name), f"{doc}: `from {module} import {name}` fails"
