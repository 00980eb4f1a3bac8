"""Graded questions of ``ex15_exploration_anchors_optimum`` (chapter 15: exploration, anchors and
the shape of the optimum).

The reference solutions are written here independently of the chapter's library
(``klbook_lib.shape``, ``klbook_lib.optimal``, ``klbook_lib.dpo``): plain Python loops over the
rows of a batch with ``math`` functions, each softmax and log-sigmoid in its stable log-space form.
``tests/grader/test_ex15_exploration.py`` checks them against the library, autograd and finite
differences, and that the classic wrong answers lose their points. Registered in
:mod:`klbook_grader.hidden.bank`.
"""
from __future__ import annotations

import math

import numpy as np

from klbook_grader.hidden.questions import REL, Question, hid, pub, simplex

EXERCISE = "ex15_exploration_anchors_optimum"
LINKS = ("dpo", "chipo")


# --------------------------------------------------------------------------- references
def _log_softmax_row(z) -> list[float]:
    """``log softmax(z)`` of one row of logits, ``-inf`` kept as ``-inf``."""
    top = max(z)
    s = sum(math.exp(x - top) for x in z if x != -math.inf)
    lse = top + math.log(s)
    return [x - lse if x != -math.inf else -math.inf for x in z]


def _entropy_row(z) -> float:
    lp = _log_softmax_row(z)
    return -sum(math.exp(v) * v for v in lp if v != -math.inf)


def _kl_rows(z_p, z_q) -> float:
    """``KL(softmax(z_p) || softmax(z_q))``, an expectation under the first."""
    lp, lq = _log_softmax_row(z_p), _log_softmax_row(z_q)
    return sum(math.exp(a) * (a - b) for a, b in zip(lp, lq) if a != -math.inf)


def optimal_policy(pi_ref, r, beta) -> np.ndarray:
    """``pi*(a) = pi_ref(a) exp(r(a) / beta) / Z`` for every row (prompt) of a ``(B, K)`` batch,
    through ``log pi_ref + r / beta`` and its maximum; ``pi* = 0`` where ``pi_ref = 0``."""
    q, rr = np.asarray(pi_ref, float), np.asarray(r, float)
    out = np.zeros(q.shape)
    for b in range(q.shape[0]):
        s = [math.log(q[b, k]) + rr[b, k] / beta if q[b, k] > 0 else -math.inf for k in range(q.shape[1])]
        lp = _log_softmax_row(s)
        out[b] = [math.exp(v) if v != -math.inf else 0.0 for v in lp]
    return out


def clip_higher_surrogate(logp, old_logp, advantage, mask, eps_low, eps_high) -> np.ndarray:
    """Per token ``min(rho A, clip(rho, 1 - eps_low, 1 + eps_high) A)`` with ``rho = pi / pi_old``;
    0 on the pads."""
    lp, lo, a = (np.asarray(x, float) for x in (logp, old_logp, advantage))
    m = np.asarray(mask, float) > 0
    out = np.zeros(lp.shape)
    for idx in np.ndindex(lp.shape):
        if not m[idx]:
            continue
        rho = math.exp(lp[idx] - lo[idx])
        clipped = min(max(rho, 1.0 - eps_low), 1.0 + eps_high)
        out[idx] = min(rho * a[idx], clipped * a[idx])
    return out


def entropy_probe(logits, delta) -> np.ndarray:
    """``[H(pi), H(pi') - H(pi), -Cov_pi(log pi, delta)]``, shape (3, B), for ``pi = softmax(z)``
    and ``pi' = softmax(z + delta)`` row by row (nats); a ``-inf`` logit is an action of
    probability 0 that contributes nothing."""
    z, d = np.asarray(logits, float), np.asarray(delta, float)
    out = np.zeros((3, z.shape[0]))
    for b in range(z.shape[0]):
        row, step = list(z[b]), list(d[b])
        lp = _log_softmax_row(row)
        h0 = _entropy_row(row)
        h1 = _entropy_row([x + y if x != -math.inf else -math.inf for x, y in zip(row, step)])
        live = [k for k in range(len(row)) if lp[k] != -math.inf]
        p = {k: math.exp(lp[k]) for k in live}
        mean_l = sum(p[k] * lp[k] for k in live)
        mean_d = sum(p[k] * step[k] for k in live)
        cov = sum(p[k] * (lp[k] - mean_l) * (step[k] - mean_d) for k in live)
        out[:, b] = (h0, h1 - h0, -cov)
    return out


