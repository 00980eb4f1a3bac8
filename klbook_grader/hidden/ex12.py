"""Graded questions of exercise 12 ("over-optimisation and distillation"), with reference solutions.

Registered in :mod:`klbook_grader.hidden.bank` under ``"ex12_overoptimisation_distillation"``.
The references are plain numpy, written independently of ``klbook_lib.rlhf.overopt`` and
``klbook_lib.rlhf.distill``; ``tests/grader/test_ex12.py`` checks them against those modules and against
brute-force enumeration.
"""
from __future__ import annotations

import math

import numpy as np

from klbook_grader.hidden.questions import Question, hid, pub, simplex

EXERCISE = "ex12_overoptimisation_distillation"

# Question 4: measured best-of-n gold rewards (relative to n = 1) at n = 1, 2, 4, ..., 256.
Q4_N = [1, 2, 4, 8, 16, 32, 64, 128, 256]
Q4_GOLD = [0.0, 0.231, 0.398, 0.521, 0.597, 0.655, 0.672, 0.683, 0.664]


# ----------------------------------------------------------------------------- references

def bon_kl(probs, scores, n) -> float:
    """Exact ``KL(best-of-n || pi)`` on a discrete space; ties broken uniformly at random.

    Outcome ``y`` with score ``s`` is picked with probability
    ``p(y) * (F(s)**n - F(s-)**n) / (F(s) - F(s-))``.
    """
    p = np.asarray(probs, dtype=float)
    s = np.asarray(scores, dtype=float)
    n = int(n)
    kl = 0.0
    for value in np.unique(s):
        tied = s == value
        group = p[tied].sum()
        if group <= 0:
            continue
        below = p[s < value].sum()
        q_group = (below + group) ** n - below ** n        # probability that the pick lands in this group
        if q_group > 0:
            kl += q_group * math.log(q_group / group)       # same ratio q/p for every outcome of the group
    return float(kl)


def bon_expected(selector, values, n) -> float:
    """Mean over all size-``n`` subsets of a pool of the ``values`` entry with the largest ``selector``.

    Sorted by the selector, the ``i``-th smallest of ``m`` is the best of ``C(i-1, n-1)`` of the
    ``C(m, n)`` subsets.
    """
    sel = np.asarray(selector, dtype=float)
    val = np.asarray(values, dtype=float)
    m, n = len(sel), int(n)
    order = np.argsort(sel, kind="stable")
    weights = np.array([math.comb(i - 1, n - 1) for i in range(1, m + 1)], dtype=float) / math.comb(m, n)
    return float(val[order] @ weights)


def sequence_reverse_kl(student_logits, teacher_logits, mask) -> np.ndarray:
    """``sum_t KL(q(.|t) || p(.|t))`` over each row's real tokens: logits ``[B, T, V]``, mask ``[B, T]``."""
    s = np.asarray(student_logits, dtype=float)
    t = np.asarray(teacher_logits, dtype=float)
    m = np.asarray(mask, dtype=float) > 0.5

    def log_softmax(z):
        z = z - z.max(-1, keepdims=True)
        return z - np.log(np.exp(z).sum(-1, keepdims=True))

    logq, logp = log_softmax(s), log_softmax(t)
    per_token = (np.exp(logq) * (logq - logp)).sum(-1)
    return np.where(m, per_token, 0.0).sum(-1)


def fit_bon_and_peak(n_values=Q4_N, gold=Q4_GOLD) -> list[float]:
    """Least-squares ``gold = alpha d - beta d^2`` with ``d = sqrt(log n - (n-1)/n)``; ``[alpha, beta, d*]``."""
    d = np.sqrt([math.log(n) - (n - 1) / n for n in n_values])
    X = np.stack([d, -d ** 2], axis=1)
    alpha, beta = np.linalg.lstsq(X, np.asarray(gold, dtype=float), rcond=None)[0]
    return [float(alpha), float(beta), float(alpha / (2 * beta))]


# ----------------------------------------------------------------------------- questions

