"""An exact, small-scale TRPO: the trust-region problem solved on a tabular MDP.

The book's notation. ``pi_theta(a|s) = softmax_a(phi(s, a) . theta)`` is a log-linear policy
with features ``phi`` (one-hot features give the tabular softmax policy); ``pi_old`` is the
policy at ``theta_old``. Everything is computed exactly (no sampling) with numpy, so each
quantity of the TRPO derivation can be inspected:

* policy evaluation: ``V``, ``Q``, advantages ``A_old = Q - V`` and the discounted state
  visitation ``eta(s) = sum_t gamma^t P(s_t = s)``; ``d = eta / sum(eta)`` is the state
  distribution used to average the KL;
* the surrogate ``L(theta) = sum_s eta(s) sum_a pi_theta(a|s) A_old(s, a)`` (the importance-
  sampled ``E[r_t A_t]`` written as an exact sum; its gradient at ``theta_old`` is the policy
  gradient ``g``);
* the mean KL ``KLbar(theta) = sum_s d(s) KL(pi_old(.|s) || pi_theta(.|s))``;
* the Fisher matrix ``F = sum_s d(s) E_{a~pi_old}[score score^T]``, the Hessian of ``KLbar``
  at ``theta_old``;
* the TRPO step: ``x = F^{-1} g`` by conjugate gradient, scaled to ``sqrt(2 delta / x^T F x)``
  so that the quadratic model ``1/2 dtheta^T F dtheta`` of the KL equals ``delta`` (the step
  is ``dtheta``, not ``s``, which names a state), then a backtracking line search that checks
  the *actual* KL and the actual surrogate gain.

:func:`short_corridor` builds the aliased corridor of Sutton and Barto (Example 13.1), where
one parameter controls the policy in every state and too large a step is harmful.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np
from tqdm import tqdm

from .divergences import kl_from_log_probs

__all__ = [
    "TabularMDP", "PolicyEval", "StepResult", "short_corridor", "tabular_features",
    "policy_probs", "evaluate", "policy_gradient", "fisher", "mean_kl", "surrogate",
    "conjugate_gradient", "natural_gradient_step", "gradient_step", "penalty_step", "train",
]


@dataclass
class TabularMDP:
    """A finite MDP.

    ``P[s, a, s']`` transition probabilities (rows may sum to less than one: the missing mass
    is the probability that the episode ends), ``R[s, a]`` expected reward, ``gamma`` the
    discount and ``mu`` the start-state distribution.
    """

    P: np.ndarray
    R: np.ndarray
    gamma: float
    mu: np.ndarray

    def __post_init__(self):
        self.P = np.asarray(self.P, dtype=float)
        self.R = np.asarray(self.R, dtype=float)
        self.mu = np.asarray(self.mu, dtype=float)
        if self.P.ndim != 3 or self.P.shape[0] != self.P.shape[2]:
            raise ValueError(f"P: must have shape (S, A, S), got {self.P.shape}")
        S, A, _ = self.P.shape
        if np.any(self.P < 0) or np.any(self.P.sum(-1) > 1 + 1e-12):
            raise ValueError("P: entries must be >= 0 and each row P[s, a, :] must sum to <= 1")
        if self.R.shape != (S, A):
            raise ValueError(f"R: must have shape (S, A) = {(S, A)}, got {self.R.shape}")
        if not np.all(np.isfinite(self.R)):
            raise ValueError("R: rewards must be finite")
        if not 0 <= self.gamma <= 1:
            raise ValueError(f"gamma: must lie in [0, 1], got {self.gamma}")
        if self.mu.shape != (S,) or np.any(self.mu < 0) or abs(self.mu.sum() - 1) > 1e-9:
            raise ValueError(f"mu: must be a probability vector of length {S}")

    @property
    def n_states(self) -> int:
        return self.P.shape[0]

    @property
    def n_actions(self) -> int:
        return self.P.shape[1]


@dataclass
class PolicyEval:
    """Exact evaluation of a policy: objective ``J``, values, advantages and visitation."""

    J: float
    V: np.ndarray
    Q: np.ndarray
    A: np.ndarray
    eta: np.ndarray   # discounted visitation, sum_t gamma^t P(s_t = s)
    d: np.ndarray     # eta normalised to a distribution


@dataclass
class StepResult:
    """One policy update: the new parameters and what was measured along the way."""

    theta: np.ndarray
    step: np.ndarray
    kl: float                 # actual KLbar(theta_old, theta)
    surrogate_gain: float     # L(theta) - L(theta_old)
    J_before: float
    J_after: float
    step_fraction: float = 1.0
    predicted_kl: float = float("nan")      # 1/2 dtheta^T F dtheta of the accepted step
    line_search: list = field(default_factory=list)
    accepted: bool = True


def short_corridor(gamma: float = 0.99) -> tuple[TabularMDP, np.ndarray]:
    """The short corridor with switched actions (Sutton and Barto, Example 13.1).

    Three non-terminal states, actions 0 = left and 1 = right, reward -1 per step. In states
    0 and 2 the actions do what they say; in state 1 they are switched. Right in state 2 ends
    the episode. The features cannot tell the states apart, ``phi(s, left) = (1, 0)`` and
    ``phi(s, right) = (0, 1)``, so one probability ``p = pi(right)`` is used everywhere and the
    best stochastic policy has ``p`` near 0.59; ``p`` close to 0 or 1 never finishes.

    Returns ``(mdp, features)`` with features of shape ``(3, 2, 2)``.
    """
    S, A = 3, 2
    P = np.zeros((S, A, S))
    P[0, 0, 0] = 1.0   # left in 0: bump into the wall
    P[0, 1, 1] = 1.0   # right in 0: to 1
    P[1, 0, 2] = 1.0   # switched: left in 1 goes right, to 2
    P[1, 1, 0] = 1.0   # switched: right in 1 goes left, to 0
    P[2, 0, 1] = 1.0   # left in 2: to 1
    # right in 2: the goal, the episode ends (row of zeros)
    R = -np.ones((S, A))
    mu = np.array([1.0, 0.0, 0.0])
    phi = np.zeros((S, A, 2))
    phi[:, 0, 0] = 1.0
    phi[:, 1, 1] = 1.0
    return TabularMDP(P, R, gamma, mu), phi


def tabular_features(n_states: int, n_actions: int) -> np.ndarray:
    """One-hot features ``phi(s, a) = e_{s*A + a}``: the log-linear policy is then tabular."""
    if n_states < 1 or n_actions < 1:
        raise ValueError(f"n_states, n_actions: must be >= 1, got {n_states}, {n_actions}")
    return np.eye(n_states * n_actions).reshape(n_states, n_actions, n_states * n_actions)


def _check_theta(phi: np.ndarray, theta: np.ndarray, name: str = "theta") -> np.ndarray:
    theta = np.asarray(theta, dtype=float)
    if theta.shape != (phi.shape[-1],):
        raise ValueError(f"{name}: must have shape ({phi.shape[-1]},), got {theta.shape}")
    if not np.all(np.isfinite(theta)):
        raise ValueError(f"{name}: must be finite")
    return theta


def policy_probs(phi: np.ndarray, theta: np.ndarray) -> np.ndarray:
    """``pi_theta(a|s)`` as an ``(S, A)`` array."""
    theta = _check_theta(phi, theta)
    logits = phi @ theta
    logits = logits - logits.max(axis=1, keepdims=True)
    e = np.exp(logits)
    return e / e.sum(axis=1, keepdims=True)


def _scores(phi: np.ndarray, pi: np.ndarray) -> np.ndarray:
    """``grad_theta log pi(a|s) = phi(s, a) - E_{pi(.|s)} phi(s, .)``, shape ``(S, A, k)``."""
    return phi - np.einsum("sa,sak->sk", pi, phi)[:, None, :]


def evaluate(mdp: TabularMDP, pi: np.ndarray) -> PolicyEval:
    """Solve the Bellman equations of ``pi`` exactly."""
    pi = np.asarray(pi, dtype=float)
    S = mdp.n_states
    if pi.shape != (S, mdp.n_actions):
        raise ValueError(f"pi: must have shape {(S, mdp.n_actions)}, got {pi.shape}")
    P_pi = np.einsum("sa,sat->st", pi, mdp.P)
    r_pi = (pi * mdp.R).sum(axis=1)
    M = np.eye(S) - mdp.gamma * P_pi
    try:
        V = np.linalg.solve(M, r_pi)
        eta = np.linalg.solve(M.T, mdp.mu)
    except np.linalg.LinAlgError:
        raise ValueError("pi: the policy never ends an undiscounted episode "
                         "(I - gamma P_pi is singular); use gamma < 1") from None
    Q = mdp.R + mdp.gamma * mdp.P @ V
    return PolicyEval(J=float(mdp.mu @ V), V=V, Q=Q, A=Q - V[:, None], eta=eta,
                      d=eta / eta.sum())


def policy_gradient(mdp: TabularMDP, phi: np.ndarray, theta: np.ndarray) -> np.ndarray:
    """``g = grad J = sum_s eta(s) sum_a pi(a|s) A(s, a) grad log pi(a|s)`` (exact)."""
    pi = policy_probs(phi, theta)
    ev = evaluate(mdp, pi)
    return np.einsum("s,sa,sa,sak->k", ev.eta, pi, ev.A, _scores(phi, pi))


def fisher(phi: np.ndarray, theta: np.ndarray, d: np.ndarray) -> np.ndarray:
    """``F = sum_s d(s) sum_a pi(a|s) score(s,a) score(s,a)^T`` in closed form.

    Per state this is the covariance of the features under ``pi(.|s)``:
    ``sum_a pi phi phi^T - (sum_a pi phi)(sum_a pi phi)^T``.
    """
    pi = policy_probs(phi, theta)
    d = np.asarray(d, dtype=float)
    if d.shape != (phi.shape[0],) or np.any(d < 0):
        raise ValueError(f"d: must be a non-negative vector of length {phi.shape[0]}")
    second = np.einsum("s,sa,sak,sal->kl", d, pi, phi, phi)
    mean = np.einsum("sa,sak->sk", pi, phi)
    return second - np.einsum("s,sk,sl->kl", d, mean, mean)


def mean_kl(phi: np.ndarray, theta_old: np.ndarray, theta: np.ndarray, d: np.ndarray) -> float:
    """``KLbar = sum_s d(s) KL(pi_old(.|s) || pi_theta(.|s))`` (exact sums over actions)."""
    p = policy_probs(phi, theta_old)
    q = policy_probs(phi, theta)
    with np.errstate(divide="ignore"):
        logp = np.log(p)                       # -inf where p = 0: those actions contribute 0
    logq = np.log(np.maximum(q, np.finfo(float).tiny))
    per_state = kl_from_log_probs(logp, logq, dim=1)
    return float(np.asarray(d) @ per_state)


def surrogate(mdp: TabularMDP, phi: np.ndarray, theta_old: np.ndarray,
              theta: np.ndarray) -> float:
    """``L(theta) - L(theta_old) = sum_s eta_old(s) sum_a pi_theta(a|s) A_old(s, a)``.

    This is ``E_{s,a ~ pi_old}[r_t A_t]`` with ``r_t = pi_theta / pi_old``, summed exactly
    (and zero at ``theta = theta_old`` because ``sum_a pi_old A_old = 0``). The true change
    ``J(theta) - J(theta_old)`` is the same sum with ``eta`` of the *new* policy.
    """
    pi_old = policy_probs(phi, theta_old)
    ev = evaluate(mdp, pi_old)
    pi = policy_probs(phi, theta)
    return float(np.einsum("s,sa,sa->", ev.eta, pi, ev.A))


def conjugate_gradient(Avp: Callable[[np.ndarray], np.ndarray], b: np.ndarray,
                       iters: int = 50, tol: float = 1e-12) -> np.ndarray:
    """Solve ``A x = b`` for symmetric positive (semi)definite ``A`` given ``x -> A x``.

    Started at 0, the iterates stay in the Krylov space of ``b``; for a singular ``A`` (the
    softmax Fisher is singular) and ``b`` in its range, this gives the minimum-norm solution.
    """
    b = np.asarray(b, dtype=float)
    if iters < 1:
        raise ValueError(f"iters: must be >= 1, got {iters}")
    x = np.zeros_like(b)
    r = b.copy()
    p = r.copy()
    rs = r @ r
    if rs == 0:
        return x
    for _ in range(iters):
        Ap = Avp(p)
        pAp = p @ Ap
        if pAp <= 0:
            break
        alpha = rs / pAp
        x = x + alpha * p
        r = r - alpha * Ap
        rs_new = r @ r
        if rs_new < tol * tol:
            break
        p = r + (rs_new / rs) * p
        rs = rs_new
    return x


def natural_gradient_step(mdp: TabularMDP, phi: np.ndarray, theta: np.ndarray, delta: float,
                          backtrack: float = 0.5, max_backtracks: int = 15,
                          damping: float = 0.0, cg_iters: int = 50) -> StepResult:
    """One TRPO step: maximise ``L`` subject to ``KLbar(pi_old || pi_theta) <= delta``.

    ``dtheta = sqrt(2 delta / x^T F x) x`` with ``x = (F + damping I)^{-1} g`` by conjugate
    gradient, then try ``theta + backtrack^j dtheta`` for ``j = 0, 1, ...`` and accept the first
    that has actual ``KLbar <= delta`` and a positive surrogate gain. If none qualifies the
    parameters are left unchanged (``accepted=False``).
    """
    theta = _check_theta(phi, theta)
    if not delta > 0:
        raise ValueError(f"delta: must be > 0, got {delta}")
    if not 0 < backtrack < 1:
        raise ValueError(f"backtrack: must lie in (0, 1), got {backtrack}")
    if damping < 0:
        raise ValueError(f"damping: must be >= 0, got {damping}")
    pi = policy_probs(phi, theta)
    ev = evaluate(mdp, pi)
    g = np.einsum("s,sa,sa,sak->k", ev.eta, pi, ev.A, _scores(phi, pi))
    F = fisher(phi, theta, ev.d)
    x = conjugate_gradient(lambda v: F @ v + damping * v, g, iters=cg_iters)
    xFx = float(x @ F @ x)
    if xFx <= 0:   # zero gradient: nothing to do
        return StepResult(theta.copy(), np.zeros_like(theta), 0.0, 0.0, ev.J, ev.J, 0.0, 0.0,
                          [], False)
    full = np.sqrt(2 * delta / xFx) * x
    trials = []
    frac = 1.0
    for _ in range(max_backtracks + 1):
        cand = theta + frac * full
        kl = mean_kl(phi, theta, cand, ev.d)
        gain = float(np.einsum("s,sa,sa->", ev.eta, policy_probs(phi, cand), ev.A))
        ok = kl <= delta and gain > 0
        trials.append({"fraction": frac, "kl": kl, "surrogate_gain": gain, "accepted": ok})
        if ok:
            J_after = evaluate(mdp, policy_probs(phi, cand)).J
            return StepResult(cand, frac * full, kl, gain, ev.J, J_after, frac,
                              frac**2 * delta, trials, True)
        frac *= backtrack
    return StepResult(theta.copy(), np.zeros_like(theta), 0.0, 0.0, ev.J, ev.J, 0.0, 0.0,
                      trials, False)


def gradient_step(mdp: TabularMDP, phi: np.ndarray, theta: np.ndarray, lr: float) -> StepResult:
    """A plain (unconstrained) policy-gradient step ``theta + lr * g``, with its KL measured."""
    theta = _check_theta(phi, theta)
    if not lr > 0:
        raise ValueError(f"lr: must be > 0, got {lr}")
    pi = policy_probs(phi, theta)
    ev = evaluate(mdp, pi)
    g = np.einsum("s,sa,sa,sak->k", ev.eta, pi, ev.A, _scores(phi, pi))
    new = theta + lr * g
    F = fisher(phi, theta, ev.d)
    dtheta = lr * g
    return StepResult(new, dtheta, mean_kl(phi, theta, new, ev.d),
                      float(np.einsum("s,sa,sa->", ev.eta, policy_probs(phi, new), ev.A)),
                      ev.J, evaluate(mdp, policy_probs(phi, new)).J, 1.0,
                      float(0.5 * dtheta @ F @ dtheta))


def penalty_step(mdp: TabularMDP, phi: np.ndarray, theta: np.ndarray, beta: float,
                 tol: float = 1e-10) -> StepResult:
    """The penalty form: ``theta_new = argmax_theta L(theta) - beta * KLbar(pi_old || pi_theta)``.

    Solved to convergence with BFGS on exact gradients:
    ``grad L = sum_s eta(s) sum_a pi_theta A_old score_theta`` and
    ``grad KLbar = sum_s d(s) (E_{pi_theta}[phi] - E_{pi_old}[phi])``.
    The KL of the result is whatever ``beta`` and the size of the advantages make it.
    """
    from scipy.optimize import minimize

    theta = _check_theta(phi, theta)
    if not beta > 0:
        raise ValueError(f"beta: must be > 0, got {beta}")
    pi_old = policy_probs(phi, theta)
    ev = evaluate(mdp, pi_old)
    mean_old = np.einsum("sa,sak->sk", pi_old, phi)

    def neg_obj(th):
        pi = policy_probs(phi, th)
        gain = np.einsum("s,sa,sa->", ev.eta, pi, ev.A)
        kl = mean_kl(phi, theta, th, ev.d)
        g_gain = np.einsum("s,sa,sa,sak->k", ev.eta, pi, ev.A, _scores(phi, pi))
        g_kl = ev.d @ (np.einsum("sa,sak->sk", pi, phi) - mean_old)
        return -(gain - beta * kl), -(g_gain - beta * g_kl)

    opt = minimize(neg_obj, theta.copy(), jac=True, method="BFGS", options={"gtol": tol})
    new = opt.x
    pi_new = policy_probs(phi, new)
    return StepResult(new, new - theta, mean_kl(phi, theta, new, ev.d),
                      float(np.einsum("s,sa,sa->", ev.eta, pi_new, ev.A)), ev.J,
                      evaluate(mdp, pi_new).J, 1.0)


def train(mdp: TabularMDP, phi: np.ndarray, theta0: np.ndarray, n_iters: int,
          method: str = "trpo", delta: float = 0.01, lr: float = 1.0, beta: float = 1.0,
          progress: bool = False) -> dict:
    """Iterate ``natural_gradient_step`` (``method="trpo"``), ``gradient_step``
    (``method="pg"``) or ``penalty_step`` (``method="penalty"``). Returns a dict of lists: ``J``, ``kl``, ``theta``, ``p`` (the action
    probabilities ``pi(a|s)`` after each iteration, shape ``(S, A)``)."""
    if method not in ("trpo", "pg", "penalty"):
        raise ValueError(f"method: must be 'trpo', 'pg' or 'penalty', got {method!r}")
    if n_iters < 1:
        raise ValueError(f"n_iters: must be >= 1, got {n_iters}")
    theta = _check_theta(phi, theta0, "theta0").copy()
    J0 = evaluate(mdp, policy_probs(phi, theta)).J
    hist = {"J": [J0], "kl": [0.0], "theta": [theta.copy()],
            "p": [policy_probs(phi, theta)]}
    for _ in tqdm(range(n_iters), disable=not progress, desc=f"tabular {method}"):
        if method == "trpo":
            res = natural_gradient_step(mdp, phi, theta, delta)
        elif method == "penalty":
            res = penalty_step(mdp, phi, theta, beta)
        else:
            res = gradient_step(mdp, phi, theta, lr)
        theta = res.theta
        hist["J"].append(res.J_after)
        hist["kl"].append(res.kl)
        hist["theta"].append(theta.copy())
        hist["p"].append(policy_probs(phi, theta))
    return hist
