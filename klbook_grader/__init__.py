"""Graded exercises: public checks for students and an autograder for teachers.

In a notebook::

    from klbook_grader import checker_for
    check = checker_for("ex01_kl_definition")
    check("q1")

From a shell: ``klbook grade exercises/ex01_kl_definition.ipynb`` (see ``grading.md``).
This module imports nothing secret: reference solutions and hidden tests live in
:mod:`klbook_grader.hidden`, which only the grader's own process loads; the
notebook being graded runs in a bubblewrap sandbox (:mod:`klbook_grader.sandbox`).
"""
from __future__ import annotations


def checker_for(exercise: str):
    """Return the ``check(question=None)`` function of an exercise notebook."""
    from klbook_grader.checker import checker_for as _checker_for

    return _checker_for(exercise)


def grade(notebook, **kwargs) -> dict:
    """Grade a notebook in a sandbox (see :func:`klbook_grader.grader.grade`)."""
    from klbook_grader.grader import grade as _grade

    return _grade(notebook, **kwargs)
