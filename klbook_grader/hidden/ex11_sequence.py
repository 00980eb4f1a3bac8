"""Graded questions of ``ex11_sequence_kl_grpo`` (chapter 11: sequence-level KL and GRPO).

The reference solutions are written here independently of the chapter's library
(``klbook_lib.rlhf.grpo``), in numpy, except :func:`kl_gradient_two_steps`, whose
reference is the gradient that autograd computes on the enumerated sequences
(``klbook_lib.seqkl``): the student derives it by hand, the grader checks it against the
exact one. ``tests/grader/test_ex11_sequence.py`` checks every reference against a second,
independent computation. Registered in :mod:`klbook_grader.hidden.bank`.
"""
from __future__ import annotations

import numpy as np

from klbook_grader.hidden.questions import Question, hid, pub

EXERCISE = "ex11_sequence_kl_grpo"
ADV_EPS = 1e-4
AGGREGATIONS = ("sequence_mean", "token_mean", "constant")


# --------------------------------------------------------------------------- references
def grpo_token_advantages(rewards, mask, group_size) -> np.ndarray:
    """GRPO's advantage of every token: (r - group mean) / (group sample std + 1e-4), 0 on pads.

    ``rewards`` is (B,), ``mask`` (B, T) with 1 on real tokens (either padding side),
    groups are ``group_size`` consecutive rows. A group of equal rewards gets 0, and so does a
    group of one response (its sample std is undefined; its reward equals its group's mean).
    """
    r = np.asarray(rewards, float)
    m = np.asarray(mask, float)
    G = int(group_size)
    out = np.zeros_like(m)
    for start in range(0, len(r), G):
        g = r[start:start + G]
        if len(g) < 2:
            continue
        adv = (g - g.mean()) / (g.std(ddof=1) + ADV_EPS)
        out[start:start + G] = adv[:, None] * m[start:start + G]
    return out


def grpo_kl_term(logp, ref_logp, mask, aggregation, max_tokens) -> float:
    """The k3 term of GRPO's loss (before beta): k3 = exp(d) - d - 1, d = ref_logp - logp.

    ``"sequence_mean"``: mean over each sequence's real tokens, then over sequences (GRPO);
    ``"token_mean"``: sum over all real tokens / their number (DAPO);
    ``"constant"``: sum over all real tokens / (B * max_tokens) (Dr. GRPO). Pads may hold
    anything (also -inf). A row without real tokens adds 0 (its count of real tokens is taken
    as at least 1, and it still counts as a sequence of the batch); a batch without any real
    token gives 0.
    """
    lp = np.asarray(logp, float)
    lq = np.asarray(ref_logp, float)
    m = np.asarray(mask, float) > 0
    d = np.where(m, lq - np.where(m, lp, 0.0), 0.0)
    k3 = np.where(m, np.expm1(d) - d, 0.0)
    if aggregation == "sequence_mean":
        return float(np.mean(k3.sum(1) / np.maximum(m.sum(1), 1)))
    if aggregation == "token_mean":
        return float(k3.sum() / max(m.sum(), 1))
    if aggregation == "constant":
        return float(k3.sum() / (m.shape[0] * int(max_tokens)))
    raise ValueError(f"aggregation: must be one of {AGGREGATIONS}, got {aggregation!r}")


def kl_gradient_two_steps(logits, ref_logits) -> np.ndarray:
    """The exact gradient of KL(pi_theta || pi_ref) over all two-token sequences, by autograd.

    Row 0 of the (V + 1, V) tables holds the first position's logits, row 1 + a those after
    the first token a. The gradient is taken on the enumerated sum (klbook_lib.seqkl).
    """
    import torch

    from klbook_lib import seqkl

    z = torch.tensor(np.asarray(logits, float), dtype=torch.float64)
    zr = torch.tensor(np.asarray(ref_logits, float), dtype=torch.float64)
    V = z.shape[1]
    space = seqkl.sequence_space(V, 2)
    # seqkl lists the prefixes breadth first: (), (0,), (1,), ...: the same rows
    assert space.prefixes == ((),) + tuple((a,) for a in range(V))
    return seqkl.exact_kl_gradient(space, z, zr).numpy()


def k3_stationary_policy(q, Q, beta) -> np.ndarray:
    """pi(a) = beta q(a) / (lam - Q(a)) with lam > max Q and sum pi = 1, by bisection."""
    q, Q, beta = np.asarray(q, float), np.asarray(Q, float), float(beta)
    lo, hi = Q.max(), Q.max() + beta
    for _ in range(300):
        mid = 0.5 * (lo + hi)
        if mid <= Q.max():
            break
        if np.sum(beta * q / (mid - Q)) > 1.0:
            lo = mid
        else:
            hi = mid
    pi = beta * q / (hi - Q)
    return pi / pi.sum()


