"""Every chapter has a graded exercise; masters score full marks, students zero.

Each grading run executes a notebook in a separate process (about a second here),
so the two parametrised tests below take most of this file's run time.
"""
from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest
import yaml

from klbook_lib.grading import student
from klbook_lib.grading.grader import grade
from klbook_lib.grading.hidden import bank

REPO = Path(__file__).resolve().parents[1]
EXERCISES = bank.exercise_names()


def _toc_files() -> list[str]:
    toc = yaml.safe_load((REPO / "_toc.yml").read_text(encoding="utf-8"))
    files: list[str] = []

    def walk(node):
        if isinstance(node, dict):
            if "file" in node:
                files.append(str(node["file"]))
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(toc)
    return files


def test_every_chapter_in_the_toc_has_an_exercise_notebook():
    """Chapters are the toc entries (and files) named chapters/NN_*; each needs exNN_*."""
    files = _toc_files()
    chapters = {f.split("/")[1] for f in files if re.fullmatch(r"chapters/\d\d_\w+", f)}
    chapters |= {p.stem for p in (REPO / "chapters").glob("[0-9][0-9]_*.ipynb")}
    assert chapters, "no numbered chapters found"
    for chapter in sorted(chapters):
        name = f"ex{chapter}"
        assert name in EXERCISES, f"chapter {chapter} has no graded questions ({name})"
        assert (REPO / "exercises" / f"{name}.ipynb").is_file(), f"exercises/{name}.ipynb is missing"
        assert (REPO / "exercises" / "masters" / f"{name}.ipynb").is_file()
    for f in files:
        if f.startswith("exercises/"):
            assert (REPO / f"{f}.ipynb").is_file(), f"{f}.ipynb listed in _toc.yml is missing"
            assert f.split("/")[1] in EXERCISES, f"{f} has no graded questions"
    assert "ex11_review" in EXERCISES and (REPO / "exercises" / "ex11_review.ipynb").is_file()


def test_student_notebooks_are_up_to_date_with_the_masters():
    stale = student.stale_files()
    assert not stale, f"run `klbook make-student`; stale: {[str(p) for p in stale]}"


@pytest.mark.parametrize("exercise", EXERCISES)
def test_notebooks_are_committed_clean_and_well_formed(exercise):
    questions = bank.questions(exercise)
    assert len(questions) >= 3
    assert len({q.kind for q in questions}) >= 2, "mix question kinds"
    for kind, path in (("master", REPO / "exercises" / "masters" / f"{exercise}.ipynb"),
                       ("student", REPO / "exercises" / f"{exercise}.ipynb")):
        nb = nbformat.read(path, as_version=4)
        nbformat.validate(nb)
        assert nb.metadata["klbook"]["exercise"] == exercise
        assert nb.metadata["kernelspec"]["name"] == "python3"
        first = nb.cells[0]
        assert first.cell_type == "markdown" and first.source.startswith("# ")
        assert "{doc}`../grading`" in first.source
        if exercise != "ex11_review":
            assert f"{{doc}}`../chapters/{exercise[2:]}`" in first.source
        text = "\n".join(c.source for c in nb.cells)
        for q in questions:
            pts = f"({q.points} point{'s' if q.points != 1 else ''})"
            assert f"## Question {q.id[1:]}: {q.title} {pts}" in text, (path, q.id)
            assert f'check("{q.id}")' in text
        for c in nb.cells:
            if c.cell_type == "code":
                assert not c.outputs and c.execution_count is None, f"{path} has outputs"
        has_solutions = student.BEGIN in text
        assert has_solutions == (kind == "master"), path


@pytest.mark.parametrize("exercise", EXERCISES)
def test_master_scores_full_marks(exercise):
    result = grade(REPO / "exercises" / "masters" / f"{exercise}.ipynb")
    assert result["exercise"] == exercise
    assert result["notes"] == [], result["notes"]          # every cell ran without error
    for q in result["questions"]:
        assert q["points"] == q["max_points"], q
    assert result["score"] == result["max_score"] > 0


@pytest.mark.parametrize("exercise", EXERCISES)
def test_student_notebook_runs_and_scores_zero(exercise):
    result = grade(REPO / "exercises" / f"{exercise}.ipynb")
    assert result["notes"] == [], result["notes"]          # a student notebook runs top to bottom
    assert result["score"] == 0, result
    for q in result["questions"]:
        assert q["points"] == 0
        if q["kind"] == "function":
            assert any("not implemented yet" in m for m in q["messages"]), q
        else:
            assert any("None" in m or "no answer" in m for m in q["messages"]), q
