"""Graded questions of exercise 13 ("KL as a tool"), with their reference solutions.

Registered in :mod:`klbook_grader.hidden.bank` under ``"ex13_kl_as_a_tool"``. The
reference functions are tested against independent computations in ``tests/grader/test_ex13.py``.
"""
from __future__ import annotations

import math

import numpy as np
from scipy import optimize

from klbook_grader.hidden.questions import Question, hid, pub

EXERCISE = "ex13_kl_as_a_tool"
GAUGE_TARGET = 0.5          # nats, question 3


# ----------------------------------------------------------------------------- references

def kl_to_uniform(logits) -> np.ndarray:
    """``KL(softmax(logits) || uniform) = log|A| - H`` over the last axis (stable for huge logits)."""
    z = np.asarray(logits, dtype=float)
    z = z - z.max(axis=-1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(axis=-1, keepdims=True))
    p = np.exp(logp)
    neg_entropy = np.where(p > 0, p * logp, 0.0).sum(axis=-1)
    return np.maximum(neg_entropy + math.log(z.shape[-1]), 0.0)


def episode_average(values, done) -> float:
    """Per-episode-then-batch average of a ``(T, N)`` batch: the mean of every episode
    fragment (a new one starts at ``t = 0`` and after every ``done``), then the plain mean of
    those fragment means."""
    v = np.asarray(values, dtype=float)
    d = np.asarray(done, dtype=bool)
    means = []
    for n in range(v.shape[1]):
        start = 0
        for t in range(v.shape[0]):
            if d[t, n] or t == v.shape[0] - 1:
                means.append(v[start:t + 1, n].mean())
                start = t + 1
    return float(np.mean(means))


def gauge_probability(target: float = GAUGE_TARGET) -> float:
    """The probability ``p >= 1/2`` of the likelier of two actions whose gauge
    ``log 2 + p log p + (1 - p) log(1 - p)`` equals ``target`` (0 < target < log 2)."""
    f = lambda p: math.log(2) + p * math.log(p) + (1 - p) * math.log(1 - p) - target  # noqa: E731
    return optimize.brentq(f, 0.5, 1 - 1e-15, xtol=1e-14)


# ----------------------------------------------------------------------------- questions

def questions():
    A = np.array
    rng = np.random.default_rng(1313)
    gauge_cases = [
        pub(A([[0.0, 0.0, 0.0]]), why="the uniform policy: 0"),
        pub(A([[2.0, 0.0], [0.0, 2.0]]), why="two rows, two actions"),
        pub(A([[1000.0, 0.0, 0.0, 0.0]]), why="huge logits: nearly deterministic, log 4"),
    ] + [hid(rng.normal(0, s, (5, k))) for s, k in ((1.0, 3), (5.0, 6), (30.0, 10))] + [
        hid(A([[-700.0, 700.0, 0.0], [1e-3, 0.0, -1e-3]])),
        hid(rng.normal(0, 2, (2, 3, 4))),
        hid(A([[5.0, 5.0, 5.0, 5.0, 5.0]])),
    ]
    avg_cases = [
        pub(A([[1.0, 4.0], [1.0, 4.0], [5.0, 4.0], [5.0, 0.0]]),
             A([[0, 0], [1, 0], [0, 0], [0, 0]]), why="one episode ends in copy 1"),
        pub(A([[1.0, 2.0, 3.0]]), A([[1, 1, 1]]), why="one step, every copy finishes"),
        pub(A([[2.0], [4.0], [6.0]]), A([[0], [0], [0]]), why="nothing ends: the plain mean"),
    ]
    for T, N, p in ((8, 4, 0.3), (5, 6, 0.6), (12, 2, 0.15), (3, 3, 1.0)):
        avg_cases.append(hid(rng.random((T, N)), (rng.random((T, N)) < p).astype(float)))
    avg_cases.append(hid(A([[1.0], [2.0], [3.0], [10.0]]), A([[0], [0], [1], [0]])))
    return [
        Question("q1", "The exploration gauge", "function", "kl_to_uniform", 3,
                 kl_to_uniform, tuple(gauge_cases), rtol=1e-6, atol=1e-9),
        Question("q2", "Averaging per episode", "function", "episode_average", 4,
                 episode_average, tuple(avg_cases), rtol=1e-9, atol=1e-12),
        Question("q3", "A gauge of half a nat", "value", "answer_q3", 2,
                 lambda: gauge_probability(GAUGE_TARGET), rtol=0.0, atol=1e-4),
        Question("q4", "Reading the gauge", "choice", "answer_q4", 2, "C"),
        Question("q5", "A penalty against forgetting", "choice", "answer_q5", 2, "B"),
    ]