def questions():
    A = np.array
    rng = np.random.default_rng(1212)
    kl_cases = [
        pub(A([0.25, 0.25, 0.25, 0.25]), A([1.0, 2.0, 3.0, 4.0]), 2, why="four equal atoms, best of 2"),
        pub(A([0.5, 0.5]), A([1.0, 1.0]), 3, why="a tie between all outcomes: KL 0"),
        pub(A([0.5, 0.25, 0.25]), A([9.0, 1.0, 2.0]), 8, why="half the mass on the best outcome"),
        hid(simplex(rng, 6), rng.normal(size=6), 1),
        hid(simplex(rng, 8), rng.integers(0, 3, 8).astype(float), 4),        # many ties
        hid(simplex(rng, 7, zeros=2), rng.normal(size=7), 5),                # outcomes of probability 0
        hid(np.full(50, 0.02), np.arange(50.0), 16),
        hid(simplex(rng, 5), A([3.0, 3.0, 1.0, 0.0, 3.0]), 64),
    ]
    pool_cases = [
        pub(A([0.3, 0.1, 0.9, 0.5]), A([1.0, 2.0, 3.0, 4.0]), 2, why="a pool of four, best of two"),
        pub(A([0.3, 0.1, 0.9, 0.5]), A([1.0, 2.0, 3.0, 4.0]), 4, why="n = m: the pick is the argmax"),
        pub(A([0.3, 0.1, 0.9]), A([1.0, 2.0, 3.0]), 1, why="n = 1: the plain mean"),
    ]
    for m, n in ((10, 3), (20, 1), (20, 7), (15, 15), (30, 12)):
        pool_cases.append(hid(rng.permutation(m) + rng.random(m) * 0.5, rng.normal(size=m), n))
    B, T, V = 3, 5, 6
    mask_right = A([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 0, 0, 0, 0]], dtype=float)
    mask_left = A([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1], [0, 0, 0, 0, 1]], dtype=float)
    seq_cases = [
        pub(A([[[0.0, 0.0]]]), A([[[0.0, 0.0]]]), A([[1.0]]), why="identical distributions: 0"),
        pub(A([[[1.0, 0.0], [0.0, 0.0]]]), A([[[0.0, 1.0], [5.0, -5.0]]]), A([[1.0, 0.0]]),
             why="the second position is a pad"),
        pub(rng.normal(0, 1, (2, 3, 4)), rng.normal(0, 1, (2, 3, 4)), A([[1, 1, 1], [1, 1, 0]], dtype=float),
             why="two rows, right padding"),
    ]
    for mask, scale in ((mask_right, 1.0), (mask_left, 3.0)):
        s, t = rng.normal(0, scale, (B, T, V)), rng.normal(0, scale, (B, T, V))
        s[mask == 0] = 500.0                                   # whatever the pads hold must not count
        t[mask == 0] = -500.0
        seq_cases.append(hid(s, t, mask))
    seq_cases.append(hid(A([[[800.0, 0.0, -800.0], [0.0, 0.0, 0.0]]]), A([[[0.0, 0.0, 0.0], [700.0, 0.0, 1.0]]]),
                          A([[1.0, 1.0]])))
    seq_cases.append(hid(rng.normal(0, 2, (4, 7, 3)), rng.normal(0, 2, (4, 7, 3)),
                          (np.arange(7)[None, :] < A([[7], [3], [1], [5]])).astype(float)))
    return [
        Question("q1", "The exact KL of best-of-n", "function", "bon_kl", 4, bon_kl, tuple(kl_cases),
                 rtol=1e-6, atol=1e-9),
        Question("q2", "Best-of-n from one pool", "function", "bon_expected", 3, bon_expected,
                 tuple(pool_cases), rtol=1e-6, atol=1e-9),
        Question("q3", "The sequence-level reverse KL of a padded batch", "function", "sequence_reverse_kl", 4,
                 sequence_reverse_kl, tuple(seq_cases), rtol=1e-6, atol=1e-8),
        Question("q4", "Fitting the best-of-n form", "value", "answer_q4", 3, fit_bon_and_peak,
                 rtol=1e-3, atol=1e-4),
        Question("q5", "A student that stops at once", "choice", "answer_q5", 2, "B"),
        Question("q6", "The control for over-optimisation", "choice", "answer_q6", 2, "C"),
    ]
