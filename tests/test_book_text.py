"""The prose of the book: numbers come from code, chapters carry the apparatus."""
from __future__ import annotations

import re

import pytest

from booktools import ROOT, hand_typed_numbers, markdown_cells

CHAPTERS = sorted((ROOT / "chapters").glob("[0-9][0-9]_*.ipynb"))
PAGES = sorted((ROOT / "chapters").glob("*.ipynb")) + sorted((ROOT / "exercises").glob("*.ipynb"))
MD_PAGES = [ROOT / p for p in ("intro.md", "notation.md", "glossary.md", "grading.md") if (ROOT / p).exists()]


def _id(p):
    return str(p.relative_to(ROOT))


def test_the_linter_catches_a_hand_typed_number():
    assert hand_typed_numbers("the fitted mean is 0.02 nats") == ["0.02"]
    assert hand_typed_numbers("about 95% of samples") == ["95%"]
    assert hand_typed_numbers("the mean is {glue:text}`mu:.2f` and $\\sigma=0.8$") == []
    assert hand_typed_numbers("```python\nx = 0.5\n```") == []


@pytest.mark.parametrize("path", PAGES, ids=_id)
def test_no_hand_typed_decimal_in_notebook_prose(path):
    found = {n for md in markdown_cells(path) for n in hand_typed_numbers(md)}
    assert not found, (f"{_id(path)}: numbers typed into prose {sorted(found)}; glue them from the "
                       "cell that computes them ({glue:text}) or write them in math if they are constants")


@pytest.mark.parametrize("path", MD_PAGES, ids=_id)
def test_no_hand_typed_decimal_in_markdown_pages(path):
    assert not hand_typed_numbers(path.read_text())


@pytest.mark.parametrize("path", CHAPTERS, ids=_id)
def test_chapter_apparatus(path):
    text = "\n".join(markdown_cells(path))
    assert "{cite}" in text or "{cite:" in text, "every chapter cites its sources"
    assert "notation" in text, "every chapter links the notation page"
    assert re.search(r"^#+\s*Exercises", text, re.M), "every chapter ends with in-text exercises"
    assert "{exercise}" in text and "{solution}" in text, "in-text exercises with hidden solutions"
    number = path.name[:2]
    assert re.search(rf"exercises/ex{number}_", text), "link to the graded exercise notebook"
    assert "{glue:" in text, "numbers in prose are glued from code"


@pytest.mark.parametrize("path", CHAPTERS, ids=_id)
def test_chapter_asserts_its_claims(path):
    import nbformat
    nb = nbformat.read(path, as_version=4)
    code = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    assert code.count("assert ") >= 3, "a chapter checks what it claims"
    assert "glue(" in code


def test_every_glossary_term_has_its_chinese_equivalent():
    text = (ROOT / "glossary.md").read_text()
    body = text.split("```{glossary}", 1)[1].split("```", 1)[0]
    entries = re.findall(r"^(\S[^\n]*)\n((?:[ \t]+[^\n]*\n?)+)", body, re.M)
    assert len(entries) >= 20
    for term, definition in entries:
        assert re.search(r"[\u4e00-\u9fff]", definition), f"glossary term {term!r} has no Chinese equivalent"
