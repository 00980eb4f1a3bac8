"""Graded questions of ``ex14_offpolicy_kl`` (chapter 14: off-policy KL, corrections and trust regions).

The reference solutions are written here independently of the chapter's library
(``klbook_lib.offpolicy``): plain Python loops over the tokens of every response, in numpy,
with the attached ratio's gradient in closed form (``grad(rho k3) = rho k1`` with respect to
``log pi_theta``); ``tests/grader/test_ex14_offpolicy.py`` checks them against autograd and the
library. Registered in :mod:`klbook_grader.hidden.bank`.
"""
from __future__ import annotations

import math

import numpy as np

from klbook_grader.hidden.questions import Question, hid, pub

EXERCISE = "ex14_offpolicy_kl"
CORRECTIONS = ("token_tis", "token_mis", "seq_tis", "seq_mis")


# --------------------------------------------------------------------------- references
def attached_k3_probe(logp, old_logp, ref_logp, mask) -> np.ndarray:
    """``[loss, grad]``, shape (2, B, T): the per-token loss ``rho * k3`` with ``rho = pi/pi_old``
    attached and ``k3 = e^d - d - 1``, ``d = log pi_ref - log pi``; and the gradient of the summed
    loss with respect to ``log pi``, ``rho * (log pi - log pi_ref)``. Both 0 on the pads."""
    lp, lo, lr = (np.asarray(x, float) for x in (logp, old_logp, ref_logp))
    m = np.asarray(mask, float) > 0
    out = np.zeros((2,) + lp.shape)
    for b in range(lp.shape[0]):
        for t in range(lp.shape[1]):
            if not m[b, t]:
                continue
            rho = math.exp(lp[b, t] - lo[b, t])
            d = lr[b, t] - lp[b, t]
            out[0, b, t] = rho * (math.expm1(d) - d)
            out[1, b, t] = rho * (-d)
    return out


def _log_weight(lp, ls, m, b) -> float:
    return sum(lp[b, t] - ls[b, t] for t in range(lp.shape[1]) if m[b, t])


def is_weights(logp, sampler_logp, mask, correction, C) -> np.ndarray:
    """The weight of every token, (B, T), 0 on pads; ``rho_t = pi/mu``, ``W = prod_t rho_t``:
    ``token_tis`` min(rho_t, C), ``token_mis`` rho_t if rho_t <= C else 0, ``seq_tis`` min(W, C)
    and ``seq_mis`` W if W <= C else 0 on every real token of the response."""
    if correction not in CORRECTIONS:
        raise ValueError(f"correction: must be one of {CORRECTIONS}, got {correction!r}")
    lp, ls = np.asarray(logp, float), np.asarray(sampler_logp, float)
    m = np.asarray(mask, float) > 0
    logC = math.log(C)
    out = np.zeros(lp.shape)
    for b in range(lp.shape[0]):
        logW = _log_weight(lp, ls, m, b)
        for t in range(lp.shape[1]):
            if not m[b, t]:
                continue
            lw = logW if correction.startswith("seq") else lp[b, t] - ls[b, t]
            if correction.endswith("tis"):
                out[b, t] = C if lw >= logC else math.exp(lw)
            else:
                out[b, t] = 0.0 if lw > logC else math.exp(lw)
    return out


def sequence_ess(logp, sampler_logp, mask) -> float:
    """Kish's effective sample size fraction ``(sum_i W_i)**2 / (n sum_i W_i**2)`` of the
    sequence weights ``W_i = exp(sum_t log rho_t)`` (a response without real tokens has W = 1)."""
    lp, ls = np.asarray(logp, float), np.asarray(sampler_logp, float)
    m = np.asarray(mask, float) > 0
    logW = [_log_weight(lp, ls, m, b) for b in range(lp.shape[0])]
    top = max(logW)
    w = [math.exp(x - top) for x in logW]
    return sum(w) ** 2 / (len(w) * sum(x * x for x in w))


