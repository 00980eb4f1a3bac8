"""The graded questions of ``ex10_other_divergences`` (chapter 10: other divergences).

Registered in :mod:`klbook_grader.hidden.bank`; the reference solutions are in
:mod:`klbook_grader.hidden.reference`.
"""
from __future__ import annotations

import numpy as np

from klbook_grader.hidden import reference as R
from klbook_grader.hidden.questions import Question, hid, pub, simplex

EXERCISE = "ex10_other_divergences"
A = np.array


def questions() -> list[Question]:
    rng = np.random.default_rng(1010)
    pairs_pub = [
        (A([0.5, 0.5]), A([0.5, 0.5]), "identical distributions"),
        (A([1.0, 0.0]), A([0.0, 1.0]), "disjoint supports"),
        (A([0.2, 0.3, 0.5]), A([0.4, 0.4, 0.2]), "three outcomes"),
    ]
    hidden = [(simplex(rng, 5), simplex(rng, 5)), (simplex(rng, 8, 3), simplex(rng, 8, 2)),
              (A([0.3, 0.7, 0.0]), A([0.0, 0.0, 1.0]))]
    js = [pub(p, q, why=w) for p, q, w in pairs_pub] + [hid(p, q) for p, q in hidden]
    tv = [pub(p, q, why=w) for p, q, w in pairs_pub] + [hid(p, q) for p, q in hidden]
    w1 = [
        pub(A([0.0, 1.0, 2.0]), A([1.0, 0.0, 0.0]), A([0.0, 0.0, 1.0]), why="all mass moved by 2"),
        pub(A([0.0, 1.0]), A([0.5, 0.5]), A([0.5, 0.5]), why="identical"),
        hid(np.sort(rng.normal(0, 3, 7)), simplex(rng, 7), simplex(rng, 7)),
        hid(A([-1.0, 0.0, 0.5, 4.0]), A([0.1, 0.2, 0.3, 0.4]), A([0.4, 0.3, 0.2, 0.1])),
    ]
    return [
        Question("q1", "Jensen-Shannon divergence", "function", "js_divergence", 3, R.js_divergence,
                 tuple(js), rtol=1e-6, atol=1e-9),
        Question("q2", "Total variation distance", "function", "tv_distance", 2, R.tv_distance,
                 tuple(tv), rtol=1e-6, atol=1e-9),
        Question("q3", "Wasserstein-1 on a line", "function", "wasserstein1", 3, R.wasserstein1,
                 tuple(w1), rtol=1e-6, atol=1e-9),
        Question("q4", "Disjoint supports", "choice", "answer_q4", 2, "C"),
    ]
