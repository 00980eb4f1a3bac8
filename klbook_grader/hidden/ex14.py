"""The graded questions of ``ex14_review`` (the review of the whole book).

Registered in :mod:`klbook_grader.hidden.bank`; the reference solutions are in
:mod:`klbook_grader.hidden.reference`.
"""
from __future__ import annotations

import numpy as np

from klbook_grader.hidden import reference as R
from klbook_grader.hidden.questions import Question, hid, pub, simplex

EXERCISE = "ex14_review"
A = np.array


def questions() -> list[Question]:
    rng = np.random.default_rng(1111)
    cases = [
        pub(np.log(A([[0.5, 0.5]])), np.log(A([[0.9, 0.1]])), why="one row"),
        pub(A([[-np.inf, 0.0]]), np.log(A([[0.3, 0.7]])), why="log p = -inf contributes 0"),
        hid(*(np.log(np.stack([simplex(rng, 5) for _ in range(4)])) for _ in range(2))),
        hid(A([[0.0, -np.inf, -np.inf], [np.log(0.5), np.log(0.5), -np.inf]]),
             np.log(A([[0.2, 0.3, 0.5], [0.1, 0.1, 0.8]])), probe="log p = -inf in several places"),
        hid(A([[np.log(0.5), np.log(0.5)]]), A([[0.0, -np.inf]]), probe="log q = -inf where p > 0"),
    ]
    return [
        Question("q1", "Why PPO and TRPO constrain KL", "choice", "answer_q1", 2, "B"),
        Question("q2", "A consequence of asymmetry", "choice", "answer_q2", 2, "C"),
        Question("q3", "KL from log-probabilities, batched", "function", "kl_from_logprobs", 4,
                 R.kl_from_logprobs, tuple(cases), rtol=1e-6, atol=1e-9),
        Question("q4", "Reading a KL spike", "choice", "answer_q4", 2, "D"),
        Question("q5", "When forward KL is the right choice", "choice", "answer_q5", 2, "B"),
    ]
