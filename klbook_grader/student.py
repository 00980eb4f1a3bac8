"""Generate the student notebooks and the public check data from the masters.

A master (``exercises/masters/exNN_*.ipynb``) holds the reference solution of each
question between ``# BEGIN SOLUTION`` and ``# END SOLUTION`` lines. In the student copy
an indented block (the body of a function) becomes ``raise NotImplementedError``, a
block at the top level (``answer_q3 = ...``) becomes ``answer_q3 = None`` for each answer
variable it assigns (helper variables of the solution, such as ``pi = ...``, are dropped,
so that nothing answer-like is left behind). Outputs are stripped.

A solution block may be followed at once by a ``# BEGIN STUDENT`` ... ``# END STUDENT``
block whose lines are commented out in the master: the student copy gets those lines,
uncommented, instead of a stub. The "broken trainer" of exercise 5 uses this: the master
runs the fixed code, the student receives the code with its bugs.

``public_cases.json`` holds, for every question, the public test inputs with their
expected values, computed from the reference solutions.

A cell tagged ``solution`` (the written model answers of the review) is left out of the
student copy altogether.
"""
from __future__ import annotations

import ast
import copy
import json
import re
from pathlib import Path

import nbformat

from klbook_grader.compare import encode

REPO = Path(__file__).resolve().parents[1]
MASTERS = REPO / "exercises" / "masters"
STUDENTS = REPO / "exercises"
PUBLIC_CASES = Path(__file__).with_name("public_cases.json")
BEGIN, END = "# BEGIN SOLUTION", "# END SOLUTION"
BEGIN_STUDENT, END_STUDENT = "# BEGIN STUDENT", "# END STUDENT"
SOLUTION_TAG = "solution"
_ANSWER = re.compile(r"answer_q\d+$")


def _uncomment(line: str, indent: str) -> str:
    body = line[len(indent):] if line.startswith(indent) else line.lstrip()
    if body.startswith("# "):
        return indent + body[2:]
    if body.rstrip() == "#":
        return ""
    raise ValueError(f"source: a line of a {BEGIN_STUDENT!r} block must be commented out "
                     f"with '# ' in the master, got {line!r}")


def _block(lines: list[str], i: int, begin: str, end: str) -> int:
    """Index of the ``end`` line of the block opened at line ``i``."""
    j = i + 1
    while j < len(lines) and lines[j].strip() != end:
        if lines[j].strip() in (BEGIN, BEGIN_STUDENT):
            raise ValueError(f"source: nested {lines[j].strip()!r} inside {begin!r}")
        j += 1
    if j == len(lines):
        raise ValueError(f"source: {begin!r} without {end!r}")
    return j


def strip_solutions(source: str, answers: set[str] | None = None) -> str:
    """Replace every marked solution block of one cell's source by its stub.

    ``answers`` are the names a top-level block may leave as ``name = None`` (default: the
    names ``answer_qN``); other names it assigns are dropped.
    """
    lines = source.split("\n")
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        stripped = line.strip()
        if stripped in (END, END_STUDENT):
            raise ValueError(f"source: {stripped!r} without its BEGIN line")
        if stripped == BEGIN_STUDENT:
            raise ValueError(f"source: {BEGIN_STUDENT!r} must follow a solution block at once")
        if stripped != BEGIN:
            out.append(line)
            i += 1
            continue
        indent = line[: len(line) - len(line.lstrip())]
        j = _block(lines, i, BEGIN, END)
        block = lines[i + 1: j]
        if j + 1 < len(lines) and lines[j + 1].strip() == BEGIN_STUDENT:
            k = _block(lines, j + 1, BEGIN_STUDENT, END_STUDENT)
            student_indent = lines[j + 1][: len(lines[j + 1]) - len(lines[j + 1].lstrip())]
            out += [_uncomment(x, student_indent) for x in lines[j + 2: k]]
            i = k + 1
            continue
        if indent:
            out += [f"{indent}# YOUR CODE HERE",
                    f'{indent}raise NotImplementedError("replace this line with your code")']
        else:
            names = []
            for node in ast.parse("\n".join(block)).body:
                if isinstance(node, ast.Assign):
                    names += [t.id for t in node.targets if isinstance(t, ast.Name)]
            keep = [n for n in dict.fromkeys(names)
                    if (n in answers if answers is not None else _ANSWER.match(n))]
            if not keep:
                raise ValueError("source: a top-level solution block must assign an answer "
                                 f"(one of {sorted(answers) if answers else 'answer_qN'}), got {names}")
            out += [f"{n} = None  # YOUR ANSWER HERE" for n in keep]
        i = j + 1
    return "\n".join(out)


