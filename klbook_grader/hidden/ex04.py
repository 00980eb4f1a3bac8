"""The graded questions of ``ex04_estimating_kl`` (chapter 4: estimating KL).

Registered in :mod:`klbook_grader.hidden.bank`; the reference solutions are in
:mod:`klbook_grader.hidden.reference`.
"""
from __future__ import annotations

import numpy as np

from klbook_grader.hidden import reference as R
from klbook_grader.hidden.questions import Question, REL, hid, pub

EXERCISE = "ex04_estimating_kl"
A = np.array


def questions() -> list[Question]:
    rng = np.random.default_rng(404)
    k3_cases = [
        pub(A([0.0, 0.0]), why="identical log-probabilities"),
        pub(A([0.5, -0.5, 2.0]), why="a few log-ratios"),
        pub(A([1e-9, -1e-9]), why="tiny log-ratios: k3 is about lr^2/2"),
        hid(rng.normal(0, 0.1, 50)), hid(rng.normal(0, 2, 50)),
        hid(A([-30.0, -5.0, 5.0, 10.0]), probe="large log-ratios of both signs"),
    ]
    est_cases = [
        pub(A([0.1, -0.2, 0.3, -0.4]), why="four samples"),
        pub(A([0.0]), why="one sample, no difference"),
        hid(rng.normal(-0.05, 0.3, 200)), hid(rng.normal(-1.0, 1.5, 1000)),
    ]
    grads = [
        pub(A([0.0, 0.0]), A([0.0, 0.0]), why="p = q: every gradient is 0"),
        pub(A([1.0, 0.0, -1.0]), A([0.0, 0.0, 0.0]), why="three tokens, uniform reference"),
        hid(rng.normal(0, 1, 5), rng.normal(0, 1, 5)),
        hid(rng.normal(0, 2, 10), rng.normal(0, 2, 10)),
        hid(A([4.0, 0.0, 0.0]), A([0.0, 0.0, 4.0]), probe="a policy far from its reference"),
        hid(A([1000.0, 1001.0, 0.0]), A([0.0, 0.0, 0.0]), probe="logits of size 1000: exp overflows"),
    ]
    return [
        Question("q1", "The k3 estimator", "function", "k3", 3, R.k3, tuple(k3_cases),
                 rtol=1e-6, atol=1e-12),
        Question("q2", "Averages of k1, k2 and k3", "function", "kl_estimates", 3, R.kl_estimates,
                 tuple(est_cases), rtol=1e-6, atol=1e-12),
        Question("q3", "The bias of k2 for two Gaussians", "value", "answer_q3", 3,
                 lambda: R.k2_bias_gaussian(0.5), **REL),
        Question("q4", "Which estimator can be negative?", "choice", "answer_q4", 2, "A"),
        Question("q5", "Which loss has the forward-KL gradient?", "choice", "answer_q5", 2, "C"),
        Question("q6", "Expected gradients of k1, k2, k3 in the reward and in the loss", "function",
                 "kl_gradients", 4, R.kl_gradients_autograd, tuple(grads), rtol=1e-6, atol=1e-10),
    ]
