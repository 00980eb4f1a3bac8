"""The graded questions of ``ex06_rlhf_reverse_kl`` (chapter 6: RLHF's reverse KL).

Registered in :mod:`klbook_grader.hidden.bank`; the reference solutions are in
:mod:`klbook_grader.hidden.reference`.
"""
from __future__ import annotations

import numpy as np

from klbook_grader.hidden import reference as R
from klbook_grader.hidden.questions import Question, REL, hid, pub

EXERCISE = "ex06_rlhf_reverse_kl"
A = np.array


def questions() -> list[Question]:
    rng = np.random.default_rng(606)
    shaped = [
        pub(A([1.0]), A([[-1.0, -2.0]]), A([[-1.0, -2.0]]), 0.1, why="policy equals reference"),
        pub(A([2.0, 0.0]), A([[-0.5, -0.5], [-3.0, -1.0]]), A([[-1.0, -1.0], [-1.0, -1.0]]), 0.5,
             why="two sequences"),
        hid(rng.normal(0, 1, 8), rng.normal(-2, 1, (8, 6)), rng.normal(-2, 1, (8, 6)), 0.05,
             probe="the KL summed over tokens, not averaged"),
        hid(rng.normal(0, 1, 3), rng.normal(-2, 1, (3, 1)), rng.normal(-2, 1, (3, 1)), 1.0),
    ]
    return [
        Question("q1", "The KL-shaped sequence reward", "function", "kl_shaped_reward", 4,
                 R.kl_shaped_reward, tuple(shaped)),
        Question("q2", "The optimal policy of a KL-regularised bandit", "value", "answer_q2", 3,
                 lambda: R.optimal_policy([0.5, 0.3, 0.2], [1.0, 2.0, 0.0], 0.5), **REL),
        Question("q3", "Not a reason for reverse KL", "choice", "answer_q3", 2, "D"),
        Question("q4", "A coefficient that is too small", "choice", "answer_q4", 2, "B"),
    ]
