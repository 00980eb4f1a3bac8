"""The graded questions of ``ex02_forward_reverse`` (chapter 2: forward and reverse KL).

Registered in :mod:`klbook_grader.hidden.bank`; the reference solutions are in
:mod:`klbook_grader.hidden.reference`.
"""
from __future__ import annotations

import numpy as np

from klbook_grader.hidden import reference as R
from klbook_grader.hidden.questions import Question, REL, hid, pub

EXERCISE = "ex02_forward_reverse"
A = np.array


def questions() -> list[Question]:
    rng = np.random.default_rng(202)
    fit_cases = [
        pub(A([0.5, 0.5]), A([-3.0, 3.0]), A([1.0, 1.0]), why="symmetric bimodal target"),
        pub(A([1.0]), A([2.0]), A([0.5]), why="a single Gaussian fits itself"),
        pub(A([0.8, 0.2]), A([0.0, 5.0]), A([1.0, 0.5]), why="unequal weights"),
    ]
    for k in (2, 3, 5):
        fit_cases.append(hid(rng.dirichlet(np.ones(k)), rng.normal(0, 4, k), rng.uniform(0.3, 2, k),
                              probe="the variance includes the spread of the means"))
    mix = ([0.5, 0.5], [-3.0, 3.0], [1.0, 1.0])
    return [
        Question("q1", "Which direction is mode seeking?", "choice", "answer_q1", 2, "B"),
        Question("q2", "The forward-KL Gaussian fit", "function", "forward_kl_gaussian_fit", 4,
                 R.forward_kl_gaussian_fit, tuple(fit_cases), rtol=1e-6, atol=1e-9),
        Question("q3", "Reverse KL of two candidate fits", "value", "answer_q3", 3,
                 lambda: [R.reverse_kl_gauss_to_mixture(3.0, 1.0, *mix),
                          R.reverse_kl_gauss_to_mixture(*R.forward_kl_gaussian_fit(*mix), *mix)],
                 **REL),
        Question("q4", "Covering every mode of an expert", "choice", "answer_q4", 2, "A"),
    ]
