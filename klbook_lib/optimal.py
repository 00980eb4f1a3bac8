"""The optimal policy of the KL-regularised objective on a finite outcome set.

For a reference policy ``pi_ref``, a reward ``r`` and a coefficient ``beta > 0`` the
objective of RLHF (for one prompt, with responses enumerated as outcomes ``y``) is

    J(pi) = E_{y ~ pi}[r(y)] - beta * KL(pi || pi_ref).

Its maximiser has a closed form, the Gibbs (or Boltzmann) tilt of ``pi_ref``:

    pi*(y) = pi_ref(y) * exp(r(y) / beta) / Z,     Z = sum_y pi_ref(y) exp(r(y) / beta),

and for every ``pi`` with ``KL(pi || pi_ref) < inf`` the objective splits exactly as

    J(pi) = beta * log Z - beta * KL(pi || pi*),

so maximising ``J`` is the same as minimising the reverse KL from ``pi`` to ``pi*``.

All functions work in float64 and in log space, so very small ``beta`` (a nearly greedy
optimum) does not overflow. Outcomes with ``pi_ref(y) = 0`` keep probability 0.
"""
from __future__ import annotations

import numpy as np
from scipy.special import logsumexp

from .divergences import kl_from_log_probs

__all__ = [
    "optimal_policy",
    "log_optimal_policy",
    "log_partition",
    "objective",
    "objective_grad_logits",
    "maximise_objective",
]


# --------------------------------------------------------------------------- checks

def _check_beta(beta: float) -> float:
    try:
        beta = float(beta)
    except (TypeError, ValueError):
        raise ValueError(f"beta: must be a positive number, got {beta!r}") from None
    if not np.isfinite(beta) or beta <= 0:
        raise ValueError(f"beta: must be a finite number > 0, got {beta}")
    return beta


def _check_probs(p, name: str) -> np.ndarray:
    p = np.asarray(p, dtype=np.float64)
    if p.ndim != 1 or p.size == 0:
        raise ValueError(f"{name}: must be a non-empty 1-D array of probabilities, got shape {p.shape}")
    if not np.all(np.isfinite(p)):
        raise ValueError(f"{name}: probabilities must be finite")
    if np.any(p < 0):
        raise ValueError(f"{name}: probabilities must be non-negative, found {p.min():g}")
    total = p.sum()
    if abs(total - 1.0) > 1e-6:
        raise ValueError(f"{name}: probabilities must sum to 1, they sum to {total:.8g}")
    return p / total


def _check_reward(r, n: int) -> np.ndarray:
    r = np.asarray(r, dtype=np.float64)
    if r.shape != (n,):
        raise ValueError(f"r: must have one reward per outcome, shape ({n},), got shape {r.shape}")
    if not np.all(np.isfinite(r)):
        raise ValueError("r: rewards must be finite")
    return r


