"""The book's structure: every notebook is in the table of contents and is executed,
and every chapter follows the page conventions (AUTHORING.md): an opening with learning
objectives and prerequisites, a Summary before the Exercises, plotting code behind a
"show code" toggle.

These tests read files only; they do not execute notebooks (nbval and the book build
do that in `make test`). What the built pages look like is checked by test_browser.py.
"""
from __future__ import annotations

import subprocess
import sys

import nbformat
import pytest
import yaml

from booktools import (EXCLUDED_DIRS, ROOT, chapter_number, disk_notebooks, draws_figure,
                       hide_input_problems, markdown_cells, opening_problems, summary_problems,
                       toc_files, toc_notebooks)

CHAPTERS = sorted((ROOT / "chapters").glob("[0-9][0-9]_*.ipynb"))


def _id(p):
    return str(p.relative_to(ROOT))


def test_every_toc_entry_exists():
    missing = [f for f in toc_files()
               if not any((ROOT / f"{f}{ext}").exists() for ext in (".md", ".ipynb"))]
    assert not missing, f"_toc.yml names files that do not exist: {missing}"


def test_every_notebook_on_disk_is_in_toc_or_explicitly_excluded():
    listed = {ROOT / f"{f}.ipynb" for f in toc_files()}
    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    for d in EXCLUDED_DIRS:
        assert f"{d}/*" in config["exclude_patterns"], f"{d} must be excluded in _config.yml"
    stray = [str(p.relative_to(ROOT)) for p in disk_notebooks()
             if p not in listed and not any(str(p.relative_to(ROOT)).startswith(d) for d in EXCLUDED_DIRS)]
    assert not stray, f"notebooks neither in _toc.yml nor excluded: {stray}"


def test_nbval_collects_every_notebook_in_toc():
    """`make test-notebooks` passes exactly the Makefile's NOTEBOOKS list to nbval:
    collect it the same way and check that no notebook of the book is skipped."""
    listed = subprocess.run(["make", "-s", "--no-print-directory", "print-notebooks"], cwd=ROOT,
                            capture_output=True, text=True, check=True).stdout.split()
    assert listed, "the Makefile lists no notebooks"
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "--nbval-lax",
                          "-p", "no:cacheprovider", *listed],
                         cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    collected = {line.split("::")[0] for line in out.stdout.splitlines() if "::" in line}
    for nb in toc_notebooks():
        rel = str(nb.relative_to(ROOT))
        assert rel in collected, f"{rel} is in _toc.yml but nbval did not collect it"
    for nb in disk_notebooks():
        rel = str(nb.relative_to(ROOT))
        assert rel in collected, f"{rel} is on disk but nbval would not run it"


@pytest.mark.parametrize("nb_path", disk_notebooks(), ids=lambda p: str(p.relative_to(ROOT)))
def test_notebooks_are_committed_clean(nb_path):
    nb = nbformat.read(nb_path, as_version=4)
    nbformat.validate(nb)
    assert nb.metadata.get("kernelspec", {}).get("name") == "python3"
    dirty = [i for i, c in enumerate(nb.cells) if c.cell_type == "code" and (c.outputs or c.execution_count)]
    assert not dirty, f"cells {dirty} carry outputs: run tools/strip_outputs.py {nb_path.name}"
    assert nb.cells and nb.cells[0].cell_type == "markdown" and nb.cells[0].source.lstrip().startswith("# "), \
        "the first cell must be a markdown title"


# ------------------------------------------------------------------ page conventions

@pytest.mark.parametrize("path", CHAPTERS, ids=_id)
def test_chapter_opens_with_objectives_and_prerequisites(path):
    nb = nbformat.read(path, as_version=4)
    problems = opening_problems(nb.cells[0].source, chapter_number(path))
    assert not problems, f"{_id(path)}, first cell: " + "; ".join(problems)


