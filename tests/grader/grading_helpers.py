"""What the grader's tests share: the ex01 master's code cells, notebooks written from cells,
the scores and messages of a grading result, and a set of wrong answers."""
from __future__ import annotations

import re
from pathlib import Path

import nbformat

from klbook_grader import grader, student

REPO = Path(grader.__file__).resolve().parents[1]      # the checkout whose grader is under test
MASTERS = REPO / "exercises" / "masters"

# full marks of ex01, question by question
FULL = {"q1": 4, "q2": 4, "q3": 2, "q4": 2}

WRONG_ANSWERS = '''
def kl_categorical(p, q):
    return 12345.0

def kl_from_logits(logits_p, logits_q):
    return np.full(np.shape(logits_p)[:-1], 12345.0)

answer_q3 = 0.0
answer_q4 = "A"
'''


def master_cells(name: str = "ex01_kl_definition") -> list[str]:
    """The code cells of a master notebook."""
    nb = nbformat.read(MASTERS / f"{name}.ipynb", as_version=4)
    return [c.source for c in nb.cells if c.cell_type == "code"]


def write_nb(folder: Path, cells: list[str], name: str = "ex01_kl_definition.ipynb",
             metadata: dict | None = None) -> Path:
    """A notebook of ``cells`` (code) written to ``folder/name``."""
    folder.mkdir(parents=True, exist_ok=True)
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    if metadata:
        nb.metadata.update(metadata)
    path = folder / name
    nbformat.write(nb, path)
    return path


def points(result: dict) -> dict:
    return {q["id"]: q["points"] for q in result["questions"]}


def messages(result: dict, qid: str) -> str:
    return " | ".join(next(q for q in result["questions"] if q["id"] == qid)["messages"])


def replace_function(cells: list[str], name: str, new: str) -> list[str]:
    """Replace the definition of ``name`` (up to the next top-level statement) by ``new``."""
    hits = [i for i, c in enumerate(cells) if re.search(rf"^def {name}\(", c, re.M)]
    assert len(hits) == 1, name
    src = cells[hits[0]]
    start = re.search(rf"^def {name}\(", src, re.M).start()
    rest = src[start:].split("\n")
    end = next((i for i, line in enumerate(rest[1:], 1) if line and not line[0].isspace()), len(rest))
    out = list(cells)
    out[hits[0]] = src[:start] + student.strip_solutions(new) + "\n" + "\n".join(rest[end:])
    return out
