"""Generate the student notebooks and the public check data from the masters.

A master (``exercises/masters/exNN_*.ipynb``) holds the reference solution of each
question between ``# BEGIN SOLUTION`` and ``# END SOLUTION`` lines. In the student copy
an indented block (the body of a function) becomes ``raise NotImplementedError``, a
block at the top level (``answer_q3 = ...``) becomes ``answer_q3 = None``. Outputs are
stripped. ``public_cases.json`` holds, for every question, the public test inputs
with their expected values, computed from the reference solutions.
"""
from __future__ import annotations

import ast
import copy
import json
from pathlib import Path

import nbformat

from klbook_lib.grading.compare import encode

REPO = Path(__file__).resolve().parents[2]
MASTERS = REPO / "exercises" / "masters"
STUDENTS = REPO / "exercises"
PUBLIC_CASES = Path(__file__).with_name("public_cases.json")
BEGIN, END = "# BEGIN SOLUTION", "# END SOLUTION"


def strip_solutions(source: str) -> str:
    """Replace every marked solution block of one cell's source by its stub."""
    lines = source.split("\n")
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.strip() != BEGIN:
            if line.strip() == END:
                raise ValueError(f"source: {END!r} without {BEGIN!r}")
            out.append(line)
            i += 1
            continue
        indent = line[: len(line) - len(line.lstrip())]
        j = i + 1
        while j < len(lines) and lines[j].strip() != END:
            if lines[j].strip() == BEGIN:
                raise ValueError(f"source: nested {BEGIN!r}")
            j += 1
        if j == len(lines):
            raise ValueError(f"source: {BEGIN!r} without {END!r}")
        block = lines[i + 1: j]
        if indent:
            out += [f"{indent}# YOUR CODE HERE",
                    f'{indent}raise NotImplementedError("replace this line with your code")']
        else:
            names = []
            for node in ast.parse("\n".join(block)).body:
                if isinstance(node, ast.Assign):
                    names += [t.id for t in node.targets if isinstance(t, ast.Name)]
            if not names:
                raise ValueError("source: a top-level solution block must assign an answer")
            out += [f"{n} = None  # YOUR ANSWER HERE" for n in dict.fromkeys(names)]
        i = j + 1
    return "\n".join(out)


def student_notebook(master: nbformat.NotebookNode, exercise: str) -> nbformat.NotebookNode:
    nb = copy.deepcopy(master)
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.source = strip_solutions(cell.source)
            cell.outputs = []
            cell.execution_count = None
        for key in ("execution", "collapsed", "scrolled"):
            cell.metadata.pop(key, None)
    nb.metadata["kernelspec"] = {"display_name": "Python 3", "language": "python", "name": "python3"}
    nb.metadata["klbook"] = {"exercise": exercise, "role": "student"}
    return nb


def public_cases() -> dict:
    """Public inputs and expected values of every question (the data ``check()`` uses)."""
    from klbook_lib.grading.hidden import bank

    data: dict = {}
    for ex in bank.exercise_names():
        data[ex] = {}
        for q in bank.questions(ex):
            entry = {"title": q.title, "kind": q.kind, "name": q.name, "points": q.points,
                     "rtol": q.rtol, "atol": q.atol}
            if q.kind == "function":
                expected = q.expected()
                entry["cases"] = [{"why": c.why, "args": c.encoded_args(), "expected": encode(e)}
                                  for c, e in zip(q.cases, expected) if c.public]
                entry["n_hidden"] = sum(not c.public for c in q.cases)
            elif q.kind == "value":
                entry["shape"] = list(q.expected().shape)
            else:
                entry["options"] = q.options
            data[ex][q.id] = entry
    return data


def _outputs() -> dict[Path, str]:
    """Every generated file and its text."""
    from klbook_lib.grading.hidden import bank

    files = {PUBLIC_CASES: json.dumps(public_cases(), indent=1, sort_keys=True) + "\n"}
    for ex in bank.exercise_names():
        master = MASTERS / f"{ex}.ipynb"
        if not master.is_file():
            raise FileNotFoundError(f"missing master notebook {master}")
        nb = student_notebook(nbformat.read(master, as_version=4), ex)
        files[STUDENTS / f"{ex}.ipynb"] = nbformat.writes(nb) + "\n"
    return files


def stale_files() -> list[Path]:
    """Generated files that are missing or differ from what the masters produce."""
    return [p for p, text in _outputs().items()
            if not p.is_file() or p.read_text(encoding="utf-8") != text]


def make_student(check: bool = False) -> list[Path]:
    """Write the generated files (or, with ``check``, only report stale ones)."""
    stale = stale_files()
    if not check:
        for p, text in _outputs().items():
            if p in stale:
                p.write_text(text, encoding="utf-8")
    return stale