def _safe_log(p: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore"):
        return np.log(p)


# --------------------------------------------------------------------------- closed form

def log_partition(pi_ref, r, beta: float) -> float:
    """``log Z = log sum_y pi_ref(y) exp(r(y) / beta)``, computed with log-sum-exp.

    ``beta * log Z`` is the maximum of the objective ``J`` (see :func:`objective`).
    """
    pi_ref = _check_probs(pi_ref, "pi_ref")
    r = _check_reward(r, pi_ref.size)
    beta = _check_beta(beta)
    return float(logsumexp(_safe_log(pi_ref) + r / beta))


def log_optimal_policy(pi_ref, r, beta: float) -> np.ndarray:
    """``log pi*(y) = log pi_ref(y) + r(y)/beta - log Z`` (``-inf`` where ``pi_ref`` is 0)."""
    pi_ref = _check_probs(pi_ref, "pi_ref")
    r = _check_reward(r, pi_ref.size)
    beta = _check_beta(beta)
    logits = _safe_log(pi_ref) + r / beta
    return logits - logsumexp(logits)


def optimal_policy(pi_ref, r, beta: float) -> np.ndarray:
    """The maximiser of ``E_pi[r] - beta KL(pi || pi_ref)``: ``pi_ref exp(r/beta) / Z``.

    Parameters
    ----------
    pi_ref : reference probabilities over the ``n`` outcomes (1-D, sums to 1).
    r : reward of each outcome, shape ``(n,)``.
    beta : KL coefficient, ``> 0``. Large ``beta`` keeps ``pi*`` near ``pi_ref``; as
        ``beta -> 0`` ``pi*`` concentrates on the reward's argmax within the support of
        ``pi_ref``.
    """
    return np.exp(log_optimal_policy(pi_ref, r, beta))


def objective(pi, pi_ref, r, beta: float) -> float:
    """``J(pi) = E_{y~pi}[r(y)] - beta * KL(pi || pi_ref)``.

    Returns ``-inf`` when ``pi`` puts mass where ``pi_ref`` has none (the KL is infinite).
    """
    pi = _check_probs(pi, "pi")
    pi_ref = _check_probs(pi_ref, "pi_ref")
    if pi.shape != pi_ref.shape:
        raise ValueError(f"pi: shape {pi.shape} does not match pi_ref shape {pi_ref.shape}")
    r = _check_reward(r, pi_ref.size)
    beta = _check_beta(beta)
    kl = float(kl_from_log_probs(_safe_log(pi), _safe_log(pi_ref)))     # +inf where pi > 0 = pi_ref
    if not np.isfinite(kl):
        return float("-inf")
    return float(pi @ r - beta * kl)


# --------------------------------------------------------------------------- numerical ascent

def _softmax(theta: np.ndarray) -> np.ndarray:
    return np.exp(theta - logsumexp(theta))


def objective_grad_logits(theta, pi_ref, r, beta: float) -> np.ndarray:
    """Gradient of ``J(softmax(theta))`` with respect to the logits ``theta``.

    With ``h(y) = r(y) - beta * log(pi(y) / pi_ref(y))`` (the derivative of ``J`` in
    ``pi(y)`` up to a constant that the softmax removes), the gradient is
    ``pi(y) * (h(y) - E_pi[h])``; it vanishes exactly when ``h`` is constant on the
    support, i.e. when ``pi`` is ``pi*``.
    """
    pi_ref = _check_probs(pi_ref, "pi_ref")
    theta = np.asarray(theta, dtype=np.float64)
    if theta.shape != pi_ref.shape:
        raise ValueError(f"theta: shape {theta.shape} does not match pi_ref shape {pi_ref.shape}")
    if np.any(pi_ref == 0):
        raise ValueError("pi_ref: the logit parameterisation needs pi_ref > 0 everywhere")
    r = _check_reward(r, pi_ref.size)
    beta = _check_beta(beta)
    log_pi = theta - logsumexp(theta)
    pi = np.exp(log_pi)
    h = r - beta * (log_pi - np.log(pi_ref))
    return pi * (h - pi @ h)


def maximise_objective(
    pi_ref,
    r,
    beta: float,
    theta0=None,
    steps: int = 3000,
    lr: float = 2.0,
    seed: int = 0,
    record_every: int = 10,
) -> dict:
    """Plain gradient ascent on softmax logits, a numerical check of the closed form.

    Starts from ``theta0`` or, if it is ``None``, from standard-normal logits drawn with
    ``seed``. The step is ``lr / beta`` times the gradient (the objective's curvature
    scales like ``beta``). Returns a history dict with lists ``step``, ``objective`` and
    ``kl_to_optimum`` (``KL(pi || pi*)``) and the final ``pi`` and ``theta``.
    """
    pi_ref = _check_probs(pi_ref, "pi_ref")
    r = _check_reward(r, pi_ref.size)
    beta = _check_beta(beta)
    if steps < 0:
        raise ValueError(f"steps: must be >= 0, got {steps}")
    if lr <= 0:
        raise ValueError(f"lr: must be > 0, got {lr}")
    if theta0 is None:
        theta = np.random.default_rng(seed).standard_normal(pi_ref.size)
    else:
        theta = np.array(theta0, dtype=np.float64)
        if theta.shape != pi_ref.shape:
            raise ValueError(f"theta0: shape {theta.shape} does not match pi_ref shape {pi_ref.shape}")
    pi_star = optimal_policy(pi_ref, r, beta)
    hist: dict = {"step": [], "objective": [], "kl_to_optimum": []}

    def record(t: int) -> None:
        pi = _softmax(theta)
        hist["step"].append(t)
        hist["objective"].append(objective(pi, pi_ref, r, beta))
        hist["kl_to_optimum"].append(float(kl_from_log_probs(_safe_log(pi), _safe_log(pi_star))))

    record(0)
    for t in range(1, steps + 1):
        theta = theta + (lr / beta) * objective_grad_logits(theta, pi_ref, r, beta)
        if t % record_every == 0 or t == steps:
            record(t)
    hist["pi"] = _softmax(theta)
    hist["theta"] = theta
    return hist
