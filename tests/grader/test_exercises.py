"""Every chapter has a graded exercise; masters score full marks, students zero.

Each grading run executes a notebook in the grader's sandbox (one to a few seconds here,
most of it importing numpy, scipy or torch; the notebooks with an outcome-graded training
task take 10 to 20 s of CPU, up to a minute on the shared machine), so the two parametrised
tests below take most of this file's run time. The classic wrong answers, fake outcomes and
the outcome tasks' seeds are tested in tests/grader/test_exercise_traps.py.
"""
from __future__ import annotations

import json

import re
from pathlib import Path

import nbformat
import pytest
import yaml

from klbook_grader import student
from klbook_grader.grader import grade
from klbook_grader.hidden import bank

REPO = Path(__file__).resolve().parents[2]
EXERCISES = bank.exercise_names()
# questions whose student version is working code with bugs, not a stub (exercise 5's trainer)
DEBUG_TASKS = {("ex05_kl_in_practice", "q5")}


def _has_outcome_task(exercise: str) -> bool:
    return any(c.judge is not None for q in bank.questions(exercise) for c in q.cases)


# the notebook's cells may take longer than the grader's default 20 s per cell on a machine
# that runs other tests beside this one (a student's trainer cell in ex05 took 21 s at load 10)
LOADED_CELL_TIMEOUT = 120.0


def _time_bound(exercise: str) -> float:
    """Seconds a grading may take here: "a few seconds", and for an outcome task (four short
    training runs, 10 to 20 s of CPU) about a minute, with room for the shared machine's load."""
    return 120.0 if _has_outcome_task(exercise) else 30.0


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


NO_GRADED_NOTEBOOK_YET: set[str] = set()   # chapters (stems) whose graded notebook is not written yet


def test_chapters_without_a_graded_notebook_say_so():
    for chapter in NO_GRADED_NOTEBOOK_YET:
        path = REPO / "chapters" / f"{chapter}.ipynb"
        if path.exists():
            text = path.read_text(encoding="utf-8")
            assert "no graded notebook" in text, f"{chapter} must say that it has no graded notebook yet"


def test_every_chapter_in_the_toc_has_an_exercise_notebook():
    """Chapters are the toc entries (and files) named chapters/NN_*; each needs exNN_*."""
    files = _toc_files()
    chapters = {f.split("/")[1] for f in files if re.fullmatch(r"chapters/\d\d_\w+", f)}
    chapters |= {p.stem for p in (REPO / "chapters").glob("[0-9][0-9]_*.ipynb")}
    assert chapters, "no numbered chapters found"
    # a chapter still without one (none at present) says on the page that its graded notebook
    # is not written yet; nothing else may be missing one
    assert NO_GRADED_NOTEBOOK_YET <= chapters
    for chapter in sorted(chapters - NO_GRADED_NOTEBOOK_YET):
        name = f"ex{chapter}"
        assert name in EXERCISES, f"chapter {chapter} has no graded questions ({name})"
        assert (REPO / "exercises" / f"{name}.ipynb").is_file(), f"exercises/{name}.ipynb is missing"
        assert (REPO / "exercises" / "masters" / f"{name}.ipynb").is_file()
    for f in files:
        if f.startswith("exercises/"):
            assert (REPO / f"{f}.ipynb").is_file(), f"{f}.ipynb listed in _toc.yml is missing"
            assert f.split("/")[1] in EXERCISES, f"{f} has no graded questions"
    assert "ex14_review" in EXERCISES and (REPO / "exercises" / "ex14_review.ipynb").is_file()


def test_every_master_is_graded_here():
    """`make test` does not run the masters under nbval: test_master_scores_full_marks
    executes each one top to bottom in the sandbox and fails on any cell that raises. That
    holds only if every master notebook is an exercise of the bank."""
    masters = {p.stem for p in (REPO / "exercises" / "masters").glob("*.ipynb")}
    assert masters and masters == set(EXERCISES), sorted(masters ^ set(EXERCISES))


def test_student_notebooks_are_up_to_date_with_the_masters():
    stale = student.stale_files()
    assert not stale, f"run `klbook make-student`; stale: {[str(p) for p in stale]}"