@pytest.mark.parametrize("path", CHAPTERS, ids=_id)
def test_chapter_has_a_summary_before_its_exercises(path):
    problems = summary_problems(markdown_cells(path))
    assert not problems, f"{_id(path)}: " + "; ".join(problems)


@pytest.mark.parametrize("path", CHAPTERS, ids=_id)
def test_plotting_code_is_behind_a_toggle(path):
    """Cells that only draw a figure carry the 'hide-input' tag (the page shows a
    "Show code cell source" toggle); cells that assert a claim stay visible."""
    problems = hide_input_problems(nbformat.read(path, as_version=4))
    assert not problems, f"{_id(path)}:\n" + "\n".join(problems)


def test_the_convention_checks_catch_what_they_should():
    opening = ("# T\n\n**Overview.** x\n\n**Learning objectives.** After this chapter you can:\n"
               "- compute a\n- derive b\n- choose c\n\n**Prerequisites.** {doc}`02_forward_reverse`.")
    assert opening_problems(opening, 3) == []
    assert opening_problems(opening, 2)  # a prerequisite cannot be the chapter itself
    assert opening_problems(opening.replace("- choose c\n", ""), 3)  # two objectives only
    assert opening_problems(opening.replace("**Prerequisites.**", "Prerequisites:"), 3)
    assert opening_problems("# T\n\n**Overview.** x\n\n**Learning objectives.**\n- a\n- b\n- c\n\n"
                            "**Prerequisites.** {doc}`../notation`", 1) == []
    assert summary_problems(["## A\n", "## Summary\n- one\n", "## Exercises\n"]) == []
    assert summary_problems(["## Summary\n- one\n", "## B\n", "## Exercises\n"])
    assert summary_problems(["## Summary\nno bullets\n", "## Exercises\n"])
    assert draws_figure("fig, ax = plt.subplots()\nax.plot(x, y)") and not draws_figure("y = f(x)")
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell("fig, ax = plt.subplots()\nax.plot(x)"),
        nbformat.v4.new_code_cell("r = run()\nassert r > 0\nfig, ax = plt.subplots()", metadata={"tags": ["hide-input"]}),
        nbformat.v4.new_code_cell("fig, ax = plt.subplots()\nax.plot(x)", metadata={"tags": ["hide-input"]}),
    ])
    assert [p.split()[1] for p in hide_input_problems(nb)] == ["0", "1"]


def test_instructor_pages_sit_in_their_own_part():
    """The execution-status and grading pages are for instructors, not in the students' parts."""
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    parts = {p.get("caption"): [c.get("file") for c in p.get("chapters", [])] for p in toc["parts"]}
    assert "For instructors" in parts, f"no 'For instructors' part in _toc.yml: {list(parts)}"
    assert set(parts["For instructors"]) == {"grading", "execution"}, parts["For instructors"]
    others = [f for caption, files in parts.items() if caption != "For instructors" for f in files]
    assert not {"grading", "execution"} & set(others)
    assert list(parts)[-1] == "For instructors", "the instructors' part comes last"


def test_the_landing_page_lists_every_chapter():
    """The intro's 'How the book is organised' names each numbered chapter, in the order of
    the table of contents (which numbers them on the site; a file's number is only its name)."""
    import re

    intro = (ROOT / "intro.md").read_text(encoding="utf-8")
    toc = re.findall(r"file: chapters/([0-9][0-9]_\w+)", (ROOT / "_toc.yml").read_text(encoding="utf-8"))
    chapters = [c for c in toc if (ROOT / "chapters" / f"{c}.ipynb").exists()]
    assert sorted(chapters) == sorted(p.stem for p in (ROOT / "chapters").glob("[0-9][0-9]_*.ipynb"))
    positions = [intro.find(f"{{doc}}`chapters/{c}`") for c in chapters]
    assert all(i >= 0 for i in positions), [c for c, i in zip(chapters, positions) if i < 0]
    assert positions == sorted(positions)
