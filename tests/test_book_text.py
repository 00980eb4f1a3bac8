"""The prose of the book: numbers come from code, chapters carry the apparatus."""
from __future__ import annotations

import re

import pytest

from booktools import (ROOT, doubled_reference_words, hand_typed_numbers, markdown_cells,
                       single_bar_divergences, toc_files, word_before_reference_role)

CHAPTERS = sorted((ROOT / "chapters").glob("[0-9][0-9]_*.ipynb"))
PAGES = sorted((ROOT / "chapters").glob("*.ipynb")) + sorted((ROOT / "exercises").glob("*.ipynb"))
MD_PAGES = [ROOT / p for p in ("intro.md", "notation.md", "glossary.md", "grading.md") if (ROOT / p).exists()]
ALL_MD_PAGES = [ROOT / f"{f}.md" for f in toc_files() if (ROOT / f"{f}.md").exists()]  # the book's pages


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
    if "no graded notebook" not in text:  # issue 26's new chapters say so (tests/grader/test_exercises.py)
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



def test_the_glossary_is_alphabetical_and_has_the_books_acronyms():
    text = (ROOT / "glossary.md").read_text()
    body = text.split("```{glossary}", 1)[1].split("```", 1)[0]
    # Sphinx sorts the rendered list (its order of appearance was the reader's complaint)
    assert body.lstrip().startswith(":sorted:")
    terms = {t for t, _ in re.findall(r"^(\S[^\n]*)\n((?:[ \t]+[^\n]*\n?)+)", body, re.M)}
    for needed in ("k1 estimator", "k2 estimator", "k3 estimator", "PPO", "TRPO", "GRPO", "DPO", "RLHF"):
        assert needed in terms, f"the glossary lacks {needed!r}"

# ---------------------------------------------------------------- KL's double bar

def test_the_single_bar_check_catches_what_myst_makes_of_a_table():
    # MyST turns '\\|' inside a Markdown table cell into '|': this is what the page then shows
    assert single_bar_divergences(r"D_{\mathrm{KL}}(\text{target}\,|\,\text{model})")
    assert single_bar_divergences(r"$D_{\mathrm{KL}}(p|q)$ and KL(target | model)") == [
        r"D_{\mathrm{KL}}(p|q)", "KL(target | model)"]
    assert single_bar_divergences(r"D_f(P|Q)") and single_bar_divergences(r"D_{\mathrm{KL}}(p \mid q)")
    # double bars, and conditioning bars inside the arguments, are fine
    for ok in (r"D_{\mathrm{KL}}(P\,\|\,Q)", r"D_{\mathrm{KL}}(p \Vert q)", "KL(π ‖ π_ref)",
               r"D_{\mathrm{KL}}(\pi(\cdot|s)\,\Vert\,\pi_{\mathrm{ref}}(\cdot\mid s))", r"D_{TV}(P, Q)"):
        assert single_bar_divergences(ok) == [], ok


def _table_rows(markdown: str) -> list[str]:
    return [line for line in markdown.splitlines() if line.lstrip().startswith("|")]


@pytest.mark.parametrize("path", ALL_MD_PAGES + PAGES, ids=_id)
def test_no_escaped_bar_in_markdown_tables(path):
    """Inside a Markdown table `\\|` renders as a single bar (MyST reads it as an escaped
    column separator): write `\\Vert` there, e.g. `$D_{\\mathrm{KL}}(P \\Vert Q)$`."""
    sources = [path.read_text()] if path.suffix == ".md" else markdown_cells(path)
    bad = [row.strip()[:120] for src in sources for row in _table_rows(src) if "\\|" in row]
    assert not bad, f"{_id(path)}: '\\|' in table rows (write \\Vert):\n" + "\n".join(bad)


# ---------------------------------------------------- references say their word once

def test_the_doubled_word_checks_work():
    assert doubled_reference_words("(exercise Exercise 4.3)") == ["exercise Exercise 4.3)"]
    assert doubled_reference_words("see Figure Fig. 2.1") and doubled_reference_words("Fig. Figure 3")
    assert doubled_reference_words("see Exercise 4.3 and Figure 2.1 and the figure (2.1)") == []
    assert word_before_reference_role("see exercise {numref}`ex-04-3`")
    assert word_before_reference_role("as Figure {numref}`fig-02-fits` shows")
    assert word_before_reference_role("see {numref}`ex-04-3` and equation {eq}`eq-01-kl`") == []


@pytest.mark.parametrize("path", ALL_MD_PAGES + PAGES, ids=_id)
def test_no_word_before_a_reference_that_writes_it(path):
    """{numref} renders "Exercise 4.3" / "Fig. 2.1" itself: "exercise {numref}`ex-04-3`"
    would read "exercise Exercise 4.3"."""
    sources = [path.read_text()] if path.suffix == ".md" else markdown_cells(path)
    bad = [hit for src in sources for hit in word_before_reference_role(src)]
    assert not bad, f"{_id(path)}: drop the word before the reference: {bad}"
