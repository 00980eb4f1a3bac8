"""The shape of the optimum, entropy collapse, anchors that move, and preference links beyond KL.

Four small, exact pieces behind chapter 15.

1. **The shape of the optimum.** The reverse-KL-regularised objective
   ``E_pi[r] - beta KL(pi || pi_ref)`` is maximised by ``pi*(y) = pi_ref(y) exp(r(y)/beta) / Z``
   (:mod:`klbook_lib.optimal`), so ``pi*(a) / pi*(b) = pi_ref(a) / pi_ref(b) * exp((r(a) - r(b)) / beta)``.
   The forward-KL-regularised objective ``E_pi[r] - beta KL(pi_ref || pi)`` is maximised by
   ``pi(a) = beta pi_ref(a) / (lam - r(a))`` with ``lam > max r`` fixed by normalisation
   (:func:`forward_kl_optimum`).
2. **Entropy collapse.** For a softmax policy ``pi = softmax(z)`` and a logit change ``d``,
   ``d/dt H(softmax(z + t d)) at t = 0 = -Cov_{a ~ pi}(log pi(a), d(a))`` (:func:`entropy_rate`).
   A natural policy-gradient step has ``d = eta A``, a vanilla softmax policy-gradient step
   ``d = eta pi (A - E_pi A)`` (:func:`pg_logit_change`). :func:`clipped_bandit_runs` trains a
   bandit with PPO-style clipped updates (``eps_low``, ``eps_high``: DAPO's clip-higher).
3. **Anchors that move.** :func:`anchor_runs` maximises ``E[r] - beta KL(pi || pi_anchor)`` on the
   enumerable sequence model of :mod:`klbook_lib.seqkl` with a fixed anchor, a periodic reset of
   the anchor to the current policy, a moving average of the anchor's logits (TRL's
   ``sync_ref_model``: ``pi_ref <- alpha pi_theta + (1 - alpha) pi_ref`` in parameters every
   ``period`` steps) or no KL, with exact or sampled gradients.
4. **Preference links.** DPO's loss ``-log sigmoid(beta [log z_w - log z_l])`` with
   ``z = pi / pi_ref``; chiPO replaces ``log z`` by ``z + log z`` and f-DPO by ``f'(z)``
   (:func:`preference_loss`, :data:`LINKS`). :func:`fit_preference_bandit` fits a tabular
   policy to an offline preference data set (:func:`preference_data`).
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from scipy.optimize import brentq

from . import seqkl
from .divergences import kl_from_log_probs
from .objectives import dpo_loss
from .optimal import optimal_policy

__all__ = [
    "optimal_ratio", "forward_kl_optimum", "forward_kl_objective", "entropy", "entropy_rate",
    "pg_logit_change", "clipped_bandit_runs", "ANCHORS", "anchor_runs", "LINKS", "link",
    "preference_loss", "preference_data", "fit_preference_bandit",
]


# --------------------------------------------------------------------------- checks
def _probs(p, name: str) -> np.ndarray:
    p = np.asarray(p, dtype=np.float64)
    if p.ndim != 1 or p.size < 2:
        raise ValueError(f"{name}: expected a 1-D array of at least 2 probabilities, got shape {p.shape}")
    if not np.all(np.isfinite(p)) or np.any(p < 0):
        raise ValueError(f"{name}: probabilities must be finite and non-negative")
    if abs(p.sum() - 1.0) > 1e-6:
        raise ValueError(f"{name}: probabilities must sum to 1, they sum to {p.sum():.8g}")
    return p / p.sum()


def _reward(r, n: int) -> np.ndarray:
    r = np.asarray(r, dtype=np.float64)
    if r.shape != (n,) or not np.all(np.isfinite(r)):
        raise ValueError(f"r: expected {n} finite rewards, got shape {r.shape}")
    return r


def _positive(name: str, x) -> float:
    try:
        x = float(x)
    except (TypeError, ValueError):
        raise ValueError(f"{name}: expected a positive number, got {x!r}") from None
    if not (math.isfinite(x) and x > 0):
        raise ValueError(f"{name}: must be a finite number > 0, got {x}")
    return x


def _int(name: str, x, minimum: int) -> int:
    if isinstance(x, bool) or not isinstance(x, (int, np.integer)) or x < minimum:
        raise ValueError(f"{name}: expected an integer >= {minimum}, got {x!r}")
    return int(x)


# --------------------------------------------------------------------------- 1. the optimum
def optimal_ratio(pi_ref, r, beta: float, a: int, b: int) -> float:
    """``pi*(a) / pi*(b)`` of the reverse-KL optimum, from :func:`klbook_lib.optimal.optimal_policy`."""
    pi = optimal_policy(pi_ref, r, beta)
    return float(pi[a] / pi[b])


def forward_kl_optimum(pi_ref, r, beta: float) -> np.ndarray:
    """The maximiser of ``E_pi[r] - beta KL(pi_ref || pi)`` over distributions ``pi``.

    Stationarity with a multiplier ``lam`` for ``sum pi = 1`` gives
    ``r(a) + beta pi_ref(a) / pi(a) = lam``, i.e. ``pi(a) = beta pi_ref(a) / (lam - r(a))``;
    ``sum_a pi(a)`` falls from ``+inf`` (``lam -> max r``) to at most 1 at ``lam = max r + beta``,
    so ``lam`` is the root on ``(max r, max r + beta]`` (``brentq``). Only outcomes with
    ``pi_ref > 0`` count (the others keep probability 0).
    """
    q = _probs(pi_ref, "pi_ref")
    r = _reward(r, q.size)
    beta = _positive("beta", beta)
    s = q > 0
    top = float(r[s].max())

    def excess(lam: float) -> float:
        return float(np.sum(beta * q[s] / (lam - r[s]))) - 1.0

    gap = beta
    while excess(top + gap * 1e-12) <= 0:   # only when every supported r is far below the top one
        gap *= 0.5
    lam = brentq(excess, top + gap * 1e-12, top + beta, xtol=1e-15, rtol=1e-15, maxiter=500)
    pi = np.zeros_like(q)
    pi[s] = beta * q[s] / (lam - r[s])
    return pi / pi.sum()


def forward_kl_objective(pi, pi_ref, r, beta: float) -> float:
    """``E_pi[r] - beta KL(pi_ref || pi)`` (``-inf`` where ``pi = 0 < pi_ref``)."""
    p, q = _probs(pi, "pi"), _probs(pi_ref, "pi_ref")
    r = _reward(r, q.size)
    beta = _positive("beta", beta)
    with np.errstate(divide="ignore"):
        kl = float(kl_from_log_probs(np.log(q), np.log(p)))      # +inf where pi = 0 < pi_ref
    return float("-inf") if math.isinf(kl) else float(p @ r - beta * kl)


# --------------------------------------------------------------------------- 2. entropy
def entropy(logits: torch.Tensor) -> torch.Tensor:
    """``H(softmax(z)) = -sum_a pi(a) log pi(a)`` over the last axis (nats)."""
    logp = torch.log_softmax(logits, -1)
    return -(logp.exp() * logp).sum(-1)


def entropy_rate(logits: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
    """``d/dt H(softmax(z + t d))`` at ``t = 0``, as ``-Cov_{a ~ pi}(log pi(a), d(a))`` (last axis)."""
    if not isinstance(logits, torch.Tensor) or not isinstance(d, torch.Tensor):
        raise ValueError("logits, d: expected torch tensors")
    if logits.shape != d.shape:
        raise ValueError(f"d: shape {tuple(d.shape)} differs from logits shape {tuple(logits.shape)}")
    logp = torch.log_softmax(logits, -1)
    pi = logp.exp()
    mean_l, mean_d = (pi * logp).sum(-1, keepdim=True), (pi * d).sum(-1, keepdim=True)
    return -(pi * (logp - mean_l) * (d - mean_d)).sum(-1)


def pg_logit_change(logits: torch.Tensor, advantage: torch.Tensor, eta: float,
                    kind: str = "natural") -> torch.Tensor:
    """The logit change of one exact policy-gradient step on a softmax policy.

    ``"natural"``: ``eta A(a)`` (natural PG, Cui et al.'s first case); ``"vanilla"``: the gradient
    of ``sum_a pi(a) A(a)`` with respect to the logits, ``eta pi(a) (A(a) - E_pi A)``.
    """
    eta = _positive("eta", eta)
    if kind not in ("natural", "vanilla"):
        raise ValueError(f"kind: must be 'natural' or 'vanilla', got {kind!r}")
    if advantage.shape != logits.shape:
        raise ValueError(f"advantage: shape {tuple(advantage.shape)} differs from logits {tuple(logits.shape)}")
    if kind == "natural":
        return eta * advantage
    pi = torch.softmax(logits, -1)
    return eta * pi * (advantage - (pi * advantage).sum(-1, keepdim=True))


def clipped_bandit_runs(ref_logits: torch.Tensor, reward: torch.Tensor, seeds: Sequence[int], *,
                        eps_low: float = 0.2, eps_high: float = 0.2, iterations: int = 60,
                        group: int = 16, epochs: int = 4, lr: float = 0.5,
                        mass: float = 0.01) -> dict[str, np.ndarray]:
    """PPO-style clipped updates on a bandit, one independent run per seed (batched).

    Each iteration samples ``group`` arms from ``pi_old`` (the current policy), standardises the
    rewards within the group (GRPO's advantage; a group with one reward value gives no update),
    and takes ``epochs`` SGD steps (``lr``) on the logits with the clipped surrogate
    ``-mean min(rho A, clip(rho, 1 - eps_low, 1 + eps_high) A)``. Returns per iteration
    (``[iterations + 1, n_seeds]``): ``entropy`` (nats), ``reward`` (exact ``E_pi[r]``) and
    ``modes`` (the number of rewarded arms with probability above ``mass``).
    """
    if not isinstance(ref_logits, torch.Tensor) or ref_logits.dim() != 1:
        raise ValueError("ref_logits: expected a 1-D tensor of arm logits")
    if not isinstance(reward, torch.Tensor) or reward.shape != ref_logits.shape:
        raise ValueError("reward: expected one reward per arm, same shape as ref_logits")
    for name, e in (("eps_low", eps_low), ("eps_high", eps_high)):
        _positive(name, e)
    if eps_low >= 1:
        raise ValueError(f"eps_low: must be < 1, got {eps_low}")
    seeds = [int(s) for s in seeds]
    if not seeds:
        raise ValueError("seeds: need at least one seed")
    iterations, group, epochs = _int("iterations", iterations, 1), _int("group", group, 2), _int("epochs", epochs, 1)
    lr = _positive("lr", lr)
    S, K = len(seeds), ref_logits.numel()
    r = reward.double()
    theta = ref_logits.double().expand(S, K).clone()
    gens = [torch.Generator().manual_seed(s) for s in seeds]
    hist = {k: np.zeros((iterations + 1, S)) for k in ("entropy", "reward", "modes")}

    def log(i: int) -> None:
        pi = torch.softmax(theta, -1)
        hist["entropy"][i] = entropy(theta).numpy()
        hist["reward"][i] = (pi @ r).numpy()
        hist["modes"][i] = ((pi > mass) & (r > 0)).sum(-1).numpy()

    log(0)
    for it in range(iterations):
        with torch.no_grad():
            old_logp = torch.log_softmax(theta, -1)
            arms = torch.stack([torch.multinomial(old_logp[i].exp(), group, replacement=True, generator=gens[i])
                                for i in range(S)])
            rw = r[arms]
            sd = rw.std(-1, keepdim=True)
            adv = torch.where(sd > 0, (rw - rw.mean(-1, keepdim=True)) / sd.clamp(min=1e-12), torch.zeros_like(rw))
            old = old_logp.gather(-1, arms)
        for _ in range(epochs):
            x = theta.clone().requires_grad_(True)
            rho = (torch.log_softmax(x, -1).gather(-1, arms) - old).exp()
            obj = torch.minimum(rho * adv, rho.clamp(1 - eps_low, 1 + eps_high) * adv).mean(-1).sum()
            (g,) = torch.autograd.grad(obj, x)
            theta = theta + lr * g
        log(it + 1)
    return hist


# --------------------------------------------------------------------------- 3. anchors
ANCHORS = ("fixed", "reset", "ema", "none")


def _sequence_entropy(space, logits) -> float:
    lp = seqkl.sequence_logprobs(space, logits)
    return float(-(lp.exp() * lp).sum())


def anchor_runs(space: seqkl.SequenceSpace, init_logits: torch.Tensor, reward, seeds: Sequence[int], *,
                anchor: str = "fixed", beta: float = 0.1, period: int = 50, alpha: float = 0.6,
                steps: int = 300, lr: float = 0.5, n_samples: int | None = None, mass: float = 0.01,
                log_every: int = 10) -> dict[str, np.ndarray]:
    """Train a tabular sequence policy on ``E[r] - beta KL(pi || pi_anchor)`` from ``init_logits``.

    ``anchor``: ``"fixed"`` (``pi_anchor = pi_init``), ``"reset"`` (every ``period`` steps the
    anchor becomes the current policy, as ProRL's reference resets), ``"ema"`` (every ``period``
    steps ``anchor <- alpha theta + (1 - alpha) anchor`` in logits, TRL's ``sync_ref_model``
    with ``ref_model_mixup_alpha = alpha`` and ``ref_model_sync_steps = period``) or ``"none"``
    (no KL term). ``n_samples=None`` uses the exact gradient (enumeration; every seed is the
    same run); otherwise each step samples ``n_samples`` responses and ascends the unbiased
    score-function estimate ``mean_i (r_i - mean r - beta (log pi(y_i) - log pi_anchor(y_i))) grad log pi(y_i)``
    (k1 in the reward, a batch-mean baseline on the task reward). Plain gradient ascent with step ``lr``.

    Returns, every ``log_every`` steps (``[n_logs, n_seeds]``): ``step``, ``reward`` (exact ``E[r]``),
    ``kl_init`` (exact ``KL(pi || pi_init)``), ``entropy`` (of whole sequences, nats) and ``modes``
    (correct sequences, ``r > 0``, with probability above ``mass``).
    """
    if anchor not in ANCHORS:
        raise ValueError(f"anchor: must be one of {ANCHORS}, got {anchor!r}")
    init = init_logits
    if not isinstance(init, torch.Tensor) or tuple(init.shape) != (space.n_prefixes, space.vocab_size):
        raise ValueError(f"init_logits: expected shape [{space.n_prefixes}, {space.vocab_size}]")
    r = torch.as_tensor(reward, dtype=torch.float64)
    if r.shape != (space.n_sequences,):
        raise ValueError(f"reward: expected one value per sequence, shape [{space.n_sequences}]")
    beta = _positive("beta", beta)
    period, steps, log_every = _int("period", period, 1), _int("steps", steps, 1), _int("log_every", log_every, 1)
    if not (0 < float(alpha) <= 1):
        raise ValueError(f"alpha: must be in (0, 1], got {alpha}")
    if n_samples is not None:
        n_samples = _int("n_samples", n_samples, 2)
    lr = _positive("lr", lr)
    seeds = [int(s) for s in seeds]
    if not seeds:
        raise ValueError("seeds: need at least one seed")
    init = init.detach().double()
    b = 0.0 if anchor == "none" else beta
    logs = list(range(0, steps + 1, log_every))
    out = {k: np.zeros((len(logs), len(seeds))) for k in ("step", "reward", "kl_init", "entropy", "modes")}
    correct = r > 0
    for j, seed in enumerate(seeds):
        g = torch.Generator().manual_seed(seed)
        theta, ref = init.clone(), init.clone()
        li = 0
        for step in range(steps + 1):
            if step == logs[li]:
                with torch.no_grad():
                    p = seqkl.sequence_logprobs(space, theta).exp()
                    out["step"][li, j] = step
                    out["reward"][li, j] = float(p @ r)
                    out["kl_init"][li, j] = float(seqkl.exact_kl(space, theta, init))
                    out["entropy"][li, j] = _sequence_entropy(space, theta)
                    out["modes"][li, j] = float(((p > mass) & correct).sum())
                li += 1
            if step == steps:
                break
            x = theta.clone().requires_grad_(True)
            if n_samples is None:
                obj = seqkl.expected_reward(space, x, r)
                if b > 0:
                    obj = obj - b * seqkl.exact_kl(space, x, ref)
            else:
                idx = seqkl.sample(space, theta, n_samples, seed=g)
                lp = seqkl.sequence_logprobs(space, x)[idx]
                with torch.no_grad():
                    ri = r[idx]
                    score = ri - ri.mean() - b * (lp - seqkl.sequence_logprobs(space, ref)[idx])
                obj = (score * lp).mean()
            (grad,) = torch.autograd.grad(obj, x)
            theta = theta + lr * grad
            if (step + 1) % period == 0:
                if anchor == "reset":
                    ref = theta.clone()
                elif anchor == "ema":
                    ref = float(alpha) * theta + (1 - float(alpha)) * ref
    return out


# --------------------------------------------------------------------------- 4. preference links
LINKS = ("dpo", "chipo", "js", "forward_kl")


def link(log_z: torch.Tensor, name: str) -> torch.Tensor:
    """The link ``phi(z)`` applied to ``z = pi / pi_ref``, from ``log z``.

    ``"dpo"``: ``log z`` (reverse KL); ``"chipo"``: ``z + log z`` (chiPO: chi^2 + KL);
    ``"js"``: ``log(2z / (1 + z))`` (f-DPO with Jensen-Shannon, ``f'(z)`` up to a constant);
    ``"forward_kl"``: ``-1/z`` (f-DPO with forward KL, ``f(z) = -log z``).
    """
    if name == "dpo":
        return log_z
    if name == "chipo":
        return log_z.exp() + log_z
    if name == "js":
        return math.log(2.0) + log_z - F.softplus(log_z)
    if name == "forward_kl":
        return -(-log_z).exp()
    raise ValueError(f"name: must be one of {LINKS}, got {name!r}")


def preference_loss(policy_chosen_logps: torch.Tensor, policy_rejected_logps: torch.Tensor,
                    ref_chosen_logps: torch.Tensor, ref_rejected_logps: torch.Tensor, beta: float,
                    name: str = "dpo") -> torch.Tensor:
    """Mean of ``-log sigmoid(beta [phi(z_w) - phi(z_l)])`` with ``z = pi / pi_ref`` and the link ``name``.

    ``name="dpo"`` is :func:`klbook_lib.objectives.dpo_loss` (called, not copied).
    """
    if name == "dpo":
        return dpo_loss(policy_chosen_logps, policy_rejected_logps, ref_chosen_logps, ref_rejected_logps, beta)[0]
    beta = _positive("beta", beta)
    lw = policy_chosen_logps - ref_chosen_logps
    ll = policy_rejected_logps - ref_rejected_logps
    return -F.logsigmoid(beta * (link(lw, name) - link(ll, name))).mean()


def preference_data(true_reward, behaviour, n_pairs: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """An offline preference data set: ``n_pairs`` pairs of distinct arms drawn from ``behaviour``,
    labelled by Bradley-Terry with ``true_reward``. Returns ``(chosen, rejected)`` arm indices."""
    mu = _probs(behaviour, "behaviour")
    r = _reward(true_reward, mu.size)
    n_pairs = _int("n_pairs", n_pairs, 1)
    if int((mu > 0).sum()) < 2:
        raise ValueError("behaviour: needs at least two arms with positive probability")
    rng = np.random.default_rng(seed)
    a = rng.choice(mu.size, size=4 * n_pairs + 16, p=mu)
    bb = rng.choice(mu.size, size=a.size, p=mu)
    keep = a != bb
    a, bb = a[keep][:n_pairs], bb[keep][:n_pairs]
    while a.size < n_pairs:   # rare: too many ties
        x, y = rng.choice(mu.size, 2, p=mu)
        if x != y:
            a, bb = np.append(a, x), np.append(bb, y)
    p_a = 1.0 / (1.0 + np.exp(-(r[a] - r[bb])))
    a_wins = rng.random(a.size) < p_a
    return np.where(a_wins, a, bb), np.where(a_wins, bb, a)


def fit_preference_bandit(pi_ref, chosen, rejected, beta: float, name: str = "dpo", *,
                          steps: int = 300, lr: float = 0.1) -> np.ndarray:
    """Fit a tabular policy (logits initialised at ``log pi_ref``) to the pairs with Adam; returns ``pi``."""
    q = _probs(pi_ref, "pi_ref")
    if np.any(q <= 0):
        raise ValueError("pi_ref: every arm needs positive probability")
    chosen, rejected = np.asarray(chosen), np.asarray(rejected)
    if chosen.shape != rejected.shape or chosen.ndim != 1 or chosen.size == 0:
        raise ValueError("chosen, rejected: expected two 1-D index arrays of the same length")
    steps, lr = _int("steps", steps, 1), _positive("lr", lr)
    log_ref = torch.tensor(np.log(q))
    cw, cl = torch.as_tensor(chosen), torch.as_tensor(rejected)
    theta = log_ref.clone().requires_grad_(True)
    opt = torch.optim.Adam([theta], lr=lr)
    for _ in range(steps):
        logp = torch.log_softmax(theta, -1)
        loss = preference_loss(logp[cw], logp[cl], log_ref[cw], log_ref[cl], beta, name)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return torch.softmax(theta.detach(), -1).numpy()