def ema_anchor_kl(thetas, alpha, period) -> np.ndarray:
    """``KL(pi_k || pi_anchor_k)`` for ``k = 0 .. N``: the anchor starts at ``theta_0`` and at every
    step ``k >= 1`` with ``k % period == 0`` becomes ``alpha theta_k + (1 - alpha) anchor`` (logits)."""
    th = np.asarray(thetas, float)
    anchor = list(th[0])
    out = np.zeros(th.shape[0])
    for k in range(th.shape[0]):
        if k >= 1 and k % int(period) == 0:
            anchor = [alpha * t + (1.0 - alpha) * a for t, a in zip(th[k], anchor)]
        out[k] = _kl_rows(list(th[k]), anchor)
    return out


def _softplus(x: float) -> float:
    return max(x, 0.0) + math.log1p(math.exp(-abs(x)))


def preference_loss(logp_w, logp_l, ref_w, ref_l, beta, link) -> np.ndarray:
    """Per pair ``-log sigmoid(beta [phi(z_w) - phi(z_l)])`` with ``z = pi / pi_ref`` and
    ``phi(z) = log z`` (``"dpo"``) or ``z + log z`` (``"chipo"``)."""
    if link not in LINKS:
        raise ValueError(f"link: must be one of {LINKS}, got {link!r}")
    w, lo, rw, rl = (np.asarray(x, float) for x in (logp_w, logp_l, ref_w, ref_l))
    out = np.zeros(w.shape)
    for i in range(w.shape[0]):
        phi = []
        for lz in (w[i] - rw[i], lo[i] - rl[i]):
            phi.append(lz if link == "dpo" else math.exp(lz) + lz)
        out[i] = _softplus(-beta * (phi[0] - phi[1]))      # -log sigmoid(x) = softplus(-x)
    return out


# --------------------------------------------------------------------------- cases
def _rows(rng, B, K, zeros=0):
    return np.stack([simplex(rng, K, zeros) for _ in range(B)])


