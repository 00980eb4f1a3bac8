"""The registry of graded exercises: each exercise's module, by the exercise's name.

A question and its cases are defined in :mod:`klbook_grader.hidden.questions`; each
exercise's questions live in their own module (``ex01`` ... ``ex14``, and the projects, ``project1``, ``project2``, ``project3``), which defines
``EXERCISE`` (the notebook's name) and ``questions()``. This module imports them all plainly
and is what the grader, ``klbook make-student`` and the release use:
:func:`exercise_names` and :func:`questions`. A new exercise adds its module to
:data:`MODULES`.
"""
from __future__ import annotations

import dataclasses
from types import ModuleType

from klbook_grader.hidden import (ex01, ex02, ex03, ex04, ex05, ex06, ex07, ex08, ex09, ex10,
                                       ex11_sequence, ex12, ex13, ex14, ex14_offpolicy,
                                       ex15_exploration, project1, project2, project3)
from klbook_grader.hidden.choices import EXPLAIN
from klbook_grader.hidden.questions import Question

# in the order the grader has always listed them (ex14, the review, used to come after ex10)
MODULES: tuple[ModuleType, ...] = (ex01, ex02, ex03, ex04, ex05, ex06, ex07, ex08, ex09, ex10, ex14,
                                   ex13, ex11_sequence, ex12, ex14_offpolicy, ex15_exploration,
                                   project1, project2, project3)
REGISTRY: dict[str, ModuleType] = {m.EXERCISE: m for m in MODULES}


def exercise_names() -> list[str]:
    """The names of every graded exercise notebook (``exNN_...``)."""
    return list(REGISTRY)


def questions(exercise: str) -> list[Question]:
    """The questions of one exercise, each choice question with its reasons why a wrong letter
    is wrong (:data:`klbook_grader.hidden.choices.EXPLAIN`); ValueError for an unknown name."""
    if exercise not in REGISTRY:
        raise ValueError(f"exercise: unknown exercise {exercise!r}")
    return [dataclasses.replace(q, explain=EXPLAIN[(exercise, q.id)])
            if q.kind == "choice" and (exercise, q.id) in EXPLAIN else q
            for q in REGISTRY[exercise].questions()]