# --------------------------------------------------------------------------- questions
def _mask(rng, B, T, left=False):
    lengths = rng.integers(1, T + 1, B)
    m = (np.arange(T)[None, :] < lengths[:, None]).astype(float)
    return m[:, ::-1].copy() if left else m


def questions() -> list:
    A = np.array
    rng = np.random.default_rng(1111_2)
    adv = [
        pub(A([1.0, 0.0, 0.0, 0.0]), A([[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]], float), 4,
             why="one group, one success, right padding"),
        pub(A([1.0, 1.0, 0.5, 0.0]), A([[1, 1], [1, 0], [1, 1], [0, 1]], float), 2,
             why="two groups; the first has equal rewards"),
        hid(rng.normal(size=8), _mask(rng, 8, 6), 4, probe="real-valued rewards, two groups"),
        hid(rng.integers(0, 2, 24).astype(float), _mask(rng, 24, 9), 8, probe="binary rewards, groups of 8"),
        hid(rng.normal(size=9), _mask(rng, 9, 5, left=True), 3, probe="left padding"),
        hid(A([0.0, 0.0, 0.0, 3.0, 3.0, 3.0]), _mask(rng, 6, 4), 3, probe="every group constant: all zero"),
    ]
    junk = _mask(rng, 5, 7)
    lp_junk = np.where(junk > 0, rng.uniform(-4, -0.1, (5, 7)), -np.inf)
    lq_junk = np.where(junk > 0, lp_junk + rng.normal(0, 1, (5, 7)), 0.0)
    kl = [
        pub(A([[-1.0, -2.0, 0.0]]), A([[-1.0, -2.0, 0.0]]), A([[1.0, 1.0, 0.0]]), "sequence_mean", 3,
             why="policy equals reference: 0"),
        pub(A([[-1.0, -0.5], [-2.0, 0.0]]), A([[-0.5, -1.0], [-1.0, 0.0]]), A([[1.0, 1.0], [1.0, 0.0]]),
             "sequence_mean", 2, why="GRPO: per-sequence mean, then mean", core=True),
        pub(A([[-1.0, -0.5], [-2.0, 0.0]]), A([[-0.5, -1.0], [-1.0, 0.0]]), A([[1.0, 1.0], [1.0, 0.0]]),
             "token_mean", 2, why="DAPO: mean over all real tokens"),
        pub(A([[-1.0, -0.5], [-2.0, 0.0]]), A([[-0.5, -1.0], [-1.0, 0.0]]), A([[1.0, 1.0], [1.0, 0.0]]),
             "constant", 4, why="Dr. GRPO: sum / (B * max_tokens)"),
    ]
    for agg in AGGREGATIONS:
        m = _mask(rng, 6, 8)
        lp = rng.uniform(-5, -0.05, (6, 8))
        kl.append(hid(lp, lp + rng.normal(0, 0.7, (6, 8)), m, agg, 10, probe=f"{agg}, padded batch",
                      core=True))
        kl.append(hid(lp_junk, lq_junk, junk, agg, 7, probe=f"{agg}, -inf on the pads", core=True))
    grad = [
        pub(np.zeros((3, 2)), np.zeros((3, 2)), why="pi_theta = pi_ref: zero gradient"),
        pub(A([[1.0, 0.0], [0.0, 0.0], [0.5, -0.5]]), np.zeros((3, 2)), why="two tokens, uniform reference"),
    ] + [hid(rng.normal(0, 1.5, (V + 1, V)), rng.normal(0, 1.0, (V + 1, V)), probe=f"random policies, V = {V}")
         for V in (2, 3, 3, 5)]
    return [
        Question("q1", "Group-relative advantages with padding", "function", "grpo_token_advantages", 3,
                 grpo_token_advantages, tuple(adv), rtol=1e-6, atol=1e-9),
        Question("q2", "GRPO's KL term and its normalisations", "function", "grpo_kl_term", 3,
                 grpo_kl_term, tuple(kl), rtol=1e-6, atol=1e-10),
        Question("q3", "The exact gradient of a two-token sequence KL", "function", "kl_gradient_two_steps", 4,
                 kl_gradient_two_steps, tuple(grad), rtol=1e-6, atol=1e-9),
        Question("q4", "Which implementation is exact?", "choice", "answer_q4", 2, "C"),
        Question("q5", "Where reward plus the k3 loss stops", "value", "answer_q5", 3,
                 lambda: k3_stationary_policy([0.5, 0.3, 0.2], [1.0, 0.0, 0.5], 0.2), rtol=0.0, atol=1e-4),
        Question("q6", "The normalisation that turns the gradient", "choice", "answer_q6", 2, "A"),
    ]
