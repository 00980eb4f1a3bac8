"""The graded questions of ``ex01_kl_definition`` (chapter 1: the definition of KL).

Registered in :mod:`klbook_grader.hidden.bank`; the reference solutions are in
:mod:`klbook_grader.hidden.reference`.
"""
from __future__ import annotations

import numpy as np

from klbook_grader.hidden import reference as R
from klbook_grader.hidden.questions import Question, REL, hid, pub, simplex

EXERCISE = "ex01_kl_definition"
A = np.array


def questions() -> list[Question]:
    rng = np.random.default_rng(101)
    kl_cases = [
        pub(A([0.5, 0.5]), A([0.9, 0.1]), why="two outcomes"),
        pub(A([0.2, 0.3, 0.5]), A([0.2, 0.3, 0.5]), why="identical distributions"),
        pub(A([0.0, 0.4, 0.6]), A([0.1, 0.3, 0.6]), why="p has a zero: 0 log 0 = 0"),
        pub(A([0.5, 0.5, 0.0]), A([1.0, 0.0, 0.0]), why="q is zero where p is not"),
    ] + [hid(simplex(rng, k), simplex(rng, k)) for k in (3, 5, 10, 50)] + [
        hid(simplex(rng, 6, zeros=2), simplex(rng, 6), probe="zeros in p"),
        hid(A([0.0, 0.0, 1.0]), A([0.25, 0.25, 0.5]), probe="zeros in p"),
        hid(A([0.3, 0.7, 0.0, 0.0]), A([0.3, 0.0, 0.4, 0.3]), probe="q = 0 where p > 0"),
        hid(A([1e-12, 1 - 1e-12]), A([0.5, 0.5]), probe="a probability of 1e-12"),
    ]
    logit_cases = [
        pub(A([[0.0, 1.0, 2.0]]), A([[2.0, 1.0, 0.0]]), why="one row"),
        pub(A([[1000.0, 0.0, -1000.0]]), A([[999.0, 1000.0, 0.0]]), why="huge logits"),
        # shifted logits give KL 0; the second row moved, so that no case is all zeros
        # (a function returning zeros must not earn any of the question's points)
        pub(A([[5.0, 5.0], [0.0, 3.0]]), A([[105.0, 105.0], [1.0, 2.0]]),
            why="the first row's logits shifted: KL 0 there"),
    ] + [hid(rng.normal(0, s, (4, 7)), rng.normal(0, s, (4, 7))) for s in (1.0, 10.0)] + [
        hid(A([[-800.0, 800.0, 0.0], [700.0, 701.0, -5.0]]), A([[0.0, 0.0, 0.0], [-700.0, 0.0, 1.0]]),
             probe="logits of size 800: exp overflows"),
        hid(rng.normal(0, 3, (2, 3, 5)), rng.normal(0, 3, (2, 3, 5)), probe="a 3-d batch"),
    ]
    return [
        Question("q1", "kl_categorical", "function", "kl_categorical", 4, R.kl_categorical,
                 tuple(kl_cases), rtol=1e-6, atol=1e-9),
        Question("q2", "KL from logits, numerically stable", "function", "kl_from_logits", 4,
                 R.kl_from_logits, tuple(logit_cases), rtol=1e-6, atol=1e-8),
        Question("q3", "KL between two Gaussians", "value", "answer_q3", 2,
                 lambda: R.gaussian_kl(0.0, 1.0, 1.0, 2.0), **REL),
        Question("q4", "Properties of KL", "choice", "answer_q4", 2, "C"),
    ]