def test_float_noise_in_the_last_digits_of_the_public_cases_is_not_stale(tmp_path, monkeypatch):
    # another CPU's float64 kernels change the last digits of computed expected values
    path = tmp_path / "public_cases.json"
    dump = lambda v, n=3: json.dumps({"ex": {"q1": {"v": v, "n": n, "why": "x"}}}, indent=1, sort_keys=True) + "\n"
    monkeypatch.setattr(student, "PUBLIC_CASES", path)
    monkeypatch.setattr(student, "outputs", lambda: {path: dump(0.42295389683271306)})
    path.write_text(dump(0.42295389683271295))
    assert student.stale_files() == []
    path.write_text(dump(0.4229539))                   # a real change of the value
    assert student.stale_files() == [path]
    path.write_text(dump(0.42295389683271306, n=4))    # a change of anything else
    assert student.stale_files() == [path]


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
        if exercise.startswith("project"):         # a project links the chapters of its part
            assert "{doc}`../chapters/" in first.source
        elif exercise != "ex14_review":
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
    result = grade(REPO / "exercises" / "masters" / f"{exercise}.ipynb", cell_timeout=LOADED_CELL_TIMEOUT)
    assert result["exercise"] == exercise
    assert result["notes"] == [], result["notes"]          # every cell ran without error
    assert result["isolation"].startswith("bubblewrap")    # graded in the sandbox, in one run
    assert result["runs"] == 1
    # "a few seconds": 1-6 s measured on the shared 2-core machine; the bound leaves room for load
    assert result["seconds"] < _time_bound(exercise), result["seconds"]
    for q in result["questions"]:
        assert q["points"] == q["max_points"], q
    assert result["score"] == result["max_score"] > 0


@pytest.mark.parametrize("exercise", EXERCISES)
def test_student_notebook_runs_and_scores_zero(exercise):
    result = grade(REPO / "exercises" / f"{exercise}.ipynb", cell_timeout=LOADED_CELL_TIMEOUT)
    assert result["notes"] == [], result["notes"]          # a student notebook runs top to bottom
    assert result["runs"] == 1 and result["seconds"] < _time_bound(exercise)
    assert result["score"] == 0, result
    for q in result["questions"]:
        assert q["points"] == 0
        if (exercise, q["id"]) in DEBUG_TASKS:        # the buggy trainer runs and fails every probe
            n_cases = len(next(b for b in bank.questions(exercise) if b.id == q["id"]).cases)
            assert sum("probes:" in m for m in q["messages"]) == n_cases, q
        elif q["kind"] == "function":
            assert any("not implemented yet" in m for m in q["messages"]), q
        else:
            assert any("None" in m or "no answer" in m for m in q["messages"]), q


def test_outcome_tasks_state_their_time_limits_and_seeds():
    """Every outcome-graded question declares its per-run time limit, offers the library its
    training needs, gives full marks before the last seed, and its notebook says so."""
    for exercise in EXERCISES:
        nb = nbformat.read(REPO / "exercises" / f"{exercise}.ipynb", as_version=4)
        text = " ".join(" ".join(c.source for c in nb.cells).split())     # line breaks as spaces
        for q in bank.questions(exercise):
            judged = [c for c in q.cases if c.judge is not None]
            if not judged:
                continue
            assert q.timeout is not None and q.library and q.public_checks, q.id
            assert all(not c.public and c.probe for c in judged)
            if len(judged) == len(q.cases):                     # a training task on seeds
                assert q.full_marks_at == len(q.cases) - 1
                assert f"at most ${q.timeout:g}$ s each" in text, (exercise, q.id)
                words = {3: "Two credits out of three", 4: "Three credits out of four",
                         6: "Five credits out of six"}[len(q.cases)]
                assert f"{words} give full marks" in text


def test_written_model_answers_stay_in_the_masters():
    """The review's model answers name the multiple-choice answers: the student copy has none."""
    master = nbformat.read(REPO / "exercises" / "masters" / "ex14_review.ipynb", as_version=4)
    tagged = [c for c in master.cells if "solution" in c.metadata.get("tags", [])]
    assert len(tagged) == 5 and all("Model answer" in c.source for c in tagged)
    for exercise in EXERCISES:
        nb = nbformat.read(REPO / "exercises" / f"{exercise}.ipynb", as_version=4)
        assert not [c for c in nb.cells if "solution" in c.metadata.get("tags", [])]
        assert "Model answer" not in "\n".join(c.source for c in nb.cells), exercise