def gspo_ratio(logp, old_logp, mask) -> np.ndarray:
    """GSPO's ratio ``exp(mean over the real tokens of log pi - log pi_old)``, one per response."""
    lp, lo = np.asarray(logp, float), np.asarray(old_logp, float)
    m = np.asarray(mask, float) > 0
    out = np.zeros(lp.shape[0])
    for b in range(lp.shape[0]):
        real = [lp[b, t] - lo[b, t] for t in range(lp.shape[1]) if m[b, t]]
        out[b] = math.exp(sum(real) / len(real))
    return out


def tv_keep(prob, old_prob, advantage, low, high) -> np.ndarray:
    """DPPO's binary TV mask: 1 keeps a token's gradient, 0 drops it when ``A > 0`` and
    ``pi - pi_old > high`` or ``A < 0`` and ``pi - pi_old < -low``."""
    p, q, a = (np.asarray(x, float) for x in (prob, old_prob, advantage))
    out = np.ones(p.shape)
    for idx in np.ndindex(p.shape):
        diff = p[idx] - q[idx]
        if (a[idx] > 0 and diff > high) or (a[idx] < 0 and diff < -low):
            out[idx] = 0.0
    return out


# --------------------------------------------------------------------------- cases
def _mask(rng, B, T, left=False):
    lengths = rng.integers(1, T + 1, B)
    lengths[0] = T                                   # one full row, one short row at least
    lengths[-1] = min(lengths[-1], max(1, T // 2))
    m = (np.arange(T)[None, :] < lengths[:, None]).astype(float)
    return m[:, ::-1].copy() if left else m


def _batch(rng, B, T, spread, left=False, junk=True):
    """log pi, log pi_old / mu, log pi_ref and a mask; the pads hold junk that breaks any
    computation that lets them in (large ratios and k3 values)."""
    m = _mask(rng, B, T, left)
    lp = rng.uniform(-4.0, -0.05, (B, T))
    lo = lp + rng.normal(0, spread, (B, T))
    lr = lp + rng.normal(0, 0.8, (B, T))
    if junk:
        pad = m == 0
        lp, lo, lr = lp.copy(), lo.copy(), lr.copy()
        lp[pad], lo[pad], lr[pad] = 3.0, -30.0, -20.0
    return lp, lo, lr, m


def _no_tie(lp, lo, m, C):
    """Keep every token ratio and sequence weight of a case away from C (no tie to round)."""
    with np.errstate(invalid="ignore"):            # -inf - -inf on the pads, left out
        lr = np.where(m > 0, lp - lo, 0.0)
    ok = np.all(np.abs(lr - math.log(C)) > 1e-3) and np.all(np.abs(lr.sum(1) - math.log(C)) > 1e-3)
    assert ok, "a case with a ratio too close to C"
    return lp, lo, m


def questions() -> list[Question]:
    A = np.array
    rng = np.random.default_rng(1414)

    # q1: the attached-ratio k3 loss
    q1 = [
        pub(A([[-1.0, -0.5]]), A([[-1.0, -0.5]]), A([[-1.2, -0.2]]), A([[1.0, 1.0]]), torch=True,
            why="on-policy: rho = 1, yet its gradient is not zero"),
        pub(A([[-1.0, -2.0, -0.7]]), A([[-1.3, -1.5, 0.0]]), A([[-0.6, -2.5, 0.0]]), A([[1.0, 1.0, 0.0]]),
            torch=True, why="off-policy, one pad", core=True),
    ]
    lp, lo, lr, m = _batch(rng, 5, 6, 0.3)
    q1.append(hid(lp, lo, lr, m, torch=True, core=True,
                  probe="off-policy padded batch: the gradient through the attached ratio, junk on the pads"))
    lp, lo, lr, m = _batch(rng, 4, 7, 0.5, left=True)
    q1.append(hid(lp, lo, lr, m, torch=True, core=True, probe="left padding"))
    lp, lo, lr, m = _batch(rng, 3, 4, 0.0, junk=False)
    q1.append(hid(lp, lp, lr, np.ones((3, 4)), torch=True, probe="on-policy, no padding"))
    lp, lo, lr, m = _batch(rng, 3, 5, 1.5)
    q1.append(hid(lp, lo, lp + rng.normal(0, 2.0, lp.shape), m, torch=True,
                  probe="large ratios and a distant reference"))
    # issue 36: the notebook says the pads may hold -inf; a loss computed on them and masked
    # afterwards is right in value and NaN in its gradient (its own generator: the cases above
    # keep their inputs)
    rng36 = np.random.default_rng(3614)
    lp, lo, lr, m = _batch(rng36, 5, 6, 0.4, junk=False)
    lp, lo, lr = (np.where(m > 0, x, -np.inf) for x in (lp, lo, lr))
    q1.append(hid(lp, lo, lr, m, torch=True, core=True, probe="-inf on every pad (log pi, pi_old and pi_ref)"))

    # q2: token- and sequence-level truncated / masked IS weights
    q2 = [
        pub(A([[-0.5, -2.0, -1.0]]), A([[-1.5, -1.9, -0.2]]), A([[1.0, 1.0, 1.0]]), "token_tis", 2.0,
            why="one ratio above C is truncated"),
        pub(A([[-0.5, -2.0, -1.0]]), A([[-1.5, -1.9, -0.2]]), A([[1.0, 1.0, 1.0]]), "token_mis", 2.0,
            why="one ratio above C is masked", core=True),
        pub(A([[-0.5, -2.0, 0.0], [-1.0, -0.3, -0.4]]), A([[-1.5, -1.9, -np.inf], [-1.2, -0.2, -0.3]]),
            A([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]]), "seq_tis", 2.0,
            why="sequence weights, -inf on a pad", core=True),
    ]
    for k, corr in enumerate(CORRECTIONS):
        lp, lo, _, m = _batch(rng, 6, 5, 0.7, left=k % 2 == 1)
        lo = np.where(m > 0, lo, -np.inf)                      # -inf on the sampler's pads
        C = 1.5 if corr.startswith("token") else 2.0
        q2.append(hid(*_no_tie(lp, lo, m, C)[:2], m, corr, C, core=True,
                      probe=f"{corr}: a padded batch, -inf on the sampler's pads"))
    for k, corr in enumerate(("token_tis", "seq_mis")):              # issue 36: -inf on both sides
        lp, lo, _, m = _batch(rng36, 5, 6, 0.6, left=k == 1, junk=False)
        lp, lo = (np.where(m > 0, x, -np.inf) for x in (lp, lo))
        C = 1.5 if corr.startswith("token") else 2.0
        q2.append(hid(*_no_tie(lp, lo, m, C)[:2], m, corr, C, core=True,
                      probe=f"{corr}: -inf on the pads of both log-probabilities"))
    lp = A([[-1.0, -1.0, -1.0, -0.5], [-1.0, -2.0, -0.1, -0.3]])
    lo = A([[-1.5, -1.5, -1.5, -0.6], [-0.2, -1.0, -0.5, -0.1]])      # row 0: every rho < C, W > C
    m = np.ones((2, 4))
    for corr in CORRECTIONS:
        q2.append(hid(lp, lo, m, corr, 2.0, core=True,
                      probe=f"{corr}: every token ratio below C, the sequence weight above it"))
    big = A([[800.0, -800.0, -0.2], [-700.0, -1.0, -0.5]])
    for corr in ("token_tis", "token_mis"):
        q2.append(hid(big, np.zeros((2, 3)), np.ones((2, 3)), corr, 3.0,
                      probe=f"{corr}: log-ratios of +-800 (overflow)"))

    # q3: the effective sample size of the sequence weights
    q3 = [
        pub(A([[-1.0, -2.0], [-0.5, 0.0]]), A([[-1.0, -2.0], [-0.5, 0.0]]), A([[1.0, 1.0], [1.0, 0.0]]),
            why="on-policy: every W = 1, ESS = 1"),
        pub(A([[-1.0, -2.0], [-0.5, 0.0]]), A([[-1.5, -2.2], [-0.2, -np.inf]]), A([[1.0, 1.0], [1.0, 0.0]]),
            why="two responses, a pad", core=True),
    ]
    for k in range(2):
        lp, lo, _, m = _batch(rng, 8, 6, 0.5, left=k == 1)
        q3.append(hid(lp, np.where(m > 0, lo, -np.inf), m, core=True,
                      probe="a padded batch: the weight of each response, not of each token"))
    lp = rng.uniform(-3, -0.1, (6, 40))
    lo = lp - 20.0 + rng.normal(0, 1.0, (6, 40))              # log W near 800: exp overflows
    q3.append(hid(lp, lo, np.ones((6, 40)), probe="log-weights of several hundred (overflow)"))

    # q4: GSPO's length-normalised ratio
    q4 = [
        pub(A([[-1.0, -2.0]]), A([[-1.5, -1.9]]), A([[1.0, 1.0]]), why="one response"),
        pub(A([[-1.0, -2.0, 0.0], [-0.5, 0.0, 0.0]]), A([[-1.5, -1.9, 0.0], [-0.2, 0.0, 0.0]]),
            A([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]]), why="responses of lengths 2 and 1", core=True),
    ]
    for k in range(2):
        lp, lo, _, m = _batch(rng, 6, 7, 0.6, left=k == 1)
        q4.append(hid(lp, lo, m, core=True, probe="padded batch: a mean over each response's real tokens"))
    lp, lo, _, m = _batch(rng, 4, 5, 0.6, junk=False)
    q4.append(hid(lp, lo, np.ones((4, 5)), probe="no padding"))

    # q5: DPPO's binary TV mask
    p = A([[0.35, 0.05, 0.60, 0.012], [0.50, 0.10, 0.02, 0.90]])
    q = A([[0.10, 0.30, 0.45, 0.010], [0.20, 0.40, 0.015, 0.60]])
    q5 = [
        pub(p, q, A([[1.0, 1.0, 1.0, 1.0], [-1.0, -1.0, -1.0, -1.0]]), 0.2, 0.2,
            why="positive advantages, then negative ones"),
        pub(p, q, A([[-1.0, -1.0, 0.0, 1.0], [1.0, 0.0, 1.0, -1.0]]), 0.2, 0.2,
            why="mixed signs and zero advantages", core=True),
    ]
    for k in range(3):
        qq = rng.uniform(0.001, 0.999, (5, 6))
        pp = np.clip(qq + rng.normal(0, 0.25, (5, 6)), 0.0, 1.0)
        adv = rng.choice([-1.5, -0.3, 0.0, 0.4, 2.0], (5, 6))
        diff = pp - qq
        lo_, hi_ = (0.1, 0.2) if k == 0 else (0.2, 0.1) if k == 1 else (0.15, 0.15)
        assert np.all(np.abs(diff - hi_) > 1e-6) and np.all(np.abs(diff + lo_) > 1e-6)
        q5.append(hid(pp, qq, adv, lo_, hi_, core=True,
                      probe=f"random tokens, low = {lo_}, high = {hi_}: the sign of the advantage"))
    small = A([[0.01, 0.01, 0.02], [0.001, 0.04, 0.03]])      # no difference of exactly 0.2 (issue 36)
    q5.append(hid(small * 5, small, A([[1.0, 1.0, 1.0], [1.0, 1.0, 1.0]]), 0.2, 0.2, core=True,
                  probe="rare tokens whose ratio grew fivefold (a difference, not a ratio)"))

    return [
        Question("q1", "The attached-ratio k3 loss and its gradient", "function", "attached_k3_probe", 4,
                 attached_k3_probe, tuple(q1), rtol=1e-6, atol=1e-9),
        Question("q2", "Truncated and masked importance weights", "function", "is_weights", 3,
                 is_weights, tuple(q2), rtol=1e-6, atol=1e-12),
        Question("q3", "The effective sample size of sequence weights", "function", "sequence_ess", 3,
                 sequence_ess, tuple(q3), rtol=1e-6, atol=1e-12),
        Question("q4", "GSPO's length-normalised ratio", "function", "gspo_ratio", 2,
                 gspo_ratio, tuple(q4), rtol=1e-6, atol=1e-12),
        Question("q5", "DPPO's binary TV mask", "function", "tv_keep", 3,
                 tv_keep, tuple(q5), rtol=0.0, atol=1e-9),
        Question("q6", "What GSPO's ratio is", "choice", "answer_q6", 2, "B"),
        Question("q7", "How far a rare token may rise", "choice", "answer_q7", 2, "C"),
    ]
