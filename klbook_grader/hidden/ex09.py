"""The graded questions of ``ex09_choosing_beta`` (chapter 9: choosing beta).

Registered in :mod:`klbook_grader.hidden.bank`; the reference solutions are in
:mod:`klbook_grader.hidden.reference`.
"""
from __future__ import annotations

import numpy as np

from klbook_grader.hidden import reference as R
from klbook_grader.hidden.questions import Question, REL, hid, pub, simplex

EXERCISE = "ex09_choosing_beta"
A = np.array


def questions() -> list[Question]:
    rng = np.random.default_rng(909)
    opt = [
        pub(A([0.5, 0.5]), A([0.0, 0.0]), 1.0, why="equal rewards: pi* = pi_ref"),
        pub(A([0.5, 0.3, 0.2]), A([1.0, 0.0, 0.0]), 1.0, why="one better action"),
        pub(A([0.25, 0.25, 0.5]), A([1.0, 2.0, 0.0]), 1e-3, why="tiny beta: no overflow"),
        hid(simplex(rng, 5), rng.normal(0, 1, 5), 0.3), hid(simplex(rng, 8), rng.normal(0, 3, 8), 1e-4),
        hid(simplex(rng, 4), rng.normal(0, 1, 4), 100.0),
    ]
    frontier = [
        pub(A([0.5, 0.5]), A([1.0, 0.0]), A([1.0]), why="one beta"),
        hid(A([0.5, 0.3, 0.2]), A([1.0, 2.0, 0.0]), A([0.1, 0.5, 2.0, 10.0])),
        hid(simplex(rng, 6), rng.normal(0, 1, 6), A([0.05, 0.2, 1.0])),
    ]
    return [
        Question("q1", "The optimal policy for a given beta", "function", "optimal_policy", 3,
                 R.optimal_policy, tuple(opt), rtol=1e-6, atol=1e-9),
        Question("q2", "The reward-KL frontier", "function", "kl_reward_frontier", 3,
                 R.kl_reward_frontier, tuple(frontier), rtol=1e-6, atol=1e-9),
        Question("q3", "The beta that hits a KL budget", "value", "answer_q3", 3,
                 lambda: R.beta_for_kl([0.5, 0.3, 0.2], [1.0, 2.0, 0.0], 0.1), **REL),
        Question("q4", "What an adaptive controller does above target", "choice", "answer_q4", 2, "A"),
    ]