def _answer_names(exercise: str) -> set[str] | None:
    from klbook_grader.hidden import bank

    try:
        return {q.name for q in bank.questions(exercise) if q.kind != "function"}
    except ValueError:
        return None


def student_notebook(master: nbformat.NotebookNode, exercise: str) -> nbformat.NotebookNode:
    nb = copy.deepcopy(master)
    answers = _answer_names(exercise)
    # cells tagged "solution" (written model answers) stay in the master: a student who
    # could open them would read the multiple-choice answers
    nb.cells = [c for c in nb.cells if SOLUTION_TAG not in c.metadata.get("tags", [])]
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.source = strip_solutions(cell.source, answers)
            cell.outputs = []
            cell.execution_count = None
        for key in ("execution", "collapsed", "scrolled"):
            cell.metadata.pop(key, None)
    nb.metadata["kernelspec"] = {"display_name": "Python 3", "language": "python", "name": "python3"}
    nb.metadata["klbook"] = {"exercise": exercise, "role": "student"}
    return nb


def public_cases() -> dict:
    """Public inputs and expected values of every question (the data ``check()`` uses)."""
    from klbook_grader.hidden import bank

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
                entry["n_hidden_runs"] = sum(c.judge is not None for c in q.cases)
                if q.public_checks:
                    entry["outcome_checks"] = [dict(c) for c in q.public_checks]
            elif q.kind == "value":
                entry["shape"] = list(q.expected().shape)
            else:
                entry["options"] = q.options
            data[ex][q.id] = entry
    return data


def outputs() -> dict[Path, str]:
    """Every generated file and its text."""
    from klbook_grader.hidden import bank

    files = {PUBLIC_CASES: json.dumps(public_cases(), indent=1, sort_keys=True) + "\n"}
    for ex in bank.exercise_names():
        master = MASTERS / f"{ex}.ipynb"
        if not master.is_file():
            raise FileNotFoundError(f"missing master notebook {master}")
        nb = student_notebook(nbformat.read(master, as_version=4), ex)
        files[STUDENTS / f"{ex}.ipynb"] = nbformat.writes(nb) + "\n"
    return files


# the expected values are computed afresh from the masters; another CPU's float64 kernels may
# change their last digits (summation order), far below any question's rtol: not stale
_CASES_RTOL = 1e-12


def _same_data(a, b) -> bool:
    """JSON data ``a`` and ``b`` equal, floats to within ``_CASES_RTOL`` (relative)."""
    if isinstance(a, float) and isinstance(b, (int, float)) or isinstance(b, float) and isinstance(a, (int, float)):
        return a == b or abs(a - b) <= _CASES_RTOL * max(abs(a), abs(b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same_data(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same_data(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


def stale_files() -> list[Path]:
    """Generated files that are missing or differ from what the masters produce."""
    stale = []
    for p, text in outputs().items():
        if not p.is_file():
            stale.append(p)
            continue
        old = p.read_text(encoding="utf-8")
        if old == text:
            continue
        if p == PUBLIC_CASES and _same_data(json.loads(old), json.loads(text)):
            continue
        stale.append(p)
    return stale


def make_student(check: bool = False) -> list[Path]:
    """Write the generated files (or, with ``check``, only report stale ones)."""
    stale = stale_files()
    if not check:
        for p, text in outputs().items():
            if p in stale:
                p.write_text(text, encoding="utf-8")
    return stale