def _tokens(rng, B, T, left=False):
    lengths = rng.integers(1, T + 1, B)
    lengths[0] = T
    lengths[-1] = min(lengths[-1], max(1, T // 2))
    m = (np.arange(T)[None, :] < lengths[:, None]).astype(float)
    return m[:, ::-1].copy() if left else m


def _clip_case(rng, B, T, lo_e, hi_e, left=False):
    """Ratios spread over every region (below, inside, above the range) away from its bounds,
    advantages of both signs, junk (``-inf`` in old_logp) on the pads."""
    m = _tokens(rng, B, T, left)
    lp = rng.uniform(-4.0, -0.1, (B, T))
    log_rho = np.log(rng.choice([0.3, 0.6, 0.75, 0.85, 0.95, 1.05, 1.15, 1.25, 1.4, 2.5], (B, T)))
    log_rho += rng.normal(0, 0.01, (B, T))
    lo = lp - log_rho
    rho = np.exp(log_rho)
    assert np.all(np.abs(rho - (1 - lo_e)) > 1e-3) and np.all(np.abs(rho - (1 + hi_e)) > 1e-3)
    adv = rng.choice([-2.0, -0.7, 0.5, 1.3], (B, T))
    pad = m == 0
    lp, lo, adv = lp.copy(), lo.copy(), adv.copy()
    lp[pad], lo[pad], adv[pad] = 5.0, -np.inf, 3.0
    return lp, lo, adv, m


def _walk(rng, N, K, scale=0.4, start=None):
    """Policy logits at steps 0..N: a random walk, so each step's policy differs from the anchor."""
    z0 = rng.normal(0, 1.0, K) if start is None else np.asarray(start, float)
    return np.cumsum(np.vstack([z0, rng.normal(0, scale, (N, K))]), axis=0)


def questions() -> list[Question]:
    A = np.array
    rng = np.random.default_rng(1515)

    # q1: the optimal policy, row by row
    q1 = [
        pub(A([[0.45, 0.05, 0.3, 0.2]]), A([[1.0, 1.0, 0.0, 0.0]]), 0.1,
            why="two equally rewarded answers the reference ranks 9:1"),
        pub(A([[0.5, 0.3, 0.2], [0.1, 0.1, 0.8]]), A([[1.0, 2.0, 0.0], [0.0, 0.5, -1.0]]), 0.5,
            why="two prompts, each with its own normaliser", core=True),
    ]
    q1.append(hid(_rows(rng, 5, 6), rng.normal(0, 1, (5, 6)), 0.3, core=True,
                  probe="a non-uniform reference: what Z sums"))
    q1.append(hid(_rows(rng, 4, 4), rng.normal(0, 1, (4, 4)), 2.0, core=True,
                  probe="a square batch: one prompt per row"))
    q1.append(hid(_rows(rng, 3, 5, zeros=2), rng.normal(0, 1, (3, 5)), 0.2,
                  probe="answers the reference never gives (pi_ref = 0)"))
    q1.append(hid(_rows(rng, 3, 6), rng.uniform(0, 10, (3, 6)), 0.01,
                  probe="r / beta of several hundred (overflow)"))
    q1.append(hid(_rows(rng, 2, 5), rng.normal(0, 1, (2, 5)), 20.0, probe="a large beta"))

    # q3: the clip-higher surrogate
    q3 = [
        pub(np.log(A([[0.5, 0.6, 0.9, 0.7, 0.95]])), np.log(A([[1.0, 0.6, 0.6, 0.9, 0.5]])),
            A([[1.0, 1.0, 1.0, 1.0, 1.0]]), A([[1.0, 1.0, 1.0, 1.0, 1.0]]), 0.2, 0.2,
            why="symmetric range, A > 0, ratios 0.5, 1, 1.5, 0.78, 1.9"),
        pub(np.log(A([[0.5, 0.6, 0.9, 0.7], [0.2, 0.3, 0.3, 0.1]])),
            np.log(A([[1.0, 0.5, 0.6, 0.9], [0.1, 0.35, 0.2, 0.1]])),
            A([[1.0, 1.0, -1.0, -1.0], [-2.0, -2.0, 0.5, 0.0]]), A([[1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 1.0, 0.0]]),
            0.2, 0.28, why="clip-higher (0.2, 0.28), both signs of A, a pad", core=True),
    ]
    for k, (lo_e, hi_e) in enumerate(((0.1, 0.3), (0.2, 0.28), (0.3, 0.1))):
        q3.append(hid(*_clip_case(rng, 6, 7, lo_e, hi_e, left=k == 1), lo_e, hi_e, core=True,
                      probe=f"eps_low = {lo_e}, eps_high = {hi_e}: which bound is which, a padded batch"))
    lp = np.log(A([[0.9, 0.9, 0.2, 0.2]]))
    lo = np.log(A([[0.3, 0.3, 0.8, 0.8]]))                     # ratios 3 and 0.25
    q3.append(hid(lp, lo, A([[-1.0, -0.5, 1.0, 0.5]]), np.ones((1, 4)), 0.2, 0.28, core=True,
                  probe="the pessimistic minimum: A < 0 with the ratio above the range, A > 0 below it"))

    # q4: entropy and its change under one update
    z0 = rng.normal(0, 2.0, (5, 7))
    A0 = rng.normal(0, 1.0, (5, 7))
    q4 = [
        pub(A([[0.0, 0.0, 0.0], [2.0, 0.0, -1.0]]), A([[0.3, -0.1, 0.5], [0.2, 0.4, -0.3]]),
            why="a uniform policy (no first-order change) and another one"),
        pub(A([[1.0, 0.5, -0.5, 0.0]]), A([[1.0, 1.0, 1.0, 1.0]]),
            why="a constant shift of the logits changes nothing", core=True),
        hid(z0, 0.1 * A0 + 0.5, core=True,
            probe="a step whose mean under pi is not 0: a covariance, not E[log pi * delta]"),
        hid(z0[:3], 0.05 * np.exp(z0[:3] - z0[:3].max(1, keepdims=True)) * A0[:3], core=True,
            probe="a vanilla policy-gradient-like step"),
        hid(A([[800.0, 799.0, 790.0, 805.0], [-700.0, -701.0, -703.0, -700.5]]),
            A([[0.1, -0.2, 0.3, 0.0], [0.5, 0.1, -0.2, 0.2]]), probe="logits of several hundred (overflow)"),
        hid(A([[1.0, -np.inf, 0.0, 2.0], [-np.inf, 0.5, 0.5, -1.0]]),
            A([[0.2, 0.3, -0.1, 0.1], [1.0, -0.4, 0.2, 0.3]]), probe="a masked action (logit -inf)"),
    ]

    # q5: the KL to a moving (EMA) anchor
    q5 = [
        pub(A([[0.0, 0.0], [0.5, 0.0], [1.0, 0.0], [1.5, 0.0], [2.0, 0.0]]), 1.0, 2,
            why="alpha = 1: a reset every 2 steps (KL 0 right after a reset)"),
        pub(A([[0.0, 0.0, 0.0], [1.0, 0.0, 0.0], [1.0, 1.0, 0.0], [2.0, 1.0, -1.0]]), 0.6, 3,
            why="alpha = 0.6 every 3 steps", core=True),
        hid(_walk(rng, 12, 5), 0.3, 4, core=True, probe="alpha = 0.3 every 4 steps: which side alpha weighs"),
        hid(_walk(rng, 9, 4), 0.6, 1, core=True, probe="period 1: the anchor moves every step, in logits"),
        hid(_walk(rng, 6, 4), 0.5, 10, probe="a period longer than the run: a fixed anchor"),
        hid(_walk(rng, 8, 3, scale=1.0, start=A([600.0, 598.0, 590.0])), 0.8, 3,
            probe="logits of several hundred (overflow)"),
    ]

    # q6: DPO's and chiPO's losses
    lw, ll = rng.uniform(-8, -1, 6), rng.uniform(-8, -1, 6)
    q6 = [
        pub(A([-2.0, -1.0]), A([-3.0, -1.5]), A([-2.0, -1.5]), A([-3.0, -1.0]), 0.1, "dpo",
            why="DPO: z = 1 on the first pair, log z = +-0.5 on the second"),
        pub(A([-2.0, -1.0]), A([-3.0, -1.5]), A([-2.0, -1.5]), A([-3.0, -1.0]), 0.1, "chipo",
            why="chiPO on the same pairs", core=True),
        hid(lw, ll, lw + rng.normal(0, 0.8, 6), ll + rng.normal(0, 0.8, 6), 0.5, "chipo", core=True,
            probe="chiPO on random pairs: the link"),
        hid(lw, ll, lw + rng.normal(0, 0.8, 6), ll + rng.normal(0, 0.8, 6), 0.2, "dpo", core=True,
            probe="DPO on random pairs, beta = 0.2"),
        hid(A([-1.0, -900.0, -5.0]), A([-900.0, -1.0, -5.0]), A([-1.0, -1.0, -5.0]), A([-1.0, -1.0, -5.0]),
            1.0, "dpo", probe="margins of several hundred (overflow)"),
        hid(A([-3.0, -3.0]), A([-1.0, -2.0]), A([-3.0, -3.0]), A([-7.0, -2.5]), 2.0, "chipo",
            probe="chiPO with a large ratio on the rejected answer (overflow)"),
    ]

    return [
        Question("q1", "The optimal policy of a KL-regularised bandit, stably", "function", "optimal_policy", 3,
                 optimal_policy, tuple(q1), rtol=1e-6, atol=1e-12),
        Question("q2", "How a reward gap moves a ratio", "value", "answer_q2", 2,
                 lambda: 0.3 / 0.1 * math.exp((0.5 - 0.8) / 0.2), **REL),
        Question("q3", "The clip-higher surrogate", "function", "clip_higher_surrogate", 3,
                 clip_higher_surrogate, tuple(q3), rtol=1e-6, atol=1e-12),
        Question("q4", "Entropy and its change under one update", "function", "entropy_probe", 3,
                 entropy_probe, tuple(q4), rtol=1e-6, atol=1e-10),
        Question("q5", "The KL to a moving anchor", "function", "ema_anchor_kl", 3,
                 ema_anchor_kl, tuple(q5), rtol=1e-6, atol=1e-12),
        Question("q6", "DPO's and chiPO's links", "function", "preference_loss", 3,
                 preference_loss, tuple(q6), rtol=1e-6, atol=1e-12),
        Question("q7", "Which tokens clip-higher lets grow", "choice", "answer_q7", 2, "A"),
        Question("q8", "Mode collapse and the shape of the optimum", "choice", "answer_q8", 2, "B"),
    ]
